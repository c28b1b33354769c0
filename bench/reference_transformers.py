"""Reference throughput with PyTorch + transformers for `cargo bench -p stepwise-model`.

Same workloads: forward passes over 8 x 256 tokens, the decoder only (the Rust side reads the
head at one position per sequence, which costs nothing), and
greedy decoding of 64 new tokens for 8 continuations of a 32-token prompt (generation), on the
fixture checkpoints and (with --big) a randomly initialised Qwen2.5-0.5B-shaped model, in f32 and
then in bf16 (what a user of a bf16 checkpoint would run; compare with the bench's bf16-held lines).
Optional: `pip install torch transformers`; never needed by the tests or CI.
Run with the same thread count as the Rust bench: `OMP_NUM_THREADS=2 python bench/reference_transformers.py`.
"""
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModel

BATCH, SEQ, NEW = 8, 256, 64
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "hf-tiny"


def scoring(model, reps):
    ids = (torch.arange(BATCH * SEQ) * 7 % 500 + 10).reshape(BATCH, SEQ)
    with torch.no_grad():
        model(ids)
        t = time.perf_counter()
        for _ in range(reps):
            model(ids)
    return reps * BATCH * SEQ / (time.perf_counter() - t)


def generation(model):
    prompt = (torch.arange(32) * 3 + 10).unsqueeze(0).repeat(BATCH, 1)
    with torch.no_grad():
        t = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    return (out.shape[1] - 32) * BATCH / (time.perf_counter() - t)


def main():
    print("threads:", torch.get_num_threads())
    prm = AutoModel.from_pretrained(FIX / "qwen2-prm", trust_remote_code=False, torch_dtype=torch.float32)
    print(f"qwen2-prm: scoring {scoring(prm, 100):.0f} tokens/s")
    pol = AutoModelForCausalLM.from_pretrained(FIX / "qwen2-policy", torch_dtype=torch.float32)
    print(f"qwen2-policy: scoring {scoring(pol.model, 100):.0f} tokens/s")
    print(f"qwen2-policy: generation {generation(pol):.0f} new tokens/s")
    if "--big" in sys.argv:
        cfg = AutoConfig.for_model("qwen2", vocab_size=151936, hidden_size=896, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                                   max_position_embeddings=4096, tie_word_embeddings=True)
        big = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
        print(f"qwen2.5-0.5b shape: scoring {scoring(big.model, 2):.0f} tokens/s")
        print(f"qwen2.5-0.5b shape: generation {generation(big):.1f} new tokens/s")
        big = big.to(torch.bfloat16)
        print(f"qwen2.5-0.5b shape (bf16): scoring {scoring(big.model, 2):.0f} tokens/s")
        print(f"qwen2.5-0.5b shape (bf16): generation {generation(big):.1f} new tokens/s")


if __name__ == "__main__":
    main()
