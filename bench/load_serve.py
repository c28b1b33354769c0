"""Load test of an OpenAI-compatible server (`stepwise serve`, vLLM): C concurrent clients send
completions for D seconds; reports errors, requests/s, generated tokens/s and latency p50/p99.
Needs `pip install openai`.

    python bench/load_serve.py http://127.0.0.1:8000 MODEL[,MODEL...] [--clients 64] [--seconds 60] [--max-tokens 32]
        [--logprobs K] [--json OUT]

With --logprobs K every completion asks for its tokens' log-probabilities and the K likeliest
(what an RL trainer's rollouts ask of vLLM); each reply is checked to hold one a token.

Several models (a base and LoRA adapters served on it, `stepwise serve --lora-modules`, vLLM's
`--enable-lora`): client k asks for model k mod their number.
"""
import argparse
import asyncio
import statistics
import time

from openai import AsyncOpenAI

PROMPTS = [f"What is {a} + {b}?\n" for a in range(3, 40, 3) for b in range(2, 30, 5)]


async def client(api, models, deadline, max_tokens, k, out, logprobs=None):
    model = models[k % len(models)]
    i = k
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        try:
            r = await api.completions.create(
                model=model, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens, temperature=0.8, seed=i,
                # Every completion runs to max_tokens, so each server generates the same work.
                extra_body={"ignore_eos": True, "min_tokens": max_tokens}, logprobs=logprobs,
            )
            if logprobs is not None and len(r.choices[0].logprobs.token_logprobs) != max_tokens:
                raise ValueError(f"{len(r.choices[0].logprobs.token_logprobs)} log-probabilities for {max_tokens} tokens")
            out["latency"].append(time.perf_counter() - t)
            out["tokens"] += r.usage.completion_tokens
        except Exception as e:  # counted, never hidden
            out["errors"].append(f"{type(e).__name__}: {e}"[:200])
        i += 7


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("model")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--warmup", type=float, default=0, help="seconds of load before the timed run")
    p.add_argument("--logprobs", type=int, help="ask for each token's log-probability and the K likeliest")
    p.add_argument("--json", help="append the figures to this JSON-lines file")
    a = p.parse_args()
    api = AsyncOpenAI(base_url=f"{a.url}/v1", api_key="none", max_retries=0, timeout=600)
    models = a.model.split(",")
    if a.warmup > 0:
        scratch = {"latency": [], "tokens": 0, "errors": []}
        deadline = time.perf_counter() + a.warmup
        await asyncio.gather(*(client(api, models, deadline, a.max_tokens, k, scratch, a.logprobs) for k in range(a.clients)))
    out = {"latency": [], "tokens": 0, "errors": []}
    start = time.perf_counter()
    deadline = start + a.seconds
    await asyncio.gather(*(client(api, models, deadline, a.max_tokens, k, out, a.logprobs) for k in range(a.clients)))
    wall = time.perf_counter() - start
    lat = sorted(out["latency"])
    q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] if lat else float("nan")
    print(
        f"{a.clients} clients, {wall:.0f} s: {len(lat)} requests, {len(out['errors'])} errors, "
        f"{len(lat) / wall:.1f} requests/s, {out['tokens'] / wall:.0f} generated tokens/s, "
        f"latency p50 {q(0.5):.3f} s p99 {q(0.99):.3f} s (mean {statistics.mean(lat) if lat else float('nan'):.3f})"
    )
    if a.json:
        import json
        row = {"models": models, "clients": a.clients, "logprobs": a.logprobs, "seconds": round(wall, 2), "requests": len(lat),
               "errors": len(out["errors"]), "tokens_per_s": round(out["tokens"] / wall, 1),
               "p50_s": round(q(0.5), 3), "p99_s": round(q(0.99), 3)}
        with open(a.json, "a") as f:
            f.write(json.dumps(row) + "\n")
    for e in sorted(set(out["errors"]))[:5]:
        print("  error:", e)
    # stepwise serve counts its decoding steps and the continuations they carried.
    try:
        import urllib.request
        text = urllib.request.urlopen(f"{a.url}/metrics", timeout=10).read().decode()
        got = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l.startswith("stepwise_decode_")}
        if got.get("stepwise_decode_steps_total"):
            print(f"  mean decoding batch: {got['stepwise_decode_rows_total'] / got['stepwise_decode_steps_total']:.1f} continuations")
    except Exception:
        pass


asyncio.run(main())
