"""TRL's DPOTrainer on the CPU at bench/dpo_cpu.sh's shape: the peer of `stepwise dpo --device cpu`.

The same random Qwen2.5-0.5B-shaped policy and the same step pairs (`stepwise pairs --layout trl`
of the same records), BATCH pairs an optimiser step in one micro-batch, β 0.1, the sigmoid loss,
AdamW at a constant learning rate. TRL at its best on this machine: the reference model's
log-probabilities computed once before training (`precompute_ref_log_probs`, as stepwise does),
weights in bf16 (`--weights bfloat16`) or float32 with bf16 autocast (`bf16=True`, PyTorch's
standard mixed precision). With `--lora-rank R`, PEFT's LoRA (rank R, alpha 2R, every linear
projection: `target_modules="all-linear"`, no dropout) on the frozen policy, as TRL trains with
a `peft_config` (its reference is the policy with the adapters switched off). Each step's seconds come from a callback around the trainer's steps,
the reference pass's from the time before the first step, the peak resident memory from
getrusage. By hand, never in tests or CI.

    /path/to/venv/bin/python bench/trl_dpo_cpu.py --policy DIR --pairs TRL_JSONL --out JSON
        [--batch 4] [--weights float32|bfloat16] [--lora-rank R]
"""

import argparse
import json
import resource
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--pairs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--weights", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument("--lora-rank", type=int, default=0)
    a = ap.parse_args()

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    rows = [json.loads(l) for l in open(a.pairs) if l.strip()]
    data = Dataset.from_list(rows)

    class Clock(TrainerCallback):
        def __init__(self):
            self.steps, self.start, self.first = [], None, None

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()
            if self.first is None:
                self.first = self.start

        def on_step_end(self, args, state, control, **kw):
            self.steps.append(time.perf_counter() - self.start)
            print(f"step {len(self.steps)}: {self.steps[-1]:.2f} s", file=sys.stderr, flush=True)

    config = DPOConfig(
        output_dir=a.out + ".trainer",
        use_cpu=True,
        bf16=True,
        per_device_train_batch_size=a.batch,
        gradient_accumulation_steps=1,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        beta=0.1,
        num_train_epochs=1,
        precompute_ref_log_probs=True,
        max_length=4096,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        dataloader_num_workers=0,
    )
    tok = AutoTokenizer.from_pretrained(a.policy)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(a.policy, dtype=getattr(torch, a.weights))
    clock = Clock()
    started = time.perf_counter()
    peft_config = None
    if a.lora_rank:
        from peft import LoraConfig

        peft_config = LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=model, args=config, train_dataset=data, processing_class=tok, callbacks=[clock],
                         peft_config=peft_config)
    trainer.train()
    whole = time.perf_counter() - started
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    result = {
        "peer": "TRL DPOTrainer",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "threads": torch.get_num_threads(),
        "pairs": len(rows),
        "batch": a.batch,
        "weights": a.weights,
        "lora_rank": a.lora_rank,
        "seconds_per_step": [round(s, 2) for s in clock.steps],
        "before_first_step_seconds": round(clock.first - started, 1) if clock.first else None,
        "train_seconds": round(whole, 1),
        "peak_gib": round(peak_gib, 2),
        "log": [{k: v for k, v in h.items() if isinstance(v, (int, float))} for h in trainer.state.log_history],
    }
    json.dump(result, open(a.out, "w"), indent=1)
    print(json.dumps({k: result[k] for k in ("seconds_per_step", "before_first_step_seconds", "train_seconds", "peak_gib")}))


if __name__ == "__main__":
    main()
