#!/usr/bin/env bash
# RL on the CPU at a pretrained policy's size: `stepwise rl --device cpu` on a random
# Qwen2.5-0.5B-shaped policy (bench/make_random_prm.py --policy) with each trainer, candle's f32
# autograd and the packed engine's (bf16 autocast, each layer recomputed, sampling from its own
# weights on the packed engine's CPU backend), the outcome reward on GSM8K problems. Each run's
# peak resident memory from /usr/bin/time, its seconds an update (and sampling's share) from its
# rl_log.jsonl. Autograd runs under an address-space limit (LIMIT_GIB, default 21; 0 for none) so
# that running out of memory ends that run, not the machine's other work (the limit counts
# address space reserved, not only memory used: the packed run reserves 28 GB to use 15).
#
#   PYTHON=/path/to/venv/bin/python bash bench/rl_cpu.sh      (torch or numpy+ml_dtypes, safetensors)
#
# The peer, with PEER_WEIGHTS set ("bfloat16+compile bfloat16 float32"; PYTHON then needs trl):
# TRL's GRPOTrainer on the same policy, problems and shape (bench/trl_grpo_cpu.py), once for each
# weight dtype (`+compile`: with the Trainer's torch_compile), after stepwise's runs. A steady update is the mean of every update but the first. The two pick
# their prompts differently, so for a comparison SAME_PROBLEM=N makes GSM8K's test problem N every
# prompt (13, of median length among the first 16: every update then feeds the same tokens).
#
# Environment: UPDATES (2), PROMPTS (2), GROUP (4), TOKENS (32), MINIBATCH (8), KL (0.04: the KL
# penalty's weight, both's; 0 runs both without a reference), LORA (0: full training; R: LoRA
# adapters of rank R, alpha 2R, on every linear projection, both's: TRL through PEFT), TRAINERS ("packed autograd"), PEER_WEIGHTS (none), SAME_PROBLEM (none: the first 16 problems), WORK (/tmp/rl_cpu), OUT (the JSON, default
# $WORK/rl_cpu.json).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BIN=${STEPWISE:-target/release/stepwise}
W=${WORK:-/tmp/rl_cpu}
UPDATES=${UPDATES:-2}
PROMPTS=${PROMPTS:-2}
GROUP=${GROUP:-4}
TOKENS=${TOKENS:-32}
MINIBATCH=${MINIBATCH:-8}
KL=${KL:-0.04}
LORA=${LORA:-0}
TRAINERS=${TRAINERS:-"packed autograd"}
PEER_WEIGHTS=${PEER_WEIGHTS:-}
SAME_PROBLEM=${SAME_PROBLEM:-}
LIMIT_GIB=${LIMIT_GIB:-21}
OUT=${OUT:-$W/rl_cpu.json}
mkdir -p "$W"
[ -f "$W/policy-0.5b/config.json" ] || "$PY" bench/make_random_prm.py 0.5b "$W/policy-0.5b" --policy \
    > "$W/make.log" 2>&1 || { echo "could not make the policy: $W/make.log"; exit 1; }
if [ -n "$SAME_PROBLEM" ]; then   # every prompt the same: the same tokens an update for stepwise and the peer
    python3 -c 'import json, sys; p = json.loads(open("data/gsm8k/test.jsonl").readlines()[int(sys.argv[1]) - 1])
for k in range(16): print(json.dumps({**p, "id": f"same-{k}"}))' "$SAME_PROBLEM" > "$W/problems.jsonl"
else
    head -16 data/gsm8k/test.jsonl > "$W/problems.jsonl"
