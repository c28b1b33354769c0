"""lm-evaluation-harness as pip installs it (0.4.13) against ``stepwise serve``: its
``local-completions`` model (OpenAI's completions API: loglikelihood requests as lists of
token-id prompts with ``echo``, ``logprobs: 1``, ``max_tokens: 1``; greedy generation with stop
strings) gives the log-likelihoods, greedy flags, generations and accuracy that the harness's own
transformers backend (``hf``) gives on the same checkpoint.

Skipped where lm_eval is not installed (it brings PyTorch and transformers);
``STEPWISE_REQUIRE_LM_EVAL=1`` (CI) turns the skip into a failure."""

import importlib.util
import json
import os
import shutil
import urllib.request

import pytest

if importlib.util.find_spec("lm_eval") is None:
    if os.environ.get("STEPWISE_REQUIRE_LM_EVAL"):
        raise RuntimeError("STEPWISE_REQUIRE_LM_EVAL is set but lm_eval is not installed")
    pytest.skip("lm_eval is not installed", allow_module_level=True)

from conftest import start_serve  # noqa: E402
from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

TASKS = ["stepwise_arith", "stepwise_arith_gen"]


def write_tasks(folder):
    """Two tasks over one local file (no download): answers chosen by likelihood, and answers
    generated greedily to the end of the line."""
    rows = []
    for i in range(24):
        a, b = 3 + (7 * i) % 23, 2 + (5 * i) % 19
        choices = sorted({a + b, a + b + 1, a + b - 1, a + b + 10})
        rows.append({"question": f"What is {a} + {b}?", "choices": [str(c) for c in choices],
                     "label": choices.index(a + b)})
    data = folder / "arith.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
              'doc_to_text: "{{question}}\\nAnswer:"\n')
    (folder / "arith.yaml").write_text(
        "task: stepwise_arith\n" + common + "output_type: multiple_choice\n"
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n')
    (folder / "arith_gen.yaml").write_text(
        "task: stepwise_arith_gen\n" + common + "output_type: generate_until\n"
        'doc_to_target: "{{choices[label]}}"\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 8\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n")


@pytest.fixture()
def served_policy(fixtures):
    """`stepwise serve` on the fixture policy, a fresh one a test (its counters start at 0)."""
    server, url = start_serve("--model", fixtures / "qwen2-policy")
    try:
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def counters(url):
    with urllib.request.urlopen(url + "/metrics") as r:
        lines = r.read().decode().splitlines()
    return {ln.split()[0]: float(ln.split()[1]) for ln in lines if ln and not ln.startswith("#")}


def by_doc(results, task):
    return {s["doc_id"]: s for s in results["samples"][task]}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    write_tasks(folder)
    return folder


def evaluate(tasks, model, model_args, **kw):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return simple_evaluate(model=model, model_args=model_args, tasks=TASKS, log_samples=True,
                           task_manager=TaskManager(include_path=str(tasks)), **kw)


@pytest.fixture(scope="module")
def tokenizer_files(fixtures, tmp_path_factory):
    """The fixture's tokenizer files alone, loaded by transformers as its `tokenizer.json` says.
    Beside a Qwen2 `config.json`, transformers 5 builds its own Qwen2 tokenizer, whose
    pre-tokenizer splits digits apart where this fixture's `tokenizer.json` (GPT-2's byte-level
    split) keeps ` 3` whole; real Qwen checkpoints' files say what the class does."""
    folder = tmp_path_factory.mktemp("tokenizer")
    source = fixtures / "qwen2-policy"
    shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def transformers_run(fixtures, tasks, tokenizer_files):
    """The harness's own transformers backend on the checkpoint: what the server must match."""
    return evaluate(tasks, "hf", f"pretrained={fixtures / 'qwen2-policy'},tokenizer={tokenizer_files},dtype=float32",
                    device="cpu", batch_size=1)


# `huggingface`: the client tokenizes with the checkpoint's files; `auto`: the harness finds the
# server's own tokenizer routes (/tokenizer_info, /tokenize, /detokenize) and needs no files.
@pytest.mark.parametrize("tokenizer", ["huggingface", "auto"])
def test_lm_eval_through_stepwise_serve_matches_its_transformers_backend(served_policy, tasks, tokenizer_files,
                                                                           transformers_run, tokenizer):
    local = f",tokenizer={tokenizer_files}" if tokenizer == "huggingface" else ""
    served = evaluate(tasks, "local-completions",
                      f"base_url={served_policy}/v1/completions,model=qwen2-policy,"
                      f"tokenizer_backend={tokenizer}{local},num_concurrent=4", batch_size=8)
    hf = transformers_run
    # Every answer's log-likelihood (summed over its tokens, echoed by the server) and whether it
    # is the greedy continuation, as transformers computes them.
    a, b = by_doc(hf, "stepwise_arith"), by_doc(served, "stepwise_arith")
    assert len(a) == len(b) == 24
    for doc, sample in a.items():
        here = [r[0] for r in sample["resps"]]
        there = [r[0] for r in b[doc]["resps"]]
        assert len(here) == len(there) == len(sample["doc"]["choices"])
        for (ll_a, greedy_a), (ll_b, greedy_b) in zip(here, there):
            assert float(ll_b) == pytest.approx(float(ll_a), abs=1e-3), f"doc {doc}"
            assert greedy_a == greedy_b, f"doc {doc}"
    # Greedy generations, cut at the stop string.
    a, b = by_doc(hf, "stepwise_arith_gen"), by_doc(served, "stepwise_arith_gen")
    assert len(a) == 24
    for doc, sample in a.items():
        assert sample["resps"] == b[doc]["resps"], f"doc {doc}"
    assert served["results"]["stepwise_arith"]["acc,none"] == hf["results"]["stepwise_arith"]["acc,none"]
    c = counters(served_policy)
    # The harness's batches of loglikelihood requests (8 prompts a request) were weighed packed.
    assert c["stepwise_logprob_sequences_total"] >= 24 * 4
    assert c["stepwise_logprob_passes_total"] < c["stepwise_logprob_sequences_total"]
    # With `auto`, the harness tokenized through the server.
    tokenized = c.get('stepwise_requests_total{endpoint="/tokenize",status="200"}', 0)
    assert (tokenized > 0) == (tokenizer == "auto")
