"""stepwise inside verl as pip installs it (0.9.1): verl's own config file, its loaders (by
package and by file path), its registry and its reward loop worker, over a real ``DataProto``.

Skipped where verl is not installed (it brings PyTorch and Ray); ``STEPWISE_REQUIRE_VERL=1``
(CI) turns the skip into a failure."""

import asyncio
import importlib.util
import os
from pathlib import Path

import pytest

if importlib.util.find_spec("verl") is None:
    if os.environ.get("STEPWISE_REQUIRE_VERL"):
        raise RuntimeError("STEPWISE_REQUIRE_VERL is set but verl is not installed")
    pytest.skip("verl is not installed", allow_module_level=True)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import verl  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker  # noqa: E402
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls  # noqa: E402
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402

import stepwise  # noqa: E402
from stepwise.integrations import verl as sv  # noqa: E402

QUESTION = "What is 2+3?"
RESPONSES = ["2+3 is 5.\n\nThe answer is \\boxed{5}.", "2+3 is 6.\n\nSo 6 it is.\n\nThe answer is \\boxed{6}."]


def verl_config(policy: Path, **reward):
    """verl's own trainer config (the file its Hydra entry point composes), as a user sets it."""
    cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    cfg.actor_rollout_ref.model.path = str(policy)
    cfg.actor_rollout_ref.model.tokenizer_path = str(policy)
    for key, value in reward.items():
        OmegaConf.update(cfg, f"reward.{key}", value)
    return cfg


def batch(tok) -> DataProto:
    """Two rollouts as verl's trainer hands them over: left-padded prompts, right-padded
    responses, one attention mask over both, ground truths and questions beside them."""
    prompt = tok(QUESTION, add_special_tokens=False)["input_ids"]
    responses = [tok(r, add_special_tokens=False)["input_ids"] for r in RESPONSES]
    p_len, r_len = len(prompt) + 2, max(map(len, responses)) + 3
    prompts = torch.zeros((2, p_len), dtype=torch.long)
    resp = torch.zeros((2, r_len), dtype=torch.long)
    mask = torch.zeros((2, p_len + r_len), dtype=torch.long)
    for i, r in enumerate(responses):
        prompts[i, p_len - len(prompt):] = torch.tensor(prompt)
        resp[i, : len(r)] = torch.tensor(r)
        mask[i, p_len - len(prompt): p_len + len(r)] = 1
    input_ids = torch.cat([prompts, resp], dim=1)
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": resp, "attention_mask": mask, "input_ids": input_ids,
                 "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)},
        non_tensors={
            "data_source": np.array(["gsm8k", "gsm8k"], dtype=object),
            "reward_model": np.array([{"ground_truth": "5"}, {"ground_truth": "5"}], dtype=object),
            "extra_info": np.array([{"question": QUESTION}, {"question": QUESTION}], dtype=object),
        },
    )


@pytest.fixture()
def prm_env(fixtures, monkeypatch):
    monkeypatch.setenv("STEPWISE_PRM", str(fixtures / "qwen2-prm"))
    monkeypatch.setenv("STEPWISE_CREDIT", "return_to_go")
    return stepwise.PRM(str(fixtures / "qwen2-prm"))


def expected(prm, credit="return_to_go"):
    """Each response's reward: the sum of its step rewards and its outcome."""
    out = []
    for text, outcome in zip(RESPONSES, [1.0, 0.0]):
        scores = prm.score(QUESTION, stepwise.split_steps(text, "\n\n"))
        out.append((sum(scores) if credit == "return_to_go" else min(scores)) + outcome)
    return out


def test_the_reward_manager_runs_in_verls_reward_loop_worker(fixtures, prm_env):
    cfg = verl_config(fixtures / "qwen2-policy", **{
        "reward_manager.source": "importlib",
        "reward_manager.module.path": "pkg://stepwise.integrations.verl",
        "reward_manager.name": "StepwiseRewardManager",
    })
    worker = RewardLoopWorker(cfg)  # verl's class, run here without its Ray actor wrapper
    assert type(worker.reward_manager).__name__ == "StepwiseRewardManager"
    data = batch(worker.input_tokenizer)
    outputs = asyncio.run(worker.compute_score_batch(data))
    scores = [o["reward_score"] for o in outputs]
    assert scores == pytest.approx(expected(prm_env), abs=1e-5)
    assert [o["reward_extra_info"]["acc"] for o in outputs] == [1.0, 0.0]
    assert [o["reward_extra_info"]["num_steps"] for o in outputs] == [2.0, 3.0]
    # verl's trainer then places each reward at the response's last token.
    rm = sv.StepwiseRewardManager.assemble_rm_scores(data, scores)
    ends = data.batch["attention_mask"][:, data.batch["prompts"].shape[1]:].sum(-1) - 1
    assert rm[0, ends[0]].item() == pytest.approx(scores[0]) and rm.sum().item() == pytest.approx(sum(scores))


def test_min_credit_through_the_registry(fixtures, prm_env, monkeypatch):
    monkeypatch.setenv("STEPWISE_CREDIT", "min")
    assert get_reward_manager_cls("stepwise") is sv.StepwiseRewardManager
    cfg = verl_config(fixtures / "qwen2-policy", **{"reward_manager.source": "register",
                                                    "reward_manager.name": "stepwise"})
    worker = RewardLoopWorker(cfg)
    outputs = asyncio.run(worker.compute_score_batch(batch(worker.input_tokenizer)))
    assert [o["reward_score"] for o in outputs] == pytest.approx(expected(prm_env, "min"), abs=1e-5)


@pytest.mark.parametrize("how", ["pkg", "file"])
def test_compute_score_loads_through_verls_own_loader(fixtures, how, monkeypatch):
    monkeypatch.delenv("STEPWISE_PRM", raising=False)
    path = "pkg://stepwise.integrations.verl" if how == "pkg" else sv.__file__
    cfg = verl_config(fixtures / "qwen2-policy", **{"custom_reward_function.path": path,
                                                    "custom_reward_function.name": "compute_score"})
    fn = get_custom_reward_fn(cfg)
    assert fn(data_source="gsm8k", solution_str=RESPONSES[0], ground_truth="5", extra_info={})["score"] == 1.0
    assert fn(data_source="gsm8k", solution_str=RESPONSES[1], ground_truth="5", extra_info={})["score"] == 0.0


def test_the_legacy_call_gives_token_level_rewards(fixtures, prm_env):
    tok = AutoTokenizer.from_pretrained(str(fixtures / "qwen2-policy"))
    manager = sv.StepwiseRewardManager(tokenizer=tok)
    data = batch(tok)
    out = manager(data, return_dict=True)
    rows = out["reward_tensor"]
    assert rows.shape == data.batch["responses"].shape
    assert rows.sum(-1).tolist() == pytest.approx(expected(prm_env), abs=1e-5)
    assert int((rows[1] != 0).sum()) == 3  # one reward a step; the wrong answer adds no outcome


def test_a_bad_credit_is_refused(fixtures):
    tok = AutoTokenizer.from_pretrained(str(fixtures / "qwen2-policy"))
    with pytest.raises(ValueError, match="credit"):
        sv.StepwiseRewardManager(tokenizer=tok, credit="sum")
    Bound = sv.make_reward_manager(credit="min", separator="\n\n")
    assert Bound(tokenizer=tok).credit == "min"
    with pytest.raises(TypeError, match="unknown settings"):
        sv.make_reward_manager(creditt="min")
