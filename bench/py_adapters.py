"""LoRA adapters put into a policy already in memory, from Python: stepwise's
`Policy.load_adapter` / `with_adapter` against PEFT's `PeftModel.load_adapter` / `set_adapter`
on transformers, the same two cores, bf16, one after the other in one process each.

Measured: an adapter's first load, then loads of a trainer's newer save under the same name
(stepwise `replace=True`; PEFT has no load in place: `delete_adapter` then `load_adapter`; the
median of REPS, the two saves alternated), the stepwise alternative of a model of its own
(`stepwise.Policy(ADAPTER)`: merged into the cache, then loaded), and greedy sampling with the
adapter (4 continuations of at most 64 tokens of one question, tokens/s; the base's beside it).

    python bench/py_adapters.py POLICY WORK [--reps 6] [--json OUT]

WORK holds lora0 and lora1 (bench/write_loras.py POLICY WORK 16 2).
"""
import argparse
import json
import os
import statistics
import tempfile
import time

QUESTION = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"
NEW, N = 64, 4


def timed(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def ours(a):
    import stepwise

    os.environ["STEPWISE_CACHE"] = tempfile.mkdtemp()
    policy = stepwise.Policy(a.policy, temperature=0.0, max_tokens=NEW)
    first, _ = timed(lambda: policy.load_adapter("tuned", f"{a.work}/lora0"))
    again = [timed(lambda k=k: policy.load_adapter("tuned", f"{a.work}/lora{(k + 1) % 2}", replace=True))[0]
             for k in range(a.reps)]
    view = policy.with_adapter("tuned")

    def tokens_per_s(p):
        p.continue_from(QUESTION, n=N)  # warm-up
        took, outs = timed(lambda: p.continue_from(QUESTION, n=N))
        return sum(c["tokens"] for c in outs) / took

    base_tps, view_tps = tokens_per_s(policy), tokens_per_s(view)
    own_s, _ = timed(lambda: stepwise.Policy(f"{a.work}/lora0", temperature=0.0, max_tokens=NEW))
    own_cached_s, _ = timed(lambda: stepwise.Policy(f"{a.work}/lora0", temperature=0.0, max_tokens=NEW))
    return {"first_load_ms": first * 1000, "reload_same_name_ms": statistics.median(again) * 1000,
            "base_tokens_per_s": base_tps, "adapter_tokens_per_s": view_tps,
            "own_model_first_s": own_s, "own_model_cached_s": own_cached_s}


def theirs(a):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(a.policy)
    base = AutoModelForCausalLM.from_pretrained(a.policy, dtype=torch.bfloat16)
    first, model = timed(lambda: PeftModel.from_pretrained(base, f"{a.work}/lora0", adapter_name="tuned"))
    again = []
    for k in range(a.reps):
        def swap(k=k):
            model.load_adapter(f"{a.work}/lora{(k + 1) % 2}", adapter_name="staging")
            model.set_adapter("staging")
            model.delete_adapter("tuned")
            model.load_adapter(f"{a.work}/lora{(k + 1) % 2}", adapter_name="tuned")
            model.set_adapter("tuned")
            model.delete_adapter("staging")
        # A load in place is two loads here (the name must be free): half of it is counted.
        again.append(timed(swap)[0] / 2)
    ids = tok(QUESTION + "\n", return_tensors="pt").input_ids.repeat(N, 1)

    def gen():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)

    def tokens_per_s():
        gen()  # warm-up
        took, out = timed(gen)
        return (out.shape[1] - ids.shape[1]) * N / took

    view_tps = tokens_per_s()
    with model.disable_adapter():
        base_tps = tokens_per_s()
    return {"first_load_ms": first * 1000, "reload_same_name_ms": statistics.median(again) * 1000,
            "base_tokens_per_s": base_tps, "adapter_tokens_per_s": view_tps}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("policy")
    p.add_argument("work")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--only", choices=["stepwise", "peft"])
    p.add_argument("--json")
    a = p.parse_args()
    out = {}
    for name, run in [("stepwise", ours), ("peft", theirs)]:
        if a.only in (None, name):
            out[name] = {k: round(v, 3) for k, v in run(a).items()}
            print(name, json.dumps(out[name]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"question_tokens_new": NEW, "continuations": N, **out}, f, indent=1)


main()
