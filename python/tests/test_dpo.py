"""DPO (``stepwise.dpo``, ``stepwise dpo``) on the repository's tiny Qwen2 policy: step pairs
mined from real OmegaPRM and PRM800K files, and rows of ``step_pairs`` in each layout."""

import json
import math
import subprocess

import pytest

import stepwise


def read_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_command_line_mines_step_pairs_trains_and_resumes(repo, fixtures, tmp_path):
    samples = repo / "data" / "prm800k" / "samples_openr.jsonl"
    out = tmp_path / "run"
    args = ["stepwise", "dpo", "--policy", str(fixtures / "qwen2-policy"), "--pairs", str(samples),
            "--out", str(out), "--epochs", "3", "--batch-size", "4", "--lr", "3e-3", "--beta", "0.5",
            "--warmup-ratio", "0"]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    assert "15 pairs (mined from 6 step-labelled records" in done.stderr, done.stderr
    # The fixture's 601-token vocabulary spells MATH's LaTeX out long: pairs past its 512
    # positions are left out, and said so.
    assert "7 of 15 pairs are longer than the policy's 512 positions and were left out" in done.stderr
    log = read_log(out / "dpo_log.jsonl")
    assert [entry["step"] for entry in log] == list(range(1, 7))
    # The policy is its reference at the first step: DPO's loss is ln 2; it falls from there.
    assert math.isclose(log[0]["train"]["loss"], math.log(2), abs_tol=1e-4)
    assert log[-1]["train"]["loss"] < log[0]["train"]["loss"]
    assert log[-1]["train"]["chosen_reward"] > log[-1]["train"]["rejected_reward"]
    for name in ("model.safetensors", "config.json", "tokenizer.json", "optimizer.safetensors", "dpo.png"):
        assert (out / name).exists(), name
    # The same command on the finished folder trains no more and says the same.
    weights = (out / "model.safetensors").read_bytes()
    again = subprocess.run(args, capture_output=True, text=True, check=True)
    assert read_log(out / "dpo_log.jsonl") == log and (out / "model.safetensors").read_bytes() == weights
    assert "6 steps" in again.stderr
    # Other settings on the same folder are refused, not mixed in.
    refused = subprocess.run(args + ["--label-smoothing", "0.1"], capture_output=True, text=True)
    assert refused.returncode != 0 and "other DPO settings" in refused.stderr
    # OmegaPRM's tree file: every pair too long for this policy is an error, not an empty run.
    tree = repo / "data" / "openr" / "samples_math-aps-tree_openr.jsonl"
    long = subprocess.run(args[:4] + ["--pairs", str(tree), "--out", str(tmp_path / "tree")],
                          capture_output=True, text=True)
    assert long.returncode != 0 and "no pair fits the policy's 512 positions" in long.stderr, long.stderr


def test_python_trains_on_step_pairs_in_each_layout(repo, fixtures, tmp_path):
    samples = repo / "data" / "prm800k" / "samples_openr.jsonl"
    policy = fixtures / "qwen2-policy"
    seen = []
    for layout in ("stepwise", "trl", "step-dpo"):
        rows = stepwise.step_pairs(samples, layout=layout)
        totals = []
        log = stepwise.dpo(policy, rows, tmp_path / layout, epochs=2, batch_size=8, lr=1e-3,
                           eval_pairs=rows, progress=lambda done, total: totals.append((done, total)))
        # The pairs past the fixture's 512 positions are left out: two steps of the 8 others
        # (TRL's one prompt text may tokenize otherwise), and the progress says so.
        assert len(log) == log[-1]["steps"] and totals[-1] == (len(log), len(log)), layout
        assert math.isclose(log[0]["train"]["loss"], math.log(2), abs_tol=1e-3), layout
        assert log[-1]["eval"] is not None and set(log[-1]["eval"]) >= {"loss", "accuracy", "margin"}
        seen.append(log[0]["train"]["chosen_logp"])
    # stepwise's and Step-DPO's layouts lay the question and the prefix out alike; TRL's prompt is
    # one text (the question and prefix joined), so its token split may differ.
    assert math.isclose(seen[0], seen[2], rel_tol=1e-5)
    # Labelled records (a path or dicts) are mined as step_pairs mines them.
    from_path = stepwise.dpo(policy, samples, tmp_path / "mined", epochs=1, batch_size=8, lr=1e-3, progress=False)
    assert len(from_path) == 1 and from_path[0]["steps"] == 1


def test_bad_settings_and_pairs_are_refused(fixtures, tmp_path):
    policy = fixtures / "qwen2-policy"
    good = [{"prompt": "2 + 2 =", "chosen": " 4", "rejected": " 5"}]
    with pytest.raises(ValueError, match="learning rate"):
        stepwise.dpo(policy, good, tmp_path / "a", lr=0)
    with pytest.raises(ValueError, match="label-smoothing"):
        stepwise.dpo(policy, good, tmp_path / "b", label_smoothing=0.5)
    with pytest.raises(ValueError, match="no preference pairs"):
        stepwise.dpo(policy, [{"id": "r", "question": "q", "steps": [{"text": "a"}]}], tmp_path / "c")
    bad = good + [{"prompt": "3 + 3 =", "chosen": 6, "rejected": " 7"}]
    with pytest.raises(stepwise.StepwiseError, match=r"pairs:2: field `chosen`: expected a string"):
        stepwise.dpo(policy, bad, tmp_path / "d")
