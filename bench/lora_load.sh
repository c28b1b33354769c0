#!/usr/bin/env bash
# Runtime LoRA updating (`stepwise serve --allow-runtime-lora-updating`, vLLM's
# `/v1/load_lora_adapter`): load and in-place reload latency of a rank-R adapter on every linear
# projection, idle and under C clients, and the clients' tokens/s with and without reloads
# (bench/lora_load.py).
#
#   bash bench/lora_load.sh POLICY_DIR [OUT.json]
#
# POLICY_DIR: bench/make_random_prm.py 0.5b DIR --policy; two adapters are written by PEFT into
# WORK (bench/write_loras.py). STEPWISE (default target/release/stepwise), PYTHON (torch,
# transformers, peft, openai), CLIENTS (16), SECONDS_EACH (60), EVERY (5 s between reloads),
# LOADS (10), NAMES (6), MAX_TOKENS (32), RANK (16), WORK (a scratch folder). BEFORE (another
# stepwise binary) runs the same after it; with VLLM=path/to/python of vLLM's CPU build, vLLM
# (VLLM_ALLOW_RUNTIME_LORA_UPDATING, `--enable-lora`) runs the same after.
set -euo pipefail
policy=$(cd "$1" && pwd) out=${2:-}
here=$(cd "$(dirname "$0")/.." && pwd)
stepwise=${STEPWISE:-$here/target/release/stepwise}
python=${PYTHON:-python3}
rank=${RANK:-16}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
. "$here/bench/servers.sh"
"$python" "$here/bench/write_loras.py" "$policy" "$work" "$rank" 2
opts=(--loads "${LOADS:-10}" --names "${NAMES:-6}" --clients "${CLIENTS:-16}" --seconds "${SECONDS_EACH:-60}" --every "${EVERY:-5}"
  --max-tokens "${MAX_TOKENS:-32}")
measure() { # LABEL URL PID: lora_load.py against the server at URL, then stop it
  "$python" "$here/bench/lora_load.py" "$2" "$work" "${opts[@]}" --json "$work/$1.json"
  kill "$3"; wait "$3" 2>/dev/null || true
}
serve_stepwise "$work/stepwise.log" --model "$policy" --allow-runtime-lora-updating
measure stepwise "$URL" $PID
if [ -n "${BEFORE:-}" ]; then
  stepwise=$BEFORE serve_stepwise "$work/before.log" --model "$policy" --allow-runtime-lora-updating
  measure before "$URL" $PID
fi
if [ -n "${VLLM:-}" ]; then
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=True serve_vllm 8232 "$work/vllm.log" "$policy" \
    --enable-lora --max-loras 1 --max-lora-rank "$rank"
  measure vllm "$URL" $PID
fi
"$python" - "$work" "$out" <<'PY'
import json, subprocess, sys
from pathlib import Path
work = Path(sys.argv[1])
cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
doc = {"cpu": next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), "")}
for name in ["stepwise", "before", "vllm"]:
    if (work / f"{name}.json").exists():
        doc[name] = json.loads((work / f"{name}.json").read_text())
text = json.dumps(doc, indent=1)
print(text)
if sys.argv[2]:
    Path(sys.argv[2]).write_text(text + "\n")
PY
