import json

import pytest

import stepwise


class Scripted:
    """A policy written in Python: rollouts reach the gold answer (7) only from prefixes without a
    step saying "wrong"; one step at a time it writes "step".""" 

    def __init__(self):
        self.calls = 0

    def continue_from(self, question, prefix, n, until, seed):
        self.calls += 1
        if until == "step":
            done = len(prefix) >= 2
            return [{"text": "The answer is 7." if done else f"step {len(prefix)}", "finished": done}
                    for _ in range(n)]
        ok = not any("wrong" in p for p in prefix)
        return ["more\nThe answer is 7." if ok and k % 2 == 0 else "The answer is 8." for k in range(n)]


def records():
    return [{"id": "a", "question": "q1", "gold_answer": "7",
             "steps": [{"text": "fine"}, {"text": "wrong turn"}, {"text": "more"}]},
            {"id": "b", "question": "q2", "gold_answer": "7", "steps": [{"text": "fine"}, {"text": "The answer is 7."}]}]


def good(label):
    """A hard label's rating, or a soft (Monte Carlo) label's "any rollout reached the answer"."""
    if "rating" in label:
        return label["rating"] == "good"
    return label["p"] > 0


@pytest.mark.parametrize("method", ["mc", "binary_search", "omegaprm"])
def test_annotate_with_a_python_policy(method):
    policy = Scripted()
    out = stepwise.annotate(records(), policy, method=method, rollouts=4)
    by_id = {r["id"]: r for r in out}
    # The first error is the step that says "wrong"; the other solution is right throughout.
    assert [good(s["label"]) for s in by_id["a"]["steps"]] == [True, False, False]
    assert all(good(s["label"]) for s in by_id["b"]["steps"])
    if method == "mc":
        assert by_id["a"]["steps"][0]["label"]["p"] == 0.5  # 2 of 4 rollouts reach 7
    assert policy.calls > 0


def test_annotate_resumes_from_its_output(tmp_path):
    path = tmp_path / "labelled.jsonl"
    first = stepwise.annotate(records(), Scripted(), method="mc", rollouts=4, output=path)
    policy = Scripted()
    again = stepwise.annotate(records(), policy, method="mc", rollouts=4, output=path)
    assert again == first
    assert policy.calls == 0  # everything was in the output already
    with pytest.raises(stepwise.StepwiseError, match="other settings"):
        stepwise.annotate(records(), Scripted(), method="mc", rollouts=8, output=path)


