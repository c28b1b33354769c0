"""Sums Nsight Compute's per-launch kernel durations by kernel: where a run's GPU time goes.

    ncu --metrics gpu__time_duration.sum --csv --page raw --print-units base PROGRAM ... > LOG
    python3 bench/ncu_summary.py LOG [--top 25]

LOG may hold the program's own output around ncu's CSV (bench/gpu_check.sh's training profile
writes both to one file): the CSV starts at the header row that names "Kernel Name", and its
rows are the lines after it that start with a quote. A units row (ncu writes one under the
header) scales the duration to milliseconds. Prints each kernel's launches, total milliseconds
and share of the whole, longest first, then the total; names are cut at their argument list
(cuBLAS's long template names are kept to 70 characters).
"""
import argparse
import csv
import sys
from collections import defaultdict

METRIC = "gpu__time_duration.sum"
TO_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}


def rows_of(path):
    """The CSV's header and rows (lists of fields) from a log that may hold other lines."""
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"') and '"Kernel Name"' in l), None)
    if start is None:
        sys.exit(f"{path}: no ncu CSV header (a row naming \"Kernel Name\") found")
    body = [lines[start]] + [l for l in lines[start + 1:] if l.startswith('"')]
    table = list(csv.reader(body))
    return table[0], table[1:]


def summarise(path):
    header, rows = rows_of(path)
    if METRIC not in header:
        sys.exit(f"{path}: the CSV has no {METRIC} column (ncu --metrics {METRIC})")
    name_col, time_col = header.index("Kernel Name"), header.index(METRIC)
    scale = 1e-6  # --print-units base: nanoseconds
    if rows and rows[0][time_col].strip() in TO_MS:  # the units row
        scale = TO_MS[rows[0][time_col].strip()]
        rows = rows[1:]
    totals, counts = defaultdict(float), defaultdict(int)
    for n, r in enumerate(rows):
        if len(r) <= max(name_col, time_col):
            continue
        try:
            ms = float(r[time_col].replace(",", "")) * scale
        except ValueError:
            sys.exit(f"{path}: CSV row {n + 1}: {METRIC} is {r[time_col]!r}, not a number")
        name = r[name_col].split("(")[0].strip()[:70] or r[name_col][:70]
        totals[name] += ms
        counts[name] += 1
    return totals, counts


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    totals, counts = summarise(a.log)
    whole = sum(totals.values())
    print(f"{'kernel':<70} {'launches':>8} {'ms':>10} {'share':>6}")
    for name in sorted(totals, key=totals.get, reverse=True)[: a.top]:
        print(f"{name:<70} {counts[name]:>8} {totals[name]:>10.2f} {100 * totals[name] / max(whole, 1e-12):>5.1f}%")
    print(f"{'all ' + str(len(totals)) + ' kernels':<70} {sum(counts.values()):>8} {whole:>10.2f} 100.0%")


if __name__ == "__main__":
    main()
