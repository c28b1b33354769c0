"""Generation throughput for bench/gpu_check.sh: 64 concurrent requests of 256 new tokens each
(sampled at temperature 0.8, every one run to its full length), in one of two ways:

    python bench/gpu_generation.py hf MODEL_DIR [--requests 64] [--tokens 256] [--batch-sizes 32,64]
        transformers' batched `generate` in bf16 with sdpa, the prompts in batches of each size
        (left-padded), each size warmed up on a whole batch of its shape run to full length and
        timed on all the requests; the figures are the fastest size's, every size's in `sweep`;
    python bench/gpu_generation.py serve URL MODEL_NAME [--requests 64] [--tokens 256]
        `stepwise serve` (or any OpenAI-compatible server) with that many clients at once,
        standard library only (urllib and threads).

Prints and writes (--out) generated tokens, seconds and tokens/s as JSON.
"""
import argparse
import json
import threading
import time
import urllib.request

PROMPTS = [f"What is {a} + {b}?\n" for a in range(3, 60, 3) for b in range(2, 40, 5)]

p = argparse.ArgumentParser()
p.add_argument("mode", choices=["hf", "serve"])
p.add_argument("target")
p.add_argument("model", nargs="?")
p.add_argument("--requests", type=int, default=64)
p.add_argument("--tokens", type=int, default=256)
p.add_argument("--out")
p.add_argument("--device", default="cuda", help="hf: cuda (the comparison) or cpu (a dry run of the script)")
p.add_argument("--batch-sizes", default="",
               help="hf: requests per generate call, comma-separated (default: all the requests in one)")
a = p.parse_args()
prompts = [PROMPTS[i % len(PROMPTS)] for i in range(a.requests)]

if a.mode == "hf":
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gpu_timing import timed

    tok = AutoTokenizer.from_pretrained(a.target)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or "<|endoftext|>"
    model = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.bfloat16, attn_implementation="sdpa").to(a.device).eval()
    gpu = a.device.startswith("cuda")
    kw = dict(max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=True, temperature=0.8, pad_token_id=tok.pad_token_id)

    def generate(chunk):
        """New tokens generated for the prompts `chunk`, every one run to full length."""
        batch = tok(chunk, return_tensors="pt", padding=True).to(a.device)
        out = model.generate(**batch, **kw)
        return (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]

    sizes = [int(b) for b in a.batch_sizes.split(",") if b.strip()] or [a.requests]
    sweep, best = [], None
    for size in sizes:
        chunks = [prompts[i:i + size] for i in range(0, len(prompts), size)]
        entry = {"batch_size": size}
        try:
            with torch.inference_mode():
                entry["warmup_seconds"], _ = timed(lambda: generate(chunks[0]), gpu)
                if gpu:
                    torch.cuda.reset_peak_memory_stats()
                secs, tokens = timed(lambda: sum(generate(c) for c in chunks), gpu)
        except torch.cuda.OutOfMemoryError as e:
            entry["error"] = f"out of memory: {e}"[:300]
            sweep.append(entry)
            torch.cuda.empty_cache()
            continue
        entry.update(tokens=tokens, seconds=secs, tokens_per_s=tokens / secs,
                     peak_gib=torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0)
        sweep.append(entry)
        print(f"  batches of {size}: warm-up {entry['warmup_seconds']:.2f}s, {tokens} tokens in {secs:.2f}s", flush=True)
        if best is None or entry["tokens_per_s"] > best["tokens_per_s"]:
            best = entry
    if best is None:
        raise SystemExit("transformers: every batch size ran out of memory: " + json.dumps(sweep))
    result = {"engine": "transformers " + __import__("transformers").__version__ + ", torch " + torch.__version__,
              "tokens": best["tokens"], "seconds": best["seconds"], "tokens_per_s": best["tokens_per_s"],
              "peak_gib": best["peak_gib"], "batch_size": best["batch_size"],
              "warmup": "a whole batch of each size, run to full length", "sweep": sweep}
else:
    url = a.target.rstrip("/") + "/v1/completions"
    counts, errors = [0] * a.requests, []

    def one(i):
        body = json.dumps({"model": a.model, "prompt": prompts[i], "max_tokens": a.tokens, "temperature": 0.8,
                           "seed": i, "ignore_eos": True}).encode()
        req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                counts[i] = json.load(r)["usage"]["completion_tokens"]
        except Exception as e:  # counted, never hidden
            errors.append(f"{type(e).__name__}: {e}"[:300])

    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(a.requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - start
    result = {"engine": "stepwise serve", "tokens": sum(counts), "seconds": secs,
              "tokens_per_s": sum(counts) / secs, "errors": errors[:5], "failed": len(errors)}

print(json.dumps(result))
if a.out:
    open(a.out, "w").write(json.dumps(result))
