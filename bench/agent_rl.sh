#!/usr/bin/env bash
# 48 updates of agent RL from the standard agent lab's seed-1 policy, one reward (and credit) at a
# time, each measured on the lab's held-out worlds every 16 updates.
set -e
# A lab run of `stepwise lab --domain agent --seed 1` in RUN (its policy/, prm_mc/, games.jsonl).
B=${STEPWISE:-target/release/stepwise}
RUN=${RUN:-runs/standard-agent-seed1}
R=${OUT:-/tmp/agent-rl}
# Each variant is REWARD[@CREDIT] (`stepwise agent rl --reward`, `--credit`; min-so-far when none;
# goal and prime take no credit).
VARIANTS=${VARIANTS:-"goal prm:$RUN/prm_mc oracle"}
mkdir -p $R
$B agent games --count 64 --seed 7001 --output $R/train.jsonl
grep "\"id\":\"e" $RUN/games.jsonl > $R/eval.jsonl
# Before RL: the starting policy on the same held-out worlds, four episodes each, as RL samples.
[ -s $R/before.jsonl ] || $B agent play --policy $RUN/policy --prompt pieces --problems $R/eval.jsonl -n 4 \
  --silent --max-actions 20 --separator "|" --max-tokens 12 --temperature 1 --seed 11 --output $R/before.jsonl 2>> $R/time.log
for v in $VARIANTS; do
  reward=${v%@*}
  credit=min-so-far
  [ "$reward" != "$v" ] && credit=${v##*@}
  name=$(basename "${reward#*:}")-$credit
  case $reward in goal|prime) name=$reward ;; esac
  /usr/bin/time -f "$name %e s" $B agent rl --policy $RUN/policy --problems $R/train.jsonl \
    --eval-problems $R/eval.jsonl --eval-every 16 --eval-samples 4 --silent --max-actions 20 \
    --separator "|" --max-tokens 12 --temperature 1 --reward $reward --credit $credit --updates 48 --worlds 4 \
    --group-size 8 --lr 1e-4 --kl 0.04 --seed 11 --out $R/$name 2>> $R/time.log
done
# Held-out success at each evaluation, the training success and the oracle's verdict over the
# first and last 8 updates, for every run.
python3 - "$R" <<'PY'
import json, pathlib, sys
r = pathlib.Path(sys.argv[1])
before = [json.loads(l) for l in open(r / "before.jsonl")]
print(f"before RL: held-out success {sum(t.get('correct') is True for t in before) / len(before):.3f}")
for log in sorted(r.glob("*/rl_log.jsonl")):
    rows = [json.loads(l) for l in open(log)]
    held = " / ".join(f"{x['heldout_accuracy']:.3f}" for x in rows if x.get("heldout_accuracy") is not None)
    mean = lambda xs: sum(xs) / max(len(xs), 1)
    first, last = rows[:8], rows[-8:]
    watch = lambda rs: mean([x.get("watched", {}).get("oracle", float("nan")) for x in rs])
    print(f"{log.parent.name}: held-out {held}; success {mean([x['accuracy'] for x in first]):.3f} -> "
          f"{mean([x['accuracy'] for x in last]):.3f}; oracle {watch(first):.3f} -> {watch(last):.3f}; "
          f"kl {mean([x['kl'] for x in last]):.3f}")
PY
