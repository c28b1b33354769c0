#!/usr/bin/env bash
# Completions that ask for their tokens' log-probabilities (`logprobs: K`, what an RL trainer's
# rollouts ask of vLLM) under C concurrent clients: generated tokens/s and latency
# (bench/load_serve.py, every completion run to --max-tokens and checked to hold one
# log-probability a token), with and without `logprobs`, on stepwise serve, on an earlier build
# of it (BEFORE, say the one that weighed the tokens in a second pass), and on vLLM.
#
#   bash bench/serve_logprobs.sh POLICY_DIR [OUT.json]
#
# POLICY_DIR: bench/make_random_prm.py 0.5b DIR --policy. STEPWISE (default
# target/release/stepwise), BEFORE (another stepwise binary; skipped when unset), PYTHON (openai),
# CLIENTS (16), SECONDS_EACH (30), WARMUP (5), MAX_TOKENS (32), K (1), WORK (a scratch folder).
# With VLLM=path/to/python of vLLM's CPU build (bench/vllm_interop.sh), vLLM serves the same
# policy on every core, right after stepwise's runs.
set -euo pipefail
policy=$(cd "$1" && pwd) out=${2:-}
here=$(cd "$(dirname "$0")/.." && pwd)
new=${STEPWISE:-$here/target/release/stepwise}
python=${PYTHON:-python3}
clients=${CLIENTS:-16} secs=${SECONDS_EACH:-30} warmup=${WARMUP:-5} max_tokens=${MAX_TOKENS:-32} k=${K:-1}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
export STEPWISE_CACHE=$work/cache
. "$here/bench/servers.sh"
results=$work/results.jsonl
: > "$results"
base=$(basename "$policy")
run() { # LABEL LOGPROBS SERVER: SERVER is a stepwise binary or `vllm`; load it, record tokens/s
  local label=$1 lp=$2 server=$3 log=$work/$1.log
  if [ "$server" = vllm ]; then
    serve_vllm 8232 "$log" "$policy" --served-model-name "$base"
  else
    stepwise=$server serve_stepwise "$log" --model "$policy"
  fi
  local pid=$PID url=$URL
  local ask=()
  [ "$lp" = yes ] && ask=(--logprobs "$k")
  "$python" "$here/bench/load_serve.py" "$url" "$base" --clients "$clients" --seconds "$secs" \
    --warmup "$warmup" --max-tokens "$max_tokens" "${ask[@]}" --json "$results.one"
  kill $pid; wait $pid 2>/dev/null || true
  "$python" - "$results.one" "$label" >> "$results" <<'PY'
import json, sys
row = json.loads(open(sys.argv[1]).read().splitlines()[-1])
row.update(label=sys.argv[2])
print(json.dumps(row))
PY
  rm -f "$results.one"
}
run stepwise_plain no "$new"
run stepwise_logprobs yes "$new"
if [ -n "${BEFORE:-}" ]; then
  run before_logprobs yes "$BEFORE"
  run before_plain no "$BEFORE"
fi
if [ -n "${VLLM:-}" ]; then
  run vllm_plain no vllm
  run vllm_logprobs yes vllm
fi
lscpu | sed -n 's/^Model name: *//p' > "$work/cpu.txt"
"$python" - "$results" "$work/cpu.txt" "$clients" "$secs" "$max_tokens" "$k" "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
doc = {"cpu": open(sys.argv[2]).read().strip(), "clients": int(sys.argv[3]), "seconds": float(sys.argv[4]),
       "max_tokens": int(sys.argv[5]), "logprobs": int(sys.argv[6]), "runs": rows}
text = json.dumps(doc, indent=1)
print(text)
if sys.argv[7]:
    open(sys.argv[7], "w").write(text + "\n")
PY
