import pytest

import stepwise
from stepwise.integrations import openrlhf, verl


def test_step_rewards_place_scores_at_step_ends():
    assert stepwise.step_rewards([5, 6, 7, 8], [0.9, 0.2], [1, 3]) == pytest.approx([0, 0.9, 0, 0.2])
    # min credit: the return from each step is the lowest score from it on.
    r = stepwise.step_rewards(4, [0.2, 0.9], [1, 3], credit="min")
    assert r == pytest.approx([0, -0.7, 0, 0.9])
    assert sum(r) == pytest.approx(0.2)  # min(0.2, 0.9) from the first step
    assert stepwise.step_rewards(4, [0.9, 0.2], [1, 3], credit="min") == pytest.approx([0, 0, 0, 0.2])
    assert stepwise.step_rewards(3, [0.5], [1], outcome=1.0) == pytest.approx([0, 0.5, 1.0])
    with pytest.raises(ValueError, match="past the response"):
        stepwise.step_rewards(2, [0.5], [2])
    with pytest.raises(ValueError, match="credit"):
        stepwise.step_rewards(2, [0.5], [1], credit="sum")


class CharTokenizer:
    """One token a character (what the reward manager needs of a tokenizer, with offsets)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)

    def __call__(self, text, return_offsets_mapping=False, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text], "offset_mapping": [(i, i + 1) for i in range(len(text))]}


def test_verl_compute_score_grades_and_summarises_steps(fixtures):
    plain = verl.compute_score("gsm8k", "2+3 is 5.\n\nThe answer is \\boxed{5}.", "5")
    assert plain["score"] == 1.0 and plain["acc"] == 1.0
    assert verl.compute_score("gsm8k", "The answer is 6.", "5")["score"] == 0.0
    fn = verl.make_compute_score(stepwise.PRM(str(fixtures / "qwen2-prm")))
    out = fn("gsm8k", "2+3 is 5.\n\nThe answer is \\boxed{5}.", "5", {"question": "What is 2+3?"})
    assert out["num_steps"] == 2.0
    assert 0.0 <= out["prm_min"] <= out["prm_mean"] <= 1.0
    assert all(isinstance(v, float) for v in out.values())


def test_verl_reward_manager_writes_step_rewards_at_step_ends(fixtures):
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    manager = verl.StepwiseRewardManager(tokenizer=CharTokenizer(), prm=prm, separator="\n\n", credit="return_to_go")
    text = "2+3 is 5.\n\nThe answer is \\boxed{5}."
    ids = [ord(c) for c in text]
    (rewards,), extra = manager.rewards([ids], ["5"], ["What is 2+3?"])
    scores = prm.score("What is 2+3?", ["2+3 is 5.", "The answer is \\boxed{5}."])
    first_end = text.index("\n") - 1
    assert rewards[first_end] == pytest.approx(scores[0])
    assert rewards[-1] == pytest.approx(scores[1] + 1.0)  # the last step's score and the outcome
    assert sum(1 for r in rewards if r) == 2
    assert extra["acc"] == [1.0] and extra["num_steps"] == [2.0]


def test_step_token_ends():
    text = "ab\n\ncd"
    offsets = [(i, i + 1) for i in range(len(text))]
    assert verl.step_token_ends(text, ["ab", "cd"], offsets) == [1, 5]
    # More steps than tokens: the ones without a token of their own are dropped.
    assert verl.step_token_ends("ab", ["a", "b", "c"], [(0, 2)]) == [0]


def test_openrlhf_reward_func(fixtures):
    prompt = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    queries = [prompt + "2+3 is 5.\n\nThe answer is \\boxed{5}.<|im_end|>", prompt + "The answer is 6.<|im_end|>"]
    fn = openrlhf.make_reward_func(stepwise.PRM(str(fixtures / "qwen2-prm")))
    out = fn(queries, [prompt, prompt], ["5", "5"])
    rewards = [float(x) for x in out["rewards"]]
    logs = {k: [float(x) for x in v] for k, v in out["extra_logs"].items()}
    assert logs["acc"] == [1.0, 0.0]
    assert logs["num_steps"] == [2.0, 1.0]
    assert rewards[0] == pytest.approx(min(out["step_scores"][0]) + 1.0, abs=1e-6)
    assert rewards[1] == pytest.approx(out["step_scores"][1][0], abs=1e-6)
    outcome_only = openrlhf.make_reward_func(None)(queries, [prompt, prompt], ["5", "5"])
    assert [float(x) for x in outcome_only["rewards"]] == [1.0, 0.0]
