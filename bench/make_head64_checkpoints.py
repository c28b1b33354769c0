"""Small Qwen2 checkpoints with head size 64 (vLLM's CPU attention rejects the fixtures' 16), built
from the fixture tokenizer with random weights: a policy (Qwen2ForCausalLM) and a PRM in
Qwen2.5-Math-PRM's layout (Qwen2ForProcessRewardModel: score MLP, rewards at `<extra_0>`), for
`bench/vllm_interop.sh` and `bench/load_serve.py`. Needs torch + transformers.

    python bench/make_head64_checkpoints.py OUT_DIR
"""
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "hf-tiny"
out = Path(sys.argv[1])
torch.manual_seed(0)
cfg = Qwen2Config(
    vocab_size=601, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False, rope_theta=10000.0,
    eos_token_id=2, pad_token_id=0,
)
policy = Qwen2ForCausalLM(cfg).eval()
for name, arch in [("policy", "Qwen2ForCausalLM"), ("prm", "Qwen2ForProcessRewardModel")]:
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(FIX / "qwen2-prm" / f, d / f)
    tensors = {k: v.contiguous() for k, v in policy.state_dict().items()}
    if arch == "Qwen2ForProcessRewardModel":
        del tensors["lm_head.weight"]
        h = cfg.hidden_size
        tensors["score.0.weight"] = torch.randn(h, h) * 0.05
        tensors["score.0.bias"] = torch.zeros(h)
        tensors["score.2.weight"] = torch.randn(2, h) * 0.05
        tensors["score.2.bias"] = torch.zeros(2)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    c = cfg.to_dict()
    c["architectures"] = [arch]
    c["torch_dtype"] = "float32"
    if arch == "Qwen2ForProcessRewardModel":
        c["num_labels"] = 2
    (d / "config.json").write_text(json.dumps(c, indent=1))
print(f"wrote {out}/policy and {out}/prm (hidden 256, 4 heads of 64, 2 layers)")