def test_long_calls_report_progress(fixtures, tmp_path, monkeypatch, caplog):
    """A callable hears every count up to the total; False is silent; without tqdm the `stepwise`
    logger hears the totals (a tqdm bar is the default where tqdm is installed)."""
    seen = []
    stepwise.annotate(records(), Scripted(), rollouts=2, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (2, 2) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    seen.clear()
    stepwise.search(["q1", "q2", "q3"], Scripted(), prm, method="bon", n=2, max_steps=3,
                    progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (3, 3)
    with pytest.raises(TypeError, match="progress"):
        stepwise.annotate(records(), Scripted(), progress="loud")
    monkeypatch.setitem(__import__("sys").modules, "tqdm.auto", None)  # as if tqdm were not installed
    with caplog.at_level("INFO", logger="stepwise"):
        stepwise.annotate(records(), Scripted(), rollouts=2)
        stepwise.annotate(records(), Scripted(), rollouts=2, progress=False)
    assert [r.getMessage() for r in caplog.records if r.name == "stepwise"] == ["records: 2/2 done"]


def test_annotate_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="judge"):
        stepwise.annotate(records(), Scripted(), method="consensus")
    with pytest.raises(ValueError, match="continue_from"):
        stepwise.annotate(records(), object())
    with pytest.raises(stepwise.StepwiseError, match="gold_answer"):
        stepwise.annotate([{"question": "q", "steps": [{"text": "a"}]}], Scripted())

    class Broken:
        def continue_from(self, *args):
            raise RuntimeError("the GPU caught fire")

    with pytest.raises(stepwise.StepwiseError, match="caught fire"):
        stepwise.annotate(records(), Broken())


def test_local_policy_continues_a_solution(fixtures):
    policy = stepwise.Policy(str(fixtures / "qwen2-policy"), temperature=0.0, max_tokens=8)
    a = policy.continue_from("What is 2+3?", [], n=2, until="end", seed=1)
    assert len(a) == 2 and a[0]["text"] == a[1]["text"]
    assert a[0]["tokens"] == len(a[0]["token_ids"]) > 0
    assert len(policy.generate("What is 2+3?", n=3)) == 3


@pytest.mark.parametrize("method", ["bon", "beam", "dvts", "lookahead", "resample"])
def test_search_every_method(fixtures, method):
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    out = stepwise.search([{"question": "q", "answer": "7"}, "another question"], Scripted(), prm,
                          method=method, n=4, width=2, max_steps=5)
    assert len(out) == 2
    first = out[0]
    assert first["steps"] and len(first["scores"]["prm"]) == len(first["steps"])
    # Graded against its gold answer (the step methods end on the scripted right answer).
    assert first["correct"] is True or (method == "bon" and first["correct"] is False)
    assert "correct" not in out[1] or out[1]["correct"] is None
    assert first["meta"]["compute"]["generated_tokens"] >= 0


def test_search_resumes(fixtures, tmp_path):
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    path = tmp_path / "beam.jsonl"
    one = stepwise.search(["q1", "q2"], Scripted(), prm, n=4, width=2, output=path)
    policy = Scripted()
    two = stepwise.search(["q1", "q2"], policy, prm, n=4, width=2, output=path)
    assert [r["steps"] for r in one] == [r["steps"] for r in two]
    assert policy.calls == 0


def test_search_reads_a_problems_file_as_the_command_line_does(fixtures, repo, tmp_path):
    """A path (str or PathLike) is a file of problems, GSM8K's as it is (its `answer` with the
    `#### N` gold): never a question whose text is the file name."""
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    gsm8k = repo / "data" / "gsm8k" / "test.jsonl"
    first_two = tmp_path / "gsm8k.jsonl"
    first_two.write_text("".join(gsm8k.read_text().splitlines(keepends=True)[:2]))
    for given in (first_two, str(first_two)):
        out = stepwise.search(given, Scripted(), prm, method="bon", n=2, max_steps=3)
        assert len(out) == 2
        assert [r["question"] for r in out] == [
            json.loads(line)["question"] for line in first_two.read_text().splitlines()]
        assert all(r["gold_answer"] for r in out)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        stepwise.search(str(tmp_path / "missing.jsonl"), Scripted(), prm, n=2)
    # A string that names no file and no records file is a question.
    out = stepwise.search("What is 2 + 5?", Scripted(), prm, method="bon", n=2, max_steps=3)
    assert out[0]["question"] == "What is 2 + 5?"


def test_a_vllm_llm_serves_as_a_policy():
    """VllmPolicy against an object shaped as vLLM's `LLM.generate` answers (vLLM itself needs a
    GPU build or its CPU build, not installed in CI): prompts laid out as stepwise lays them, one
    step stopped at the separator, the answer read by annotation."""
    from types import SimpleNamespace

    from stepwise.integrations.vllm import VllmPolicy

    class FakeLLM:
        def __init__(self):
            self.prompts = []

        def generate(self, prompts, params, use_tqdm=False):
            self.prompts.extend(prompts)
            wrong = "wrong" in prompts[0]
            outs = [SimpleNamespace(text="The answer is 8." if wrong or k % 2 else "The answer is 7.",
                                    finish_reason="stop", stop_reason=None, token_ids=[1, 2, 3])
                    for k in range(params["n"])]
            return [SimpleNamespace(outputs=outs)]

    class Policy(VllmPolicy):
        def sampling_params(self, n, until, seed):
            return {"n": n, "until": until, "seed": seed}

    llm = FakeLLM()
    out = stepwise.annotate(records(), Policy(llm), method="mc", rollouts=4)
    by_id = {r["id"]: r for r in out}
    assert [good(s["label"]) for s in by_id["a"]["steps"]] == [True, False, False]
    assert "q1\nfine\n" in llm.prompts
    one = Policy(llm).continue_from("q", ["a"], 2, "step", 0)
    assert [c["finished"] for c in one] == [True, True]  # the end of sequence, not the separator


class Judge:
    """A judge written in Python: it always puts the first error at paragraph 1."""

    def continue_from(self, question, prefix, n, until, seed):
        return ["The earliest error is in paragraph \\boxed{1}."] * n


def test_annotate_by_a_judge_and_by_consensus():
    out = {r["id"]: r for r in stepwise.annotate(records(), Scripted(), method="judge", judge=Judge())}
    assert [good(s["label"]) for s in out["a"]["steps"]] == [True, False, False]
    assert [good(s["label"]) for s in out["b"]["steps"]] == [True, False]
    both = {r["id"]: r for r in stepwise.annotate(records(), Scripted(), method="consensus", judge=Judge(), rollouts=4)}
    # Monte Carlo and the judge agree on "a" (first error at 1), not on "b" (MC finds none).
    assert both["a"]["meta"]["consensus"] is True
    assert [good(s["label"]) for s in both["a"]["steps"]] == [True, False, False]
    assert both["b"]["meta"]["consensus"] is False
    assert all("label" not in s for s in both["b"]["steps"])


class Verifier:
    """A generative verifier in Python: two of three chains call step 2 incorrect."""

    def continue_from(self, question, prefix, n, until, seed):
        assert "Step 2: 12 + 1 = 13" in question
        bad = "Step 1: fine \\boxed{correct}\nStep 2: it adds 1, the problem adds 2 \\boxed{incorrect}"
        good = "Step 1: \\boxed{correct}\nStep 2: \\boxed{correct}\nStep 3: \\boxed{correct}"
        return [bad, bad, good][:n]


def test_generative_scores_are_each_steps_share_of_correct_verdicts():
    items = [("Ann has 3 bags of 4 apples and finds 2 more.", ["3 * 4 = 12", "12 + 1 = 13", "The answer is 13."])]
    scores = stepwise.generative_scores(Verifier(), items, samples=3)
    assert scores[0] == pytest.approx([1.0, 1 / 3, 1 / 3])
    # A Python policy gives no log-probabilities: its verdicts vote 1 or 0 either way.
    assert stepwise.generative_scores(Verifier(), items, samples=3, likelihood=False) == scores
    with pytest.raises(ValueError):
        stepwise.generative_scores(Verifier(), items, samples=0)


class IndexJudge:
    """A judge in Python that answers right after a solution: step 1 twice, no error once."""

    def continue_from(self, question, prefix, n, until, seed):
        assert list(prefix) == ["3 * 4 = 12", "12 + 1 = 13", "The answer is 13."]
        return ["1", "1", "- 1"][:n]


def test_judge_scores_vote_or_weigh_the_first_wrong_step(fixtures):
    items = [("Ann has 3 bags of 4 apples and finds 2 more.", ["3 * 4 = 12", "12 + 1 = 13", "The answer is 13."])]
    # Votes: each step's share of the answers that put the first error after it.
    votes = stepwise.judge_scores(IndexJudge(), items, likelihood=False, samples=3)
    assert votes[0] == pytest.approx([1.0, 1 / 3, 1 / 3])
    # A Python policy gives no log-probabilities to weigh the answers with.
    with pytest.raises(stepwise.StepwiseError, match="log-probabilities"):
        stepwise.judge_scores(IndexJudge(), items)
    with pytest.raises(ValueError, match="format"):
        stepwise.judge_scores(IndexJudge(), items, format="critique")
    # A local checkpoint weighs every verdict: a step's score is the probability of the verdicts
    # after it, so each row falls from step to step and stays a probability.
    local = stepwise.Policy(str(fixtures / "qwen2-policy"), separator="\n")
    weighed = stepwise.judge_scores(local, items + [("What is 2 + 3?", ["2 + 3 = 5", "The answer is 5."])])
    for row in weighed:
        assert all(0.0 <= s <= 1.0 for s in row)
        assert all(a >= b - 1e-6 for a, b in zip(row, row[1:])), row
    assert weighed == stepwise.judge_scores(local, items + [("What is 2 + 3?", ["2 + 3 = 5", "The answer is 5."])])


def test_generative_scores_with_python_tools(fixtures):
    items = [("What is 2 + 3?", ["2 + 3 = 5", "The answer is 5."])]
    local = stepwise.Policy(str(fixtures / "qwen2-policy"), temperature=0.0, max_tokens=8)
    # Random weights write neither code nor verdicts: every step unjudged, but the chain was
    # written through the tool loop (a local policy continues its own text).
    assert stepwise.generative_scores(local, items, samples=1, tools="python") == [[0.5, 0.5]]
    with pytest.raises(ValueError, match="tools"):
        stepwise.generative_scores(local, items, tools="bash")
    # A Python policy cannot continue its own text, which the tool loop needs.
    with pytest.raises(stepwise.StepwiseError, match="continue its own text"):
        stepwise.generative_scores(Verifier(), items, samples=1, tools="python")


class FailsOn(Scripted):
    """The scripted policy, raising for one question (a record its model cannot take)."""

    def __init__(self, question):
        super().__init__()
        self.question = question

    def continue_from(self, question, prefix, n, until, seed):
        if question == self.question:
            raise RuntimeError(f"cannot take {question!r}")
        return super().continue_from(question, prefix, n, until, seed)


def test_annotate_and_search_keep_what_they_did_when_a_record_fails(fixtures, tmp_path):
    recs = records() + [dict(records()[1], id="c", question="q3")]
    # raise: the record named, the ones before it on the error (and in the output).
    with pytest.raises(stepwise.StepwiseError, match=r"record 2 \(`b`\) could not be labelled: .*cannot take") as err:
        stepwise.annotate(recs, FailsOn("q2"), method="mc", rollouts=2, output=tmp_path / "mc.jsonl")
    assert [r["id"] for r in err.value.records] == ["a"]
    # skip: every record back, the failed one unlabelled with the reason, a warning with the count.
    with pytest.warns(UserWarning, match="1 of 3 records could not be labelled"):
        out = stepwise.annotate(recs, FailsOn("q2"), method="mc", rollouts=2, on_error="skip")
    assert [r["id"] for r in out] == ["a", "b", "c"]
    assert "cannot take" in out[1]["meta"]["annotate_error"]
    assert all("label" not in s for s in out[1]["steps"])
    assert all("label" in s for s in out[2]["steps"])
    # A record without a gold answer is one such record under skip.
    missing = [dict(records()[0])] + [{"id": "nogold", "question": "q", "steps": [{"text": "a"}]}]
    missing[0].pop("id")
    with pytest.warns(UserWarning):
        out = stepwise.annotate(missing, Scripted(), method="mc", rollouts=2, on_error="skip")
    assert "gold_answer" in out[1]["meta"]["annotate_error"]
    with pytest.raises(ValueError, match="on_error"):
        stepwise.annotate(recs, Scripted(), on_error="ignore")
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    problems = [{"question": "q1", "answer": "7"}, {"question": "q2", "answer": "7"}]
    with pytest.raises(stepwise.StepwiseError, match="cannot take"):
        stepwise.search(problems, FailsOn("q2"), prm, method="bon", n=2, threads=1)
    with pytest.warns(UserWarning, match="1 of 2 records could not be searched"):
        out = stepwise.search(problems, FailsOn("q2"), prm, method="bon", n=2, on_error="skip")
    assert out[0]["steps"] and not out[1]["steps"]
    assert "cannot take" in out[1]["meta"]["search_error"]


def _bf16_policy(fixtures, folder):
    """A random Qwen2 policy 512 wide (one layer) stored in bf16, with the fixture policy's
    tokenizer: the smallest shape the CPU samples on the packed engine, which batches."""
    import numpy as np
    import shutil
    import struct

    folder.mkdir()
    src = fixtures / "qwen2-policy"
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copy(src / f, folder / f)
    config = json.loads((src / "config.json").read_text())
    hidden, inter, kv_dim, vocab = 512, 1024, 128, config["vocab_size"]
    config.update(hidden_size=hidden, intermediate_size=inter, num_attention_heads=8, num_key_value_heads=2,
                  num_hidden_layers=1, layer_types=["full_attention"], dtype="bfloat16")
    (folder / "config.json").write_text(json.dumps(config))
    p = "model.layers.0."
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
              p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.q_proj.bias": (hidden,),
              p + "self_attn.k_proj.weight": (kv_dim, hidden), p + "self_attn.k_proj.bias": (kv_dim,),
              p + "self_attn.v_proj.weight": (kv_dim, hidden), p + "self_attn.v_proj.bias": (kv_dim,),
              p + "self_attn.o_proj.weight": (hidden, hidden), p + "mlp.gate_proj.weight": (inter, hidden),
              p + "mlp.up_proj.weight": (inter, hidden), p + "mlp.down_proj.weight": (hidden, inter)}
    rng = np.random.default_rng(0)
    header, blobs, at = {}, [], 0
    for name, shape in shapes.items():
        x = np.ones(shape, np.float32) if "norm" in name else rng.uniform(-0.05, 0.05, shape).astype(np.float32)
        if "embed" in name:
            x *= 10
        blob = (x.view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    return folder


def test_continue_all_asks_many_at_once_as_each_alone(fixtures, tmp_path):
    asks = [{"question": "What is 2+3?", "n": 2, "seed": 1},
            {"question": "Name a prime.", "prefix": ["Two is one."], "n": 3, "seed": 2},
            {"question": "Say done."}]
    # The CPU decoder (one ask after another) and the packed engine (all asks in one batch).
    for source in [fixtures / "qwen2-policy", _bf16_policy(fixtures, tmp_path / "bf16")]:
        policy = stepwise.Policy(str(source), temperature=1.0, max_tokens=6)
        got = policy.continue_all(asks)
        assert [len(g) for g in got] == [2, 3, 1]
        for ask, conts in zip(asks, got):
            alone = policy.continue_from(ask["question"], ask.get("prefix", []), n=ask.get("n", 1),
                                         seed=ask.get("seed", 0))
            assert [c["token_ids"] for c in conts] == [c["token_ids"] for c in alone]
            assert all(c["tokens"] > 0 for c in conts)
    with pytest.raises(ValueError, match="ask 1: field `question` is missing"):
        policy.continue_all([{"question": "q"}, {"n": 2}])
    with pytest.raises(ValueError, match="ask 0: unknown field `temperature`"):
        policy.continue_all([{"question": "q", "temperature": 2.0}])
    with pytest.raises(ValueError, match="ask 0: field `n`"):
        policy.continue_all([{"question": "q", "n": 0}])
