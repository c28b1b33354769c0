#!/usr/bin/env python3
"""The lab's headline numbers over several run folders (one per seed), as the markdown tables in
docs/lab.md: best-of-32 with 95% intervals, the paired differences the issues set targets on,
RL (process against outcome rewards, lucky-correct before and after), label quality, and the
studio stage's selection policies (per seed, and pooled over the seeds: the paired best-of-32
difference over every seed's problems, a bootstrap resampling problems within each seed). For
agent runs, best-of-all trajectories (PRM-MC against the ORM) and the RL stage (each reward
source against outcome-only RL), per seed and pooled.

    python3 bench/lab_seeds.py runs/standard-code-seed1 runs/standard-code-seed2 runs/standard-code-seed3
"""

import json
import random
import sys
from collections import defaultdict
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
    if runs[0]["domain"] == "agent":
        agent_bon_section(folders, runs)
        return agent_rl_section(folders, runs)
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
    studio_section(folders, runs)


def best_of_n_correct(folder, verifier, n=32):
    """Each problem's best-of-n pick by `verifier`'s lowest step score (an empty solution scores
    0, as the lab's aggregation does): was it right? Tied picks count by their share of right
    answers (the lab breaks ties by a random order; this is its expectation)."""
    groups = defaultdict(list)
    with open(Path(folder) / "scored_eval.jsonl") as f:
        for line in f:
            r = json.loads(line)
            groups[r["problem_id"]].append(r)
    out = {}
    for pid, sols in groups.items():
        values = [min(s["scores"][verifier]) if s["scores"][verifier] else 0.0 for s in sols[:n]]
        top = [s for s, v in zip(sols, values) if v == max(values)]
        out[pid] = sum(1.0 for s in top if s.get("correct")) / len(top)
    return out


def pooled_difference(folders, a, b, resamples=4000, seed=0):
    """Mean paired difference a − b of best-of-32 over all seeds' problems (`pooled`)."""
    per_seed = []
    for folder in folders:
        ca, cb = best_of_n_correct(folder, a), best_of_n_correct(folder, b)
        per_seed.append([ca[p] - cb[p] for p in sorted(ca)])
    return pooled(per_seed, resamples, seed)


def pooled(per_seed, resamples=4000, seed=0):
    """Mean of every seed's paired differences (one list a seed, one entry a problem), with a
    95% bootstrap interval that resamples problems within each seed."""
    total = sum(len(d) for d in per_seed)
    mean = sum(sum(d) for d in per_seed) / total
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        acc = 0.0
        for d in per_seed:
            acc += sum(d[rng.randrange(len(d))] for _ in range(len(d)))
        means.append(acc / total)
    means.sort()
    return mean, means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1], total


def studio_section(folders, runs):
    if not all("studio" in m for m in runs):
        return
    seeds = " | ".join(f"seed {m['seed']}" for m in runs)
    print(f"\n| studio: best-of-32 (min), ProcessBench F1 | {seeds} |\n|---|{'---|' * len(runs)}")
    for k, arm in enumerate(runs[0]["studio"]["arms"]):
        cells = [f"{m['studio']['arms'][k]['bon']['32']:.3f}, {m['studio']['arms'][k]['processbench_f1']:.3f}"
                 for m in runs]
        print(f"| {arm['policy']} | {' | '.join(cells)} |")
    print(f"\n| studio, paired best-of-32 | {seeds} | pooled |\n|---|{'---|' * (len(runs) + 1)}")
    for d0 in runs[0]["studio"]["paired"]:
        cells = []
        for m in runs:
            d = next(d for d in m["studio"]["paired"] if d["a"] == d0["a"] and d["b"] == d0["b"])
            cells.append(signed(d))
        verifier = lambda name: "prm_studio_" + name.split("PRM-studio ")[1].split(" (")[0].replace("-", "_")
        mean, lo, hi, n = pooled_difference(folders, verifier(d0["a"]), verifier(d0["b"]))
        pooled = f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}] (n={n})"
        cells.append(f"**{pooled}**" if lo > 0 or hi < 0 else pooled)
        print(f"| {d0['a']} − {d0['b']} | {' | '.join(cells)} |")


def bad_on_the_way(t):
    """Whether the oracle saw an invalid or regressing action in the labelled trajectory `t`."""
    return any(k in ("invalid", "regress") for k in t["meta"]["actions"])


AGG = {"min": min, "mean": lambda xs: sum(xs) / len(xs), "last": lambda xs: xs[-1]}


def agent_best_of_all(folder):
    """Each held-out world's best-of-all pick (all its trajectories, the lab's largest N) by the
    ORM and by PRM-MC in each aggregation: was it a success, and a clean one (the oracle saw no
    invalid or regressing action)? Tied picks count by their share, the lab's expectation."""
    lucky = set()
    with open(Path(folder) / "oracle_eval.jsonl") as f:
        for line in f:
            o = json.loads(line)
            if o.get("correct") is True and bad_on_the_way(o):
                lucky.add(o["id"])
    groups = defaultdict(list)
    with open(Path(folder) / "trajectories_eval_scored.jsonl") as f:
        for line in f:
            t = json.loads(line)
            groups[t["problem_id"]].append(t)
    score = {"ORM": lambda t: (t["scores"]["orm"] or [0.0])[-1]}
    for prm in ("prm_mc", "prm_td"):
        for name, agg in AGG.items():
            score[f"{prm.upper().replace('_', '-')}-{name}"] = (
                lambda t, agg=agg, prm=prm: agg(t["scores"][prm]) if t["scores"][prm] else 0.0)
    out = {k: ({}, {}) for k in score}
    for pid, ts in groups.items():
        for k, f in score.items():
            values = [f(t) for t in ts]
            top = [t for t, v in zip(ts, values) if v == max(values)]
            won = [t.get("correct") is True for t in top]
            out[k][0][pid] = sum(won) / len(top)
            out[k][1][pid] = sum(w and t["id"] not in lucky for w, t in zip(won, top)) / len(top)
    return out


