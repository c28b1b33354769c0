#!/usr/bin/env bash
# Several LoRA adapters on one served policy (`stepwise serve --lora-modules`, unmerged) against
# the base alone and against an adapter served merged (`--model ADAPTER`, a model's memory an
# adapter): generated tokens/s under C concurrent clients (bench/load_serve.py, every completion
# run to --max-tokens), and each server's peak resident memory.
#
#   bash bench/lora_serve.sh POLICY_DIR [OUT.json]
#
# POLICY_DIR: bench/make_random_prm.py 0.5b DIR --policy. Three rank-R adapters on every linear
# projection are written by PEFT into WORK (bench/write_loras.py).
# STEPWISE (default target/release/stepwise), PYTHON (torch, transformers, peft, openai),
# CLIENTS (16), SECONDS_EACH (30), WARMUP (5), MAX_TOKENS (32), RANK (16), WORK (a scratch
# folder). With VLLM=path/to/python of vLLM's CPU build (bench/vllm_interop.sh), vLLM serves the
# same base alone and with the three adapters (`--enable-lora --lora-modules`, `--max-loras 3`),
# loaded the same way, on every core (VLLM_CPU_OMP_THREADS_BIND), right after stepwise's runs.
set -euo pipefail
policy=$(cd "$1" && pwd) out=${2:-}
here=$(cd "$(dirname "$0")/.." && pwd)
stepwise=${STEPWISE:-$here/target/release/stepwise}
python=${PYTHON:-python3}
clients=${CLIENTS:-16} secs=${SECONDS_EACH:-30} warmup=${WARMUP:-5} max_tokens=${MAX_TOKENS:-32} rank=${RANK:-16}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
export STEPWISE_CACHE=$work/cache
. "$here/bench/servers.sh"
"$python" "$here/bench/write_loras.py" "$policy" "$work" "$rank" 3
results=$work/results.jsonl
: > "$results"
run() { # LABEL MODELS ARGS...: serve with ARGS (`vllm ARGS...`: vLLM), load it, record tokens/s and peak memory
  local label=$1 models=$2; shift 2
  local log=$work/$label.log pid url
  if [ "$1" = vllm ]; then
    shift
    serve_vllm 8231 "$log" "$policy" --served-model-name "$(basename "$policy")" "$@"
  else
    serve_stepwise "$log" "$@"
  fi
  pid=$PID url=$URL
  "$python" "$here/bench/load_serve.py" "$url" "$models" --clients "$clients" --seconds "$secs" \
    --warmup "$warmup" --max-tokens "$max_tokens" --json "$results.one"
  local hwm
  # vLLM's engine core is a child process: its peak counts too.
  hwm=$(for p in $pid $(pgrep -P $pid); do awk '/VmHWM/ {print $2}' /proc/$p/status; done | paste -sd+ | bc)
  kill $pid; wait $pid 2>/dev/null || true
  "$python" - "$results.one" "$label" "$hwm" >> "$results" <<'PY'
import json, sys
row = json.loads(open(sys.argv[1]).read().splitlines()[-1])
row.update(label=sys.argv[2], peak_rss_gib=round(int(sys.argv[3]) / 2**20, 3))
print(json.dumps(row))
PY
  rm -f "$results.one"
}
base=$(basename "$policy")
mods=(--lora-modules "a0=$work/lora0" "a1=$work/lora1" "a2=$work/lora2")
# The merge into the cache happens before the first timed run (a server start), not in it.
"$stepwise" merge "$work/lora0" --out "$work/merged0" > /dev/null 2>&1 || true
run base "$base" --model "$policy"
run merged "merged0" --model "$work/merged0"
run one_unmerged "a0" --model "$policy" "${mods[@]}"
run three_unmerged "a0,a1,a2" --model "$policy" "${mods[@]}"
run base_and_three "$base,a0,a1,a2" --model "$policy" "${mods[@]}"
if [ -n "${VLLM:-}" ]; then
  run vllm_base "$base" vllm
  run vllm_three "a0,a1,a2" vllm --enable-lora --max-loras 3 --max-lora-rank "$rank" "${mods[@]}"
fi
lscpu | sed -n 's/^Model name: *//p' > "$work/cpu.txt"
"$python" - "$results" "$work/cpu.txt" "$clients" "$secs" "$max_tokens" "$rank" "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
doc = {"cpu": open(sys.argv[2]).read().strip(), "clients": int(sys.argv[3]), "seconds": float(sys.argv[4]),
       "max_tokens": int(sys.argv[5]), "rank": int(sys.argv[6]), "runs": rows}
text = json.dumps(doc, indent=1)
print(text)
if sys.argv[7]:
    open(sys.argv[7], "w").write(text + "\n")
PY
