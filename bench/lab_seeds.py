#!/usr/bin/env python3
"""The lab's headline numbers over several run folders (one per seed), as the markdown tables in
docs/lab.md: best-of-32 with 95% intervals, the paired differences the issues set targets on,
RL (process against outcome rewards, lucky-correct before and after) and label quality.

    python3 bench/lab_seeds.py runs/standard-code-seed1 runs/standard-code-seed2 runs/standard-code-seed3
"""

import json
import sys
from pathlib import Path

BON = ["PRM-MC (min)", "PRM-oracle (min)", "ORM", "judge, generative (min)", "majority vote", "pass@N"]
PAIRED = [("PRM-MC (min)", "majority vote"), ("PRM-MC (min)", "ORM"), ("PRM-oracle (min)", "ORM"),
          ("PRM-oracle (min)", "PRM-MC (min)")]
RL_PAIRED = [("prm_mc", "outcome"), ("prm_oracle", "outcome"), ("orm", "outcome"), ("prime", "outcome"),
             ("oracle", "outcome")]


def interval(d, key="ci95"):
    lo, hi = d[key]
    return f"[{lo:+.3f}, {hi:+.3f}]"


def signed(d):
    text = f"{d['difference']:+.3f} {interval(d)}"
    lo, hi = d["ci95"]
    return f"**{text}**" if lo > 0 or hi < 0 else text


def main(folders):
    runs = [json.loads((Path(f) / "metrics.json").read_text()) for f in folders]
    seeds = " | ".join(f"seed {m['seed']}" for m in runs)
    print(f"domain {runs[0]['domain']}, preset {runs[0]['preset']}\n")
    print(f"| best-of-32 | {seeds} |\n|---|{'---|' * len(runs)}")
    for method in BON:
        cells = []
        for m in runs:
            curve = next((c for c in m["bon"] if c["method"] == method), None)
            p = curve and next((p for p in curve["points"] if p["n"] == 32), None)
            cells.append(f"{p['accuracy']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}]" if p else "-")
        print(f"| {method} | {' | '.join(cells)} |")
    print(f"\n| paired, best-of-32 | {seeds} |\n|---|{'---|' * len(runs)}")
    for a, b in PAIRED:
        cells = []
        for m in runs:
            d = next((d for d in m["paired"] if d["a"] == a and d["b"] == b), None)
            cells.append(signed(d) if d else "-")
        print(f"| {a} − {b} | {' | '.join(cells)} |")
    if all("rl" in m for m in runs):
        print(f"\n| RL, accuracy after (paired) | {seeds} |\n|---|{'---|' * len(runs)}")
        for a, b in RL_PAIRED:
            cells = []
            for m in runs:
                d = next((d for d in m["rl"]["paired"] if d["a"] == a and d["b"] == b
                          and d["measure"].startswith("accuracy")), None)
                cells.append(signed(d) if d else "-")
            print(f"| {a} − {b} | {' | '.join(cells)} |")
        print(f"\n| RL reward | accuracy before → after, lucky-correct before → after ({seeds}) |\n|---|---|")
        for name in ["outcome", "orm", "prm_mc", "prm_oracle", "prime", "oracle"]:
            cells = []
            for m in runs:
                v = next(v for v in m["rl"]["variants"] if v["reward"] == name)
                cells.append(f"{v['accuracy_before']:.3f} → {v['accuracy_after']:.3f}, "
                             f"{100 * v['lucky_correct_before']:.1f}% → {100 * v['lucky_correct_after']:.1f}%")
            print(f"| {name} | {' / '.join(cells)} |")
    print("\n| | " + seeds + " |\n|---|" + "---|" * len(runs))
    rows = [
        ("policy accuracy", lambda m: f"{m['policy_accuracy']:.3f}"),
        ("lucky-correct (of correct answers)", lambda m: f"{100 * m['lucky_correct_rate']:.1f}%"),
        ("MC hard labels = oracle (steps)", lambda m: f"{m['mc_label_quality']['hard_accuracy']:.3f}"),
        ("PRM-MC ProcessBench F1", lambda m: f"{dict((k, v) for k, v in m['processbench'])['PRM-MC']['f1']:.3f}"),
    ]
    for name, cell in rows:
        print(f"| {name} | {' | '.join(cell(m) for m in runs)} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
