"""The peer of `stepwise score --device cuda` in bench/gpu_check.sh: transformers in bf16 with
sdpa attention scoring ProcessBench records with a Qwen2.5-Math-PRM-layout checkpoint, as its
model card does (chat template, steps joined by <extra_0>, softmax class 1 of the score MLP at
each <extra_0>), on the GPU, batched by length (sorted, then padded batches of at most
--max-batch-tokens tokens).

    python bench/gpu_transformers.py MODEL_DIR PROCESSBENCH.json OUT.json [--max-batch-tokens N]

Writes tokens, seconds, tokens/s, peak GPU memory and every record's step scores (by id) to
OUT.json. Needs torch, transformers and safetensors (the GPU machine has them); never in tests.
"""
import argparse
import json
import time
from pathlib import Path

import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoModel, AutoTokenizer

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("data")
p.add_argument("out")
p.add_argument("--max-batch-tokens", type=int, default=16384)
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

# Batches by length: longest first, each padded to its longest, at most the token budget.
order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i][1]))
batches, cur = [], []
for i in order:
    longest = len(encoded[cur[0]][1]) if cur else len(encoded[i][1])
    if cur and longest * (len(cur) + 1) > a.max_batch_tokens:
        batches.append(cur)
        cur = []
    cur.append(i)
if cur:
    batches.append(cur)

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


scores = {}
with torch.inference_mode():
    run(batches[-1][:1])  # warm-up (cuBLAS handles, kernels), not timed
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    outs = [(b, run(b)) for b in batches]
    if gpu:
        torch.cuda.synchronize()
    secs = time.perf_counter() - start
    for b, probs in outs:
        for i, pr in zip(b, probs):
            scores[encoded[i][0]] = pr.tolist()
tokens = sum(len(s) for _, s in encoded)
result = {
    "engine": "transformers " + __import__("transformers").__version__ + ", torch " + torch.__version__ + ", " + a.dtype,
    "records": len(encoded),
    "tokens": tokens,
    "seconds": secs,
    "tokens_per_s": tokens / secs,
    "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0,
    "batches": len(batches),
    "scores": scores,
}
Path(a.out).write_text(json.dumps(result))
print(f"transformers: {len(encoded)} records, {tokens} tokens in {secs:.2f}s: {tokens / secs:.0f} tokens/s, "
      f"peak {result['peak_gib']:.1f} GiB")
