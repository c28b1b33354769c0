"""What the lab's calculator tells a verifier, against what the judges read from it: on a lab run
folder's held-out samples (scored_eval.jsonl), how many first errors are arithmetic slips (the
stated result is not what the calculator gives), how often the rule "the first step whose result
the calculator contradicts" finds the first error (or that there is none), and how often the
judges do (those the run has: the judge, with a calculator, writing a chain, working each step,
at each step not working it, and each weighed by likelihood; a step judged wrong at a score under
0.5).

    python bench/lab_calculator_bound.py RUN_DIR [RUN_DIR ...]

Standard library only.
"""
import json
import sys
from pathlib import Path


def calculator(step):
    """(value, stated) of an equation step `a op b = c`, else None (the lab's task.rs)."""
    w = step.split()
    if len(w) != 5 or w[3] != "=" or w[1] not in ("+", "-", "*", "%"):
        return None
    try:
        a, b, c = int(w[0]), int(w[2]), int(w[4])
    except ValueError:
        return None
    if w[1] == "%":
        return (a % b, c) if b > 0 else None
    return ({"+": a + b, "-": a - b, "*": a * b}[w[1]], c)


def first_false(flags):
    return next((i for i, f in enumerate(flags) if not f), -1)


JUDGES = [("judge", "the judge"), ("judge_calculator", "the judge with a calculator"),
          ("judge_chain", "the judge writing a chain"), ("judge_worked", "the judge working each step"),
          ("judge_direct", "the judge at each step not working it")]
# Each judge weighed by likelihood too, where the run weighs them (`judge_likelihood`).
JUDGES += [(name + "_likelihood", what + " (likelihood)") for name, what in list(JUDGES)
           if name != "judge_chain"]

for run in sys.argv[1:]:
    n = errors = slips = rule = 0
    found = {name: 0 for name, _ in JUDGES}
    present = set()
    for line in (Path(run) / "scored_eval.jsonl").open():
        r = json.loads(line)
        truth = first_false(r["meta"]["oracle"])
        checks = [calculator(s["text"]) for s in r["steps"]]
        n += 1
        if truth >= 0:
            errors += 1
            c = checks[truth]
            slips += c is not None and c[0] != c[1]
        rule += first_false([c is None or c[0] == c[1] for c in checks]) == truth
        for name, _ in JUDGES:
            if name in r["scores"]:
                present.add(name)
                found[name] += first_false([x >= 0.5 for x in r["scores"][name]]) == truth
    judges = ", ".join(f"{what} {found[name] / n:.3f}" for name, what in JUDGES if name in present)
    print(f"{run}: {n} samples, {errors} erroneous; first error an arithmetic slip: {slips / errors:.3f}; "
          f"first error found by the first-slip rule {rule / n:.3f}, {judges}")
