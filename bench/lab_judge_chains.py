"""What the lab's thinking judges write, checked piece by piece: on a lab run folder's held-out
samples (scored_eval.jsonl), sample the judge that writes a chain (judge_chain/), the judge
asked at each step that works it again (judge_worked/) and its control that does not
(judge_direct/) with the Python package, and count, over the equation steps, how often a
thinking judge copies the left side of the step it is on (the right step found) and gives it
the right value (the arithmetic), how often each judge's verdict agrees with the oracle's, and
how many arithmetic slips each calls wrong; steps up to the oracle's first error, as all three
were trained.

    python bench/lab_judge_chains.py RUN_DIR [--solutions 300] [--seed 0]

Needs the stepwise Python package (pip install ./python). A chain's piece k is read as its
verdict on step k (the chain goes through the steps in order).
"""
import argparse
import json
import random
from pathlib import Path

import stepwise


def equation(text):
    """(left side, value the calculator gives it) of `a op b = c`, else None (the lab's task.rs)."""
    w = text.split()
    if len(w) != 5 or w[3] != "=" or w[1] not in ("+", "-", "*", "%"):
        return None
    try:
        a, b = int(w[0]), int(w[2])
    except ValueError:
        return None
    if w[1] == "%" and b <= 0:
        return None
    value = {"+": a + b, "-": a - b, "*": a * b, "%": a % b if b > 0 else 0}[w[1]]
    return " ".join(w[:3]), value


class Tally:
    """A thinking judge's piece about an equation step is `a op b = v verdict`: the step's left
    side copied, v the value it computes for it; the control's piece is the verdict alone."""

    def __init__(self, thinking):
        self.thinking = thinking
        self.steps = self.copied = self.worked_right = self.verdicts = self.verdict_right = 0
        self.slips = self.slips_caught = 0

    def piece(self, step, good, piece):
        """One piece written about `step` (oracle verdict `good`)."""
        words = piece.split()
        verdict = words[-1] if words and words[-1] in ("yes", "no") else None
        if verdict is not None:
            self.verdicts += 1
            self.verdict_right += (verdict == "yes") == good
        eq = equation(step)
        if eq is None:
            return
        self.steps += 1
        slip = step.split()[4] != str(eq[1])
        self.slips += slip
        self.slips_caught += slip and verdict == "no"
        if len(words) == 6 and " ".join(words[:3]) == eq[0] and words[3] == "=":
            self.copied += 1
            self.worked_right += words[4] == str(eq[1])

    def summary(self):
        share = lambda a, b: round(a / b, 3) if b else None
        worked = {
            "left_side_copied": share(self.copied, self.steps),
            "value_right_when_copied": share(self.worked_right, self.copied),
        }
        return {
            "equation_steps_reached": self.steps,
            **(worked if self.thinking else {}),
            "verdicts": self.verdicts,
            "verdict_agrees_with_oracle": share(self.verdict_right, self.verdicts),
            "slips_reached": self.slips,
            "slips_called_no": share(self.slips_caught, self.slips),
        }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("--solutions", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    run = Path(args.run)
    records = [json.loads(line) for line in (run / "scored_eval.jsonl").open()]
    random.seed(args.seed)
    sample = random.sample(records, min(args.solutions, len(records)))
    out = {}
    for name, per_step, thinking in (
        ("judge_chain", False, True),
        ("judge_worked", True, True),
        ("judge_direct", True, False),
    ):
        if not (run / name / "DONE").exists():
            continue
        policy = stepwise.Policy(str(run / name), separator="|", prompt="pieces", max_tokens=96)
        tally = Tally(thinking)
        for r in sample:
            steps = [s["text"] for s in r["steps"]]
            oracle = r["meta"]["oracle"]
            if per_step:
                for k, step in enumerate(steps):
                    (answer,) = policy.continue_from(r["question"], steps[: k + 1], n=1, seed=k)
                    tally.piece(step, oracle[k], answer["text"])
                    if not oracle[k]:
                        break
            else:
                (answer,) = policy.continue_from(r["question"], steps, n=1, seed=0)
                pieces = answer["text"].split("|")
                for k, piece in enumerate(pieces[: len(steps)]):
                    tally.piece(steps[k], oracle[k], piece)
                    if not oracle[k]:
                        break
        out[name] = tally.summary()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
