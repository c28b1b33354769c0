#!/usr/bin/env bash
# The whole GPU comparison as one command: stepwise's CUDA engine against transformers (bf16,
# sdpa, batched by length) on the same GPU, scoring ProcessBench GSM8K and MATH with random
# Qwen2.5-Math-PRM-layout checkpoints of the 0.5B and 7B shapes; and generation (64 concurrent
# requests of 256 tokens, a 0.5B-shaped policy) against transformers' batched generate.
#
# Two steps, because the GPU machine has no Rust toolchain and no network:
#   1. here:            bash bench/gpu_check.sh prepare
#      builds the CUDA binary (no toolkit needed), strips it into .gpu/, and copies what the run
#      needs from ../shared (ProcessBench, the fixture tokenizer) beside it;
#   2. on the GPU:      bash bench/gpu_check.sh run          (the device tool: carry [".gpu"])
#      makes the checkpoints there with PyTorch, runs both engines on both datasets and shapes,
#      checks the flash kernel against the plain one and the CPU engine, and writes
#      $OUT/gpu_check.json (and prints a table). Each stage is timed out on its own, so a failing
#      stage leaves the others' numbers.
#
# Environment: SHAPES (default "0.5b 7b"), DATASETS (default "gsm8k math"), MAX_BATCH_TOKENS
# (default 16384), OUT (default /tmp/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
G=.gpu

prepare() {
    set -e
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    cargo build --release -p stepwise-cli --features cuda
    mkdir -p "$G/data" "$G/qwen2-prm"
    strip -o "$G/stepwise" target/release/stepwise
    cp ../shared/data/processbench/gsm8k.json ../shared/data/processbench/math.json "$G/data/"
    cp ../shared/fixtures/hf-tiny/qwen2-prm/{config.json,tokenizer.json,tokenizer_config.json} "$G/qwen2-prm/"
    du -sh "$G"
    echo "carry .gpu, then run: bash bench/gpu_check.sh run"
}