fi
for t in $TRAINERS; do
    rm -rf "$W/run-$t"
    limit=()
    [ "$t" = autograd ] && [ "$LIMIT_GIB" -gt 0 ] && limit=(prlimit --as=$((LIMIT_GIB << 30)))
    echo "== $t"
    /usr/bin/time -v "${limit[@]}" "$BIN" rl --policy "$W/policy-0.5b" --problems "$W/problems.jsonl" \
        --out "$W/run-$t" --device cpu --trainer "$t" --updates "$UPDATES" --prompts "$PROMPTS" \
        --group-size "$GROUP" --max-tokens "$TOKENS" --minibatch-size "$MINIBATCH" --kl "$KL" --lr 1e-6 \
        --checkpoint-every 0 --lora-rank "$LORA" > "$W/$t.log" 2>&1
    echo "exit $?" >> "$W/$t.log"
    grep -E "Maximum resident|^exit|rror|memory" "$W/$t.log" | tail -3
done
for d in $PEER_WEIGHTS; do
    echo "== TRL, $d weights"
    compile=()
    [ "${d#*+}" = compile ] && compile=(--compile)
    "$PY" bench/trl_grpo_cpu.py --policy "$W/policy-0.5b" --problems "$W/problems.jsonl" \
        --out "$W/trl-$d.json" --updates "$UPDATES" --prompts "$PROMPTS" --group "$GROUP" \
        --tokens "$TOKENS" --kl "$KL" --lr 1e-6 --lora-rank "$LORA" --weights "${d%+compile}" "${compile[@]}" > "$W/trl-$d.log" 2>&1
    echo "exit $?" >> "$W/trl-$d.log"
    tail -2 "$W/trl-$d.log"
done
python3 - "$W" "$OUT" "$TRAINERS" "$PEER_WEIGHTS" <<'EOF'
import json, re, sys
from pathlib import Path
w, out, trainers, peers = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
steady = lambda s: round(sum(s[1:]) / len(s[1:]), 2) if len(s) > 1 else None
runs = {}
for t in trainers:
    text = (w / f"{t}.log").read_text(errors="replace")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    code = re.search(r"^exit (\d+)", text, re.M)
    log = w / f"run-{t}" / "rl_log.jsonl"
    updates = [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []
    runs[t] = {
        "exit": int(code.group(1)) if code else None,
        "peak_gib": round(int(rss.group(1)) / 2**20, 2) if rss else None,
        "updates": [{k: u.get(k) for k in ("update", "seconds", "sampling_seconds", "logprob_seconds", "learn_seconds", "sampled_tokens", "kl", "loss")}
                    for u in updates],
    }
    if updates:
        runs[t]["seconds_per_update"] = round(sum(u["seconds"] for u in updates) / len(updates), 1)
        runs[t]["steady_seconds_per_update"] = steady([u["seconds"] for u in updates])
    if runs[t]["exit"]:
        runs[t]["error"] = [l for l in text.splitlines() if "rror" in l or "memory" in l][-3:]
trl = {}
for d in peers:
    f = w / f"trl-{d}.json"
    trl[d] = json.load(open(f)) if f.exists() else {"error": (w / f"trl-{d}.log").read_text(errors="replace")[-2000:]}
    trl[d]["steady_seconds_per_update"] = steady(trl[d].get("seconds_per_update", []))
best = min((p["steady_seconds_per_update"], d) for d, p in trl.items() if p["steady_seconds_per_update"]) if trl else None
ours = runs.get("packed", {}).get("steady_seconds_per_update")
ratio = {"peer": f"TRL, {best[1]} weights", "steady_ratio": round(best[0] / ours, 2)} if best and ours else None
json.dump({"policy": "random Qwen2.5-0.5B shape, bf16", "runs": runs, "trl": trl, "against_best_peer": ratio},
          open(out, "w"), indent=1)
for t, r in runs.items():
    print(t, "exit", r["exit"], "peak", r["peak_gib"], "GiB", "s/update", r.get("seconds_per_update"),
          "steady", r.get("steady_seconds_per_update"))
for d, p in trl.items():
    print("TRL", d, "steady", p["steady_seconds_per_update"], "peak", p.get("peak_gib"), "GiB")
print("against the best peer:", ratio)
EOF
