#!/usr/bin/env bash
# Scoring through the Python package against the command line, on the same records and the same
# checkpoint, in one sitting on one machine: tokens/s of `stepwise score` and of
# `stepwise.PRM(...).score_records(...)` (both release builds), run in turns, and whether the two
# give the same scores.
#
#   bash bench/python_vs_cli_scoring.sh MODEL_DIR RECORDS [ROUNDS]
#
# MODEL_DIR: a PRM (e.g. `python bench/make_random_prm.py 0.5b DIR`); RECORDS: any file stepwise
# reads (e.g. the first 64 ProcessBench GSM8K records). VENV: the virtual environment the package
# is installed into (default /tmp/stepwise-bench-venv). Both time the scoring alone (records read,
# model loaded before the clock starts) and encode the same token ids.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=$(realpath "${1:?usage: bench/python_vs_cli_scoring.sh MODEL_DIR RECORDS [ROUNDS]}")
RECORDS=$(realpath "${2:?usage: bench/python_vs_cli_scoring.sh MODEL_DIR RECORDS [ROUNDS]}")
ROUNDS=${3:-3}
VENV=${VENV:-/tmp/stepwise-bench-venv}
cargo build --release -p stepwise-cli
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet ./python
out=$(mktemp -d)
for round in $(seq 1 "$ROUNDS"); do
    line=$(target/release/stepwise score --model "$MODEL" --input "$RECORDS" --output "$out/cli-$round.jsonl" \
        --device cpu 2>&1 | grep '^scored')
    tokens=$(echo "$line" | sed -E 's/.*\(([0-9]+) tokens\).*/\1/')
    echo "round $round, command line: $line"
    (cd "$out" && "$VENV/bin/python" - "$MODEL" "$RECORDS" "$tokens" "$round" <<'EOF'
import json, sys, time
import stepwise
model, records, tokens, round_ = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
recs = stepwise.read(records)
prm = stepwise.PRM(model, device="cpu")
start = time.perf_counter()
scored = prm.score_records(recs)
secs = time.perf_counter() - start
cli = [json.loads(l)["scores"]["prm"] for l in open(f"cli-{round_}.jsonl")]
same = all(a == b for x, y in zip(cli, [r["scores"]["prm"] for r in scored]) for a, b in zip(x, y))
print(f"round {round_}, python: scored {len(recs)} solutions in {secs:.2f}s: {tokens / secs:.0f} tokens/s; "
      f"the same scores as the command line: {same}")
EOF
    )
done
