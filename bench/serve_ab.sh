#!/usr/bin/env bash
# Two stepwise builds served in turn, interleaved (A, B, A, B…, so the machine's drift falls on
# both): generated tokens/s under each number of concurrent clients (bench/load_serve.py, every
# completion run to --max-tokens). For a change in the engine, measured where it applies.
#
#   A=old/stepwise B=new/stepwise bash bench/serve_ab.sh POLICY_DIR [OUT.jsonl]
#
# CLIENTS ("8 6"), ROUNDS (2), SECONDS_EACH (30), WARMUP (5), MAX_TOKENS (32), PYTHON (openai).
set -euo pipefail
policy=$(cd "$1" && pwd) out=${2:-/dev/stdout}
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
export STEPWISE_CACHE=$work/cache
. "$here/bench/servers.sh"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in A B; do
    for c in ${CLIENTS:-8 6}; do
      stepwise=${!side} serve_stepwise "$work/$side.log" --model "$policy"
      "$python" "$here/bench/load_serve.py" "$URL" "$(basename "$policy")" --clients "$c" \
        --seconds "${SECONDS_EACH:-30}" --warmup "${WARMUP:-5}" --max-tokens "${MAX_TOKENS:-32}" --json "$work/one"
      kill "$PID"; wait "$PID" 2>/dev/null || true
      "$python" -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().splitlines()[-1]); r.update(side=sys.argv[2], build=sys.argv[3], round=int(sys.argv[4])); print(json.dumps(r))' \
        "$work/one" "$side" "${!side}" "$round" >> "$out"
      rm -f "$work/one"
    done
  done
done
