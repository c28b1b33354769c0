#!/usr/bin/env bash
# The whole GPU comparison as one command: stepwise's CUDA engine against transformers (bf16,
# sdpa, batched by length) on the same GPU, scoring ProcessBench GSM8K and MATH with random
# Qwen2.5-Math-PRM-layout checkpoints of the 0.5B and 7B shapes; and generation (64 concurrent
# requests of 256 tokens, a 0.5B-shaped policy) against transformers' batched generate.
#
# Two steps, because the GPU machine has no Rust toolchain and no network:
#   1. here:            bash bench/gpu_check.sh prepare
#      builds the CUDA binary (no toolkit needed), strips it into .gpu/, and copies what the run
#      needs from data/ and fixtures/ (ProcessBench, the fixture tokenizer) beside it;
#   2. on the GPU:      bash bench/gpu_check.sh run          (the device tool: carry [".gpu"])
#      makes the checkpoints there with PyTorch, runs both engines on both datasets and shapes,
#      checks the flash kernel against the plain one and the CPU engine, and writes
#      $OUT/gpu_check.json (and prints a table). Each stage is timed out on its own, so a failing
#      stage leaves the others' numbers.
#
# The peers at their best (issue #54): transformers' scoring is warmed up on a whole pass over the
# data and timed on the next, at each of PEER_BUDGETS (default "16384,32768,65536" tokens a
# batch; all are reported, stepwise is compared with the fastest); transformers' generate is
# warmed up on a whole batch of each of GEN_PEER_BATCHES (default "32,64" requests at once) and
# timed on all the requests, the fastest size compared. The sweep costs about five more passes of
# the peer a run (on the H100's old figures: about 6 more minutes, most of it 7B on MATH), so the
# whole comparison takes two 10-minute calls: SHAPES=0.5b, then SHAPES=7b TRAINING=0 RL_UPDATES=0
# GENERATION=0 on the warm machine.
# `python3 bench/gpu_table.py $OUT/gpu_check.json` prints the docs' tables from the summary.
#
# One lease of 15 minutes (a machine's start, one 10-minute call, the transfers):
#   bash bench/gpu_check.sh session    (SESSION_SECONDS, default 570: the stages' shared deadline;
#                                       DEVICE=cpu LIMIT=4 TRAIN_STEPS=2 BIG=0.5b: a dry run)
# runs the stages in the order issue #54 ranks them, each skipped and named when what is left
# would not hold it: 0.5B scoring on both datasets (the peer's sweep), the classifier's
# training and its per-kernel profile (TRAIN_PROFILE=0 skips it), 7B on GSM8K (the sweep), the
# log-ratio verifier's training and RL, generation, then
# 7B on MATH with the peer at the budget that won on GSM8K (its sweep alone is ~4 minutes).
#
# Environment: SHAPES (default "0.5b 7b"), DATASETS (default "gsm8k math"), MAX_BATCH_TOKENS
# (stepwise's batches, default 16384), OUT (default /tmp/gpu_check), TIME_BUDGET (seconds, default 450: a stage that
# would not fit is skipped and named), GENERATION=0 (skip generation), F32_REFERENCE=N
# (transformers in float32 on N GSM8K records: the reference both bf16 engines are measured
# against), TRAINING=0 (skip training), TRAIN_STEPS (default 200), TRAIN_VALID (records held out
# for both engines' validation loss, default 40), TRAIN_OBJECTIVES (default
# "prm log-ratio"), TRAIN_LIMIT (seconds for each engine's training, default 150: on an H200
# PyTorch's 200 steps took 63-69 s and stepwise's would take about 290), TRAIN_PROFILE=1 (Nsight
# Compute's per-kernel times of 3 stepwise training steps), RL_UPDATES (default 3; 0 skips RL and
# the agent's RL), AGENT_RL_SHAPE (default "4 4 8": worlds, episodes each, most actions),
# RL_SHAPE (default "8 8 128": prompts, samples each, most tokens), SCORING=0 (skip the scoring
# comparisons), CROSS_CHECK=0 (skip the CUDA-vs-CPU and flash-vs-plain checks on 24 records),
# DEVICE=cpu LIMIT=4 TRAIN_STEPS=2 (a dry run of the whole script without a GPU). Only training
# and RL: SHAPES=0.5b DATASETS=gsm8k SCORING=0 GENERATION=0. After a cut-off,
# `bash bench/gpu_check.sh summary` writes the JSON from what finished. On one H200 (2026-12-04,
# docs/benchmarks.md) `session` with SESSION_SECONDS=555 ran the 0.5B scoring (about 2.5
# minutes with the peer's sweeps), both training objectives (up to 2 x 150 s each) and 7B GSM8K's
# stepwise pass; the 7B peer's sweep (104 s with the checkpoint made), RL (31 s) and generation
# (47 s at one peer batch size) then ran as `run` calls on the warm machine.
set -uo pipefail
cd "$(dirname "$0")/.."
G=.gpu

