#!/usr/bin/env python3
"""stepwise.ray on this machine: records/s with 1 and 2 workers.

code     `stepwise.ray.run_tests`: HumanEval's canonical solutions (164, each twice: 328 programs)
         run against their tests in the sandbox, one program at a time a worker, shards of 32;
         CPU-bound, so 2 workers on the 2 cores should give close to 2x. For reference the same
         programs through `stepwise.run_tests` in one process with 1 and 2 threads (no Ray).
score    `stepwise.ray.score` of ProcessBench's GSM8K and MATH records (1400, four times: 5600) against a fleet of 8
         simulated H100-class PRM servers (crates/stepwise-remote/examples/simulated_fleet.rs,
         `/v1/score_steps`: a 7B PRM's prefill, one forward pass at a time, 5 ms plus the words at
         20000 tokens/s), shards of 64 and batches of 64 (a shard goes out as sixteen requests
         of four; an actor scores two shards at once, the default for servers), 1, 2 and 4
         actors of half a CPU each (scoring against servers is I/O); for reference
         `stepwise.PRM(servers).score_records` in one process. Each server's busy fraction (the
         share of time a forward pass runs) over the run comes from its `/stats`.

Each job runs on a local Ray instance (`ray.init(num_cpus=2)`); its time includes the actors'
start. Results go to --json (bench/results/ray.json).

Usage: python3 bench/ray_scale.py [--modes code,score] [--sim target/debug/examples/simulated_fleet]
       [--json bench/results/ray.json]
Needs: pip install ./python "ray[data]"
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray

import stepwise
import stepwise.ray as sray

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import http  # noqa: E402  (the simulated fleet's HTTP helper)

REPO = Path(__file__).resolve().parents[1]
HUMANEVAL = REPO / "data" / "humaneval" / "HumanEval.jsonl"


def code(tmp):
    problems = [json.loads(line) for line in HUMANEVAL.read_text().splitlines()]
    samples = [{"task_id": p["task_id"], "completion": p["canonical_solution"]} for p in problems] * 2
    path = tmp / "samples.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    out = {"programs": len(samples)}
    for threads in (1, 2):
        started = time.perf_counter()
        got = stepwise.run_tests(str(HUMANEVAL), samples, threads=threads)
        secs = time.perf_counter() - started
        assert sum(g["passed"] for g in got) == len(samples)
        out[f"in_process_{threads}_threads_records_per_s"] = round(len(samples) / secs, 1)
    for actors in (1, 2):
        summary = sray.run_tests(HUMANEVAL, path, tmp / f"runs-{actors}", actors=actors)
        assert sum(r["passed"] for r in sray.read(tmp / f"runs-{actors}")) == len(samples)
        out[f"ray_{actors}_workers_records_per_s"] = round(summary["records_per_s"], 1)
        out[f"ray_{actors}_workers_seconds"] = round(summary["seconds"], 2)
        print(f"code: {actors} worker(s): {summary['records_per_s']:.1f} programs/s", flush=True)
    out["speedup_2_over_1"] = round(out["ray_2_workers_records_per_s"] / out["ray_1_workers_records_per_s"], 2)
    return out


def score(tmp, sim):
    servers = tmp / "servers.txt"
    fleet = subprocess.Popen([sim, "--servers", "8", "--list", str(servers)], stderr=subprocess.PIPE, text=True)
    try:
        line = fleet.stderr.readline()
        urls = line.split("listening on ", 1)[1].strip().split(",")
        records = []
        for name in ("gsm8k", "math"):
            records += stepwise.read(REPO / "data" / "processbench" / f"{name}.json")
        records = [dict(r, id=f"{r['id']}-{k}") for k in range(4) for r in records]
        data = tmp / "records.parquet"
        stepwise.write(records, data)
        out = {"records": len(records), "servers": len(urls)}

        def busy():
            return [round(http(u + "/stats")["prefill_busy"], 3) for u in urls]

        def reset():
            for u in urls:
                http(u + "/stats/reset", {})

        reset()
        started = time.perf_counter()
        stepwise.PRM(str(servers)).score_records(records, batch_size=64)
        out["in_process_records_per_s"] = round(len(records) / (time.perf_counter() - started), 1)
        out["in_process_busy"] = busy()
        for actors in (1, 2, 4):
            reset()
            summary = sray.score(data, tmp / f"scored-{actors}", prm=str(servers), actors=actors, shard_size=64,
                                 batch_size=64, num_cpus=0.5)
            out[f"ray_{actors}_actors_records_per_s"] = round(summary["records_per_s"], 1)
            out[f"ray_{actors}_actors_busy"] = busy()
            print(f"score: {actors} actor(s): {summary['records_per_s']:.1f} records/s, busy {busy()}", flush=True)
        return out
    finally:
        fleet.terminate()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="code,score")
    ap.add_argument("--sim", default=str(REPO / "target" / "debug" / "examples" / "simulated_fleet"))
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "ray.json"))
    a = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    ray.data.DataContext.get_current().enable_progress_bars = False
    results = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "ray": ray.__version__, "stepwise": stepwise.__version__}}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if "code" in a.modes:
            results["code"] = code(tmp)
        if "score" in a.modes:
            results["score"] = score(tmp, a.sim)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
