"""The code domain from Python: programs run against HumanEval's tests in the sandbox, pass@k,
and annotation and search whose steps are lines of code, checked by execution."""

import json

import pytest

import stepwise


@pytest.fixture(scope="module")
def humaneval(repo):
    return repo / "data" / "humaneval" / "HumanEval.jsonl"


@pytest.fixture(scope="module")
def problems(humaneval):
    return [json.loads(line) for line in humaneval.read_text().splitlines()]


def lines(code):
    return [line for line in code.splitlines() if line.strip()]


def test_run_tests_passes_references_and_fails_broken_programs(humaneval, problems):
    samples = []
    for p in problems[:6]:
        samples.append({"task_id": p["task_id"], "completion": p["canonical_solution"]})
        samples.append({"task_id": p["task_id"], "completion": "    return None\n"})
    out = stepwise.run_tests(humaneval, samples, timeout=5.0)
    assert [r["passed"] for r in out] == [True, False] * 6
    assert out[0]["result"] == "passed" and out[0]["tests_run"] == out[0]["tests_passed"] > 0
    assert out[1]["result"].startswith(("failed", "error")), out[1]
    assert out[1]["task_id"] == samples[1]["task_id"], "the samples come back with their fields"
    # A stepwise record: the program's lines as steps.
    record = {"problem_id": problems[0]["task_id"], "steps": lines(problems[0]["canonical_solution"])}
    assert stepwise.run_tests(humaneval, [record])[0]["passed"] is True
    # A program that never ends is stopped at its timeout.
    loop = stepwise.run_tests(humaneval, [{"task_id": "HumanEval/0", "completion": "    while True:\n        pass\n"}],
                              timeout=1.0)
    assert loop[0]["passed"] is False and loop[0]["result"].startswith("timeout"), loop[0]


def test_run_tests_errors_name_the_sample(humaneval):
    with pytest.raises(stepwise.StepwiseError, match="sample 2.*completion"):
        stepwise.run_tests(humaneval, [{"task_id": "HumanEval/0", "completion": "    pass\n"}, {"task_id": "x"}])
    with pytest.raises(stepwise.StepwiseError, match="HumanEval/9999"):
        stepwise.run_tests(humaneval, [{"task_id": "HumanEval/9999", "completion": "    pass\n"}])


def test_pass_at_k():
    assert stepwise.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert stepwise.pass_at_k(10, 0, 5) == 0.0
    assert stepwise.pass_at_k(5, 1, 5) == 1.0
    with pytest.raises(ValueError):
        stepwise.pass_at_k(3, 4, 1)


class RestOfReference:
    """A policy in Python that completes any prefix with the rest of the reference solution, one
    line a step."""

    def __init__(self, problems):
        self.refs = {p["prompt"]: lines(p["canonical_solution"]) for p in problems}

    def continue_from(self, question, prefix, n, until, seed):
        rest = self.refs[question][len(prefix):]
        if until == "step":
            return [{"text": rest[0], "finished": len(rest) == 1} for _ in range(n)]
        return ["\n".join(rest)] * n


def test_annotate_labels_lines_by_execution(humaneval, problems):
    p = problems[0]  # has_close_elements: seven lines, the comparison on the fifth
    steps = lines(p["canonical_solution"])
    flipped = [s.replace("distance < threshold", "distance > threshold") for s in steps]
    assert flipped != steps
    record = {"id": "flip", "problem_id": p["task_id"], "question": p["prompt"], "gold_answer": p["task_id"],
              "steps": [{"text": s} for s in flipped]}
    for method in ["mc", "binary_search"]:
        out = stepwise.annotate([record], RestOfReference(problems), method=method, rollouts=1,
                                code_problems=humaneval)
        labels = [s["label"] for s in out[0]["steps"]]
        bad = [i for i, l in enumerate(labels) if not (l.get("p", 0) > 0 or l.get("rating") == "good")]
        first_flip = next(i for i, (a, b) in enumerate(zip(steps, flipped)) if a != b)
        assert bad and bad[0] == first_flip, (method, labels)


def test_search_over_lines_is_graded_by_the_tests(humaneval, problems, fixtures):
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    # The shortest problem: the fixture PRM reads 512 positions.
    p = min(problems, key=lambda p: len(p["prompt"]) + len(p["canonical_solution"]))
    out = stepwise.search([p["task_id"]], RestOfReference(problems), prm, method="beam", n=2, width=2,
                          max_steps=10, code_problems=humaneval)
    assert out[0]["gold_answer"] == p["task_id"]
    assert out[0]["correct"] is True, out[0]
    with pytest.raises(ValueError, match="HumanEval/9999"):
        stepwise.search(["HumanEval/9999"], RestOfReference(problems), prm, code_problems=humaneval)


def test_verl_reward_function_for_code(humaneval, problems, monkeypatch):
    from stepwise.integrations import verl

    p = problems[0]
    score = verl.make_code_compute_score(humaneval, timeout=5.0)
    right = score("openai_humaneval", p["canonical_solution"], p["task_id"])
    assert right == {"score": 1.0, "acc": 1.0, "test_pass_rate": 1.0}
    wrong = score("openai_humaneval", p["canonical_solution"].replace("<", ">"), p["task_id"])
    assert wrong["score"] == 0.0 and 0.0 <= wrong["test_pass_rate"] < 1.0
    # The module's compute_score, configured from the environment as verl runs it.
    monkeypatch.setenv("STEPWISE_CODE_PROBLEMS", str(humaneval))
    assert verl.compute_score("openai_humaneval", p["canonical_solution"], p["task_id"])["score"] == 1.0


def test_run_tests_names_a_sample_it_cannot_run_or_skips_it(humaneval, problems):
    samples = [{"task_id": problems[0]["task_id"], "completion": problems[0]["canonical_solution"]},
               {"task_id": "HumanEval/99999", "completion": "    return 1\n"}]
    with pytest.raises(stepwise.StepwiseError, match="sample 2: no problem `HumanEval/99999`"):
        stepwise.run_tests(humaneval, samples)
    with pytest.warns(UserWarning, match="1 of 2 samples could not be run"):
        out = stepwise.run_tests(humaneval, samples, on_error="skip")
    assert out[0]["passed"] is True
    assert out[1]["passed"] is None and "no problem" in out[1]["error"]