prepare() {
    set -e
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    cargo build --release -p stepwise-cli --features cuda
    mkdir -p "$G/data" "$G/qwen2-prm"
    strip -o "$G/stepwise" target/release/stepwise
    # The commit the binary was built from (+ "-dirty" with uncommitted changes).
    echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates Cargo.toml Cargo.lock || echo -dirty)" > "$G/commit.txt"
    cp data/processbench/gsm8k.json data/processbench/math.json "$G/data/"
    head -256 data/gsm8k/test.jsonl > "$G/data/gsm8k-test.jsonl"
    cp fixtures/hf-tiny/qwen2-prm/{config.json,tokenizer.json,tokenizer_config.json} "$G/qwen2-prm/"
    du -sh "$G"
    echo "carry .gpu, then run: bash bench/gpu_check.sh run"
}

run() {
    OUT=${OUT:-/tmp/gpu_check}
    W=${WORK:-/tmp/gpu_check_work}
    SHAPES=${SHAPES:-"0.5b 7b"}
    DATASETS=${DATASETS:-"gsm8k math"}
    BUDGET=${MAX_BATCH_TOKENS:-16384}
    PEER_BUDGETS=${PEER_BUDGETS:-16384,32768,65536} # the peer's token budgets, each warmed up on a whole pass
    GEN_PEER_BATCHES=${GEN_PEER_BATCHES:-32,64}     # the generation peer's batch sizes
    DEVICE=${DEVICE:-cuda}          # cpu: a dry run of this script (with LIMIT) on a machine without a GPU
    LIMIT=${LIMIT:-}                # score only the first LIMIT records of each dataset
    TIME_BUDGET=${TIME_BUDGET:-450} # seconds: a stage that would not fit in what is left is skipped
    GENERATION=${GENERATION:-1}     # 0: skip the generation stage
    F32_REFERENCE=${F32_REFERENCE:-0} # N > 0: transformers in float32 on the first N GSM8K records, per shape
    TRAINING=${TRAINING:-1}         # 0: skip the training stage
    TRAIN_STEPS=${TRAIN_STEPS:-200} # optimiser steps of each engine in the training stage
    TRAIN_VALID=${TRAIN_VALID:-40}  # records held out for both engines' validation loss (at most a fifth)
    TRAIN_OBJECTIVES=${TRAIN_OBJECTIVES:-"prm log-ratio"} # which verifiers the training stage trains
    TRAIN_LIMIT=${TRAIN_LIMIT:-150} # seconds each engine's training may take (stepwise's 200 steps took ~290 s on an H200)
    TRAIN_PROFILE=${TRAIN_PROFILE:-0} # 1: Nsight Compute's per-kernel times of 3 training steps of stepwise's classifier
    RL_UPDATES=${RL_UPDATES:-3}     # updates of the RL stage (0: skip it)
    RL_SHAPE=${RL_SHAPE:-"8 8 128"} # RL's prompts per update, samples per prompt, most tokens per sample
    AGENT_RL_SHAPE=${AGENT_RL_SHAPE:-"4 4 8"} # the agent's RL: worlds per update, episodes each, most actions
    SCORING=${SCORING:-1}           # 0: skip the scoring comparisons (only training, RL, generation)
    GEN_REQUESTS=${GEN_REQUESTS:-64}
    GEN_TOKENS=${GEN_TOKENS:-256}
    BIN="$G/stepwise"
    mkdir -p "$OUT" "$W"
    export PYTHONUNBUFFERED=1
    if [ "$DEVICE" = cuda ]; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/gpu.txt"
    else
        echo "none (dry run on $DEVICE)" > "$W/gpu.txt"
    fi
    lscpu | grep -m1 'Model name' | tee "$W/cpu.txt"
    cp "$G/commit.txt" "$W/commit.txt" 2>/dev/null || true
    # Whether a stage limited to $1 seconds (expected to take half of that) fits in what is left
    # of TIME_BUDGET.
    fits() {
        if [ $((SECONDS + $1 / 2)) -gt "$TIME_BUDGET" ]; then
            echo "-- skipped ($2): about $(($1 / 2))s would not fit in the ${TIME_BUDGET}s budget (at ${SECONDS}s)" \
                | tee -a "$W/skipped.txt"
            return 1
        fi
    }
    # A stage's time limit: $1 seconds, or what is left of TIME_BUDGET if less.
    limit() {
        local left=$((TIME_BUDGET - SECONDS))
        echo $(( left < $1 ? (left > 5 ? left : 5) : $1 ))
    }
    # Peak GPU memory of a command: nvidia-smi sampled every 100 ms while it runs.
    # The log starts empty: a stage run again (a rerun on the warm machine) is read for its own
    # figures, not the first run's.
    peak() {
        local log=$1; shift
        : > "$log"
        local sampler=
        if [ "$DEVICE" = cuda ]; then
            nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$log.mem" &
            sampler=$!
        fi
        local t0=$SECONDS
        "$@"
        local rc=$?
        [ -n "$sampler" ] && { kill $sampler 2>/dev/null; wait $sampler 2>/dev/null; }
        [ -s "$log.mem" ] && echo "peak_mib $(sort -n "$log.mem" | tail -1)" >> "$log"
        echo "exit $rc after $((SECONDS - t0))s" >> "$log"
        return $rc
    }
    # bench/gpu_compare.py's comparison of $2 with $3 (named $4) into the file $1 (its line, then
    # its JSON), the line shown. (Not `| tee | head -1`: head closing the pipe can cost the file
    # its JSON line.)
    compare() {
        local out=$1; shift
        python3 bench/gpu_compare.py "$@" > "$out"
        head -1 "$out"
    }
    for ds in $DATASETS; do
        python3 -c "import json,sys; n=sys.argv[3]; r=json.load(open(sys.argv[1])); json.dump(r[:int(n)] if n else r, open(sys.argv[2],'w'))" \
            "$G/data/$ds.json" "$W/$ds.json" "$LIMIT"
    done
    # Outputs from nothing: `stepwise score` resumes a .jsonl it finds, `train-prm` and `rl` a
    # folder (a stage run again on the warm machine, or one cut off by its time limit, would time
    # only what was missing), and a peer's old JSON would stand in for a run that failed.
    fresh() { for f in "$@"; do rm -rf "$f" "$f.settings.json" "$f.lock"; done; }
    # The peer and stepwise on one dataset and shape; $3, $4: each engine's time limit.
    compare_scoring() {
        local shape=$1 ds=$2 tag="$1-$2" M="$W/prm-$1"
        echo "== $tag"
        # stepwise first (one cold pass, seconds): the peer's sweep is the long part, and a peer cut
        # off by its limit still leaves the budgets it finished in its JSON.
        fresh "$W/sw-$tag.jsonl"
        fits "$4" "stepwise $tag" && peak "$W/sw-$tag.log" timeout "$(limit "$4")" "$BIN" score --model "$M" --input "$W/$ds.json" \
            --output "$W/sw-$tag.jsonl" --device "$DEVICE" --max-batch-tokens "$BUDGET" >> "$W/sw-$tag.log" 2>&1
        grep -vE '^(peak_mib|exit)' "$W/sw-$tag.log" | tail -2
        fresh "$W/hf-$tag.json"
        fits "$3" "transformers $tag" && peak "$W/hf-$tag.log" timeout "$(limit "$3")" python3 bench/gpu_transformers.py "$M" \
            "$W/$ds.json" "$W/hf-$tag.json" --max-batch-tokens "$PEER_BUDGETS" --device "$DEVICE" >> "$W/hf-$tag.log" 2>&1
        grep -E "^transformers|  [0-9]+ tokens a batch|Error" "$W/hf-$tag.log" | tail -4
        [ -f "$W/sw-$tag.jsonl" ] && [ -f "$W/hf-$tag.json" ] && compare "$W/cmp-$tag.txt" "$W/sw-$tag.jsonl" \
            "$W/hf-$tag.json" "stepwise vs transformers, $tag"
    }
    make_checkpoint() { # shape, folder, time limit, extra flags
        [ -f "$2/config.json" ] && return 0
        fits "$3" "checkpoint $2" || return 1
        timeout "$(limit "$3")" python3 bench/make_random_prm.py "$1" "$2" --tokenizer "$G/qwen2-prm" --device "$DEVICE" \
            ${4:-} > "$W/make-$(basename "$2").log" 2>&1
        local rc=$?
        tail -1 "$W/make-$(basename "$2").log"
        return $rc
    }
    first=$(echo $DATASETS | cut -d' ' -f1)
    # Both bf16 engines against transformers in float32 on the first F32_REFERENCE records of the
    # first dataset: which of the two is nearer the exact function.
    reference_f32() {
        local shape=$1 tag="$1-$first"
        [ "$F32_REFERENCE" -gt 0 ] && fits "$2" "float32 reference $shape" || return 0
        fresh "$W/f32-$tag.json"
        peak "$W/f32-$tag.log" timeout "$(limit "$2")" python3 bench/gpu_transformers.py "$W/prm-$shape" "$W/$first.json" \
            "$W/f32-$tag.json" --dtype float32 --limit "$F32_REFERENCE" --warmup one --device "$DEVICE" >> "$W/f32-$tag.log" 2>&1
        grep -E "^transformers|Error" "$W/f32-$tag.log" | tail -2
        [ -f "$W/f32-$tag.json" ] || return 0
        [ -f "$W/sw-$tag.jsonl" ] && compare "$W/cmp-f32-sw-$tag.txt" "$W/sw-$tag.jsonl" "$W/f32-$tag.json" \
            "stepwise bf16 vs transformers float32, $tag"
        [ -f "$W/hf-$tag.json" ] && compare "$W/cmp-f32-hf-$tag.txt" "$W/hf-$tag.json" "$W/f32-$tag.json" \
            "transformers bf16 vs transformers float32, $tag"
    }
    # 1. The 0.5B shape: both engines on each dataset; the CUDA engine against the CPU engine and
    #    the flash kernel against the plain one on 24 records.
    if [ "$SCORING" = 1 ] && [[ " $SHAPES " == *" 0.5b "* ]] && make_checkpoint 0.5b "$W/prm-0.5b" 120; then
        for ds in $DATASETS; do compare_scoring 0.5b "$ds" 240 150; done
        reference_f32 0.5b 90
        python3 -c "import json,sys; json.dump(json.load(open(sys.argv[1]))[:24], open(sys.argv[2],'w'))" \
            "$G/data/gsm8k.json" "$W/gsm8k24.json"
        if [ "$DEVICE" = cuda ] && [ "${CROSS_CHECK:-1}" = 1 ] && fits 90 "CUDA vs CPU engine"; then
            fresh "$W/cpu24.jsonl" "$W/gpu24.jsonl" "$W/simple24.jsonl"
            timeout 60 "$BIN" score --model "$W/prm-0.5b" --input "$W/gsm8k24.json" --output "$W/cpu24.jsonl" \
                --device cpu > "$W/cpu24.log" 2>&1
            timeout 30 "$BIN" score --model "$W/prm-0.5b" --input "$W/gsm8k24.json" --output "$W/gpu24.jsonl" \
                --device cuda > "$W/gpu24.log" 2>&1
            [ -f "$W/cpu24.jsonl" ] && [ -f "$W/gpu24.jsonl" ] && compare "$W/cmp-cpu.txt" "$W/gpu24.jsonl" \
                "$W/cpu24.jsonl" "CUDA vs CPU engine, 0.5b, 24 records"
            STEPWISE_CUDA_SIMPLE_ATTENTION=1 timeout 30 "$BIN" score --model "$W/prm-0.5b" --input "$W/gsm8k24.json" \
                --output "$W/simple24.jsonl" --device cuda > "$W/simple24.log" 2>&1
            [ -f "$W/simple24.jsonl" ] && [ -f "$W/gpu24.jsonl" ] && compare "$W/cmp-simple-0.5b.txt" "$W/gpu24.jsonl" \
                "$W/simple24.jsonl" "flash vs plain attention kernel, 0.5b, 24 records"
        fi
    fi
    # 1b. Training: a 0.5B-shaped verifier trained TRAIN_STEPS steps on the first dataset's
    #     ProcessBench labels (steps up to the first error) by `stepwise train-prm --device cuda`
    #     and by PyTorch (bench/gpu_train.py: f32 masters, bf16 autocast, AdamW), the same
    #     batches' rules: `prm` (the PRM checkpoint's decoder under a new classifier head) and
    #     `log-ratio` (a causal LM scoring each step by its tokens' log-likelihood against a
    #     constant reference: the LM head's vocabulary logits at every learned token; the
    #     constant is log(1/151936), what a uniform model gives each token; β 0.01 as in
    #     bench/train_peer_cpu.sh, which keeps a step's score off 0 and 1 at the start: the
    #     random policy's log-likelihood of a step is some 18 nats under the constant's).
    compare_training() { # name, checkpoint, the peer's objective flags, train-prm's head flags
        local name=$1 M=$2
        echo "== training ($name)"
        local flags=(--steps "$TRAIN_STEPS" --lr 1e-5 --batch-size 16 --max-batch-tokens "$BUDGET" --max-len 2048)
        # The same held-out records for both: the first TRAIN_VALID (at most a fifth), trained on the rest.
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); k=min(int(sys.argv[2]), len(r)//5); \
json.dump(r[k:], open(sys.argv[3],'w')); json.dump(r[:k], open(sys.argv[4],'w'))" \
            "$W/$first.json" "$TRAIN_VALID" "$W/train-$first.json" "$W/valid-$first.json"
        fresh "$W/train-hf-$name.json" "$W/trained-$name"
        fits "$TRAIN_LIMIT" "transformers training ($name)" && peak "$W/train-hf-$name.log" timeout "$(limit "$TRAIN_LIMIT")" python3 \
            bench/gpu_train.py "$M" "$W/train-$first.json" "$W/train-hf-$name.json" "${flags[@]}" $3 --device "$DEVICE" \
            --valid-data "$W/valid-$first.json" >> "$W/train-hf-$name.log" 2>&1
        grep -E "^transformers|Error" "$W/train-hf-$name.log" | tail -2
        fits "$TRAIN_LIMIT" "stepwise training ($name)" && peak "$W/train-sw-$name.log" timeout "$(limit "$TRAIN_LIMIT")" "$BIN" train-prm \
            --data "$W/train-$first.json" --base "$M" --out "$W/trained-$name" --device "$DEVICE" "${flags[@]}" $4 \
            --valid-data "$W/valid-$first.json" --stop-at-first-bad >> "$W/train-sw-$name.log" 2>&1
        grep -vE '^(peak_mib|exit)' "$W/train-sw-$name.log" | tail -2
    }
    # Where a training step's GPU time goes (issue #54: stepwise trained at 0.27-0.30x PyTorch's
    # tokens/s): Nsight Compute's duration of every kernel over 3 steps of the classifier (model
    # loading included), clocks left alone: one CSV row a launch in train-profile.log, summed by
    # kernel into train-profile.txt by bench/ncu_summary.py.
    profile_training() {
        command -v ncu > /dev/null || { echo "-- skipped (training profile): no ncu" | tee -a "$W/skipped.txt"; return 0; }
        fits 240 "training profile" || return 0
        echo "== training profile"
        fresh "$W/profiled-prm"
        timeout "$(limit 240)" ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base \
            "$BIN" train-prm --data "$W/train-$first.json" --base "$W/prm-0.5b" --out "$W/profiled-prm" --device cuda \
            --steps 3 --lr 1e-5 --batch-size 16 --max-batch-tokens "$BUDGET" --max-len 2048 --stop-at-first-bad \
            > "$W/train-profile.log" 2>&1
        echo "exit $?" >> "$W/train-profile.log"
        python3 bench/ncu_summary.py "$W/train-profile.log" | tee "$W/train-profile.txt"
    }
    P="$W/policy-0.5b"
    if [ "$TRAINING" = 1 ] && [[ " $SHAPES " == *" 0.5b "* ]]; then
        [[ " $TRAIN_OBJECTIVES " == *" prm "* ]] && make_checkpoint 0.5b "$W/prm-0.5b" 120 \
            && compare_training prm "$W/prm-0.5b" "" ""
        [[ " $TRAIN_OBJECTIVES " == *" log-ratio "* ]] && make_checkpoint 0.5b "$P" 120 --policy \
            && compare_training log-ratio "$P" "--objective log-ratio --reference-logprob -11.93 --beta 0.01" \
                "--head log-ratio --reference-logprob -11.93 --beta 0.01"
    fi
    # (after the training stage, which writes the training split it reads)
    if [ "$TRAIN_PROFILE" = 1 ] && [ "$DEVICE" = cuda ] && make_checkpoint 0.5b "$W/prm-0.5b" 120 \
        && [ -f "$W/train-$first.json" ]; then
        profile_training
    fi
    # 1c. RL on the GPU: `stepwise rl --device cuda` (sampling from the trainer's own weights, the
    #     PPO-clip update on the packed trainer) for RL_UPDATES updates of RL_SHAPE (8 GSM8K
    #     prompts x 8 samples of at most 128 tokens), the outcome reward; no peer, its seconds per
    #     update.
    if [ "$RL_UPDATES" -gt 0 ] && [[ " $SHAPES " == *" 0.5b "* ]] && make_checkpoint 0.5b "$P" 120 --policy \
        && fits 150 "rl"; then
        echo "== rl"
        head -64 "$G/data/gsm8k-test.jsonl" > "$W/gsm8k-problems.jsonl"
        read -r rl_prompts rl_group rl_tokens <<< "$RL_SHAPE"
        fresh "$W/rl-0.5b"
        peak "$W/rl-sw.log" timeout "$(limit 150)" "$BIN" rl --policy "$P" --problems "$W/gsm8k-problems.jsonl" \
            --out "$W/rl-0.5b" --device "$DEVICE" --updates "$RL_UPDATES" --prompts "$rl_prompts" \
            --group-size "$rl_group" --max-tokens "$rl_tokens" \
            --minibatch-size 16 --lr 1e-6 --checkpoint-every 0 --max-batch-tokens "$BUDGET" >> "$W/rl-sw.log" 2>&1
        grep -vE '^(peak_mib|exit)' "$W/rl-sw.log" | tail -2
    fi
    # 1d. An agent's RL on the GPU: `stepwise agent rl --device cuda` (the same packed learner;
    #     each action sampled on its own up to the observation mark, observations left out of
    #     the loss) for RL_UPDATES updates of AGENT_RL_SHAPE (4 rooms worlds x 4 episodes of at most 8 actions),
    #     the goal as the reward; never run on a GPU before. Its seconds per update.
    if [ "$RL_UPDATES" -gt 0 ] && [[ " $SHAPES " == *" 0.5b "* ]] && make_checkpoint 0.5b "$P" 120 --policy \
        && fits 120 "agent-rl"; then
        echo "== agent rl"
        fresh "$W/agent-rl-0.5b"
        read -r agent_worlds agent_group agent_actions <<< "$AGENT_RL_SHAPE"
        "$BIN" agent games --count 16 --seed 1 --output "$W/agent-games.jsonl" > "$W/agent-games.log" 2>&1
        peak "$W/agent-rl-sw.log" timeout "$(limit 120)" "$BIN" agent rl --policy "$P" \
            --problems "$W/agent-games.jsonl" --out "$W/agent-rl-0.5b" --device "$DEVICE" --reward goal \
            --updates "$RL_UPDATES" --worlds "$agent_worlds" --group-size "$agent_group" \
            --max-actions "$agent_actions" --max-tokens 16 --lr 1e-6 \
            --checkpoint-every 0 --max-batch-tokens "$BUDGET" >> "$W/agent-rl-sw.log" 2>&1
        grep -vE '^(peak_mib|exit)' "$W/agent-rl-sw.log" | tail -2
    fi
    # 2. Generation: GEN_REQUESTS concurrent requests of GEN_TOKENS sampled tokens, a 0.5B-shaped
    #    policy: transformers' batched generate against `stepwise serve` with that many clients.
    if [ "$GENERATION" = 1 ] && make_checkpoint 0.5b "$P" 120 --policy && fits 240 "generation"; then
        echo "== generation"
        fresh "$W/gen-hf.json" "$W/gen-sw.json"
        peak "$W/gen-hf.log" timeout "$(limit 180)" python3 bench/gpu_generation.py hf "$P" --out "$W/gen-hf.json" \
            --requests "$GEN_REQUESTS" --tokens "$GEN_TOKENS" --batch-sizes "$GEN_PEER_BATCHES" --device "$DEVICE" \
            >> "$W/gen-hf.log" 2>&1
        grep -v '^peak_mib' "$W/gen-hf.log" | tail -2
        "$BIN" serve --model "$P" --device "$DEVICE" --port 8123 > "$W/gen-serve.log" 2>&1 &
        SERVER=$!
        for _ in $(seq 1 60); do
            python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8123/health')" 2>/dev/null && break
            sleep 1
        done
        peak "$W/gen-sw.log" timeout "$(limit 90)" python3 bench/gpu_generation.py serve http://127.0.0.1:8123 policy-0.5b \
            --out "$W/gen-sw.json" --requests "$GEN_REQUESTS" --tokens "$GEN_TOKENS" >> "$W/gen-sw.log" 2>&1
        grep -v '^peak_mib' "$W/gen-sw.log" | tail -2
        kill $SERVER 2>/dev/null
        wait $SERVER 2>/dev/null
        tail -3 "$W/gen-serve.log"
    fi
    # 3. The 7B shape (Qwen2.5-Math-PRM-7B's config).
    if [ "$SCORING" = 1 ] && [[ " $SHAPES " == *" 7b "* ]] && make_checkpoint 7b "$W/prm-7b" 150; then
        for ds in $DATASETS; do compare_scoring 7b "$ds" 420 180; done
        reference_f32 7b 150
    fi
    summary
}

