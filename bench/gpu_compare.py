"""Compares two scorings of the same records (bench/gpu_check.sh): each file is stepwise's scored
JSONL (`scores.prm` per record) or bench/gpu_transformers.py's JSON (`scores` by id). Prints and
returns as JSON: records compared, the largest step-score difference, and how often the first
error (the first step scored under 0.5, or none) is the same.

    python bench/gpu_compare.py A B [NAME]
"""
import json
import sys
from pathlib import Path


def load(path):
    p = Path(path)
    if p.suffix == ".jsonl":
        out = {}
        for line in p.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out[r["id"]] = r["scores"]["prm"]
        return out
    return json.loads(p.read_text())["scores"]


def first_error(scores):
    return next((i for i, s in enumerate(scores) if s < 0.5), -1)


def compare(a, b):
    common = [k for k in a if k in b]
    steps_differ = sum(len(a[k]) != len(b[k]) for k in common)
    diffs = [abs(x - y) for k in common if len(a[k]) == len(b[k]) for x, y in zip(a[k], b[k])]
    same_first = sum(first_error(a[k]) == first_error(b[k]) for k in common)
    return {
        "records": len(common),
        "missing": len(set(a) ^ set(b)),
        "step_counts_differ": steps_differ,
        "max_abs_diff": max(diffs, default=float("nan")),
        "mean_abs_diff": sum(diffs) / len(diffs) if diffs else float("nan"),
        "same_first_error": same_first / max(len(common), 1),
    }


if __name__ == "__main__":
    result = compare(load(sys.argv[1]), load(sys.argv[2]))
    name = sys.argv[3] if len(sys.argv) > 3 else f"{sys.argv[1]} vs {sys.argv[2]}"
    print(f"{name}: {result['records']} records, max |diff| {result['max_abs_diff']:.4f}, "
          f"mean {result['mean_abs_diff']:.5f}, same first error {100 * result['same_first_error']:.1f}%"
          + (f", {result['missing']} missing" if result["missing"] else "")
          + (f", {result['step_counts_differ']} with other step counts" if result["step_counts_differ"] else ""))
    print(json.dumps(result))
