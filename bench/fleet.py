#!/usr/bin/env python3
"""One driver against a fleet of simulated H100-class policy servers: does it keep them busy, and
what does it cost?

For each fleet size N, starts N simulated servers (crates/stepwise-remote/examples/simulated_fleet.rs:
each decodes up to 64 sequences at once at 50 tokens/s each after a 40 ms first token, as vLLM
serving a 7B policy on an H100 does at that batch), writes their URLs to a file, and runs one
`stepwise` process against that file:

  generate     stepwise generate --model servers.txt -n 8 --max-in-flight 8
  annotate     stepwise annotate --method mc --policy servers.txt --rollouts 8 --threads 8N
  score        stepwise score --model servers.txt --batch-size 64, ProcessBench's GSM8K and MATH
               solutions over and over, against the servers' PRM route (`/v1/score_steps`: a 7B
               PRM's prefill, one forward pass at a time, 5 ms plus the words at 20,000 tokens/s)

After a warm-up it measures, over a window: requests/s and sequences/s the fleet answered, each
server's busy fraction (the time-average of min(sequences running, 64) / 64; for `score`, the
share of the time a forward pass runs), and the driver's CPU time (utime + stime from /proc) per
request and in all (cores used).

Usage: python3 bench/fleet.py [--sizes 1,8,64,256] [--modes generate,annotate,score] [--window 20]
       [--stepwise target/release/stepwise] [--sim target/release/examples/simulated_fleet]
       [--json bench/results/fleet.json]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

CAPACITY, TOKENS_PER_SECOND, FIRST_TOKEN_MS, MEAN_TOKENS, N_PER_REQUEST = 64, 50.0, 40.0, 120, 8


def http(url, body=None):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_fleet(sim, n, d):
    servers = os.path.join(d, "servers.txt")
    proc = subprocess.Popen([sim, "--servers", str(n), "--capacity", str(CAPACITY), "--tokens-per-second",
                             str(TOKENS_PER_SECOND), "--first-token-ms", str(FIRST_TOKEN_MS), "--mean-tokens",
                             str(MEAN_TOKENS), "--list", servers], stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    if "listening on" not in line:
        raise SystemExit(f"the simulated fleet did not start: {line}")
    urls = line.split("listening on ", 1)[1].strip().split(",")
    return proc, servers, urls


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def processbench(count):
    """ProcessBench's GSM8K and MATH solutions, over and over, `count` of them (ids made unique)."""
    base = []
    for name in ("gsm8k", "math"):
        with open(os.path.join(REPO, "data", "processbench", f"{name}.json")) as f:
            base += json.load(f)
    return [dict(base[i % len(base)], id=f"{base[i % len(base)]['id']}-{i}") for i in range(count)]


def inputs(d, mode, count):
    path = os.path.join(d, f"{mode}-input.jsonl")
    with open(path, "w") as f:
        if mode == "score":
            for r in processbench(count):
                f.write(json.dumps(r) + "\n")
            return path
        for i in range(count):
            if mode == "generate":
                f.write(json.dumps({"id": f"p{i}", "question": f"What is {i} + 7?", "answer": str(i + 7)}) + "\n")
            else:
                steps = [{"text": f"Step {k}: {i} + {k} = {i + k}"} for k in range(1, 4)] + [{"text": "The answer is 7"}]
                f.write(json.dumps({"id": f"s{i}", "problem_id": f"p{i}", "question": f"What is {i} + 7?",
                                    "gold_answer": "7", "steps": steps}) + "\n")
    return path


def driver(stepwise, mode, servers, n, inp, out):
    common = ["--max-in-flight", str(CAPACITY // N_PER_REQUEST), "--max-tokens", "400", "--input", inp, "--output", out]
    if mode == "score":
        cmd = [stepwise, "score", "--model", servers, "--batch-size", "64", "--input", inp, "--output", out]
    elif mode == "generate":
        cmd = [stepwise, "generate", "--model", servers, "-n", str(N_PER_REQUEST)] + common
    else:
        cmd = [stepwise, "annotate", "--method", "mc", "--policy", servers, "--rollouts", str(N_PER_REQUEST),
               "--threads", str(n * CAPACITY // N_PER_REQUEST)] + common
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def measure(args, mode, n):
    # A request holds its n slots until its longest sequence ends: the longest of n lengths drawn
    # uniformly from [m/2, 3m/2) is m/2 + m n / (n + 1) on average.
    longest = MEAN_TOKENS / 2 + MEAN_TOKENS * N_PER_REQUEST / (N_PER_REQUEST + 1)
    latency = FIRST_TOKEN_MS / 1e3 + longest / TOKENS_PER_SECOND
    ideal_rps = n * CAPACITY / N_PER_REQUEST / latency
    # Enough work that the driver is still busy at the end of the window.
    count = int(ideal_rps * (args.warmup + args.window) * 1.5 / (1 if mode == "generate" else 4)) + 64
    if mode == "score":
        # A server scores ~20,000 words/s; ProcessBench's solutions have ~250 words.
        ideal_rps = None
        count = int(n * 20000 / 150 * (args.warmup + args.window) * 1.5)
    with tempfile.TemporaryDirectory() as d:
        sim, servers, urls = start_fleet(args.sim, n, d)
        try:
            proc = driver(args.stepwise, mode, servers, n, inputs(d, mode, count), os.path.join(d, "out.jsonl"))
            time.sleep(args.warmup)
            if proc.poll() is not None:
                raise SystemExit(f"{mode} ended early: {proc.stderr.read()}")
            for u in urls:
                http(u + "/stats/reset", {})
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(args.window)
            cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
            stats = [http(u + "/stats") for u in urls]
            still = proc.poll() is None
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finally:
            sim.send_signal(signal.SIGKILL)
            sim.wait()
    secs = t1 - t0
    requests = sum(s["requests"] for s in stats)
    busy = [s["prefill_busy" if mode == "score" else "busy"] for s in stats]
    return {
        "mode": mode,
        "servers": n,
        "window_s": round(secs, 1),
        "driver_ran_through_window": still,
        "requests_per_s": round(requests / secs, 1),
        "sequences_per_s": round(sum(s["sequences"] for s in stats) / secs, 1),
        "ideal_requests_per_s": ideal_rps and round(ideal_rps, 1),
        "busy_mean": round(sum(busy) / len(busy), 4),
        "busy_min": round(min(busy), 4),
        "driver_cores": round((cpu1 - cpu0) / secs, 3),
        "driver_cpu_ms_per_request": round(1e3 * (cpu1 - cpu0) / max(requests, 1), 3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,8,64,256")
    ap.add_argument("--modes", default="generate,annotate")
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--stepwise", default="target/release/stepwise")
    ap.add_argument("--sim", default="target/release/examples/simulated_fleet")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for mode in args.modes.split(","):
        for n in [int(x) for x in args.sizes.split(",")]:
            row = measure(args, mode, n)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| mode | servers | requests/s (ideal) | sequences/s | busy mean (min) | driver cores | driver CPU per request |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['servers']} | {r['requests_per_s']} ({r['ideal_requests_per_s'] or '-'}) | "
              f"{r['sequences_per_s']} | {100 * r['busy_mean']:.1f}% ({100 * r['busy_min']:.1f}%) | "
              f"{r['driver_cores']} | {r['driver_cpu_ms_per_request']} ms |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": os.uname().nodename, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
