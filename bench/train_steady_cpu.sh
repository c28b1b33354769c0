#!/usr/bin/env bash
# Training steps in their steady state on the CPU: `stepwise train-prm --trainer packed` against
# PyTorch's bf16 autocast AdamW (bench/gpu_train.py --device cpu) on the same batch every step
# (one ProcessBench GSM8K record of median length, BATCH copies a step, so both read the same
# tokens), each run twice, for SHORT and for LONG steps: a step's seconds in the steady state are
# (LONG's − SHORT's seconds in steps) / (LONG − SHORT), and the first step's are what SHORT's
# steps took beyond SHORT steady ones (the memory both touch for the first time: the
# optimiser's state, the gradients, the activations). By hand, never in tests or CI.
#
#   PYTHON=/path/to/venv/bin/python bash bench/train_steady_cpu.sh   (torch, transformers, safetensors)
#
# Environment: BATCHES (default "1 4"), SHORT (default 2), LONG (default 6), WORK (default
# /tmp/train_steady), OUT (the JSON, default $WORK/train_steady.json).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BIN=${STEPWISE:-target/release/stepwise}
W=${WORK:-/tmp/train_steady}
BATCHES=${BATCHES:-"1 4"}
SHORT=${SHORT:-2}
LONG=${LONG:-6}
OUT=${OUT:-$W/train_steady.json}
mkdir -p "$W"
cargo build --release -p stepwise-cli || exit 1
[ -f "$W/prm/config.json" ] || "$PY" bench/make_random_prm.py 0.5b "$W/prm" > "$W/make.log" 2>&1 \
    || { echo "could not make the PRM: $W/make.log"; exit 1; }
python3 - "$W" <<'PYEOF'
import json, sys
records = json.load(open("data/processbench/gsm8k.json"))[:64]
def chars(r):
    first_bad = r["label"] if r["label"] >= 0 else len(r["steps"])
    return len(r["problem"]) + sum(len(s) for s in r["steps"][: first_bad + 1])
median = sorted(records, key=chars)[len(records) // 2]
json.dump([median] * 16, open(f"{sys.argv[1]}/same.json", "w"))
PYEOF
source bench/common.sh
for b in $BATCHES; do
    flags=(--lr 1e-5 --max-len 2048 --max-batch-tokens 65536 --batch-size "$b")
    for steps in "$SHORT" "$LONG"; do
        rm -rf "$W/run"
        run "stepwise-b$b-s$steps" "$BIN" train-prm --data "$W/same.json" --base "$W/prm" --out "$W/run" \
            --device cpu --trainer packed --steps "$steps" "${flags[@]}" --valid-fraction 0 --stop-at-first-bad
        run "torch-b$b-s$steps" "$PY" bench/gpu_train.py "$W/prm" "$W/same.json" "$W/torch-b$b-s$steps.json" \
            --steps "$steps" "${flags[@]}" --device cpu
    done
done
python3 - "$W" "$OUT" "$BATCHES" "$SHORT" "$LONG" <<'PYEOF'
import json, re, sys
from pathlib import Path
w, out, batches, short, long_ = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4]), int(sys.argv[5])
def in_steps(log):
    text = log.read_text(errors="replace")
    m = re.search(r"\(([\d.]+)s in steps: (\d+) tokens", text) or re.search(r"(\d+) tokens in ([\d.]+)s", text)
    if m is None:
        return None
    a, b = m.groups()
    return (float(a), int(b)) if "in steps" in m.group(0) else (float(b), int(a))
cpu = Path("/proc/cpuinfo").read_text()
model = re.search(r"model name\s*:\s*(.*)", cpu)
result = {"cpu": model.group(1) if model else None, "cores": cpu.count("processor\t:"), "short": short, "long": long_, "runs": {}}
for b in batches:
    for who in ("stepwise", "torch"):
        s, l = in_steps(w / f"{who}-b{b}-s{short}.log"), in_steps(w / f"{who}-b{b}-s{long_}.log")
        if s is None or l is None:
            continue
        step = (l[0] - s[0]) / (long_ - short)
        tokens = (l[1] - s[1]) / (long_ - short)
        first = s[0] - (short - 1) * step
        result["runs"][f"{who}-b{b}"] = {
            "tokens_a_step": tokens, "steady_s_a_step": step, "steady_tokens_per_s": tokens / step,
            "first_step_s": first, "short_run_tokens_per_s": s[1] / s[0], "long_run_tokens_per_s": l[1] / l[0]}
        r = result["runs"][f"{who}-b{b}"]
        print(f"{who:8} batch {b}: {tokens:6.0f} tokens a step, steady {step:6.2f} s a step = {r['steady_tokens_per_s']:6.1f} tokens/s; first step {first:6.2f} s")
out.write_text(json.dumps(result, indent=1))
PYEOF