run() {
    OUT=${OUT:-/tmp/gpu_check}
    W=${WORK:-/tmp/gpu_check_work}
    SHAPES=${SHAPES:-"0.5b 7b"}
    DATASETS=${DATASETS:-"gsm8k math"}
    BUDGET=${MAX_BATCH_TOKENS:-16384}
    BIN="$G/stepwise"
    mkdir -p "$OUT" "$W"
    export PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/gpu.txt"
    lscpu | grep -m1 'Model name' | tee "$W/cpu.txt"
    # Peak GPU memory of a command: nvidia-smi sampled every 100 ms while it runs.
    peak() {
        local log=$1; shift
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$log.mem" &
        local sampler=$!
        "$@"
        local rc=$?
        kill $sampler 2>/dev/null
        wait $sampler 2>/dev/null
        echo "peak_mib $(sort -n "$log.mem" | tail -1)" >> "$log"
        return $rc
    }
    for shape in $SHAPES; do
        M="$W/prm-$shape"
        [ -f "$M/config.json" ] || timeout 300 python3 bench/make_random_prm.py "$shape" "$M" \
            --tokenizer "$G/qwen2-prm" --device cuda 2>&1 | tail -2
        for ds in $DATASETS; do
            tag="$shape-$ds"
            echo "== $tag"
            peak "$W/hf-$tag.log" timeout 400 python3 bench/gpu_transformers.py "$M" "$G/data/$ds.json" \
                "$W/hf-$tag.json" --max-batch-tokens "$BUDGET" >> "$W/hf-$tag.log" 2>&1
            grep -E "^transformers|Error" "$W/hf-$tag.log" | tail -2
            peak "$W/sw-$tag.log" timeout 400 "$BIN" score --model "$M" --input "$G/data/$ds.json" \
                --output "$W/sw-$tag.jsonl" --device cuda --max-batch-tokens "$BUDGET" \
                >> "$W/sw-$tag.log" 2>&1
            tail -2 "$W/sw-$tag.log"
            python3 bench/gpu_compare.py "$W/sw-$tag.jsonl" "$W/hf-$tag.json" "stepwise vs transformers, $tag" \
                | tee "$W/cmp-$tag.txt" | head -1
        done
        # The flash kernel against the plain one (every head size falls back to it), on GSM8K.
        ds=$(echo $DATASETS | cut -d' ' -f1)
        STEPWISE_CUDA_SIMPLE_ATTENTION=1 timeout 400 "$BIN" score --model "$M" --input "$G/data/$ds.json" \
            --output "$W/simple-$shape.jsonl" --device cuda > "$W/simple-$shape.log" 2>&1
        tail -1 "$W/simple-$shape.log"
        python3 bench/gpu_compare.py "$W/sw-$shape-$ds.jsonl" "$W/simple-$shape.jsonl" \
            "flash vs plain attention kernel, $shape" | tee "$W/cmp-simple-$shape.txt" | head -1
    done
    # The CUDA engine against the CPU engine (f32 arithmetic) on the first 24 GSM8K records, 0.5B.
    python3 -c "import json,sys; json.dump(json.load(open(sys.argv[1]))[:24], open(sys.argv[2],'w'))" \
        "$G/data/gsm8k.json" "$W/gsm8k24.json"
    if [ -d "$W/prm-0.5b" ]; then
        timeout 300 "$BIN" score --model "$W/prm-0.5b" --input "$W/gsm8k24.json" --output "$W/cpu24.jsonl" \
            --device cpu > "$W/cpu24.log" 2>&1
        timeout 300 "$BIN" score --model "$W/prm-0.5b" --input "$W/gsm8k24.json" --output "$W/gpu24.jsonl" \
            --device cuda > "$W/gpu24.log" 2>&1
        python3 bench/gpu_compare.py "$W/gpu24.jsonl" "$W/cpu24.jsonl" "CUDA vs CPU engine, 0.5b, 24 records" \
            | tee "$W/cmp-cpu.txt" | head -1
    fi
    # Generation: 64 concurrent requests of 256 sampled tokens each, a 0.5B-shaped policy:
    # transformers' batched generate against `stepwise serve --device cuda` with 64 clients.
    P="$W/policy-0.5b"
    [ -f "$P/config.json" ] || timeout 300 python3 bench/make_random_prm.py 0.5b "$P" --policy \
        --tokenizer "$G/qwen2-prm" --device cuda 2>&1 | tail -1
    echo "== generation"
    peak "$W/gen-hf.log" timeout 300 python3 bench/gpu_generation.py hf "$P" --out "$W/gen-hf.json" \
        >> "$W/gen-hf.log" 2>&1
    tail -1 "$W/gen-hf.log"
    "$BIN" serve --model "$P" --device cuda --port 8123 > "$W/gen-serve.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 1 120); do
        python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8123/health')" 2>/dev/null && break
        sleep 1
    done
    peak "$W/gen-sw.log" timeout 300 python3 bench/gpu_generation.py serve http://127.0.0.1:8123 policy-0.5b \
        --out "$W/gen-sw.json" >> "$W/gen-sw.log" 2>&1
    tail -1 "$W/gen-sw.log"
    kill $SERVER 2>/dev/null
    wait $SERVER 2>/dev/null
    # The summary.
    python3 - "$W" "$OUT/gpu_check.json" <<'EOF'
import json, re, sys
from pathlib import Path
w, out = Path(sys.argv[1]), Path(sys.argv[2])
summary = {"gpu": (w / "gpu.txt").read_text().strip(), "cpu": (w / "cpu.txt").read_text().strip(), "runs": {}}
def cmp(name):
    f = w / name
    return json.loads(f.read_text().splitlines()[-1]) if f.exists() and f.read_text().strip() else None
tags = sorted({f.stem[3:] for f in w.glob("hf-*.log")} | {f.stem[3:] for f in w.glob("sw-*.log")})
for tag in tags:
    hf = w / f"hf-{tag}.json"
    ref = json.loads(hf.read_text()) if hf.exists() else {"error": "no result (see logs.tgz)"}
    ref.pop("scores", None)
    run = {"transformers": ref}
    hf_log = w / f"hf-{tag}.log"
    pk = re.search(r"peak_mib (\d+)", hf_log.read_text()) if hf_log.exists() else None
    if pk:
        ref["peak_gpu_mib_nvidia_smi"] = int(pk[1])
    log = w / f"sw-{tag}.log"
    if log.exists():
        text = log.read_text()
        m = re.search(r"scored (\d+) solutions \((\d+) tokens\) in ([\d.]+)s: (\d+) tokens/s", text)
        pk = re.search(r"peak_mib (\d+)", text)
        run["stepwise"] = {"records": int(m[1]), "tokens": int(m[2]), "seconds": float(m[3]),
                           "tokens_per_s": int(m[4])} if m else {"error": text[-2000:]}
        if pk:
            run["stepwise"]["peak_gpu_mib_nvidia_smi"] = int(pk[1])
        if m and "tokens_per_s" in ref:
            run["ratio"] = int(m[4]) / ref["tokens_per_s"]
    run["agreement"] = cmp(f"cmp-{tag}.txt")
    summary["runs"][tag] = run
for f in sorted(w.glob("cmp-simple-*.txt")):
    summary[f.stem] = cmp(f.name)
summary["cuda_vs_cpu"] = cmp("cmp-cpu.txt")
gen = {}
for who in ("hf", "sw"):
    f = w / f"gen-{who}.json"
    gen[who] = json.loads(f.read_text()) if f.exists() else {"error": "no result (see logs.tgz)"}
    pk = re.search(r"peak_mib (\d+)", (w / f"gen-{who}.log").read_text()) if (w / f"gen-{who}.log").exists() else None
    if pk:
        gen[who]["peak_gpu_mib_nvidia_smi"] = int(pk[1])
if "tokens_per_s" in gen["hf"] and "tokens_per_s" in gen["sw"]:
    gen["ratio"] = gen["sw"]["tokens_per_s"] / gen["hf"]["tokens_per_s"]
summary["generation_64x256"] = gen
out.write_text(json.dumps(summary, indent=1))
print(f"{'run':<14} {'transformers tok/s':>19} {'stepwise tok/s':>15} {'ratio':>6} {'max|diff|':>9} {'same 1st err':>12}")
for tag, r in summary["runs"].items():
    sw, a = r.get("stepwise", {}), r.get("agreement") or {}
    print(f"{tag:<14} {r['transformers'].get('tokens_per_s', 0):>19.0f} {sw.get('tokens_per_s', 0):>15} "
          f"{r.get('ratio', 0):>6.2f} {a.get('max_abs_diff', float('nan')):>9.4f} {100 * a.get('same_first_error', 0):>11.1f}%")
g = summary["generation_64x256"]
print(f"generation 64 x 256: transformers {g['hf'].get('tokens_per_s', 0):.0f} tok/s, "
      f"stepwise {g['sw'].get('tokens_per_s', 0):.0f} tok/s, ratio {g.get('ratio', 0):.2f}, "
      f"failed requests {g['sw'].get('failed', '?')}")
print(f"written: {out}")
EOF
    tar czf "$OUT/logs.tgz" -C "$W" $(cd "$W" && ls *.log *.txt 2>/dev/null)
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: bash bench/gpu_check.sh prepare|run"; exit 2 ;;
esac
