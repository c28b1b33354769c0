"""Adapter loads of two `stepwise serve` builds, alternated on fresh idle servers
(`--allow-runtime-lora-updating`, vLLM's `/v1/load_lora_adapter`): a fresh server's first load,
four loads under new names kept served, six reloads in place (medians), and the resident memory
with the five adapters served; the builds' order swaps each round.

    python bench/lora_ab.py NEW_BINARY OLD_BINARY POLICY_DIR WORK [--rounds 3] [--json OUT]

WORK holds lora0 and lora1 (bench/write_loras.py POLICY_DIR WORK 16 2).
"""
import argparse
import json
import statistics
import subprocess
import time
import urllib.request

from lora_load import call


def one(binary, a):
    p = subprocess.Popen([binary, "serve", "--model", a.policy, "--allow-runtime-lora-updating", "--port", str(a.port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{a.port}"
    try:
        while True:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=1).read()
                break
            except OSError:
                if p.poll() is not None:
                    raise SystemExit(f"{binary} serve exited")
                time.sleep(0.3)

        def load(name, k, inplace=False):
            body = {"lora_name": name, "lora_path": f"{a.work}/lora{k}", "load_inplace": inplace}
            return call(url, "/v1/load_lora_adapter", body)

        first = load("x", 0)
        kept = [load(f"k{i}", i % 2) for i in range(4)]
        inplace = [load("x", (i + 1) % 2, True) for i in range(6)]
        status = open(f"/proc/{p.pid}/status").read().splitlines()
        rss = int(next(l for l in status if l.startswith("VmRSS")).split()[1]) // 1024
    finally:
        p.terminate()
        p.wait()
    return {"first_ms": round(first * 1000, 1), "new_kept_ms": round(statistics.median(kept) * 1000, 1),
            "inplace_ms": round(statistics.median(inplace) * 1000, 1), "rss_mib_5_adapters": rss}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("new")
    p.add_argument("old")
    p.add_argument("policy")
    p.add_argument("work")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--port", type=int, default=18440)
    p.add_argument("--json")
    a = p.parse_args()
    rows = []
    for rnd in range(a.rounds):
        for name in (["new", "old"] if rnd % 2 == 0 else ["old", "new"]):
            row = {"bin": name, "round": rnd, **one(getattr(a, name), a)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


main()
