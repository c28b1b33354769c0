#!/usr/bin/env bash
# The CPU engine on a Xeon with AMX (Sapphire Rapids or later): each workload with the AMX tiles
# (the default where the CPU and kernel allow them) and without (`STEPWISE_AMX=0`: the AVX512_BF16
# tiles), one binary, one after the other, beside PyTorch's bf16 on the same cores (oneDNN, which
# uses AMX itself) at its best. By hand, never in tests or CI.
#
#   PYTHON=/path/to/venv/bin/python bash bench/amx_cpu.sh        (torch, transformers, safetensors)
#
#  1. scoring: `stepwise score` of the first RECORDS ProcessBench GSM8K records with a random
#     Qwen2.5-Math-PRM-shaped 0.5B checkpoint, against bench/gpu_transformers.py --device cpu
#     (each token budget warmed up on a whole pass, then timed; the best budget counts); the
#     largest step-score difference of each stepwise run from PyTorch's;
#  2. training: `train-prm --trainer packed` (bf16 autocast), batch 1, STEPS steps, against
#     bench/gpu_train.py --device cpu (PyTorch's bf16 autocast AdamW), as bench/train_cpu.sh;
#  3. generation: `generate -n 4 --max-tokens 32` of 32 GSM8K questions with a random 0.5B
#     policy (prefill in tiles; decoding's few rows take the weight-streaming kernel either way).
#
# Environment: WORK (default /tmp/amx_cpu), RECORDS (default 64), STEPS (default 2), OUT (the
# JSON, default $WORK/amx_cpu.json). Exits early where the CPU has no AMX.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BIN=${STEPWISE:-target/release/stepwise}
W=${WORK:-/tmp/amx_cpu}
RECORDS=${RECORDS:-64}
STEPS=${STEPS:-2}
OUT=${OUT:-$W/amx_cpu.json}
grep -q amx_bf16 /proc/cpuinfo || { echo "this CPU has no AMX (amx_bf16 is not in /proc/cpuinfo)"; exit 1; }
mkdir -p "$W"
cargo build --release -p stepwise-cli || exit 1
[ -f "$W/prm/config.json" ] || "$PY" bench/make_random_prm.py 0.5b "$W/prm" > "$W/make.log" 2>&1 \
    || { echo "could not make the PRM: $W/make.log"; exit 1; }
[ -f "$W/policy/config.json" ] || "$PY" bench/make_random_prm.py 0.5b "$W/policy" --policy >> "$W/make.log" 2>&1 \
    || { echo "could not make the policy: $W/make.log"; exit 1; }
python3 - "$W" "$RECORDS" <<'EOF'
import json, sys
w, n = sys.argv[1], int(sys.argv[2])
json.dump(json.load(open("data/processbench/gsm8k.json"))[:n], open(f"{w}/records.json", "w"))
with open("data/gsm8k/test.jsonl") as f, open(f"{w}/problems.jsonl", "w") as out:
    for i, line in zip(range(32), f):
        r = json.loads(line)
        out.write(json.dumps({"id": f"q{i}", "question": r["question"], "answer": r["answer"]}) + "\n")
EOF
source bench/common.sh
for amx in 1 0; do
    rm -f "$W/score-amx$amx.jsonl" "$W/score-amx$amx.jsonl.settings.json"
    STEPWISE_AMX=$amx run "score-amx$amx" "$BIN" score --model "$W/prm" --input "$W/records.json" \
        --output "$W/score-amx$amx.jsonl" --device cpu
done
run score-torch "$PY" bench/gpu_transformers.py "$W/prm" "$W/records.json" "$W/score-torch.json" --device cpu \
    --max-batch-tokens 1024,4096,16384
flags=(--steps "$STEPS" --lr 1e-5 --max-len 2048 --max-batch-tokens 65536 --batch-size 1)
for amx in 1 0; do
    rm -rf "$W/train-amx$amx"
    STEPWISE_AMX=$amx run "train-amx$amx" "$BIN" train-prm --data "$W/records.json" --base "$W/prm" \
        --out "$W/train-amx$amx" --device cpu --trainer packed "${flags[@]}" --valid-fraction 0 --stop-at-first-bad
done
run train-torch "$PY" bench/gpu_train.py "$W/prm" "$W/records.json" "$W/train-torch.json" "${flags[@]}" --device cpu
for amx in 1 0; do
    rm -f "$W/generate-amx$amx.jsonl" "$W/generate-amx$amx.jsonl.settings.json"
    STEPWISE_AMX=$amx run "generate-amx$amx" "$BIN" generate --model "$W/policy" --input "$W/problems.jsonl" \
        -n 4 --max-tokens 32 --output "$W/generate-amx$amx.jsonl" --device cpu
done
python3 - "$W" "$OUT" <<'EOF'
import json, re, sys
from pathlib import Path
sys.path.insert(0, "bench")
from gpu_compare import compare, load
w, out = Path(sys.argv[1]), Path(sys.argv[2])
runs = {}
for log in sorted(w.glob("*.log")):
    if log.stem == "make":
        continue
    text = log.read_text(errors="replace")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    tps = re.findall(r"([\d.]+) tokens/s", text)
    seconds = None
    if wall:
        parts = [float(p) for p in wall.group(1).split(":")]
        seconds = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    runs[log.stem] = {
        "exit": int(re.findall(r"^exit (\d+)", text, re.M)[-1]) if re.search(r"^exit", text, re.M) else None,
        "tokens_per_s": float(tps[-1]) if tps else None,
        "wall_s": seconds,
        "peak_rss_gib": int(rss.group(1)) / 2**20 if rss else None,
    }
torch_scores = w / "score-torch.json"
for amx in ("1", "0"):
    mine = w / f"score-amx{amx}.jsonl"
    if mine.exists() and torch_scores.exists():
        runs[f"score-amx{amx}"]["against_torch"] = compare(load(mine), load(torch_scores))
cpu = Path("/proc/cpuinfo").read_text()
model = re.search(r"model name\s*:\s*(.*)", cpu)
result = {"cpu": model.group(1) if model else None, "cores": cpu.count("processor\t:"), "amx": "amx_bf16" in cpu, "runs": runs}
out.write_text(json.dumps(result, indent=1))
for name, r in runs.items():
    print(f"{name:16} exit {r['exit']}  {r['tokens_per_s'] or 0:8.1f} tokens/s  wall {r['wall_s'] or 0:7.1f} s  peak {r['peak_rss_gib'] or 0:5.1f} GiB")
EOF
