#!/usr/bin/env bash
# Training a 0.5B PRM on the CPU: `stepwise train-prm --device cpu` with each trainer (candle's
# autograd, and the packed engine's: bf16 autocast, each layer recomputed) against PyTorch's bf16
# autocast AdamW (bench/gpu_train.py on the CPU, the GPU stage's peer), on the same ProcessBench
# GSM8K records and settings as bench/gpu_check.sh's training stage (lr 1e-5, --max-len 2048,
# the classifier head on a random Qwen2.5-0.5B-shaped checkpoint). Each run's peak resident
# memory from /usr/bin/time, its tokens/s in training steps from its own last line.
#
#   PYTHON=/path/to/venv/bin/python bash bench/train_cpu.sh        (torch, transformers, safetensors)
#
# The peer runs as it is and with gradient checkpointing (each layer recomputed, as stepwise's
# packed trainer does). Environment: STEPS (default 2), BATCHES (default "1 8"), WORK (default /tmp/train_cpu),
# AUTOGRAD_BATCHES (default "1": candle's autograd ran out of 24 GB at batch 16), OUT (the JSON,
# default $WORK/train_cpu.json).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BIN=${STEPWISE:-target/release/stepwise}
W=${WORK:-/tmp/train_cpu}
STEPS=${STEPS:-2}
BATCHES=${BATCHES:-"1 8"}
AUTOGRAD_BATCHES=${AUTOGRAD_BATCHES:-1}
OUT=${OUT:-$W/train_cpu.json}
mkdir -p "$W"
[ -f "$W/prm-0.5b/config.json" ] || "$PY" bench/make_random_prm.py 0.5b "$W/prm-0.5b" > "$W/make.log" 2>&1 \
    || { echo "could not make the checkpoint: $W/make.log"; exit 1; }
python3 -c "import json; json.dump(json.load(open('data/processbench/gsm8k.json'))[:64], open('$W/train.json', 'w'))"
flags=(--steps "$STEPS" --lr 1e-5 --max-len 2048 --max-batch-tokens 65536)
source bench/common.sh
for b in $BATCHES; do
    if [[ " $AUTOGRAD_BATCHES " == *" $b "* ]]; then
        rm -rf "$W/autograd-$b"
        run "autograd-b$b" "$BIN" train-prm --data "$W/train.json" --base "$W/prm-0.5b" --out "$W/autograd-$b" \
            --device cpu --trainer autograd "${flags[@]}" --batch-size "$b" --valid-fraction 0 --stop-at-first-bad
    fi
    rm -rf "$W/packed-$b"
    run "packed-b$b" "$BIN" train-prm --data "$W/train.json" --base "$W/prm-0.5b" --out "$W/packed-$b" \
        --device cpu --trainer packed "${flags[@]}" --batch-size "$b" --valid-fraction 0 --stop-at-first-bad
    run "torch-b$b" "$PY" bench/gpu_train.py "$W/prm-0.5b" "$W/train.json" "$W/torch-b$b.json" "${flags[@]}" \
        --batch-size "$b" --device cpu
    # The peer with each layer recomputed too (transformers' gradient checkpointing).
    run "torch-ckpt-b$b" "$PY" bench/gpu_train.py "$W/prm-0.5b" "$W/train.json" "$W/torch-ckpt-b$b.json" \
        "${flags[@]}" --batch-size "$b" --device cpu --gradient-checkpointing
done
python3 - "$W" "$OUT" <<'EOF'
import json, re, sys
from pathlib import Path
w, out = Path(sys.argv[1]), Path(sys.argv[2])
runs = {}
for log in sorted(w.glob("*-b*.log")):
    text = log.read_text(errors="replace")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    tps = re.findall(r"([\d.]+) tokens/s", text)
    runs[log.stem] = {
        "exit": int(re.findall(r"^exit (\d+)", text, re.M)[-1]) if re.search(r"^exit", text, re.M) else None,
        "tokens_per_s": float(tps[-1]) if tps else None,
        "peak_rss_gib": int(rss.group(1)) / 2**20 if rss else None,
    }
cpu = Path("/proc/cpuinfo").read_text()
model = re.search(r"model name\s*:\s*(.*)", cpu)
result = {"cpu": model.group(1) if model else None, "cores": cpu.count("processor\t:"), "runs": runs}
out.write_text(json.dumps(result, indent=1))
for name, r in runs.items():
    print(f"{name:14} exit {r['exit']}  {r['tokens_per_s'] or 0:8.1f} tokens/s  peak {r['peak_rss_gib'] or 0:5.1f} GiB")
EOF