summary() {
    OUT=${OUT:-/tmp/gpu_check}
    W=${WORK:-/tmp/gpu_check_work}
    mkdir -p "$OUT"
    # The summary.
    python3 - "$W" "$OUT/gpu_check.json" <<'EOF'
import json, re, sys
from pathlib import Path
w, out = Path(sys.argv[1]), Path(sys.argv[2])
def text(name):
    f = w / name
    return f.read_text().strip() if f.exists() else None
summary = {"gpu": text("gpu.txt"), "cpu": text("cpu.txt"), "commit": text("commit.txt"),
           "skipped": (text("skipped.txt") or "").splitlines(), "runs": {}}
def cmp(name):
    """The JSON line of a comparison's output (None when it has none: a stage cut off)."""
    f = w / name
    for line in reversed(f.read_text().splitlines() if f.exists() else []):
        if line.startswith("{"):
            return json.loads(line)
    return None
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
        sw_log = log.read_text()
        m = re.search(r"scored (\d+) solutions \((\d+) tokens\) in ([\d.]+)s: (\d+) tokens/s", sw_log)
        pk = re.search(r"peak_mib (\d+)", sw_log)
        run["stepwise"] = {"records": int(m[1]), "tokens": int(m[2]), "seconds": float(m[3]),
                           "tokens_per_s": int(m[4])} if m else {"error": sw_log[-2000:]}
        if pk:
            run["stepwise"]["peak_gpu_mib_nvidia_smi"] = int(pk[1])
        if m and "tokens_per_s" in ref:
            run["ratio"] = int(m[4]) / ref["tokens_per_s"]
    run["agreement"] = cmp(f"cmp-{tag}.txt")
    summary["runs"][tag] = run
for f in sorted(w.glob("cmp-simple-*.txt")) + sorted(w.glob("cmp-f32-*.txt")):
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
def training(name):
    train = {}
    f = w / f"train-hf-{name}.json"
    train["transformers"] = json.loads(f.read_text()) if f.exists() else {"error": "no result (see logs.tgz)"}
    log = w / f"train-sw-{name}.log"
    if log.exists():
        t = log.read_text()
        m = re.search(r"trained (\d+) steps on \S+ in ([\d.]+)s \(([\d.]+)s in steps: (\d+) tokens, (\d+) tokens/s\), loss ([\d.]+)", t)
        state = w / f"trained-{name}" / "trainer_state.json"
        st = json.loads(state.read_text()) if state.exists() else None
        if m:
            train["stepwise"] = {"steps": int(m[1]), "seconds_total": float(m[2]), "seconds": float(m[3]),
                                 "tokens": int(m[4]), "tokens_per_s": int(m[5]), "last_loss": float(m[6])}
        elif st:  # cut off: the run's state at its last checkpoint
            train["stepwise"] = {"partial": True, "steps": st["step"], "seconds": st["seconds"], "tokens": st["tokens"],
                                 "tokens_per_s": int(st["tokens"] / max(st["seconds"], 1e-9)),
                                 "last_loss": st["last_loss"], "log": t[-1000:]}
        else:
            train["stepwise"] = {"error": t[-2000:]}
        if st:  # its validations, (step, loss), as PyTorch's valid_history
            train["stepwise"]["valid_history"] = [[step, v.get("loss")] for step, v in st.get("history", [])]
    metrics = w / f"trained-{name}" / "metrics.json"
    if metrics.exists() and "stepwise" in train:  # the checkpoint kept: the best validation's
        train["stepwise"]["valid_loss_kept"] = json.loads(metrics.read_text())["loss"]
    # The target: stepwise's validation loss within 5% of PyTorch's after the same steps, read
    # at the last step both validated at (both validate every steps/5).
    ours = dict(map(tuple, train.get("stepwise", {}).get("valid_history", [])))
    theirs = dict(map(tuple, train["transformers"].get("valid_history", [])))
    common = sorted(set(ours) & set(theirs))
    if common:
        at = common[-1]
        train["valid_loss_at_step"] = {"step": at, "transformers": theirs[at], "stepwise": ours[at]}
        train["valid_loss_gap"] = ours[at] / theirs[at] - 1
    for who, log in (("transformers", f"train-hf-{name}.log"), ("stepwise", f"train-sw-{name}.log")):
        pk = re.search(r"peak_mib (\d+)", (w / log).read_text()) if (w / log).exists() else None
        if pk and who in train:
            train[who]["peak_gpu_mib_nvidia_smi"] = int(pk[1])
    if "tokens_per_s" in train["transformers"] and "tokens_per_s" in train.get("stepwise", {}):
        train["ratio"] = train["stepwise"]["tokens_per_s"] / train["transformers"]["tokens_per_s"]
    return train
summary["training_0.5b"] = training("prm")
summary["training_log_ratio_0.5b"] = training("log-ratio")
for key, run in (("rl_0.5b", "rl"), ("agent_rl_0.5b", "agent-rl")):
    rl_log, rl_text = w / f"{run}-0.5b" / "rl_log.jsonl", text(f"{run}-sw.log")
    if rl_log.exists():
        updates = [json.loads(line) for line in rl_log.read_text().splitlines() if line.strip()]
        summary[key] = {"updates": updates, "log": (rl_text or "")[-600:]}
    elif rl_text:
        summary[key] = {"error": rl_text[-2000:]}
if text("train-profile.txt"):  # the per-kernel table of stepwise's training steps
    summary["training_profile"] = text("train-profile.txt").splitlines()
out.write_text(json.dumps(summary, indent=1))
print(f"{'run':<14} {'transformers tok/s':>19} {'(budget)':>8} {'stepwise tok/s':>15} {'ratio':>6} {'max|diff|':>9} "
      f"{'same 1st err':>12}")
for tag, r in summary["runs"].items():
    sw, a, hf = r.get("stepwise", {}), r.get("agreement") or {}, r["transformers"]
    print(f"{tag:<14} {hf.get('tokens_per_s', 0):>19.0f} {hf.get('max_batch_tokens', 0):>8} {sw.get('tokens_per_s', 0):>15} "
          f"{r.get('ratio', 0):>6.2f} {a.get('max_abs_diff', float('nan')):>9.4f} {100 * a.get('same_first_error', 0):>11.1f}%")
    for e in hf.get("sweep", []):
        print(f"    transformers at {e['max_batch_tokens']} tokens a batch: "
              + (f"{e['tokens_per_s']:.0f} tok/s (warm-up pass {e['warmup_seconds']:.1f}s)" if "seconds" in e else e.get("error", "")))
g = summary["generation_64x256"]
print(f"generation 64 x 256: transformers {g['hf'].get('tokens_per_s', 0):.0f} tok/s (batches of {g['hf'].get('batch_size')}), "
      f"stepwise {g['sw'].get('tokens_per_s', 0):.0f} tok/s, ratio {g.get('ratio', 0):.2f}, "
      f"failed requests {g['sw'].get('failed', '?')}")
for key in ("training_0.5b", "training_log_ratio_0.5b"):
    t = summary[key]
    print(f"{key}: transformers {t['transformers'].get('tokens_per_s', 0):.0f} tok/s, "
          f"stepwise {t.get('stepwise', {}).get('tokens_per_s', 0):.0f} tok/s, ratio {t.get('ratio', 0):.2f}, "
          f"validation loss at step {t.get('valid_loss_at_step', {}).get('step')}: "
          f"{t.get('valid_loss_at_step', {}).get('transformers')} / {t.get('valid_loss_at_step', {}).get('stepwise')}")
for key in ("rl_0.5b", "agent_rl_0.5b"):
    for u in summary.get(key, {}).get("updates", []):
        print(f"{key} update {u['update']}: {u['seconds']:.1f}s ({u['sampling_seconds']:.1f}s sampling, "
              f"{u.get('logprob_seconds', 0):.1f}s log-probabilities, {u.get('learn_seconds', 0):.1f}s learning), "
              f"{u['sampled_tokens']} tokens sampled, {u['updated_tokens']} learned, loss {u['loss']:.4f}, kl {u['kl']:.5f}")
    if "error" in summary.get(key, {}):
        print(f"{key}: failed, see the log in the JSON")
print(f"written: {out}")
EOF
    tar czf "$OUT/logs.tgz" -C "$W" $(cd "$W" && ls *.log *.txt *.mem 2>/dev/null)
}

