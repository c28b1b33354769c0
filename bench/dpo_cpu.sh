#!/usr/bin/env bash
# DPO on the CPU at a pretrained policy's size: `stepwise dpo --device cpu --trainer packed` on a
# random Qwen2.5-0.5B-shaped policy (bench/make_random_prm.py --policy) against TRL's DPOTrainer
# (bench/trl_dpo_cpu.py) on the same step pairs: `stepwise pairs` of PRM800K's sample records
# (data/prm800k, 15 pairs), stepwise's layout for stepwise and TRL's for TRL, BATCH pairs a step,
# one epoch. Both take the reference's log-probabilities once before the first step. The two
# shuffle the pairs differently, so the comparison is the epoch: every pair once, the sum of the
# optimiser steps' seconds, and the whole run's wall clock and peak resident memory.
#
#   PYTHON=/path/to/venv/bin/python bash bench/dpo_cpu.sh     (torch, transformers, trl, datasets)
#
# LORA=R trains LoRA adapters of rank R (alpha 2R, every linear projection) on both sides:
# `--lora-rank R` here, PEFT's LoraConfig through TRL's peft_config there.
#
# Environment: BATCH (4), LORA (0: full training), PAIRS (the first this many pairs, default all 15), PEER_WEIGHTS ("bfloat16 float32"), WORK (/tmp/dpo_cpu), OUT (the JSON,
# default $WORK/dpo_cpu.json), STEPWISE (target/release/stepwise).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BIN=${STEPWISE:-target/release/stepwise}
W=${WORK:-/tmp/dpo_cpu}
BATCH=${BATCH:-4}
PAIRS=${PAIRS:-15}
LORA=${LORA:-0}
PEER_WEIGHTS=${PEER_WEIGHTS:-"bfloat16 float32"}
OUT=${OUT:-$W/dpo_cpu.json}
mkdir -p "$W"
[ -f "$W/policy-0.5b/config.json" ] || "$PY" bench/make_random_prm.py 0.5b "$W/policy-0.5b" --policy \
    > "$W/make.log" 2>&1 || { echo "could not make the policy: $W/make.log"; exit 1; }
"$BIN" pairs data/prm800k/samples_openr.jsonl "$W/all.jsonl" 2> "$W/pairs.log"
"$BIN" pairs data/prm800k/samples_openr.jsonl "$W/all_trl.jsonl" --layout trl 2>> "$W/pairs.log"
head -n "$PAIRS" "$W/all.jsonl" > "$W/pairs.jsonl"
head -n "$PAIRS" "$W/all_trl.jsonl" > "$W/pairs_trl.jsonl"
rm -rf "$W/run"
echo "== stepwise"
/usr/bin/time -v "$BIN" dpo --policy "$W/policy-0.5b" --pairs "$W/pairs.jsonl" --out "$W/run" --device cpu \
    --trainer packed --batch-size "$BATCH" --minibatch-size "$BATCH" --lr 1e-6 --warmup-ratio 0 \
    --checkpoint-every 0 --lora-rank "$LORA" > "$W/stepwise.log" 2>&1
echo "exit $?" >> "$W/stepwise.log"
grep -E "Maximum resident|Elapsed|^exit|rror" "$W/stepwise.log" | tail -4
for d in $PEER_WEIGHTS; do
    echo "== TRL, $d weights"
    /usr/bin/time -v "$PY" bench/trl_dpo_cpu.py --policy "$W/policy-0.5b" --pairs "$W/pairs_trl.jsonl" \
        --out "$W/trl-$d.json" --batch "$BATCH" --weights "$d" --lora-rank "$LORA" > "$W/trl-$d.log" 2>&1
    echo "exit $?" >> "$W/trl-$d.log"
    grep -E "Elapsed|^exit" "$W/trl-$d.log" | tail -2
done
python3 - "$W" "$OUT" "$PEER_WEIGHTS" "$LORA" <<'EOF'
import json, re, sys
from pathlib import Path
w, out, peers = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split()

def wall(text):
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", text)
    return round(int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3)), 1) if m else None

text = (w / "stepwise.log").read_text(errors="replace")
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
log = [json.loads(l) for l in (w / "run" / "dpo_log.jsonl").read_text().splitlines()] if (w / "run" / "dpo_log.jsonl").exists() else []
ours = {
    "peak_gib": round(int(rss.group(1)) / 2**20, 2) if rss else None,
    "wall_seconds": wall(text),
    "seconds_per_step": [round(l["seconds"], 2) for l in log],
    "epoch_step_seconds": round(sum(l["seconds"] for l in log), 1) if log else None,
    "tokens": log[-1]["tokens"] if log else None,
    "loss": [round(l["train"]["loss"], 4) for l in log],
}
trl = {}
for d in peers:
    f = w / f"trl-{d}.json"
    t = (w / f"trl-{d}.log").read_text(errors="replace")
    trl[d] = json.load(open(f)) if f.exists() else {"error": t[-2000:]}
    trl[d]["wall_seconds"] = wall(t)
    steps = trl[d].get("seconds_per_step", [])
    trl[d]["epoch_step_seconds"] = round(sum(steps), 1) if steps else None
best = min((p["epoch_step_seconds"], d) for d, p in trl.items() if p.get("epoch_step_seconds")) if trl else None
ratio = None
if best and ours["epoch_step_seconds"]:
    ratio = {"peer": f"TRL, {best[1]} weights", "epoch_steps_ratio": round(best[0] / ours["epoch_step_seconds"], 2),
             "wall_ratio": round(trl[best[1]]["wall_seconds"] / ours["wall_seconds"], 2) if ours["wall_seconds"] else None}
json.dump({"policy": "random Qwen2.5-0.5B shape, bf16", "lora_rank": int(sys.argv[4]), "pairs": "stepwise pairs of data/prm800k/samples_openr.jsonl",
           "stepwise": ours, "trl": trl, "against_best_peer": ratio}, open(out, "w"), indent=1)
print("stepwise: epoch steps", ours["epoch_step_seconds"], "s, wall", ours["wall_seconds"], "s, peak", ours["peak_gib"], "GiB")
for d, p in trl.items():
    print("TRL", d, "epoch steps", p.get("epoch_step_seconds"), "s, wall", p.get("wall_seconds"), "s, peak", p.get("peak_gib"), "GiB")
print("against the best peer:", ratio)
EOF
