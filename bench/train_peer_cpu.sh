#!/usr/bin/env bash
# The training stage of bench/gpu_check.sh on the CPU, with the fixture checkpoints: stepwise's
# `train-prm` and the PyTorch peer (bench/gpu_train.py) train the same verifier on the same
# ProcessBench records and are validated on the same held-out ones. Not a speed comparison (the
# CPU trainer is candle's autograd, the GPU's is the packed engine): it checks, before a GPU is
# lent, that the two implement one objective — the same inputs, labels and loss — so that on
# the GPU "the loss falling alike" measures the trainers, not a difference in what they learn.
#
#   bash bench/train_peer_cpu.sh [STEPS]      (needs torch and transformers: PYTHON=.../python)
#
# Prints each engine's validation loss (the mean BCE over the held-out labelled steps) before and
# after training, and the gap, for the classifier head (`prm`) and the log-ratio head against a
# constant reference; beside stepwise's own validation after the last step, the same mean read
# back through `stepwise score` from the checkpoint it keeps (the best validation's).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-40}
PY=${PYTHON:-python3}
BIN=${STEPWISE:-target/debug/stepwise}
W=${WORK:-/tmp/train_peer_cpu}
rm -rf "$W" && mkdir -p "$W"
# 96 GSM8K records to train on, the next 32 to validate on.
python3 -c "import json; r=json.load(open('data/processbench/gsm8k.json')); \
json.dump(r[:96], open('$W/train.json','w')); json.dump(r[96:128], open('$W/valid.json','w'))"
SEED=${SEED:-0}
flags=(--steps "$STEPS" --lr 1e-3 --batch-size 8 --max-len 512 --max-batch-tokens 16384 --seed "$SEED")
# Mean BCE of a scored file's labelled steps against ProcessBench's labels (steps up to the first
# wrong one: good before it, bad at it), the steps whose separator lies within the 512 positions
# both trainers learn from (in the layout of $2: the classifier's, or the log-ratio head's with
# the separator after the problem too).
valid_loss() {
    "$PY" - "$1" "$W/valid.json" "$2" <<'EOF'
import json, math, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file("fixtures/hf-tiny/qwen2-prm/tokenizer.json")
enc = lambda t: tok.encode(t, add_special_tokens=False).ids
scores = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    scores[r["id"]] = r["scores"]["prm"]
total = n = 0
for r in json.load(open(sys.argv[2])):
    first_bad = r["label"] if r["label"] >= 0 else len(r["steps"])
    length = len(enc(r["problem"])) + (len(enc("\n")) if sys.argv[3] == "log-ratio" else 0)
    for k, (step, p) in enumerate(zip(r["steps"][: first_bad + 1], scores[r["id"]])):
        length += len(enc(step)) + len(enc("\n"))
        if length > 512:
            break
        y = 1.0 if k < first_bad else 0.0
        p = min(max(p, 1e-7), 1 - 1e-7)
        total -= y * math.log(p) + (1 - y) * math.log(1 - p)
        n += 1
print(f"{total / n:.4f}")
EOF
}
for objective in prm log-ratio; do
    if [ "$objective" = prm ]; then
        base=fixtures/hf-tiny/qwen2-prm peer=() own=()
    else
        # The constant reference: about what the random fixture policy gives a token (its mean
        # log-probability on these records is about -24; a uniform model would give -6.4), so the
        # verifier starts near 0.5 on every step; beta 0.01 keeps a step's score off 0 and 1 (its sum
        # runs over about 50 tokens whose log-probabilities spread from -3 to -54).
        base=fixtures/hf-tiny/qwen2-policy peer=(--objective log-ratio --reference-logprob -24 --beta 0.01)
        own=(--head log-ratio --reference-logprob -24 --beta 0.01)
    fi
    "$PY" bench/gpu_train.py "$base" "$W/train.json" "$W/hf-$objective.json" "${flags[@]}" "${peer[@]}" \
        --device cpu --valid-data "$W/valid.json" > "$W/hf-$objective.log" 2>&1
    "$BIN" train-prm --data "$W/train.json" --valid-data "$W/valid.json" --base "$base" --out "$W/sw-$objective" \
        "${flags[@]}" "${own[@]}" --stop-at-first-bad > "$W/sw-$objective.log" 2>&1
    "$BIN" score --model "$W/sw-$objective" --input "$W/valid.json" --output "$W/scored-$objective.jsonl" 2> /dev/null
    hf=$(python3 -c "import json; r=json.load(open('$W/hf-$objective.json')); print(f\"{r['valid_loss_start']:.4f} {r['valid_loss']:.4f}\")")
    sw=$(valid_loss "$W/scored-$objective.jsonl" "$objective")
    read -r hf_start hf_end <<< "$hf"
    # stepwise's own validation after the last step (its trainer_state; on the CPU the loss of a
    # batch of sequences weighted by their count, a mean near the per-step one).
    last=$(python3 -c "import json; print(f\"{json.load(open('$W/sw-$objective/trainer_state.json'))['history'][-1][1]['loss']:.4f}\")")
    python3 -c "print(f'$objective, $STEPS steps, seed $SEED: validation loss PyTorch $hf_start -> $hf_end, stepwise $last \
after the last step (the best validation it keeps, scored: $sw); gap {$last / $hf_end - 1:+.1%}')"
done
