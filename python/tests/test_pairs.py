"""Step-level preference pairs (``stepwise.step_pairs``, ``stepwise pairs``) from real PRM800K
records and from studio corrections, in each layout."""

import json
import subprocess

import pytest

import stepwise


def test_pairs_from_prm800k_rated_completions(repo):
    path = repo / "data" / "prm800k" / "samples_openr.jsonl"
    pairs = stepwise.step_pairs(str(path))
    assert len(pairs) == 15
    first = pairs[0]
    assert first["id"] == "0@1" and first["answer"] == "29"
    assert first["chosen"] == "We have $3p+e=1.24$ and $5p+e=1.82$."
    assert (first["chosen_source"], first["rejected_source"]) == ("step", "completion")
    # Records in memory give the same pairs as the file.
    assert stepwise.step_pairs(stepwise.read(path)) == pairs
    dpo = stepwise.step_pairs(path, layout="step-dpo", dataset="prm800k")
    assert set(dpo[0]) == {"dataset", "prompt", "initial_reason_steps", "chosen", "rejected", "full_chosen",
                           "full_rejected", "answer"}
    assert dpo[0]["full_chosen"] == dpo[0]["initial_reason_steps"] + dpo[0]["chosen"]
    trl = stepwise.step_pairs(path, layout="trl")
    assert set(trl[0]) == {"prompt", "chosen", "rejected"}
    assert trl[0]["prompt"] == first["question"] + "\n" + first["prefix"][0] + "\n"
    with pytest.raises(ValueError, match="step-dpo"):
        stepwise.step_pairs(path, layout="dpo")
    with pytest.raises(ValueError, match="chosen_min"):
        stepwise.step_pairs(path, chosen_min=0)


def test_a_studio_correction_is_the_chosen_step():
    record = {"id": "r", "question": "What is 2 + 3 * 4?", "gold_answer": "14",
              "steps": [{"text": "3 * 4 = 12.", "label": {"rating": "good"}},
                        {"text": "12 + 2 = 15.", "label": {"rating": "bad"}}],
              "meta": {"studio": {"labellings": [{"labeller": "lin", "corrections": {"1": "12 + 2 = 14."}}]}}}
    (pair,) = stepwise.step_pairs([record])
    assert (pair["chosen"], pair["rejected"], pair["chosen_source"]) == ("12 + 2 = 14.", "12 + 2 = 15.", "human")
    assert pair["prefix"] == ["3 * 4 = 12."]


def test_the_command_line_writes_the_same_pairs(repo, tmp_path):
    path = repo / "data" / "openr" / "samples_math-aps-tree_openr.jsonl"
    out = tmp_path / "pairs.jsonl"
    done = subprocess.run(["stepwise", "pairs", str(path), str(out), "--layout", "step-dpo"],
                          capture_output=True, text=True, check=True)
    assert "7 pairs from 242 records" in done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == stepwise.step_pairs(path, layout="step-dpo", dataset="samples_math-aps-tree_openr")


def test_a_policy_samples_the_right_step_a_wrong_one_lacks():
    """Step-DPO's rectification: the wrong step has no sibling, so a policy samples from its
    prefix; the first continuation reaching the gold answer gives the chosen step."""
    record = {"id": "r", "question": "What is 2 + 3 * 4?", "gold_answer": "14",
              "steps": [{"text": "3 * 4 = 12.", "label": {"rating": "good"}},
                        {"text": "12 + 2 = 15.", "label": {"rating": "bad"}}]}
    assert stepwise.step_pairs([record]) == []

    class Writer:
        def __init__(self):
            self.asked = []

        def continue_from(self, question, prefix, n, until, seed):
            self.asked.append((question, list(prefix), n, until))
            return ["12 + 2 = 15.\nThe answer is 15.", "12 + 2 = 14.\nThe answer is 14."][:n]

    writer, seen = Writer(), []
    (pair,) = stepwise.step_pairs([record], complete_with=writer, samples=2,
                                  progress=lambda done, total: seen.append((done, total)))
    assert writer.asked == [("What is 2 + 3 * 4?", ["3 * 4 = 12."], 2, "end")]
    assert (pair["chosen"], pair["rejected"], pair["chosen_source"]) == ("12 + 2 = 14.", "12 + 2 = 15.", "sampled")
    assert (pair["prefix"], pair["chosen_ends"]) == (["3 * 4 = 12."], False)
    assert seen[-1] == (1, 1)
    with pytest.raises(ValueError, match="samples"):
        stepwise.step_pairs([record], complete_with=writer, samples=0)


def test_the_check_turns_away_a_sampled_step_whose_own_rollouts_miss():
    record = {"id": "r", "question": "What is 2 + 3 * 4?", "gold_answer": "14",
              "steps": [{"text": "3 * 4 = 12.", "label": {"rating": "good"}},
                        {"text": "12 + 2 = 15.", "label": {"rating": "bad"}}]}

    class Lucky:
        """A slip first that lands on 14 once, then the right step; after the slip, 13 mostly."""

        def continue_from(self, question, prefix, n, until, seed):
            if prefix[-1] == "12 + 2 = 13.":
                return ["The answer is 14." if k == 0 else "The answer is 13." for k in range(n)]
            if prefix[-1] == "12 + 2 = 14.":
                return ["The answer is 14."] * n
            return ["12 + 2 = 13.\nThe answer is 14.", "12 + 2 = 14.\nThe answer is 14."][:n]

    (loose,) = stepwise.step_pairs([record], complete_with=Lucky(), samples=2)
    assert loose["chosen"] == "12 + 2 = 13."
    (checked,) = stepwise.step_pairs([record], complete_with=Lucky(), samples=2, check_rollouts=4)
    assert checked["chosen"] == "12 + 2 = 14."
