"""Why weighing a lab judge's verdicts by likelihood ranks as it does: on a lab run folder's
held-out samples (scored_eval.jsonl), for each judge scored both ways (`judge` and
`judge_likelihood`, ...), with each solution ranked by its min step score as best-of-N ranks it:

- ties: the share of problems whose top score is shared by two samples or more (best-of-N then
  takes the first of them: a draw at random among them);
- within-problem AUROC: the chance that a right sample of a problem outscores a wrong one of the
  same problem (ties count half), what best-of-N depends on;
- the top of the votes: among a problem's samples that every sampled verdict keeps (score 1),
  the share that is right, against how often the one the likelihood ranks first among them is,
  and where that one stands among them by the verifiers' base confidence (its min step score,
  `base_confidence`: 0 the least confident of them, 1 the most; 0.5 is no relation).

    python3 bench/lab_judge_likelihood.py RUN_DIR [RUN_DIR ...]

Standard library only.
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

JUDGES = ["judge", "judge_calculator", "judge_worked", "judge_direct"]


def low(sample, name):
    """A sample's min step score by `name`, 0 for a sample without steps (as best-of-N has it)."""
    return min(sample["scores"][name], default=0.0)


def auroc(problems, name):
    hits = pairs = 0.0
    for samples in problems:
        right = [low(s, name) for s in samples if s["correct"]]
        wrong = [low(s, name) for s in samples if not s["correct"]]
        for a in right:
            for b in wrong:
                pairs += 1
                hits += 1.0 if a > b else 0.5 if a == b else 0.0
    return hits / max(pairs, 1)


def tied(problems, name):
    shared = 0
    for samples in problems:
        top = [low(s, name) for s in samples]
        shared += top.count(max(top)) > 1
    return shared / max(len(problems), 1)


def top_of_votes(problems, votes, weighed):
    """(share right among the samples all votes keep, share right of the likeliest of them,
    that one's mean rank among them by the base's confidence, problems with two kept or more)."""
    kept_right = kept = first_right = problems_with = 0
    rank = 0.0
    for samples in problems:
        kept_here = [s for s in samples if low(s, votes) == 1.0]
        if len(kept_here) < 2:
            continue
        kept += len(kept_here)
        kept_right += sum(s["correct"] for s in kept_here)
        best = max(kept_here, key=lambda s: low(s, weighed))
        first_right += best["correct"]
        problems_with += 1
        if "base_confidence" in best["scores"]:
            by_base = sorted(kept_here, key=lambda s: low(s, "base_confidence"))
            rank += by_base.index(best) / (len(kept_here) - 1)
    n = max(problems_with, 1)
    return kept_right / max(kept, 1), first_right / n, rank / n, problems_with


for run in sys.argv[1:]:
    by_problem = defaultdict(list)
    with open(Path(run) / "scored_eval.jsonl") as f:
        for line in f:
            s = json.loads(line)
            by_problem[s["problem_id"]].append(s)
    problems = list(by_problem.values())
    present = problems[0][0]["scores"]
    print(f"{run}: {len(problems)} problems, {sum(map(len, problems))} samples")
    for votes in JUDGES:
        weighed = votes + "_likelihood"
        if votes not in present or weighed not in present:
            continue
        mean_kept, likeliest, rank, n = top_of_votes(problems, votes, weighed)
        print(f"  {votes}: ties at the top {tied(problems, votes):.3f} sampled / {tied(problems, weighed):.3f} "
              f"weighed; within-problem AUROC {auroc(problems, votes):.3f} / {auroc(problems, weighed):.3f}; "
              f"kept by every vote: {mean_kept:.3f} right, the likeliest of them {likeliest:.3f}, "
              f"its rank by the base's confidence {rank:.2f} ({n} problems)")
