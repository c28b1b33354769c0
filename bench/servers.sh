# Shared by the bench scripts that load a server (sourced): each starts one in the background
# and waits until it answers, setting PID (to kill) and URL. STEPWISE and VLLM as the scripts
# take them.

# serve_stepwise LOG ARGS...: `stepwise serve ARGS` on a free port, its messages in LOG.
serve_stepwise() {
  local log=$1
  shift
  "$stepwise" serve "$@" --port 0 > /dev/null 2> "$log" &
  PID=$! URL=""
  for _ in $(seq 1 600); do
    URL=$(sed -n 's/^stepwise serve: listening on //p' "$log")
    [ -n "$URL" ] && return 0
    kill -0 $PID 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.5
  done
  echo "stepwise serve did not start: $log"; exit 1
}

# serve_vllm PORT LOG POLICY ARGS...: vLLM's OpenAI server (its CPU build, bf16, bound to every
# core) on POLICY at PORT, its output in LOG.
serve_vllm() {
  local port=$1 log=$2 model=$3
  shift 3
  VLLM_CPU_OMP_THREADS_BIND=0-$(($(nproc) - 1)) VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} \
    VLLM_TARGET_DEVICE=cpu "$VLLM" -m vllm.entrypoints.openai.api_server --model "$model" \
    --dtype bfloat16 --port "$port" "$@" > "$log" 2>&1 &
  PID=$! URL=http://127.0.0.1:$port
  for _ in $(seq 1 600); do
    curl -sf "$URL/v1/models" > /dev/null && return 0
    kill -0 $PID 2>/dev/null || { tail -30 "$log"; exit 1; }
    sleep 1
  done
  echo "vLLM did not start: $log"; exit 1
}