# The stages by rank under one deadline (SESSION_SECONDS from now); `run` reads TIME_BUDGET
# against the shell's SECONDS, which keeps counting across the calls below.
session() {
    export TIME_BUDGET=$((SECONDS + ${SESSION_SECONDS:-570}))
    local W=${WORK:-/tmp/gpu_check_work} big=${BIG:-7b} # BIG=0.5b: a CPU dry run of the session
    echo "#### 1. 0.5B scoring, the classifier's training"
    SHAPES=0.5b CROSS_CHECK=0 TRAIN_OBJECTIVES=prm RL_UPDATES=0 GENERATION=0 TRAIN_PROFILE=${TRAIN_PROFILE:-1} run
    echo "#### 2. 7B on GSM8K"
    SHAPES=$big DATASETS=gsm8k TRAINING=0 RL_UPDATES=0 GENERATION=0 run
    echo "#### 3. the log-ratio verifier's training, RL"
    SHAPES=0.5b DATASETS=gsm8k SCORING=0 TRAIN_OBJECTIVES=log-ratio GENERATION=0 run
    echo "#### 4. generation"
    SHAPES=0.5b DATASETS=gsm8k SCORING=0 TRAINING=0 RL_UPDATES=0 run
    echo "#### 5. 7B on MATH"
    local best
    best=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['max_batch_tokens'])" \
        "$W/hf-$big-gsm8k.json" 2>/dev/null || echo 32768)
    SHAPES=$big DATASETS=math PEER_BUDGETS=$best TRAINING=0 RL_UPDATES=0 GENERATION=0 run
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    session) session ;;
    summary) summary ;;
    *) echo "usage: bash bench/gpu_check.sh prepare|run|session|summary"; exit 2 ;;
esac
