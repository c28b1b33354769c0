"""lm-evaluation-harness's loglikelihood requests on the CPU: its own transformers backend (`hf`)
against its `local-completions` model pointed at `stepwise serve`, on the same random Qwen2
checkpoint (built here: head size 64, the fixture tokenizer), a multiple-choice task of
`DOCS` arithmetic questions (4 answers each) read from a local file. Each configuration runs a
whole warm-up pass, then a timed one; the table gives every configuration (the peer's batch
sizes, the client's concurrency and prompts a request) and the best of each side, and the two
sides' log-likelihoods are compared answer by answer.

    python bench/lm_eval_loglikelihood.py OUT.json     # a Python with lm_eval[api,hf]==0.4.13
    DOCS=50 PREAMBLE=40 python bench/lm_eval_loglikelihood.py OUT.json   # long shared contexts

`PREAMBLE=N` puts N worked sums of its own before every question, as a few-shot task's
examples drawn for each question: a question's answers then share a long context that the other
questions do not.

Never run in tests or CI (it takes minutes); `target/release/stepwise` must be built (or
`STEPWISE` name another build).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

REPO = Path(__file__).resolve().parents[1]
DOCS = int(os.environ.get("DOCS", "400"))
PREAMBLE = int(os.environ.get("PREAMBLE", "0"))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def checkpoint(out: Path) -> Path:
    """A random Qwen2ForCausalLM of about 22M parameters, and its tokenizer files alone (so
    transformers reads `tokenizer.json` as written, as stepwise does)."""
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=601, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=False, rope_theta=10000.0, eos_token_id=2, pad_token_id=0)
    model = Qwen2ForCausalLM(cfg).eval()
    policy = out / "policy"
    policy.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(policy / "model.safetensors"))
    config = cfg.to_dict()
    config["architectures"] = ["Qwen2ForCausalLM"]
    config["torch_dtype"] = "float32"
    (policy / "config.json").write_text(json.dumps(config))
    fixture = REPO / "fixtures" / "hf-tiny" / "qwen2-policy"
    tokenizer = out / "tokenizer"
    tokenizer.mkdir(exist_ok=True)
    for d in (policy, tokenizer):
        shutil.copy(fixture / "tokenizer.json", d / "tokenizer.json")
    tok_config = json.loads((fixture / "tokenizer_config.json").read_text())
    (policy / "tokenizer_config.json").write_text(json.dumps(tok_config))
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return out


def task(out: Path) -> Path:
    rows = []
    for i in range(DOCS):
        a, b = 3 + (7 * i) % 89, 2 + (5 * i) % 71
        choices = sorted({a + b, a + b + 1, a + b - 1, a + b + 10})
        shots = "".join(f"{x} + {y} = {x + y}. " for x, y in ((7 + (13 * i + 5 * j) % 83, 4 + (11 * i + 3 * j) % 61)
                                                          for j in range(PREAMBLE)))
        rows.append({"question": f"{shots}Question {i}: what is {a} + {b}?", "choices": [str(c) for c in choices],
                     "label": choices.index(a + b)})
    out.mkdir(parents=True, exist_ok=True)
    (out / "arith.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "arith.yaml").write_text(
        f"task: bench_arith\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {out / 'arith.jsonl'}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n')
    return out


def timed(tasks: Path, model: str, model_args: str, **kw):
    """A warm-up pass, then the timed pass: (seconds, per-answer log-likelihoods, accuracy)."""
    run = lambda: simple_evaluate(model=model, model_args=model_args, tasks=["bench_arith"], log_samples=True,
                                  task_manager=TaskManager(include_path=str(tasks)), **kw)
    run()
    start = time.perf_counter()
    out = run()
    seconds = time.perf_counter() - start
    lls = [float(r[0][0]) for s in sorted(out["samples"]["bench_arith"], key=lambda s: s["doc_id"])
           for r in s["resps"]]
    return seconds, lls, out["results"]["bench_arith"]["acc,none"]


def main():
    result_path = Path(sys.argv[1])
    work = Path(tempfile.mkdtemp(prefix="lm-eval-bench-"))
    ckpt, tasks = checkpoint(work / "ckpt"), task(work / "tasks")
    policy, tokenizer = ckpt / "policy", ckpt / "tokenizer"
    answers = 4 * DOCS
    rows, reference = [], None
    for batch in (1, 16, 64):
        s, lls, acc = timed(tasks, "hf", f"pretrained={policy},tokenizer={tokenizer},dtype=float32",
                            device="cpu", batch_size=batch)
        reference = reference or lls
        rows.append({"side": "transformers (lm_eval hf)", "setting": f"batch_size={batch}", "seconds": s,
                     "answers_per_s": answers / s, "acc": acc})
        print(rows[-1], flush=True)
    exe = os.environ.get("STEPWISE", REPO / "target" / "release" / "stepwise")
    server = subprocess.Popen([str(exe), "serve", "--model", str(policy), "--port", "0", "--host", "127.0.0.1"],
                              stderr=subprocess.PIPE, text=True)
    try:
        url = next(line.split("listening on ")[1].strip() for line in server.stderr if "listening on " in line)
        worst = 0.0
        for concurrent, batch in ((4, 1), (16, 1), (4, 8), (16, 8)):
            s, lls, acc = timed(tasks, "local-completions",
                                f"base_url={url}/v1/completions,model=policy,tokenizer={tokenizer},"
                                f"tokenizer_backend=huggingface,num_concurrent={concurrent}", batch_size=batch)
            worst = max(worst, max(abs(a - b) for a, b in zip(lls, reference)))
            rows.append({"side": "stepwise serve (lm_eval local-completions)",
                         "setting": f"num_concurrent={concurrent},batch_size={batch}", "seconds": s,
                         "answers_per_s": answers / s, "acc": acc})
            print(rows[-1], flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    best = lambda side: max((r for r in rows if r["side"].startswith(side)), key=lambda r: r["answers_per_s"])
    summary = {
        "lm_eval": "0.4.13", "torch": torch.__version__, "docs": DOCS, "answers": answers,
        "worked_sums_before_each_question": PREAMBLE,
        "checkpoint": "random Qwen2, hidden 512, 8 layers, 8 heads of 64, vocab 601, float32",
        "rows": rows, "max_abs_loglikelihood_diff": worst,
        "ratio_best_stepwise_to_best_transformers": best("stepwise")["answers_per_s"] / best("transformers")["answers_per_s"],
    }
    result_path.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
