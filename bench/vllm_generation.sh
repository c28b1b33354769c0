#!/usr/bin/env bash
# Serving throughput, `stepwise serve` against vLLM's CPU server, by hand (never in tests or CI).
#
#   bench/vllm_generation.sh POLICY_DIR [CLIENTS] [SECONDS] [MAX_TOKENS]
#
# POLICY_DIR: a causal LM in bf16 (e.g. `python bench/make_random_prm.py 0.5b DIR --policy`).
# Each server runs alone on the machine, on every core (vLLM bound to them explicitly: its default
# keeps one core back), `--dtype bfloat16` for vLLM and `--dtype auto` (the checkpoint's bf16) for
# stepwise. bench/load_serve.py then runs CLIENTS concurrent clients (default 8) asking for
# MAX_TOKENS-token completions (default 32) at temperature 0.8 for SECONDS (default 60), after a
# 15 s warm-up, and this prints both lines and the ratio of generated tokens/s. Install vLLM's
# CPU build as in bench/vllm_interop.sh; its virtual environment also has the `openai` package the
# load test needs.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bench/vllm_generation.sh POLICY_DIR [CLIENTS] [SECONDS] [MAX_TOKENS]}
CLIENTS=${2:-8}
SECONDS_=${3:-60}
MAX_TOKENS=${4:-32}
VLLM=${VLLM:-/tmp/vllm-env/bin/python}
PORT=${PORT:-8221}
W=${W:-/tmp/vllm-generation}
S=target/release/stepwise
mkdir -p "$W"
cargo build --release -p stepwise-cli

up() { for _ in $(seq 1 120); do curl -sf "localhost:$PORT/v1/models" >/dev/null && return; sleep 5; done; echo "server did not start: $1"; exit 1; }
load() {
  local args=(--clients "$CLIENTS" --max-tokens "$MAX_TOKENS")
  $VLLM bench/load_serve.py "http://127.0.0.1:$PORT" policy "${args[@]}" --seconds 15 >/dev/null
  $VLLM bench/load_serve.py "http://127.0.0.1:$PORT" policy "${args[@]}" --seconds "$SECONDS_" | tee "$W/$1.txt"
}

VLLM_CPU_OMP_THREADS_BIND=0-$(($(nproc) - 1)) VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} \
VLLM_TARGET_DEVICE=cpu $VLLM -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name policy \
  --dtype bfloat16 --port "$PORT" > "$W/vllm.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
up "$W/vllm.log"
grep -o "core ids=.*" "$W/vllm.log" | head -1
load vllm
kill $SERVER; wait $SERVER 2>/dev/null || true

$S serve --model "$MODEL" --served-model-name policy --port "$PORT" > "$W/stepwise.log" 2>&1 &
SERVER=$!
up "$W/stepwise.log"
load stepwise
kill $SERVER; wait $SERVER 2>/dev/null || true

python3 - "$W" <<'EOF'
import re, sys
rate = lambda f: float(re.search(r"([0-9.]+) generated tokens/s", open(f"{sys.argv[1]}/{f}.txt").read()).group(1))
ours, theirs = rate("stepwise"), rate("vllm")
print(f"stepwise {ours:.0f} generated tokens/s, vLLM {theirs:.0f}: {ours / theirs:.2f}x")
EOF
