#!/usr/bin/env bash
# A progress head against a promise head on the same TD labels: both trained from the agent lab's
# seed-1 policy on its label trajectories (TD(0.5) labels, values from its PRM-TD), then scored on
# its 768 held-out trajectories; AUC of good (progress) against bad (invalid, regress, ruin)
# actions by the oracle, first actions left out (they have no state before them to compare).
set -e
B=${STEPWISE:-target/release/stepwise}
RUN=${RUN:-runs/standard-agent-seed1}
R=${OUT:-/tmp/agent-progress-head}
mkdir -p $R
$B score --model $RUN/prm_td --input $RUN/trajectories_label.jsonl --output $R/scored_label.jsonl
$B agent label --method td --lambda 0.5 --gamma 0.9 --problems $RUN/games.jsonl --input $R/scored_label.jsonl \
  --output $R/td.jsonl
for t in progress promise; do
  $B train-prm --data $R/td.jsonl --base $RUN/policy --target $t --separator "|" --steps 40 --batch-size 32 \
    --valid-fraction 0 --seed 1 --out $R/$t
  $B score --model $R/$t --input $RUN/trajectories_eval.jsonl --output $R/eval_$t.jsonl
done
python3 - "$R" "$RUN" <<'PY'
import bisect, json, sys
r, run = sys.argv[1], sys.argv[2]
oracle = {}
for line in open(f"{run}/oracle_eval.jsonl"):
    t = json.loads(line)
    oracle[t["id"]] = t["meta"]["actions"]
def auc(good, bad):
    bad = sorted(bad)
    wins = sum(bisect.bisect_left(bad, g) + 0.5 * (bisect.bisect_right(bad, g) - bisect.bisect_left(bad, g)) for g in good)
    return wins / (len(good) * len(bad))
def scores(t):
    rows = (json.loads(l) for l in open(f"{r}/eval_{t}.jsonl"))
    return {x["id"]: list(x["scores"].values())[0] for x in rows}
progress, promise = scores("progress"), scores("promise")
for name, value in [("progress head, 2s - 1", lambda k, i: 2 * progress[k][i] - 1),
                    ("promise head, s - s_before / 0.9", lambda k, i: promise[k][i] - promise[k][i - 1] / 0.9),
                    ("promise head, s", lambda k, i: promise[k][i])]:
    good, bad = [], []
    for k, actions in oracle.items():
        for i, a in enumerate(actions[1:], start=1):
            (good if a == "progress" else bad if a in ("invalid", "regress", "ruin") else []).append(value(k, i))
    print(f"{name}: AUC {auc(good, bad):.3f} ({len(good)} good, {len(bad)} bad actions)")
PY
