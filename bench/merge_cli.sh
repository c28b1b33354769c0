#!/usr/bin/env bash
# `stepwise merge` (a PEFT LoRA adapter merged onto its base into a folder) against PEFT's own
# `PeftModel.from_pretrained(base, adapter).merge_and_unload().save_pretrained(out)`, on the same
# base and adapter, interleaved ROUNDS times; with OTHER=path/to/another/stepwise binary, that
# build too (an A/B of two commits, the two taking turns to go first), each merged model compared
# byte for byte with the first's. Each run starts after a `sync`.
#
#   bash bench/merge_cli.sh POLICY_DIR ADAPTER_DIR [OUT.json]
#
# POLICY_DIR: bench/make_random_prm.py 0.5b DIR --policy; ADAPTER_DIR: PEFT's adapter on it (the
# rank-16 all-linear adapter of bench/peft_merge.py). STEPWISE (default target/release/stepwise),
# PYTHON (a Python with torch, transformers and peft), ROUNDS (3), WORK (a scratch folder).
set -euo pipefail
policy=$1 adapter=$2 out=${3:-}
here=$(cd "$(dirname "$0")/.." && pwd)
stepwise=${STEPWISE:-$here/target/release/stepwise}
python=${PYTHON:-python3}
rounds=${ROUNDS:-3}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
# Each run starts with no dirty pages (the last run's 1.2 GB written back first, untimed).
seconds() { local t0 t1; sync; t0=$(date +%s.%N); "$@" > /dev/null 2>&1; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
peft_merge() {
  "$python" - "$policy" "$adapter" "$work/peft" <<'PY'
import os, shutil, sys, time, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
shutil.rmtree(sys.argv[3], ignore_errors=True)
os.sync()
start = time.perf_counter()
base = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
PeftModel.from_pretrained(base, sys.argv[2]).merge_and_unload().save_pretrained(sys.argv[3])
print(time.perf_counter() - start)
PY
}
declare -A times
builds=(stepwise)
[ -n "${OTHER:-}" ] && builds+=(other)
for r in $(seq "$rounds"); do
  order=("${builds[@]}")
  # Odd rounds one build first, even rounds the other.
  [ $((r % 2)) = 0 ] && [ ${#builds[@]} = 2 ] && order=(other stepwise)
  for b in "${order[@]}"; do
    bin=$stepwise; [ "$b" = other ] && bin=$OTHER
    rm -rf "$work/$b"
    times[$b]+="$(seconds "$bin" merge "$adapter" --out "$work/$b") "
  done
  # PEFT's seconds from inside Python: its imports (torch, transformers, peft) not counted.
  times[peft]+="$(peft_merge 2>/dev/null | tail -1) "
done
same=null
if [ -n "${OTHER:-}" ]; then
  same=true
  for f in "$work"/stepwise/*.safetensors; do cmp -s "$f" "$work/other/$(basename "$f")" || same=false; done
fi
json=$("$python" - "${times[stepwise]}" "${times[other]:-}" "${times[peft]}" "$same" <<'PY'
import json, platform, subprocess, sys
import peft, torch, transformers
s, o, p = ([float(x) for x in a.split()] for a in sys.argv[1:4])
same = sys.argv[4]
cpu = subprocess.run(["sh", "-c", "lscpu | grep 'Model name' | sed 's/.*: *//'"], capture_output=True, text=True).stdout.strip()
print(json.dumps({
    "cpu": cpu, "threads": torch.get_num_threads(),
    "versions": {"peft": peft.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    "stepwise_merge_seconds": s, "other_build_merge_seconds": o or None, "peft_merge_and_save_seconds": p,
    "other_build_byte_identical": json.loads(same),
    "stepwise_vs_peft_best": round(min(p) / min(s), 2),
}, indent=1))
PY
)
echo "$json"
[ -n "$out" ] && echo "$json" > "$out"
rm -rf "$work"
