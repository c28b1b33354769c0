"""Streaming latency of an OpenAI-compatible server (`stepwise serve`, vLLM): C concurrent
clients stream completions for D seconds; reports the time to the first text chunk (TTFT), the
time between chunks, and the whole reply's time, p50 and p99. With `--prompts K`, each request
is a list of K prompts (OpenAI's completions take one), and `all_first` is the time until every
one of them has had text. Needs `pip install openai`.

    python bench/stream_ttft.py URL MODEL [--clients 1] [--seconds 30] [--max-tokens 128] [--prompts 1] [--json OUT]
"""
import argparse
import asyncio
import json
import time

from openai import AsyncOpenAI

PROMPTS = [f"What is {a} + {b}?\n" for a in range(3, 40, 3) for b in range(2, 30, 5)]


async def client(api, a, deadline, k, out):
    i = k
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        first, every, last, gaps, chunks, started = None, None, t, [], 0, set()
        prompt = [PROMPTS[(i + j) % len(PROMPTS)] for j in range(a.prompts)]
        try:
            stream = await api.completions.create(
                model=a.model, prompt=prompt[0] if a.prompts == 1 else prompt, max_tokens=a.max_tokens,
                temperature=0.8, seed=i, stream=True, extra_body={"ignore_eos": True, "min_tokens": a.max_tokens},
            )
            async for chunk in stream:
                texts = [c for c in chunk.choices if c.text]
                if texts:
                    now = time.perf_counter()
                    if first is None:
                        first = now - t
                    else:
                        gaps.append(now - last)
                    last, chunks = now, chunks + 1
                    started.update(c.index for c in texts)
                    if every is None and len(started) == a.prompts:
                        every = now - t
            out["ttft"].append(first)
            out["all_first"].append(every)
            out["total"].append(time.perf_counter() - t)
            out["gaps"].extend(gaps)
            out["chunks"].append(chunks)
        except Exception as e:  # counted, never hidden
            out["errors"].append(f"{type(e).__name__}: {e}"[:200])
        i += 7


def q(xs, f):
    xs = sorted(x for x in xs if x is not None)
    return round(xs[min(len(xs) - 1, int(f * len(xs)))], 4) if xs else None


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("model")
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=1, help="prompts a request (a list of K)")
    p.add_argument("--json")
    a = p.parse_args()
    api = AsyncOpenAI(base_url=f"{a.url}/v1", api_key="none", max_retries=0, timeout=600)
    warm = {"ttft": [], "total": [], "gaps": [], "chunks": [], "errors": [], "all_first": []}
    await client(api, a, time.perf_counter() + 1e-9, 0, warm)  # one request first: warm-up
    out = {"ttft": [], "total": [], "gaps": [], "chunks": [], "errors": [], "all_first": []}
    deadline = time.perf_counter() + a.seconds
    await asyncio.gather(*(client(api, a, deadline, k, out) for k in range(a.clients)))
    row = {"clients": a.clients, "max_tokens": a.max_tokens, "prompts": a.prompts, "requests": len(out["total"]), "errors": len(out["errors"]),
           "ttft_p50_s": q(out["ttft"], 0.5), "ttft_p99_s": q(out["ttft"], 0.99),
           "all_first_p50_s": q(out["all_first"], 0.5),
           "between_chunks_p50_s": q(out["gaps"], 0.5), "between_chunks_p99_s": q(out["gaps"], 0.99),
           "total_p50_s": q(out["total"], 0.5), "chunks_p50": q(out["chunks"], 0.5)}
    print(json.dumps(row))
    for e in sorted(set(out["errors"]))[:5]:
        print("  error:", e)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(row) + "\n")


asyncio.run(main())
