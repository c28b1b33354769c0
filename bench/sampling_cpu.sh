#!/usr/bin/env bash
# Sampling and annotating with a pretrained-size policy on the CPU (docs/benchmarks.md, "sampling
# and annotating a 0.5B policy on the CPU"): `generate`; Monte Carlo, binary-search, OmegaPRM and
# consensus `annotate`; a judge weighed by likelihood; `agent play`; an agent's Monte Carlo and
# binary-search labels. Each is
# timed with /usr/bin/time (its seconds and peak resident memory), on a random
# Qwen2.5-0.5B-shaped policy stored in bf16
# (bench/make_random_prm.py --policy). With BASELINE set to another build of stepwise, the same
# commands run with it too and each pair of output files is compared.
#
#   PYTHON=/path/to/venv/bin/python BASELINE=/path/to/old/stepwise bash bench/sampling_cpu.sh
#
# Environment: STEPWISE (target/release/stepwise), BASELINE (none), WORK (/tmp/sampling_cpu),
# OUT (the JSON, default $WORK/sampling_cpu.json), PYTHON (for the policy: torch or
# numpy+ml_dtypes, and safetensors), RUNS (only these runs, by name, e.g. "mc judge_likelihood").
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
W=${WORK:-/tmp/sampling_cpu}
OUT=${OUT:-$W/sampling_cpu.json}
POLICY=$W/policy-0.5b
mkdir -p "$W"
[ -f "$POLICY/config.json" ] || "$PY" bench/make_random_prm.py 0.5b "$POLICY" --policy \
    > "$W/make.log" 2>&1 || { echo "could not make the policy: $W/make.log"; exit 1; }
# 32 GSM8K questions; 16 model solutions of 8 of them (two each), their lines as steps.
python3 - "$W" <<'EOF'
import json, sys
w = sys.argv[1]
with open("data/gsm8k/test.jsonl") as f, open(f"{w}/problems.jsonl", "w") as out:
    for i, line in zip(range(32), f):
        r = json.loads(line)
        out.write(json.dumps({"id": f"q{i}", "question": r["question"], "answer": r["answer"]}) + "\n")
with open("data/gsm8k/example_model_solutions.first300.jsonl") as f, open(f"{w}/solutions.jsonl", "w") as out:
    for i, line in zip(range(8), f):
        r = json.loads(line)
        gold = r["ground_truth"].split("A:")[-1].strip()
        for k in ["6b_finetuning", "175b_verification"]:
            steps = [{"text": t} for t in r[k]["solution"].split("\n") if t.strip()]
            out.write(json.dumps({"id": f"g{i}-{k}", "problem_id": f"g{i}", "question": r["question"],
                                  "steps": steps, "gold_answer": gold}) + "\n")
EOF
runs() {  # the commands, as NAME then arguments; $1 is the build, $2 the folder of its outputs
    local bin=$1 d=$2
    echo "generate $bin generate --model $POLICY --input $W/problems.jsonl -n 4 --max-tokens 32 --output $d/generate.jsonl"
    echo "mc $bin annotate --policy $POLICY --input $W/solutions.jsonl --rollouts 8 --max-tokens 32 --output $d/mc.jsonl"
    echo "binary $bin annotate --method binary-search --policy $POLICY --input $W/solutions.jsonl --rollouts 8 --max-tokens 32 --output $d/binary.jsonl"
    echo "omegaprm $bin annotate --method omegaprm --policy $POLICY --input $W/solutions.jsonl --rollouts 8 --max-tokens 32 --output $d/omegaprm.jsonl"
    echo "play $bin agent play --policy $POLICY --problems $W/games.jsonl -n 4 --max-tokens 12 --output $d/play.jsonl"
    echo "agent_mc $bin agent label --method mc --problems $W/games.jsonl --input $W/expert4.jsonl --rollouts 4 --policy $POLICY --max-tokens 8 --output $d/agent_mc.jsonl"
    echo "consensus $bin annotate --method consensus --policy $POLICY --judge $POLICY --judge-verdict likelihood --judge-format index --input $W/solutions8.jsonl --rollouts 8 --max-tokens 32 --output $d/consensus.jsonl"
    echo "judge_likelihood $bin annotate --method judge --policy $POLICY --judge $POLICY --judge-verdict likelihood --judge-format index --input $W/solutions.jsonl --output $d/judge_likelihood.jsonl"
    echo "agent_binary $bin agent label --method binary --problems $W/games.jsonl --input $W/weak.jsonl --rollouts 4 --policy $POLICY --max-tokens 8 --output $d/agent_binary.jsonl"
}
BIN=${STEPWISE:-target/release/stepwise}
"$BIN" agent games --count 8 --seed 7001 --output "$W/games.jsonl" > /dev/null 2>&1
rm -f "$W/expert.jsonl"
"$BIN" agent play --expert 0.7 --problems "$W/games.jsonl" -n 2 --output "$W/expert.jsonl" > /dev/null 2>&1
# A poor player's trajectories (all 8 fail, 30 actions each), for binary search to search.
rm -f "$W/weak.jsonl"
"$BIN" agent play --expert 0.1 --problems "$W/games.jsonl" -n 1 --output "$W/weak.jsonl" > /dev/null 2>&1
head -8 "$W/solutions.jsonl" > "$W/solutions8.jsonl"
# The 4 shortest expert trajectories (ties in file order): a few states, each a history to feed.
python3 -c '
import json, sys
rows = [l for l in open(sys.argv[1])]
rows.sort(key=lambda l: len(json.loads(l)["steps"]))
open(sys.argv[2], "w").writelines(rows[:4])' "$W/expert.jsonl" "$W/expert4.jsonl"
builds=("new:$BIN")
[ -n "${BASELINE:-}" ] && builds=("old:$BASELINE" "${builds[@]}")
echo "{" > "$OUT"
first=1
for b in "${builds[@]}"; do
    name=${b%%:*}
    bin=${b#*:}
    rm -rf "${W:?}/$name"
    mkdir -p "$W/$name"
    while read -r run cmd; do
        [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $run "* ]] || continue
        /usr/bin/time -f "%e %M" -o "$W/$name/$run.time" $cmd --device cpu > "$W/$name/$run.log" 2>&1
        read -r secs kb < "$W/$name/$run.time"
        echo "$name $run: $secs s, peak $kb kB"
        [ $first = 1 ] || echo "," >> "$OUT"
        first=0
        printf '"%s/%s": {"seconds": %s, "peak_kb": %s}' "$name" "$run" "$secs" "$kb" >> "$OUT"
    done < <(runs "$bin" "$W/$name")
done
echo "}" >> "$OUT"
if [ -n "${BASELINE:-}" ]; then
    for run in generate mc binary omegaprm play agent_mc consensus judge_likelihood agent_binary; do
        [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $run "* ]] || continue
        if cmp -s "$W/old/$run.jsonl" "$W/new/$run.jsonl"; then echo "$run: the same records"; else echo "$run: records differ"; fi
    done
fi
echo "$OUT"
