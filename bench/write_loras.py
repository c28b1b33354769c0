"""Writes N rank-R LoRA adapters of POLICY with PEFT (every linear projection, both halves
random: PEFT's `init_lora_weights=False`, B scaled down as trained adapters' updates are small)
into WORK/lora0 … WORK/lora{N-1}; an adapter already there is kept.

    python bench/write_loras.py POLICY_DIR WORK RANK N
"""
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

policy, work, rank, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for k in range(n):
    if (work / f"lora{k}" / "adapter_model.safetensors").exists():
        continue
    torch.manual_seed(k)
    base = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.bfloat16)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(base, cfg)
    with torch.no_grad():  # small updates, as trained adapters make
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.01)
    model.save_pretrained(work / f"lora{k}")
