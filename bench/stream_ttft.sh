#!/usr/bin/env bash
# Streaming latency (`"stream": true`): time to the first text chunk, between chunks, and the
# whole reply, for 1 client and for C concurrent clients (bench/stream_ttft.py), stepwise serve
# against vLLM's CPU build on the same policy.
#
#   bash bench/stream_ttft.sh POLICY_DIR [OUT.json]
#
# POLICY_DIR: bench/make_random_prm.py 0.5b DIR --policy (a copy whose LM head writes text is
# made in WORK). STEPWISE (default
# target/release/stepwise), PYTHON (openai), CLIENTS (16), SECONDS_EACH (30), MAX_TOKENS (128),
# PROMPTS (1: prompts a request, a list of that many),
# WORK (a scratch folder); VLLM=path/to/python of vLLM's CPU build runs vLLM after stepwise.
set -euo pipefail
policy=$(cd "$1" && pwd) out=${2:-}
here=$(cd "$(dirname "$0")/.." && pwd)
stepwise=${STEPWISE:-$here/target/release/stepwise}
python=${PYTHON:-python3}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
. "$here/bench/servers.sh"
rows=$work/rows.jsonl
: > "$rows"
# The random policy's tokenizer (the fixtures') has 600 tokens and its LM head 151936 rows: it
# would sample ids that decode to nothing. A copy whose LM head favours the tokenizer's tokens
# writes text; its shapes, and so every timing, are the policy's.
"$python" - "$policy" "$work/talking" <<'PY'
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
if not (dst / "config.json").exists():
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    for f in src.glob("*.safetensors"):
        t = load_file(f)
        if "lm_head.weight" in t:
            w = t["lm_head.weight"].clone()
            w[:600] *= 20
            w[600:] = 0
            t["lm_head.weight"] = w
        save_file(t, dst / f.name, metadata={"format": "pt"})
PY
policy=$work/talking
model=$(basename "$policy")
measure() { # LABEL URL PID
  for c in 1 "${CLIENTS:-16}"; do
    "$python" "$here/bench/stream_ttft.py" "$2" "$model" --clients "$c" --seconds "${SECONDS_EACH:-30}" \
      --max-tokens "${MAX_TOKENS:-128}" --prompts "${PROMPTS:-1}" --json "$work/one.jsonl"
    "$python" -c "import json,sys; r=json.loads(open(sys.argv[1]).read().splitlines()[-1]); r['server']=sys.argv[2]; print(json.dumps(r))" \
      "$work/one.jsonl" "$1" >> "$rows"
  done
  kill "$3"; wait "$3" 2>/dev/null || true
}
serve_stepwise "$work/stepwise.log" --model "$policy"
measure stepwise "$URL" $PID
if [ -n "${VLLM:-}" ]; then
  serve_vllm 8233 "$work/vllm.log" "$policy" --served-model-name "$model"
  measure vllm "$URL" $PID
fi
"$python" - "$rows" "$out" <<'PY'
import json, subprocess, sys
cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
doc = {"cpu": next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), ""),
       "runs": [json.loads(l) for l in open(sys.argv[1])]}
text = json.dumps(doc, indent=1)
print(text)
if sys.argv[2]:
    open(sys.argv[2], "w").write(text + "\n")
PY
