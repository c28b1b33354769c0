"""TRL's GRPOTrainer on the CPU at bench/rl_cpu.sh's shape: the peer of `stepwise rl --device cpu`.

The same random Qwen2.5-0.5B-shaped policy, the same GSM8K problems (the question and "\\n" as
the prompt), PROMPTS prompts x GROUP samples an update of at most TOKENS new tokens at
temperature 1, one optimiser step an update over all of them in one micro-batch, the outcome
reward (the last number against the gold answer), the KL penalty to the frozen starting policy
(beta 0.04, so TRL keeps a reference model as stepwise does), PPO's clip 0.2, one iteration.
Weights in float32 with bf16 autocast (`bf16=True`), AdamW: PyTorch's standard mixed precision;
`--weights bfloat16` loads them in bf16 (open-r1's GRPO recipes), which is faster and rounds each
update to bf16.
Each update's seconds come from a callback around the trainer's steps (generation, the reference
model's log-probabilities, the loss, its backward and the optimiser step), the peak resident
memory from getrusage. By hand, never in tests or CI.

    /path/to/venv/bin/python bench/trl_grpo_cpu.py --policy DIR --problems FILE --out JSON
        [--updates 3] [--prompts 2] [--group 4] [--tokens 32] [--gradient-checkpointing]
        [--weights float32|bfloat16] [--compile]
"""

import argparse
import json
import re
import resource
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--problems", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--updates", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--kl", type=float, default=0.04)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="PEFT's LoRA of this rank (alpha 2R, every linear projection) on the frozen policy")
    ap.add_argument("--compile", action="store_true", help="the Trainer's torch_compile (inductor)")
    ap.add_argument("--weights", choices=["float32", "bfloat16"], default="float32",
                    help="float32: mixed precision (f32 weights, bf16 autocast); bfloat16: the weights and "
                    "AdamW's in bf16 too (open-r1's recipes)")
    a = ap.parse_args()

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    def gold(answer):
        return answer.split("####")[-1].strip().replace(",", "")

    rows = [json.loads(l) for l in open(a.problems) if l.strip()]
    data = Dataset.from_list([{"prompt": r["question"] + "\n", "gold": gold(r["answer"])} for r in rows])

    def outcome(completions, gold, **_):
        out = []
        for text, want in zip(completions, gold):
            numbers = re.findall(r"-?\d[\d,]*\.?\d*", text)
            out.append(1.0 if numbers and numbers[-1].replace(",", "").rstrip(".") == want else 0.0)
        return out

    class Clock(TrainerCallback):
        def __init__(self):
            self.steps, self.start = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.steps.append(time.perf_counter() - self.start)
            print(f"update {len(self.steps)}: {self.steps[-1]:.2f} s", file=sys.stderr, flush=True)

    batch = a.prompts * a.group
    config = GRPOConfig(
        output_dir=a.out + ".trainer",
        use_cpu=True,
        bf16=True,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=a.group,
        max_completion_length=a.tokens,
        temperature=1.0,
        learning_rate=a.lr,
        beta=a.kl,
        epsilon=0.2,
        num_iterations=1,
        max_steps=a.updates,
        gradient_checkpointing=a.gradient_checkpointing,
        model_init_kwargs={"dtype": getattr(torch, a.weights)},
        torch_compile=a.compile,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        dataloader_num_workers=0,
    )
    clock = Clock()
    peft_config = None
    if a.lora_rank:
        from peft import LoraConfig

        peft_config = LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=a.policy, reward_funcs=outcome, args=config, train_dataset=data, callbacks=[clock],
                          peft_config=peft_config)
    spent = {"generate": 0.0, "reference": 0.0}

    def timed(name, f):
        def call(*args, **kw):
            t = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                spent[name] += time.perf_counter() - t

        return call

    trainer.model.generate = timed("generate", trainer.model.generate)
    if trainer.ref_model is not None:
        trainer.ref_model.forward = timed("reference", trainer.ref_model.forward)
    started = time.perf_counter()
    trainer.train()
    whole = time.perf_counter() - started
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    result = {
        "peer": "TRL GRPOTrainer",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "threads": torch.get_num_threads(),
        "shape": {"prompts": a.prompts, "group": a.group, "max_tokens": a.tokens, "updates": a.updates},
        "gradient_checkpointing": a.gradient_checkpointing,
        "weights": a.weights,
        "lora_rank": a.lora_rank,
        "torch_compile": a.compile,
        "seconds_per_update": [round(s, 2) for s in clock.steps],
        "train_seconds": round(whole, 1),
        "generate_seconds": round(spent["generate"], 1),
        "reference_seconds": round(spent["reference"], 1),
        "peak_gib": round(peak_gib, 2),
        "log": [{k: v for k, v in h.items() if isinstance(v, (int, float))} for h in trainer.state.log_history],
    }
    json.dump(result, open(a.out, "w"), indent=1)
    print(json.dumps({k: result[k] for k in ("seconds_per_update", "generate_seconds", "reference_seconds", "peak_gib")}))


if __name__ == "__main__":
    main()
