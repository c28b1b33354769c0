"""TRL's ``DPOTrainer`` as pip installs it (1.16.0) trains on ``stepwise.step_pairs(...,
layout="trl")`` as they are: real PRM800K pairs, the repository's tiny Qwen2 policy on the CPU.

Skipped where TRL is not installed (it brings PyTorch); ``STEPWISE_REQUIRE_TRL=1`` (CI) turns the
skip into a failure."""

import importlib.util
import math
import os

import pytest

if importlib.util.find_spec("trl") is None:
    if os.environ.get("STEPWISE_REQUIRE_TRL"):
        raise RuntimeError("STEPWISE_REQUIRE_TRL is set but trl is not installed")
    pytest.skip("trl is not installed", allow_module_level=True)

import datasets  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402

import stepwise  # noqa: E402


def test_dpo_trainer_learns_from_step_pairs(repo, fixtures, tmp_path):
    pairs = stepwise.step_pairs(repo / "data" / "prm800k" / "samples_openr.jsonl", layout="trl")
    train = datasets.Dataset.from_list(pairs[:4])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(fixtures / "qwen2-policy", dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(fixtures / "qwen2-policy")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    args = DPOConfig(output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=4, learning_rate=5e-3,
                     logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", beta=0.1)
    trainer = DPOTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    # The first step is DPO's ln 2 (the policy is its reference); the same four pairs again and
    # again, the chosen steps pull ahead of the rejected.
    assert abs(losses[0] - math.log(2)) < 1e-3, losses
    assert losses[-1] < losses[0] - 0.05, losses
