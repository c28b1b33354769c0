"""The peer of `stepwise score --device cuda` in bench/gpu_check.sh: transformers in bf16 with
sdpa attention scoring ProcessBench records with a Qwen2.5-Math-PRM-layout checkpoint, as its
model card does (chat template, steps joined by <extra_0>, softmax class 1 of the score MLP at
each <extra_0>), on the GPU, batched by length (sorted, then padded batches of at most
--max-batch-tokens tokens).

    python bench/gpu_transformers.py MODEL_DIR PROCESSBENCH.json OUT.json [--max-batch-tokens 16384,32768,65536]

The peer at its best: each token budget is warmed up on a whole pass over the data (every batch
shape it will meet: cuBLAS and sdpa choose their kernels by shape, and the first pass pays for
that) and timed on the next. Several budgets, comma-separated, are each run that way; the
result's figures are the fastest budget's, every budget's (and its warm-up pass's seconds) are in
`sweep` (OUT.json is written after each budget: a run cut off keeps those it finished; `budgets_asked` says which were meant). `--warmup one` warms up on one record only, as the first GPU check did (its figures are
superseded: docs/benchmarks.md).

Writes tokens, seconds, tokens/s, peak GPU memory and every record's step scores (by id, from the
fastest budget's timed pass) to OUT.json. Needs torch, transformers and safetensors (the GPU
machine has them); never in tests.
"""
import argparse
import json
from pathlib import Path

import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoModel, AutoTokenizer

from gpu_timing import timed

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("data")
p.add_argument("out")
p.add_argument("--max-batch-tokens", default="16384",
               help="a token budget per padded batch, or several comma-separated, each timed after a whole warm-up pass")
p.add_argument("--warmup", choices=["pass", "one"], default="pass",
               help="pass: a whole untimed pass over the data first (the default); one: one record (the old set-up)")
p.add_argument("--device", default="cuda", help="cuda (the comparison) or cpu (a dry run of the script)")
p.add_argument("--limit", type=int, help="score only the first N records (a dry run, or a float32 reference)")
p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
               help="float32: a reference for both bf16 engines (true float32 products, no TF32)")
a = p.parse_args()
dev = torch.device(a.device)
gpu = dev.type == "cuda"
model_dir = Path(a.model)

tok = AutoTokenizer.from_pretrained(model_dir)
# Token ids from the checkpoint's tokenizer.json, as transformers 4, vLLM and stepwise read it:
# transformers 5 rebuilds some tokenizers (Qwen2's among them) from the vocabulary and merges
# with its own pre-tokenizer, which splits some numbers differently (" 18" as "Ġ", "18" where the
# file says "Ġ18"): the two engines would then score different inputs.
fast = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
step_id = fast.token_to_id("<extra_0>")
records = json.loads(Path(a.data).read_text())[: a.limit]
encoded = []
for r in records:
    head = tok.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["problem"]}],
        tokenize=False, add_generation_prompt=True)
    text = head + "".join(s + "<extra_0>" for s in r["steps"]) + "<|im_end|><|endoftext|>"
    encoded.append((r["id"], fast.encode(text).ids))

dtype = getattr(torch, a.dtype)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
body = AutoModel.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(dev).eval()
h = body.config.hidden_size
files = sorted(model_dir.glob("*.safetensors"))
head_weights = {}
for f in files:
    with safe_open(f, "pt") as st:
        for k in st.keys():
            if k.startswith("score."):
                head_weights[k[len("score."):]] = st.get_tensor(k)
score = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 2))
score.load_state_dict(head_weights)
score = score.to(dtype).to(dev).eval()


def batches_of(budget):
    """Batches by length: longest first, each padded to its longest, at most `budget` tokens."""
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i][1]))
    out, cur = [], []
    for i in order:
        longest = len(encoded[cur[0]][1]) if cur else len(encoded[i][1])
        if cur and longest * (len(cur) + 1) > budget:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


pad = fast.token_to_id("<|endoftext|>") or 0


def run(batch):
    seqs = [encoded[i][1] for i in batch]
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    for k, s in enumerate(seqs):
        ids[k, :len(s)] = torch.tensor(s)
        mask[k, :len(s)] = 1
    ids, mask = ids.to(dev, non_blocking=True), mask.to(dev, non_blocking=True)
    hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state
    at = ids == step_id
    probs = torch.softmax(score(hidden[at]).float(), dim=-1)[:, 1]
    counts = at.sum(dim=1).tolist()
    return probs.split(counts)


budgets = [int(b) for b in str(a.max_batch_tokens).split(",") if b.strip()]
tokens = sum(len(s) for _, s in encoded)
sweep, best, scores = [], None, {}


def write_result():
    """OUT.json from the budgets timed so far: written after each, so that a run cut off by its
    time limit keeps the budgets it finished."""
    result = {
        "engine": "transformers " + __import__("transformers").__version__ + ", torch " + torch.__version__ + ", " + a.dtype,
        "records": len(encoded),
        "tokens": tokens,
        "seconds": best["seconds"],
        "tokens_per_s": tokens / best["seconds"],
        "peak_gib": best["peak_gib"],
        "batches": best["batches"],
        "max_batch_tokens": best["max_batch_tokens"],
        "warmup": "on a whole pass" if a.warmup == "pass" else "on one record",
        "budgets_asked": budgets,
        "sweep": [dict(e, tokens_per_s=tokens / e["seconds"]) if "seconds" in e else e for e in sweep],
        "scores": scores,
    }
    Path(a.out).write_text(json.dumps(result))
    return result


for budget in budgets:
    batches = batches_of(budget)
    entry = {"max_batch_tokens": budget, "batches": len(batches)}
    try:
        with torch.inference_mode():
            if a.warmup == "pass":
                entry["warmup_seconds"], _ = timed(lambda: [run(b) for b in batches], gpu)
            else:
                entry["warmup_seconds"], _ = timed(lambda: run(batches[-1][:1]), gpu)
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            secs, outs = timed(lambda: [(b, run(b)) for b in batches], gpu)
    except torch.cuda.OutOfMemoryError as e:
        entry["error"] = f"out of memory: {e}"[:300]
        sweep.append(entry)
        print(f"transformers at {budget} tokens a batch: out of memory")
        torch.cuda.empty_cache()
        continue
    entry.update(seconds=secs, peak_gib=torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0)
    sweep.append(entry)
    print(f"  {budget} tokens a batch: {len(batches)} batches, warm-up {entry['warmup_seconds']:.2f}s, timed {secs:.2f}s")
    if best is None or secs < best["seconds"]:
        best = entry
        scores = {encoded[i][0]: pr.tolist() for b, probs in outs for i, pr in zip(b, probs)}
    del outs
    write_result()
if best is None:
    raise SystemExit("transformers: every token budget ran out of memory: " + json.dumps(sweep))
result = write_result()
print(f"transformers: {len(encoded)} records, {tokens} tokens in {best['seconds']:.2f}s: "
      f"{tokens / best['seconds']:.0f} tokens/s at {best['max_batch_tokens']} tokens a batch (the best of "
      f"{len(budgets)}, each timed after a warm-up {result['warmup']}), peak {result['peak_gib']:.1f} GiB")
