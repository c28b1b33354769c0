"""Runtime LoRA updating on a served policy (vLLM's `/v1/load_lora_adapter`): how long a load
takes, idle and while clients generate, and what reloading costs the clients' tokens/s. The RL
loop that trains a LoRA and samples its rollouts from a server hands each new adapter over so.

    python bench/lora_load.py URL WORK [--loads 10] [--names 6] [--clients 16] [--seconds 60]
        [--every 5] [--max-tokens 32] [--json OUT]

WORK holds lora0 and lora1 (bench/write_loras.py). Phases: (1) `x` loaded from lora0, then
reloaded in place `--loads` times, alternating lora1 and lora0, then unloaded, then `--names`
loads under new names (as an RL loop that names each step's adapter anew loads them), each
unloaded after, each call timed on an idle server; (2) `x` loaded again, C clients generate from it (bench/load_serve.py) for
`--seconds`, first untouched, then with `x` reloaded in place every `--every` seconds. Prints one
JSON object (and writes it to --json).
"""
import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


def call(url, route, body):
    """POST `body` to `route`: seconds taken; raises on a status other than 200."""
    req = urllib.request.Request(url + route, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()
    return time.perf_counter() - t


def load(url, work, k, inplace, name="x"):
    return call(url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(work / f"lora{k}"), "load_inplace": inplace})


def clients(a, extra=None):
    """Tokens/s of C clients on `x` for a.seconds (bench/load_serve.py), `extra` run meanwhile."""
    out = Path(a.work) / "load.jsonl"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).with_name("load_serve.py")), a.url, "x", "--clients", str(a.clients),
           "--seconds", str(a.seconds), "--max-tokens", str(a.max_tokens), "--warmup", "3", "--json", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    stop = threading.Event()
    times = []
    if extra:
        threading.Thread(target=extra, args=(stop, times), daemon=True).start()
    proc.wait()
    stop.set()
    row = json.loads(out.read_text().splitlines()[-1])
    return row, times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("work")
    p.add_argument("--loads", type=int, default=10)
    p.add_argument("--names", type=int, default=6, help="loads under new names, each unloaded after")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--every", type=float, default=5)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--json")
    a = p.parse_args()
    work = Path(a.work)
    first = load(a.url, work, 0, False)
    again = [load(a.url, work, (i + 1) % 2, True) for i in range(a.loads)]
    unload = call(a.url, "/v1/unload_lora_adapter", {"lora_name": "x"})
    named = []
    for i in range(a.names):
        named.append(load(a.url, work, i % 2, False, f"step{i}"))
        call(a.url, "/v1/unload_lora_adapter", {"lora_name": f"step{i}"})
    load(a.url, work, 0, False)
    still, _ = clients(a)

    def reload(stop, times):
        time.sleep(3 + a.every)  # past load_serve's warm-up
        k = 1
        while not stop.wait(0):
            times.append(load(a.url, work, k, True))
            k ^= 1
            if stop.wait(a.every):
                break

    reloading, busy = clients(a, reload)
    doc = {
        "first_load_s": round(first, 3),
        "reload_in_place_s": {"median": round(statistics.median(again), 3), "max": round(max(again), 3), "n": len(again)},
        "unload_s": round(unload, 4),
        "new_name_s": {"median": round(statistics.median(named), 3), "max": round(max(named), 3), "n": len(named)}
        if named else None,
        "under_load": {
            "clients": a.clients, "seconds": a.seconds, "every_s": a.every,
            "tokens_per_s_still": still["tokens_per_s"], "tokens_per_s_reloading": reloading["tokens_per_s"],
            "p99_s_still": still["p99_s"], "p99_s_reloading": reloading["p99_s"],
            "errors": still["errors"] + reloading["errors"],
            "reload_s": {"median": round(statistics.median(busy), 3) if busy else None, "n": len(busy)},
        },
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
