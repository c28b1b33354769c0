"""The peer of `stepwise train-prm --device cuda` in bench/gpu_check.sh: the same verifier trained
with PyTorch and transformers on the same GPU, as stepwise trains it: f32 master weights with bf16
autocast, AdamW (betas 0.9 / 0.999, eps 1e-8, weight decay 0.01), warm-up then cosine,
global-norm clipping at 1.0. Two objectives:

- `--objective classify` (default): the decoder of a Qwen2.5-Math-PRM-layout checkpoint from
  bench/make_random_prm.py under a new 2-class token-classification head (as `train-prm` makes
  it), BCE with logits on logit(good) - logit(bad) at each labelled step's separator;
- `--objective log-ratio`: a causal LM (`make_random_prm.py --policy`) trained as `train-prm
  --head log-ratio --reference-logprob C` trains it: each step's tokens (its text and separator)
  scored by beta * (sum of their log-probabilities - n * C), BCE with logits against the step's
  label; the vocabulary logits at every learned token (the solution's, after the problem).

Inputs are encoded in stepwise's TRL layout (the problem's ids, then each step's ids followed by
the separator's, each encoded alone without special tokens; the label read at the separator's
last token); for the log-ratio objective, in the policy's (the separator after the problem too). ProcessBench's `label` (the first wrong step, -1 for none) labels the steps before
it good and that step bad, and nothing after it (`--stop-at-first-bad`). Batches: at most
--batch-size solutions and --max-batch-tokens real tokens, padded to their longest.

    python bench/gpu_train.py MODEL_DIR PROCESSBENCH.json OUT.json --steps 200

Writes the steps, tokens, seconds in steps, tokens/s, peak GPU memory and the loss curve to
OUT.json; with --valid-data, the validation loss before and after training (outside the timing). Needs torch, transformers and safetensors (the GPU machine has them); never in tests.
"""
import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModel, AutoModelForCausalLM

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("data")
p.add_argument("out")
p.add_argument("--steps", type=int, default=200)
p.add_argument("--lr", type=float, default=1e-5)
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--max-batch-tokens", type=int, default=16384)
p.add_argument("--max-len", type=int, default=2048)
p.add_argument("--separator", default="\n")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--gradient-checkpointing", action="store_true",
               help="recompute each layer in the backward (transformers' gradient checkpointing), as "
                    "stepwise's packed trainer does: less memory, about a third more products")
p.add_argument("--device", default="cuda", help="cuda (the comparison) or cpu (a dry run of the script)")
p.add_argument("--objective", default="classify", choices=["classify", "log-ratio"])
p.add_argument("--beta", type=float, default=1.0)
p.add_argument("--reference-logprob", type=float, default=-0.5)
p.add_argument("--valid-data", help="ProcessBench records to validate on before and after training "
               "(as `train-prm --valid-data`): the mean loss over their labelled steps")
a = p.parse_args()
dev = torch.device(a.device)
gpu = dev.type == "cuda"
model_dir = Path(a.model)
fast = Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def enc(text):
    return fast.encode(text, add_special_tokens=False).ids


sep = enc(a.separator)
# As train-prm: labels past the model's context or --max-len are left out.
max_len = min(a.max_len, json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings", a.max_len))
log_ratio = a.objective == "log-ratio"
# Each example: its ids, where its learned tokens start, and its targets: (position, label) at
# each step's separator, or (first, last position, label) of each step's tokens.
def examples_of(path):
    out = []
    for r in json.loads(Path(path).read_text()):
        ids, targets = enc(r["problem"]) + (sep if log_ratio else []), []
        learn_from = len(ids)
        first_bad = r["label"] if r["label"] >= 0 else len(r["steps"])
        for k, step in enumerate(r["steps"][: first_bad + 1]):
            start = len(ids)
            ids += enc(step) + sep
            if len(ids) <= max_len:
                label = 1.0 if k < first_bad else 0.0
                targets.append((start, len(ids) - 1, label) if log_ratio else (len(ids) - 1, label))
        ids = ids[:max_len]
        if targets:
            out.append((ids, learn_from, targets))
    return out


examples = examples_of(a.data)
valid = examples_of(a.valid_data) if a.valid_data else []

torch.backends.cuda.matmul.allow_tf32 = False
if log_ratio:
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    body, score = lm.model, lm.lm_head
else:
    body = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    # A new 2-class token-classification head, as `train-prm` puts on a checkpoint (normal with
    # std 0.02, bias 0; the PRM's own `score` MLP is left out).
    torch.manual_seed(a.seed)
    score = torch.nn.Linear(body.config.hidden_size, 2)
    torch.nn.init.normal_(score.weight, std=0.02)
    torch.nn.init.zeros_(score.bias)
    score = score.to(dev)
if a.gradient_checkpointing:
    body.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
h = body.config.hidden_size
params = list({id(q): q for q in list(body.parameters()) + list(score.parameters())}.values())
opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
body.train()
score.train()
pad = fast.token_to_id("<|endoftext|>") or 0


def batches(rng):
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        cur, tokens = [], 0
        for i in order:
            n = len(examples[i][0])
            if cur and (len(cur) == a.batch_size or tokens + n > a.max_batch_tokens):
                yield cur
                cur, tokens = [], 0
            cur.append(i)
            tokens += n
        if cur:
            yield cur


def schedule(step):
    warmup = max(a.steps // 20, 1)
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(a.steps - warmup, 1)))


