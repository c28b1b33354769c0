"""Reading a PEFT LoRA adapter made elsewhere: stepwise's merge onto the base against PEFT's own
(`PeftModel.from_pretrained(...).merge_and_unload().save_pretrained(...)`, what a user runs to
hand a merged model to another tool), on the same policy and the same adapter.

    python bench/peft_merge.py POLICY_DIR WORK_DIR [--rank 16] [--out result.json]

POLICY_DIR: a Hugging Face causal LM folder (bench/make_random_prm.py 0.5b DIR --policy makes a
random Qwen2.5-0.5B-shaped one). The adapter: rank R (alpha 2R) on every linear projection with
both halves drawn at random (`init_lora_weights=False`), written by PEFT. stepwise's side is
`stepwise.Policy(adapter)` with an empty cache (the merge, written to STEPWISE_CACHE, then the
load), against the same call again (the merged model found in the cache: the merge's seconds are
the difference) and `stepwise.Policy(merged folder)` (the load alone); and
`stepwise.merge_adapter(adapter, out)` (`stepwise merge`: the merge into a folder of its own, the
same work as PEFT's line, merged weights checked against PEFT's). Needs torch, transformers, peft and the stepwise package."""

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path


def seconds(work):
    start = time.perf_counter()
    out = work()
    return time.perf_counter() - start, out


def largest_difference(theirs, mine):
    """The largest absolute difference between two merged models' tensors of the same name
    (both bf16: PEFT merges in bf16, stepwise in f32 and rounds once)."""
    from safetensors.torch import load_file

    def tensors(folder):
        out = {}
        for f in folder.glob("*.safetensors"):
            out.update(load_file(str(f)))
        return out

    a, b = tensors(theirs), tensors(mine)
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a if k in b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("policy", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import peft
    import torch
    import transformers
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    adapter, cache, peft_out = work / "adapter", work / "cache", work / "peft-merged"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch.bfloat16)
    config = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules="all-linear",
                        init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(adapter)
    del model

    def peft_merge():
        base = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch.bfloat16)
        PeftModel.from_pretrained(base, adapter).merge_and_unload().save_pretrained(peft_out)

    peft_seconds, _ = seconds(peft_merge)

    os.environ["STEPWISE_CACHE"] = str(cache)
    import stepwise

    def policy_seconds(source):
        took, policy = seconds(lambda: stepwise.Policy(source, max_tokens=1))
        del policy
        return took

    first = policy_seconds(adapter)
    merged = next(p for p in (cache / "merged").iterdir() if not p.name.startswith("."))
    # Each twice, the faster kept: the first load after a write can wait on the page cache.
    again = min(policy_seconds(adapter) for _ in range(2))
    load = min(policy_seconds(merged) for _ in range(2))
    mine_out = work / "stepwise-merged"
    command_seconds, _ = seconds(lambda: stepwise.merge_adapter(adapter, mine_out))
    result = {
        "versions": {"peft": peft.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "threads": torch.get_num_threads(),
        "rank": args.rank,
        "adapter_mib": round((adapter / "adapter_model.safetensors").stat().st_size / 2**20, 1),
        "model_mib": round(sum(f.stat().st_size for f in merged.glob("*.safetensors")) / 2**20, 1),
        "peft_merge_and_save_seconds": round(peft_seconds, 2),
        "stepwise_first_policy_seconds": round(first, 2),
        "stepwise_load_merged_seconds": round(load, 2),
        "stepwise_merge_seconds": round(first - again, 2),
        "stepwise_cached_policy_seconds": round(again, 2),
        "stepwise_merge_adapter_seconds": round(command_seconds, 2),
        "largest_difference_from_peft": largest_difference(peft_out, mine_out),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
