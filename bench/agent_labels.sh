#!/usr/bin/env bash
# Labels for agents' actions against the rooms oracle, and what each costs in environment steps:
# Monte Carlo from the state after each action at K = 2, 4, 8 rollouts (discount 0.9), and each
# trajectory's own discounted return (TD with lambda 1: no rollouts, and by construction no
# progress past the first action), and binary search for the first dead action at K = 2, 4, 8
# rollouts a probed state (it labels only the actions up to that one). The expert (skill 0.6) plays and rolls out, so no model is
# needed. Prints one JSON line per method: {"compared", "good", "auc", "env_steps", ...}.
#
# Usage: bash bench/agent_labels.sh [WORK_DIR]   (default /tmp/stepwise-agent-labels; uses
# target/debug/stepwise unless STEPWISE names another build; about a minute on two cores)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/stepwise-agent-labels}"
S="${STEPWISE:-$(pwd)/target/debug/stepwise}"
[ -x "$S" ] || cargo build -p stepwise-cli
mkdir -p "$work" && cd "$work"
rm -f eval.jsonl oracle.jsonl returns.jsonl mc*.jsonl binary*.jsonl
"$S" agent games --count 60 --seed 2 --output eval-games.jsonl
"$S" agent play --problems eval-games.jsonl --expert 0.6 -n 2 --output eval.jsonl
"$S" agent label --method oracle --problems eval-games.jsonl --input eval.jsonl --output oracle.jsonl
"$S" agent label --method td --lambda 1 --gamma 0.9 --problems eval-games.jsonl --input eval.jsonl --output returns.jsonl
printf 'own return (td, lambda 1): '
"$S" agent compare --input returns.jsonl --reference oracle.jsonl --gamma 0.9
for k in 2 4 8; do
  "$S" agent label --method mc --rollouts "$k" --gamma 0.9 --expert 0.6 --problems eval-games.jsonl \
    --input eval.jsonl --output "mc$k.jsonl"
  printf 'mc, %s rollouts: ' "$k"
  "$S" agent compare --input "mc$k.jsonl" --reference oracle.jsonl --gamma 0.9
done
for k in 2 4 8; do
  "$S" agent label --method binary --rollouts "$k" --expert 0.6 --problems eval-games.jsonl \
    --input eval.jsonl --output "binary$k.jsonl"
  printf 'binary search, %s rollouts a probe: ' "$k"
  "$S" agent compare --input "binary$k.jsonl" --reference oracle.jsonl --gamma 0.9
done
