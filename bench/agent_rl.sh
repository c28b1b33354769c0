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
PAIRED=${PAIRED:-16}
# RL seeds: each variant is trained once a seed (run folders NAME-sSEED); the summary pairs runs
# of the same seed and pools the seeds (each world's success averaged over them).
SEEDS=${SEEDS:-11}
# The goal's weight beside a process reward (`--goal-weight`); runs at another weight than 1 are
# named NAME-wWEIGHT.
GOAL_WEIGHT=${GOAL_WEIGHT:-1}
# Updates and peak learning rate of every run; runs at other values than 48 and 1e-4 are named
# NAME-uUPDATES and NAME-lrLR (the summary pairs each against the goal's run at the same values).
UPDATES=${UPDATES:-48}
LR=${LR:-1e-4}
mkdir -p $R
[ -s $R/train.jsonl ] || $B agent games --count 64 --seed 7001 --output $R/train.jsonl
[ -s $R/eval.jsonl ] || grep "\"id\":\"e" $RUN/games.jsonl > $R/eval.jsonl
# Before RL: the starting policy on the same held-out worlds, four episodes each, as RL samples.
[ -s $R/before.jsonl ] || $B agent play --policy $RUN/policy --prompt pieces --problems $R/eval.jsonl -n 4 \
  --silent --max-actions 20 --separator "|" --max-tokens 12 --temperature 1 --seed 11 --output $R/before.jsonl 2>> $R/time.log
for seed in $SEEDS; do
for v in $VARIANTS; do
  reward=${v%@*}
  credit=min-so-far
  [ "$reward" != "$v" ] && credit=${v##*@}
  name=$(basename "${reward#*:}")-$credit
  case $reward in goal|prime) name=$reward ;; esac
  [ "$GOAL_WEIGHT" != 1 ] && name=$name-w$GOAL_WEIGHT
  tag=
  [ "$UPDATES" != 48 ] && tag=$tag-u$UPDATES
  [ "$LR" != 1e-4 ] && tag=$tag-lr$LR
  name=$name$tag-s$seed
  /usr/bin/time -f "$name %e s" $B agent rl --policy $RUN/policy --problems $R/train.jsonl \
    --eval-problems $R/eval.jsonl --eval-every 16 --eval-samples 4 --silent --max-actions 20 \
    --separator "|" --max-tokens 12 --temperature 1 --reward $reward --credit $credit --goal-weight $GOAL_WEIGHT --updates $UPDATES --worlds 4 \
    --group-size 8 --lr $LR --kl 0.04 --seed $seed --out $R/$name 2>> $R/time.log
  # The final policy on every held-out world, PAIRED episodes each, and the oracle's verdicts.
  $B agent play --policy $R/$name --prompt pieces --problems $R/eval.jsonl -n $PAIRED --silent --max-actions 20 \
    --separator "|" --max-tokens 12 --temperature 1 --seed 12 --output $R/$name/final.jsonl 2>> $R/time.log
  $B agent label --method oracle --problems $R/eval.jsonl --input $R/$name/final.jsonl \
    --output $R/$name/final_oracle.jsonl 2>> $R/time.log
done
done
# Held-out success at each evaluation, the training success and the oracle's verdict over the
# first and last 8 updates, for every run.
python3 - "$R" <<'PY'
import json, pathlib, random, sys
def mean(xs):
    return sum(xs) / max(len(xs), 1)
r = pathlib.Path(sys.argv[1])
before = [json.loads(l) for l in open(r / "before.jsonl")]
print(f"before RL: held-out success {sum(t.get('correct') is True for t in before) / len(before):.3f}")
for log in sorted(r.glob("*/rl_log.jsonl")):
    rows = [json.loads(l) for l in open(log)]
    held = " / ".join(f"{x['heldout_accuracy']:.3f}" for x in rows if x.get("heldout_accuracy") is not None)
    first, last = rows[:8], rows[-8:]
    watch = lambda rs: mean([x.get("watched", {}).get("oracle", float("nan")) for x in rs])
    print(f"{log.parent.name}: held-out {held}; success {mean([x['accuracy'] for x in first]):.3f} -> "
          f"{mean([x['accuracy'] for x in last]):.3f}; oracle {watch(first):.3f} -> {watch(last):.3f}; "
          f"kl {mean([x['kl'] for x in last]):.3f}")
# Paired over worlds: each final policy's success and clean success (no invalid, regressing or
# ruinous action on the way) per world, against the first variant's (goal when it ran).
def per_world(path):
    won, clean = {}, {}
    for line in open(path):
        t = json.loads(line)
        ok = t.get("correct") is True
        bad = any(a in ("invalid", "regress", "ruin") for a in t["meta"]["actions"])
        won.setdefault(t["problem_id"], []).append(ok)
        clean.setdefault(t["problem_id"], []).append(ok and not bad)
    return ({k: mean(v) for k, v in won.items()}, {k: mean(v) for k, v in clean.items()})
runs = {}
for p in sorted(r.glob("*-s*/final_oracle.jsonl")):
    variant, seed = p.parent.name.rsplit("-s", 1)
    runs.setdefault(variant, {})[seed] = per_world(p)
# Each run pairs with the goal's at the same updates and learning rate (its name's -uN-lrX tail).
import re
def base_of(name):
    tail = re.search(r"(-u\d+)?(-lr[0-9.e-]+)?$", name).group(0)
    return "goal" + tail if "goal" + tail in runs else next(iter(runs), None)
def interval(a, b, rng):
    ks = sorted(a.keys() & b.keys())
    d = [a[k] - b[k] for k in ks]
    boot = sorted(mean([d[rng.randrange(len(d))] for _ in d]) for _ in range(10000))
    return mean(d), boot[250], boot[9749], len(ks)
def pooled(by_seed, seeds, i):
    worlds = set.intersection(*(set(by_seed[s][i]) for s in seeds))
    return {k: mean([by_seed[s][i][k] for s in seeds]) for k in worlds}
for name, by_seed in runs.items():
    for seed, (won, clean) in sorted(by_seed.items()):
        print(f"{name} (seed {seed}): final success {mean(list(won.values())):.3f}, clean {mean(list(clean.values())):.3f}")
    base = base_of(name)
    if name == base:
        continue
    shared = sorted(by_seed.keys() & runs[base].keys())
    rows = [(f"seed {s}", [s]) for s in shared] + ([("seeds " + " ".join(shared), shared)] if len(shared) > 1 else [])
    for label, seeds in rows:
        for i, what in ((0, "success"), (1, "clean success")):
            m, lo, hi, n = interval(pooled(by_seed, seeds, i), pooled(runs[base], seeds, i), random.Random(12))
            print(f"  {name} - {base}, {what}, {label}: {m:+.3f} [{lo:+.3f}, {hi:+.3f}] over {n} worlds")
PY
