#!/usr/bin/env bash
# Compiles and links `stepwise` with `--features cuda` on a machine with no CUDA toolkit and no GPU:
# NVIDIA's compiler, runtime, cuBLAS and cuRAND come from PyPI wheels into a throw-away venv.
#
# What it proves: candle's CUDA kernels compile with nvcc (PTX for compute capability 90) and
# stepwise's engine builds and links against the CUDA libraries. What it cannot prove: that the
# binary runs on a GPU. The GPU driver's libcuda is not on PyPI, so the link uses an empty
# stand-in and leaves the driver's symbols unresolved; the binary it makes does not start. On a
# machine with a CUDA toolkit, build with `cargo build --release -p stepwise-cli --features cuda`
# instead.
#
# Usage: bash bench/check_cuda_build.sh [WORK_DIR]   (default /tmp/stepwise-cuda; about 1.4 GB of
# wheels and a separate target folder, 8–10 minutes on two cores)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/stepwise-cuda}"
mkdir -p "$work"
python3 -m venv "$work/venv"
# One CUDA release throughout: nvcc 13.0 with the nvvm and crt of 13.0 (a newer nvvm writes PTX
# that 13.0's ptxas rejects), and a release cudarc 0.19 knows.
"$work/venv/bin/pip" install -q \
    'nvidia-cuda-nvcc==13.0.88' 'nvidia-nvvm==13.0.88' 'nvidia-cuda-crt==13.0.88' \
    'nvidia-cuda-runtime==13.0.88' 'nvidia-cuda-nvrtc==13.0.88' 'nvidia-cuda-cccl==13.0.*' \
    'nvidia-cublas==13.0.*' 'nvidia-curand'
wheels="$("$work/venv/bin/python" -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia/cu13"
# A toolkit-shaped folder: bin, include and nvvm as shipped, lib64 with the unversioned names
# the linker looks for, and the empty libcuda stand-in.
root="$work/cuda"
rm -rf "$root"
mkdir -p "$root/lib64"
for d in bin include nvvm; do ln -s "$wheels/$d" "$root/$d"; done
for f in "$wheels"/lib/*.so.*; do
    name="$(basename "$f")"
    ln -sf "$f" "$root/lib64/$name"
    ln -sf "$f" "$root/lib64/${name%%.so.*}.so"
done
echo 'void stepwise_no_cuda_driver(void) {}' | cc -shared -fPIC -o "$root/lib64/libcuda.so" -x c -
PATH="$root/bin:$PATH" CUDA_ROOT="$root" CUDA_COMPUTE_CAP=90 CARGO_TARGET_DIR="$work/target" \
    RUSTFLAGS="-C link-arg=-Wl,--unresolved-symbols=ignore-in-object-files" \
    cargo build -p stepwise-cli --features cuda
echo "stepwise built with --features cuda: $work/target/debug/stepwise"
