#!/usr/bin/env bash
# 48 updates of agent RL from the standard agent lab's seed-1 policy, three rewards, one at a time.
set -e
# A lab run of `stepwise lab --domain agent --seed 1` in RUN (its policy/, prm_mc/, games.jsonl).
B=${STEPWISE:-target/release/stepwise}
RUN=${RUN:-runs/standard-agent-seed1}
R=${OUT:-/tmp/agent-rl}
mkdir -p $R
$B agent games --count 64 --seed 7001 --output $R/train.jsonl
grep "\"id\":\"e" $RUN/games.jsonl > $R/eval.jsonl
# Before RL: the starting policy on the same held-out worlds, four episodes each, as RL samples.
$B agent play --policy $RUN/policy --prompt pieces --problems $R/eval.jsonl -n 4 --silent \
  --max-actions 20 --separator "|" --max-tokens 12 --temperature 1 --seed 11 --output $R/before.jsonl 2>> $R/time.log
for reward in goal prm:$RUN/prm_mc oracle; do
  name=${reward%%:*}
  /usr/bin/time -f "$name %e s" $B agent rl --policy $RUN/policy --problems $R/train.jsonl \
    --eval-problems $R/eval.jsonl --eval-every 16 --eval-samples 4 --silent --max-actions 20 \
    --separator "|" --max-tokens 12 --temperature 1 --reward $reward --updates 48 --worlds 4 \
    --group-size 8 --lr 1e-4 --kl 0.04 --seed 11 --out $R/$name 2>> $R/time.log
done
