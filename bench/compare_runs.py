"""Compare two lab run folders file by file: every JSON and JSONL record equal once timing
fields are set aside, every other file (weights, tokenizers) byte for byte; the studio's SQLite
databases, logs, plots and reports (which carry timings) are skipped. Used to check that a change
which should not change what the lab computes does not (docs/benchmarks.md).

    python3 bench/compare_runs.py runs/before runs/after [--only-json]
"""

import json
import sys
from pathlib import Path

# Fields that measure time or speed, not results.
TIMING = ("seconds", "elapsed", "wall", "per_second", "per_s", "tokens_per_s", "time", "_ms", "eta")


def timing(key: str) -> bool:
    k = key.lower()
    return any(t in k for t in TIMING)


def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if not timing(k)}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v


def records(path: Path):
    text = path.read_text()
    if path.suffix == ".json":
        return [strip(json.loads(text))]
    return [strip(json.loads(line)) for line in text.splitlines() if line.strip()]


def main() -> int:
    a, b = Path(sys.argv[1]), Path(sys.argv[2])
    only_json = "--only-json" in sys.argv
    names = sorted({p.relative_to(a) for p in a.rglob("*") if p.is_file()} | {p.relative_to(b) for p in b.rglob("*") if p.is_file()})
    same, differ, missing = 0, [], []
    for n in names:
        pa, pb = a / n, b / n
        if not (pa.exists() and pb.exists()):
            missing.append(str(n))
            continue
        if n.suffix in (".json", ".jsonl"):
            ok = records(pa) == records(pb)
        elif only_json or n.suffix in (".lock", ".log", ".png", ".svg", ".html", ".md", ".sqlite", ".sqlite-wal", ".sqlite-shm"):
            continue
        else:
            ok = pa.read_bytes() == pb.read_bytes()
        if ok:
            same += 1
        else:
            differ.append(str(n))
    print(f"{same} files equal; {len(differ)} differ; {len(missing)} in one folder only")
    for n in differ:
        print("differs:", n)
    for n in missing:
        print("only in one:", n)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
