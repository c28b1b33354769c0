"""Hostile and careless arguments: refused with a ValueError that says why before anything is
allocated, graded as they should be, never an abort, a panic or a silently dropped value; a long
call stops at Ctrl-C."""

import json
import math
import os
import signal
import threading
import time

import pytest

import stepwise


def test_huge_sizes_are_refused_before_allocating(fixtures):
    with pytest.raises(ValueError, match="2\\^24"):
        stepwise.step_rewards(10**12, [0.5], [3])
    policy = stepwise.Policy(str(fixtures / "qwen2-policy"), max_tokens=4)
    with pytest.raises(ValueError, match="n=1000000000"):
        policy.generate("What is 2 + 3?", n=10**9)
    with pytest.raises(ValueError, match="n=0"):
        policy.continue_from("What is 2 + 3?", [], n=0)


@pytest.mark.parametrize("kw", [{"temperature": math.nan}, {"temperature": -1.0}, {"top_p": 0.0},
                                {"top_p": math.inf}, {"max_tokens": 0}])
def test_bad_sampling_settings_are_value_errors(fixtures, kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        stepwise.Policy(str(fixtures / "qwen2-policy"), **kw)


def test_no_answer_is_never_right():
    assert stepwise.grade(None, None) is False
    assert stepwise.grade(math.nan, math.nan) is False
    assert stepwise.grade("", "") is False
    assert stepwise.grade([None, "4", math.nan], "4") == [False, True, False]
    assert stepwise.grade("inf", "\\infty") is True
    assert stepwise.grade(math.inf, "\\infty") is True
    assert stepwise.grade(-math.inf, "\\infty") is False
    assert stepwise.grade(0.5, "\\frac{1}{2}") is True
    with pytest.raises(ValueError):
        stepwise.grade(True, "1")


def test_non_finite_scores_are_refused_not_dropped(tmp_path):
    rec = {"question": "q", "steps": [{"text": "a", "score": 0.5}, {"text": "b", "score": math.nan}]}
    with pytest.raises(ValueError, match=r"record 1: steps\[1\]\.score: NaN"):
        stepwise.read([rec])
    bad = {"question": "q", "steps": [{"text": "a"}, {"text": "b"}], "scores": {"prm": [0.5, math.inf]}}
    with pytest.raises(ValueError, match=r"scores\.prm\[1\]: inf"):
        stepwise.write([bad], tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()
    # In files: Python's json writes NaN, which is not JSON; the reader names the line.
    (tmp_path / "nan.jsonl").write_text(json.dumps({"id": "a", "problem_id": "p", "question": "q",
                                                   "steps": [{"text": "a", "score": math.nan}]}) + "\n")
    with pytest.raises(stepwise.StepwiseError, match="nan.jsonl:1"):
        stepwise.read(tmp_path / "nan.jsonl")


def test_scores_come_back_as_written(tmp_path):
    rec = {"question": "q", "steps": [{"text": "a", "score": 0.3}, {"text": "b", "score": 0.1}],
           "scores": {"prm": [0.3, 0.7]}}
    back = stepwise.read([rec])[0]
    assert [s["score"] for s in back["steps"]] == [0.3, 0.1]
    assert back["scores"]["prm"] == [0.3, 0.7]
    stepwise.write([rec], tmp_path / "x.jsonl")
    assert '"prm":[0.3,0.7]' in (tmp_path / "x.jsonl").read_text()
    assert stepwise.read(tmp_path / "x.jsonl")[0]["scores"]["prm"] == [0.3, 0.7]


def test_generators_and_non_utf8_paths_are_read(tmp_path):
    gen = ({"question": f"q{i}", "steps": [{"text": "a"}]} for i in range(3))
    assert [r["question"] for r in stepwise.read(gen)] == ["q0", "q1", "q2"]
    name = os.fsdecode(bytes(tmp_path) + b"/caf\xe9.jsonl")
    stepwise.write([{"question": "q", "steps": [{"text": "a"}]}], name)
    assert stepwise.read(name)[0]["question"] == "q"
    # A string is a path to a file of records, wherever records are taken.
    assert stepwise.convert(name, "trl")[0]["prompt"] == "q"
    with pytest.raises(FileNotFoundError, match="no such file: records"):
        stepwise.convert("records", "trl")
    with pytest.raises(ValueError, match="not bytes"):
        stepwise.convert(b"records", "trl")


def test_run_tests_validates_timeout_and_threads(repo):
    he = repo / "data" / "humaneval" / "HumanEval.jsonl"
    for t in (1e300, math.nan, 0.0, -1.0, 86401.0):
        with pytest.raises(ValueError, match="timeout"):
            stepwise.run_tests(he, [], timeout=t)
    with pytest.raises(ValueError, match="four per core"):
        stepwise.run_tests(he, [], threads=10**5)


def interrupt_after(seconds):
    # A runner started in the background (a CI job launched with `&`) inherits SIGINT ignored,
    # and Python then installs no KeyboardInterrupt handler: install it, as an interactive one has.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    t = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    t.start()
    return t


def test_ctrl_c_stops_run_tests_between_batches(repo):
    he = repo / "data" / "humaneval" / "HumanEval.jsonl"
    slow = [{"task_id": "HumanEval/0", "completion": "    import time\n    time.sleep(3)\n"}] * 40
    start = time.monotonic()
    interrupt_after(0.5)
    with pytest.raises(KeyboardInterrupt):
        stepwise.run_tests(he, slow, timeout=2.0, threads=1)
    # One batch of four programs (at most 2 s each), not forty.
    assert time.monotonic() - start < 30


def test_run_tests_interrupted_resumes_from_its_output(repo, tmp_path):
    he = repo / "data" / "humaneval" / "HumanEval.jsonl"
    problems = [json.loads(line) for line in he.read_text().splitlines()[:4]]
    samples = [{"task_id": p["task_id"], "completion": c} for p in problems
               for c in (p["canonical_solution"], "    return None\n")]
    whole = stepwise.run_tests(he, samples, timeout=5.0, threads=1)
    out = tmp_path / "graded.jsonl"
    # Ctrl-C lands in the first batch of four: the call stops after it, its four kept.
    interrupt_after(0.05)
    with pytest.raises(KeyboardInterrupt):
        stepwise.run_tests(he, samples, timeout=5.0, threads=1, output=out)
    assert len(out.read_text().splitlines()) == 4
    assert stepwise.run_tests(he, samples, timeout=5.0, threads=1, output=out) == whole
    assert [json.loads(line) for line in out.read_text().splitlines()] == whole
    with pytest.raises(stepwise.StepwiseError, match="other settings"):
        stepwise.run_tests(he, samples[:4], timeout=5.0, threads=1, output=out)
    with pytest.raises(stepwise.StepwiseError, match="must be a .jsonl"):
        stepwise.run_tests(he, samples, output=tmp_path / "graded.parquet")


def test_ctrl_c_stops_generate(fixtures):
    policy = stepwise.Policy(str(fixtures / "qwen2-policy"), max_tokens=64)
    start = time.monotonic()
    interrupt_after(0.5)
    with pytest.raises(KeyboardInterrupt):
        policy.generate("What is 2 + 3?", n=2000)
    assert time.monotonic() - start < 10


def test_ctrl_c_stops_score_records(fixtures, processbench):
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    recs = stepwise.read(processbench)[:8] * 200
    start = time.monotonic()
    interrupt_after(0.5)
    with pytest.raises(KeyboardInterrupt):
        prm.score_records(recs, batch_size=1)
    assert time.monotonic() - start < 30


def test_devices_and_dtypes_as_torch_spells_them(fixtures):
    prm = str(fixtures / "qwen2-prm")
    want = stepwise.PRM(prm, device="cpu", dtype="f32").score("q", ["a step"])
    for dtype in ("float32", "torch.float32", "fp32"):
        assert stepwise.PRM(prm, device="cpu", dtype=dtype).score("q", ["a step"]) == want
    for dtype in ("bfloat16", "torch.bfloat16", "bf16", None):
        assert stepwise.PRM(prm, device="cpu", dtype=dtype).device == "cpu"
    for dtype in ("float16", "torch.float16", "fp16", "half"):
        with pytest.raises(ValueError, match="float16 is not a compute type"):
            stepwise.PRM(prm, dtype=dtype)
    # A CUDA index is cuda:N, which this CPU build refuses saying so.
    with pytest.raises((ValueError, stepwise.StepwiseError), match="cuda:1.*without CUDA|without CUDA"):
        stepwise.PRM(prm, device=1)
    with pytest.raises(ValueError, match="device=.tpu."):
        stepwise.PRM(prm, device="tpu")


def test_floats_come_back_as_written(fixtures):
    # An f32 result comes back as the float that prints as it does, not its binary widening.
    assert stepwise.step_rewards(3, [0.9], [1]) == [0.0, 0.9, 0.0]
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    scores = prm.score("q", ["a", "b"])
    digits = [repr(s).split("e")[0].replace("-", "").replace(".", "").lstrip("0") for s in scores]
    assert all(len(d) <= 9 for d in digits), scores  # an f32's shortest decimal, not 17 digits
    rec = prm.score_records([{"question": "q", "steps": [{"text": "a"}, {"text": "b"}]}])[0]
    assert rec["scores"]["prm"] == scores == prm.score_batch([("q", ["a", "b"])])[0]
