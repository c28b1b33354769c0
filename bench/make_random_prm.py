"""A Qwen2.5-Math-PRM-layout checkpoint (Qwen2ForProcessRewardModel: score MLP, rewards at
`<extra_0>`), or with `--policy` a causal LM (Qwen2ForCausalLM), with random bf16 weights at a
real model's shape, written in shards with a
`model.safetensors.index.json` as released checkpoints are, and the fixture PRM's tokenizer. For
`bench/bf16_engine.sh`. Needs safetensors, and torch (or, without torch, numpy and ml_dtypes:
the same layout from numpy's generator, other random values); memory stays about one shard.

    python bench/make_random_prm.py {0.5b|7b} OUT_DIR [--dtype bfloat16|float32] [--policy]
        [--tokenizer DIR] [--device cuda]

`--tokenizer` names the folder whose tokenizer files are copied (default: the fixture PRM's, in
fixtures/); `--device cuda` draws the weights on a GPU (a 7B checkpoint in seconds, not minutes).
"""
import argparse
import json
import shutil
from pathlib import Path

try:
    import torch
    from safetensors.torch import save_file
except ImportError:  # numpy + ml_dtypes stand in (bf16 as ml_dtypes.bfloat16)
    torch = None
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "hf-tiny" / "qwen2-prm"
# Qwen2.5-Math-PRM-7B's config.json, and the same layout at Qwen2.5-0.5B's shape.
SHAPES = {
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=4096, rope_theta=10000.0),
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096, rope_theta=1000000.0),
}
SHARD_BYTES = 4 << 30

p = argparse.ArgumentParser()
p.add_argument("shape", choices=SHAPES)
p.add_argument("out")
p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
p.add_argument("--policy", action="store_true", help="a causal LM (lm_head) instead of the PRM head")
p.add_argument("--tokenizer", default=str(FIX), help="folder with tokenizer.json and tokenizer_config.json")
p.add_argument("--device", default="cpu", help="where the random weights are drawn (cpu or cuda)")
a = p.parse_args()
FIX = Path(a.tokenizer)
dtype = getattr(torch, a.dtype) if torch else (ml_dtypes.bfloat16 if a.dtype == "bfloat16" else np.float32)
c = SHAPES[a.shape]
h, i, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
d = h // c["num_attention_heads"]
kv = c["num_key_value_heads"] * d
out = Path(a.out)
out.mkdir(parents=True, exist_ok=True)
if torch:
    torch.manual_seed(0)
else:
    rng = np.random.default_rng(0)


def shapes():
    yield "model.embed_tokens.weight", (c["vocab_size"], h)
    for l in range(L):
        p = f"model.layers.{l}"
        yield f"{p}.input_layernorm.weight", (h,)
        yield f"{p}.post_attention_layernorm.weight", (h,)
        for n, s in [("q", h), ("k", kv), ("v", kv)]:
            yield f"{p}.self_attn.{n}_proj.weight", (s, h)
            yield f"{p}.self_attn.{n}_proj.bias", (s,)
        yield f"{p}.self_attn.o_proj.weight", (h, h)
        yield f"{p}.mlp.gate_proj.weight", (i, h)
        yield f"{p}.mlp.up_proj.weight", (i, h)
        yield f"{p}.mlp.down_proj.weight", (h, i)
    yield "model.norm.weight", (h,)
    if a.policy:
        yield "lm_head.weight", (c["vocab_size"], h)
        return
    yield "score.0.weight", (h, h)
    yield "score.0.bias", (h,)
    yield "score.2.weight", (2, h)
    yield "score.2.bias", (2,)


def make(name, shape):
    if torch is None:
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            return np.ones(shape, dtype=dtype)
        if name.endswith("bias"):
            return np.zeros(shape, dtype=dtype)
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype)
    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        return torch.ones(shape, dtype=dtype)
    if name.endswith("bias"):
        return torch.zeros(shape, dtype=dtype)
    return (torch.randn(shape, device=a.device) * 0.02).to(dtype).cpu()


shards, current, size = [], {}, 0
for name, shape in shapes():
    t = make(name, shape)
    current[name] = t
    size += t.nbytes if torch is None else t.numel() * t.element_size()
    if size >= SHARD_BYTES:
        shards.append(current)
        current, size = {}, 0
        save_file(shards[-1], str(out / f"part-{len(shards)}.tmp"), metadata={"format": "pt"})
        shards[-1] = list(shards[-1].keys())
if current:
    shards.append(current)
    save_file(current, str(out / f"part-{len(shards)}.tmp"), metadata={"format": "pt"})
    shards[-1] = list(current.keys())
weight_map, total = {}, 0
for k, names in enumerate(shards, 1):
    final = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
    (out / f"part-{k}.tmp").rename(out / final)
    total += (out / final).stat().st_size
    weight_map.update({n: final for n in names})
(out / "model.safetensors.index.json").write_text(
    json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
config = json.loads((FIX / "config.json").read_text())
config.update(c)
config.update(torch_dtype=a.dtype, layer_types=["full_attention"] * L, max_window_layers=L)
if a.policy:
    config.update(architectures=["Qwen2ForCausalLM"], eos_token_id=2, pad_token_id=0)
    for k in ["id2label", "label2id"]:
        config.pop(k, None)
(out / "config.json").write_text(json.dumps(config, indent=1))
for f in ["tokenizer.json", "tokenizer_config.json"]:
    shutil.copy(FIX / f, out / f)
print(f"{out}: {a.shape} shape, {a.dtype}, {len(shards)} shard(s), {total / 1e9:.2f} GB")