def logits_of(seqs):
    """The verifier's logit z of each labelled step of `seqs`, its label, and the batch's tokens."""
    t = max(len(s[0]) for s in seqs)
    ids = torch.full((len(seqs), t), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    # Rows read: a classifier's at each target; a log-ratio verifier's at every learned token
    # (the row before it), with the token and, per step, which of those rows it sums.
    rows, labels, tokens, spans = [], [], [], []
    for k, (s, learn_from, targets) in enumerate(seqs):
        ids[k, : len(s)] = torch.tensor(s)
        mask[k, : len(s)] = 1
        if log_ratio:
            first = len(rows)
            rows += [k * t + q - 1 for q in range(learn_from, len(s))]
            tokens += s[learn_from:]
            for start, end, y in targets:
                spans.append((first + start - learn_from, first + end + 1 - learn_from))
                labels.append(y)
        else:
            for pos, y in targets:
                rows.append(k * t + pos)
                labels.append(y)
    ids, mask = ids.to(dev), mask.to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state
        at = hidden.reshape(-1, h)[torch.tensor(rows, device=dev)]
        logits = score(at).float()
    y = torch.tensor(labels, device=dev)
    if log_ratio:
        target = torch.tensor(tokens, device=dev)
        logp = -torch.nn.functional.cross_entropy(logits, target, reduction="none")
        sums = torch.stack([logp[i:j].sum() - (j - i) * a.reference_logprob for i, j in spans])
        z = a.beta * sums
    else:
        z = logits[:, 1] - logits[:, 0]
    return z, y, sum(len(s[0]) for s in seqs)


def loss_of(batch):
    z, y, tokens = logits_of([examples[i] for i in batch])
    return torch.nn.functional.binary_cross_entropy_with_logits(z, y), tokens


def valid_loss():
    """The mean loss over every labelled step of the validation records, as stepwise's packed
    trainer measures it (batches of at most --max-batch-tokens tokens, no gradients)."""
    if not valid:
        return None
    total, count, cur, tokens = 0.0, 0, [], 0
    body.eval()
    with torch.no_grad():
        for ex in valid + [None]:
            if ex is None or (cur and tokens + len(ex[0]) > a.max_batch_tokens):
                z, y, _ = logits_of(cur)
                total += torch.nn.functional.binary_cross_entropy_with_logits(z, y, reduction="sum").item()
                count += len(y)
                cur, tokens = [], 0
            if ex is not None:
                cur.append(ex)
                tokens += len(ex[0])
    body.train()
    return total / max(count, 1)


valid_start = valid_loss()
rng = random.Random(a.seed)
stream = batches(rng)
losses, tokens = [], 0
if gpu:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
# Validated every steps/5 steps as `train-prm` validates (outside the timing), so the two
# engines' validation curves compare step for step.
every, history, secs = max(a.steps // 5, 1), [], 0.0
start = time.perf_counter()
for step in range(a.steps):
    for g in opt.param_groups:
        g["lr"] = a.lr * schedule(step)
    loss, n = loss_of(next(stream))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    tokens += n
    losses.append(loss.item())
    if (step + 1) % every == 0 and step + 1 < a.steps and valid:
        if gpu:
            torch.cuda.synchronize()
        secs += time.perf_counter() - start
        history.append((step + 1, valid_loss()))
        start = time.perf_counter()
if gpu:
    torch.cuda.synchronize()
secs += time.perf_counter() - start
valid_end = valid_loss()
if valid_end is not None:
    history.append((a.steps, valid_end))
result = {
    "engine": "transformers " + __import__("transformers").__version__ + ", torch " + torch.__version__
    + ", f32 master weights, bf16 autocast" + (", gradient checkpointing" if a.gradient_checkpointing else ""),
    "objective": a.objective,
    "steps": a.steps,
    "tokens": tokens,
    "seconds": secs,
    "tokens_per_s": tokens / secs,
    "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0,
    "loss_first_10": sum(losses[:10]) / max(len(losses[:10]), 1),
    "loss_last_10": sum(losses[-10:]) / max(len(losses[-10:]), 1),
    "losses": losses,
    "valid_history": history,
    "valid_loss_start": valid_start,
    "valid_loss": valid_end,
    "valid_records": len(valid),
}
Path(a.out).write_text(json.dumps(result))
print(f"transformers training: {a.steps} steps, {tokens} tokens in {secs:.2f}s: {tokens / secs:.0f} tokens/s, "
      f"loss {result['loss_first_10']:.4f} -> {result['loss_last_10']:.4f}, peak {result['peak_gib']:.1f} GiB"
      + (f", validation loss {valid_start:.4f} -> {valid_end:.4f}" if valid else ""))
