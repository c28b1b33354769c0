"""stepwise.grade against math-verify (PyPI), side by side on the same 5,000 answer pairs, in one
process on one machine: throughput of each, and how often they agree.

    pip install ./python math-verify && python bench/grade_vs_math_verify.py [N]

The pairs come from the public data in data/ (nothing is made up by hand):
- GSM8K: the final answers of real model solutions (`example_model_solutions`, "A: N") against the
  gold `#### N` answer;
- MATH-500: every gold answer against itself, against the next problem's answer, and in the forms
  solutions write it (\\boxed{}, $...$, \\dfrac for \\frac, spacing, a trailing period).
math-verify parses both sides as its documentation shows (LaTeX inside `$...$` unless already
boxed or delimited; then `verify(gold, answer)`); stepwise grades the bare strings in its lenient
mode, a list at a time (the GIL released, every core), and one pair per call.
"""
import json
import sys
import time
from pathlib import Path

import stepwise

SHARED = Path(__file__).resolve().parents[1] / "data"


def pairs(n):
    out = []
    gsm_gold = {}
    for line in (SHARED / "gsm8k" / "test.jsonl").read_text().splitlines():
        r = json.loads(line)
        gsm_gold[r["question"]] = r["answer"].split("####")[-1].strip()
    for line in (SHARED / "gsm8k" / "example_model_solutions.first300.jsonl").read_text().splitlines():
        r = json.loads(line)
        gold = gsm_gold[r["question"]]
        for key in ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"):
            sol = r.get(key, {}).get("solution", "")
            answer = sol.rsplit("A:", 1)[-1].strip() if "A:" in sol else sol.strip().split("\n")[-1]
            out.append(("gsm8k model answer", answer, gold))
    math = [json.loads(l)["answer"] for l in (SHARED / "math500" / "test.jsonl").read_text().splitlines()]
    forms = [
        ("itself", lambda a: a),
        ("boxed", lambda a: f"\\boxed{{{a}}}"),
        ("dollars", lambda a: f"${a}$"),
        ("dfrac", lambda a: a.replace("\\frac", "\\dfrac")),
        ("spaced", lambda a: a.replace(",", ", ").replace("+", " + ")),
        ("period", lambda a: a + "."),
        ("x =", lambda a: f"x = {a}"),
    ]
    for i, a in enumerate(math):
        for name, f in forms:
            out.append((f"math500 {name}", f(a), a))
        out.append(("math500 other answer", math[(i + 1) % len(math)], a))
    return out[:n]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    data = pairs(n)
    given = [g for _, g, _ in data]
    gold = [t for _, _, t in data]
    print(f"{len(data)} pairs")

    from math_verify import parse, verify

    def latex(x):
        return x if "$" in x or "\\boxed" in x else f"${x}$"

    start = time.perf_counter()
    mv = []
    for g, t in zip(given, gold):
        try:
            mv.append(bool(verify(parse(latex(t)), parse(latex(g)))))
        except Exception:
            mv.append(False)
    mv_secs = time.perf_counter() - start

    start = time.perf_counter()
    sw_list = stepwise.grade(given, gold)
    list_secs = time.perf_counter() - start
    start = time.perf_counter()
    sw_one = [stepwise.grade(g, t) for g, t in zip(given, gold)]
    one_secs = time.perf_counter() - start
    assert sw_one == sw_list

    agree = sum(a == b for a, b in zip(mv, sw_list))
    print(f"math-verify {mv_secs:.2f}s ({len(data) / mv_secs:,.0f} pairs/s)")
    print(f"stepwise.grade, one list: {list_secs:.3f}s ({len(data) / list_secs:,.0f} pairs/s): "
          f"{mv_secs / list_secs:.0f}x math-verify")
    print(f"stepwise.grade, a call per pair: {one_secs:.3f}s ({len(data) / one_secs:,.0f} pairs/s): "
          f"{mv_secs / one_secs:.0f}x math-verify")
    print(f"agreement {agree}/{len(data)} ({100 * agree / len(data):.1f}%); "
          f"stepwise says equal {sum(sw_list)}, math-verify {sum(mv)}")
    by_kind = {}
    for (kind, g, t), a, b in zip(data, mv, sw_list):
        k = by_kind.setdefault(kind, [0, 0, []])
        k[0] += 1
        k[1] += a == b
        if a != b and len(k[2]) < 3:
            k[2].append((g, t, "math-verify", a, "stepwise", b))
    for kind, (count, same, examples) in sorted(by_kind.items()):
        print(f"  {kind:<22} {same}/{count} agree" + (f"; e.g. {examples}" if examples else ""))


if __name__ == "__main__":
    main()
