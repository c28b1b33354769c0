#!/usr/bin/env bash
# Keeps the CUDA build honest on a machine with no GPU, no driver and no CUDA toolkit (as CI's):
#  1. `cargo build --release -p stepwise-cli --features cuda` — nothing of NVIDIA's is needed to
#     build: cudarc loads the driver, NVRTC and cuBLAS when a GPU is first asked for;
#  2. the binary links none of NVIDIA's libraries (so it starts anywhere) and, asked for a GPU
#     here, says that there is no driver instead of failing to start or panicking;
#  3. the engine's CUDA kernels compile with NVRTC for compute capability 8.0, 8.9 and 9.0 and
#     every head size (tests/cuda_kernels.rs), with NVRTC from NVIDIA's Python wheel (no driver
#     needed to compile);
#  4. the CUDA wheel builds as the README says (`MATURIN_PEP517_ARGS="--features cuda" pip
#     install ./python`, here `maturin build --release --features cuda`, what pip runs): its
#     native module links none of NVIDIA's libraries, `stepwise.cuda_available` is true, the
#     package and the command line inside it say that there is no driver when asked for a GPU here,
#     and `device="auto"` falls back to the CPU.
# What it cannot prove: that the kernels run right on a GPU (bench/gpu_check.sh does that).
#
# Usage: bash bench/check_cuda_build.sh [WORK_DIR]   (default /tmp/stepwise-cuda: a venv with
# NVRTC and the wheel, ~150 MB; the builds share target/ with the others, ~3 minutes on two cores
# for the command line and ~10 more for the wheel)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/stepwise-cuda}"
mkdir -p "$work"
cargo build --release -p stepwise-cli --features cuda
bin=target/release/stepwise
if ldd "$bin" | grep -Ei 'libcuda|cublas|nvrtc|curand|cudart'; then
    echo "FAIL: $bin links NVIDIA libraries at load time (it would not start without them)"
    exit 1
fi
echo "ok: $bin needs no NVIDIA library to start"
printf '[{"id":"a","problem":"1+1?","steps":["2"],"label":-1,"final_answer_correct":true}]' > "$work/one.json"
if out=$("$bin" score --model fixtures/hf-tiny/qwen2-prm --input "$work/one.json" \
        --output "$work/one.jsonl" --device cuda 2>&1); then
    echo "FAIL: --device cuda succeeded on a machine without a GPU?"; exit 1
fi
echo "$out" | grep -q "NVIDIA driver" || { echo "FAIL: unexpected answer without a driver: $out"; exit 1; }
echo "ok: without a driver, --device cuda says: $(echo "$out" | tail -1)"
[ -x "$work/venv/bin/python" ] || python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q 'nvidia-cuda-nvrtc==13.0.88'
nvrtc=$("$work/venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')
STEPWISE_CUDA_LIBS="$nvrtc" cargo test --release -p stepwise-model --features cuda --test cuda_kernels
echo "ok: the CUDA kernels compile with NVRTC ($nvrtc)"

"$work/venv/bin/pip" install -q 'maturin>=1.7,<2'
rm -rf "$work/wheels"
# From python/, as pip runs it: maturin reads pyproject.toml's settings there and adds --features.
(cd python && "$work/venv/bin/maturin" build --quiet --release --features cuda -o "$work/wheels")
"$work/venv/bin/pip" install -q --force-reinstall --no-deps "$work"/wheels/stepwise-*.whl
module=$("$work/venv/bin/python" -c 'import stepwise._stepwise as m; print(m.__file__)')
if ldd "$module" | grep -Ei 'libcuda|cublas|nvrtc|curand|cudart'; then
    echo "FAIL: the wheel's $module links NVIDIA libraries at load time"
    exit 1
fi
echo "ok: the CUDA wheel's native module needs no NVIDIA library to import"
"$work/venv/bin/python" - <<'PY'
import stepwise
assert stepwise.cuda_available, "the wheel was built without its cuda feature"
try:
    stepwise.PRM("fixtures/hf-tiny/qwen2-prm", device="cuda")
except Exception as e:  # noqa: BLE001 - the message is what is checked
    assert "NVIDIA driver" in str(e), f"unexpected answer without a driver: {e}"
    print(f"ok: PRM(device='cuda') without a driver says: {e}")
else:
    raise SystemExit("FAIL: PRM(device='cuda') succeeded on a machine without a GPU?")
scores = stepwise.PRM("fixtures/hf-tiny/qwen2-prm", device="auto").score("1+1?", ["2"])
print(f"ok: device='auto' falls back to the CPU: {scores}")
PY
if out=$("$work/venv/bin/stepwise" score --model fixtures/hf-tiny/qwen2-prm --input "$work/one.json" \
        --output "$work/one-wheel.jsonl" --device cuda 2>&1); then
    echo "FAIL: the wheel's stepwise --device cuda succeeded without a GPU?"; exit 1
fi
echo "$out" | grep -q "NVIDIA driver" || { echo "FAIL: the wheel's command line answered: $out"; exit 1; }
echo "ok: the wheel's command line says: $(echo "$out" | tail -1)"