def agent_bon_section(folders, runs):
    """The agent lab's best-of-all (N = 32 in the standard preset): PRM-MC in each aggregation
    against the ORM per seed (the lab's own pairs) and pooled over the seeds' worlds."""
    seeds = " | ".join(f"seed {m['seed']}" for m in runs)
    picks = [agent_best_of_all(f) for f in folders]
    for m, p in zip(runs, picks):
        lab = next(pt["accuracy"] for c in m["bon"]["curves"] if c["method"] == "ORM" for pt in c["points"][-1:])
        mine = sum(p["ORM"][0].values()) / len(p["ORM"][0])
        if abs(lab - mine) > 1e-9:
            print(f"(seed {m['seed']}: ORM best-of-all {mine:.3f} here, {lab:.3f} in the lab)")
    print(f"| best-of-all − ORM (lab's pair; this script's where the lab has none) | {seeds} | pooled |"
          f"\n|---|{'---|' * (len(runs) + 1)}")
    for verifier in [k for k in picks[0] if k != "ORM"]:
        for i, what in ((0, "success"), (1, "clean success")):
            cells, per_seed = [], []
            for m, p in zip(runs, picks):
                a, b = p[verifier][i], p["ORM"][i]
                diffs = [a[k] - b[k] for k in sorted(a)]
                per_seed.append(diffs)
                d = next((d for d in m["bon"]["paired"] if d["a"] == verifier and d["b"] == "ORM"
                          and ("clean" in d["measure"]) == (i == 1)), None)
                cells.append(signed(d) if d else f"{sum(diffs) / len(diffs):+.3f}")
            mean, lo, hi, n = pooled(per_seed)
            text = f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}] (n={n})"
            cells.append(f"**{text}**" if lo > 0 or hi < 0 else text)
            print(f"| {verifier} − ORM, {what} | {' | '.join(cells)} |")
    print()


def agent_rl_world_rates(folder, source, runs=1):
    """Each held-out world's success and clean success (no invalid or regressing action on the
    way) after the agent lab's RL with `source`, from its oracle-labelled trajectories: over
    its `runs` RL seeds (folders `rl_<source>`, `rl_<source>-seed2`, …), as the lab pools them."""
    won, clean = defaultdict(list), defaultdict(list)
    dirs = [f"rl_{source}"] + [f"rl_{source}-seed{k}" for k in range(2, runs + 1)]
    for d in dirs:
        with open(Path(folder) / d / "eval_oracle.jsonl") as f:
            for line in f:
                t = json.loads(line)
                ok = t.get("correct") is True
                won[t["problem_id"]].append(ok)
                clean[t["problem_id"]].append(ok and not bad_on_the_way(t))
    rate = lambda d: {k: sum(v) / len(v) for k, v in d.items()}
    return rate(won), rate(clean)


def agent_rl_section(folders, runs):
    """The agent lab's RL stage: success after RL per seed, each source against outcome-only
    RL per seed (the lab's own intervals) and pooled over the seeds' held-out worlds."""
    seeds = " | ".join(f"seed {m['seed']}" for m in runs)
    sources = [v["reward"] for v in runs[0]["rl"]["variants"]]
    print(f"| after RL ({runs[0]['rl'].get('seeds', 1)} runs a source, {runs[0]['rl']['eval_samples']} episodes a world after each) | {seeds} |\n|---|{'---|' * len(runs)}")
    for name in sources:
        cells = []
        for m in runs:
            v = next(v for v in m["rl"]["variants"] if v["reward"] == name)
            by_run = " / ".join(f"{x:.3f}" for x in v.get("success_by_run", []))
            runs_note = f"; runs {by_run}" if len(v.get("success_by_run", [])) > 1 else ""
            cells.append(f"{v['success']:.3f} (clean {v['clean_success']:.3f}, lucky {100 * v['lucky_rate']:.0f}%{runs_note})")
        print(f"| {name} | {' | '.join(cells)} |")
    print(f"\n| − outcome | {seeds} | pooled |\n|---|{'---|' * (len(runs) + 1)}")
    for name in sources[1:]:
        for i, what in ((0, "success"), (1, "clean success")):
            cells, per_seed = [], []
            for folder, m in zip(folders, runs):
                d = next(d for d in m["rl"]["paired"] if d["a"] == name and d["measure"].startswith(what))
                cells.append(signed(d))
                n_runs = m["rl"].get("seeds", 1)
                a = agent_rl_world_rates(folder, name, n_runs)[i]
                b = agent_rl_world_rates(folder, "outcome", n_runs)[i]
                per_seed.append([a[k] - b[k] for k in sorted(a.keys() & b.keys())])
            mean, lo, hi, n = pooled(per_seed)
            text = f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}] (n={n})"
            cells.append(f"**{text}**" if lo > 0 or hi < 0 else text)
            print(f"| {name} − outcome, {what} | {' | '.join(cells)} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
