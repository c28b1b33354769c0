"""Single-turn RL from Python (`stepwise.rl`, the run `stepwise rl` makes): the fixture policy
trained against the outcome, a PRM and PRIME, checkpoints that load, resumption, and what it refuses."""

import json

import pytest
import stepwise

PROBLEMS = [
    {"id": "a", "question": "What is 2 + 3?", "answer": "5"},
    {"id": "b", "question": "What is 4 * 2?", "answer": "#### 8"},
]
SMALL = dict(updates=2, prompts=2, group_size=2, max_tokens=8, lr=1e-4, checkpoint_every=1, seed=4)


@pytest.mark.parametrize("trainer", ["autograd", "packed"])
@pytest.mark.parametrize("reward", ["outcome", "prm", "prime"])
def test_rl_trains_against_each_reward_and_resumes(tmp_path, fixtures, reward, trainer):
    """With either CPU trainer: candle's autograd, and the packed engine's (sampling from its own
    weights; PRIME's implicit PRM a second packed trainer)."""
    spec = f"prm:{fixtures / 'qwen2-prm'}" if reward == "prm" else reward
    out = tmp_path / reward
    seen = []
    # The random policy is always wrong: PRIME learns from every group here.
    log = stepwise.rl(fixtures / "qwen2-policy", PROBLEMS, out, reward=spec, prime_filter=(0.0, 1.0),
                      progress=lambda done, total: seen.append((done, total)), trainer=trainer, **SMALL)
    assert [entry["update"] for entry in log] == [1, 2] and seen[-1] == (2, 2)
    # The k3 estimate of the KL is never negative in exact arithmetic; at the first update the
    # policy is the reference, read through two paths (the trainer's and the sampler's kernels),
    # whose rounding leaves it within a hair of 0 either side (-1.9e-9 on an AVX2-only CPU).
    assert all(entry["sampled_tokens"] > 0 and entry["kl"] > -1e-6 for entry in log)
    assert (reward == "prime") == all("implicit_prm" in entry for entry in log)
    assert [json.loads(line)["update"] for line in (out / "rl_log.jsonl").read_text().splitlines()] == [1, 2]
    assert stepwise.Policy(out, max_tokens=4).generate("What is 2 + 3?", seed=1)
    if reward == "prime":
        # The implicit PRM's folder is a verifier stepwise.PRM reads.
        assert len(stepwise.PRM(out / "implicit_prm").score("What is 2 + 3?", ["2 + 3 = 5"])) == 1
    again = stepwise.rl(fixtures / "qwen2-policy", PROBLEMS, out, reward=spec, prime_filter=(0.0, 1.0),
                        trainer=trainer, **SMALL)
    assert [(e["update"], e["seconds"]) for e in again] == [(e["update"], e["seconds"]) for e in log]


@pytest.mark.parametrize("trainer", ["autograd", "packed"])
def test_rl_without_a_kl_penalty_runs_no_reference(tmp_path, fixtures, trainer):
    """kl=0 (TRL's beta=0): no reference loaded or run, no `kl` in the log; PRIME keeps it."""
    spec = f"prm:{fixtures / 'qwen2-prm'}"
    log = stepwise.rl(fixtures / "qwen2-policy", PROBLEMS, tmp_path / "a", reward=spec, kl=0.0, trainer=trainer, **SMALL)
    assert [entry["update"] for entry in log] == [1, 2] and all("kl" not in entry for entry in log)
    prime = stepwise.rl(fixtures / "qwen2-policy", PROBLEMS, tmp_path / "b", reward="prime", kl=0.0,
                        prime_filter=(0.0, 1.0), trainer=trainer, **SMALL)
    assert all("kl" in entry and "implicit_prm" in entry for entry in prime)
    with pytest.raises((ValueError, stepwise.StepwiseError), match="--kl -1"):
        stepwise.rl(fixtures / "qwen2-policy", PROBLEMS, tmp_path / "c", kl=-1.0)


def test_rl_with_lora_writes_the_merged_policy_beside_its_adapters(tmp_path, fixtures):
    """lora_rank: the policy frozen, PEFT's adapter files beside the merged policy; the same call
    again resumes; another rank on the folder is refused; candle's autograd cannot train LoRA."""
    spec = f"prm:{fixtures / 'qwen2-prm'}"
    policy, out = fixtures / "qwen2-policy", tmp_path / "lora"
    kwargs = {**SMALL, "reward": spec, "trainer": "packed", "lora_rank": 4, "lora_targets": "q,v", "lr": 1e-2}
    log = stepwise.rl(policy, PROBLEMS, out, **kwargs)
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, ["q_proj", "v_proj"])
    assert (out / "adapter_model.safetensors").exists()
    weights = (out / "model.safetensors").read_bytes()
    assert weights != (policy / "model.safetensors").read_bytes()
    assert stepwise.rl(policy, PROBLEMS, out, **kwargs) == log and (out / "model.safetensors").read_bytes() == weights
    with pytest.raises(stepwise.StepwiseError, match="other RL settings"):
        stepwise.rl(policy, PROBLEMS, out, **{**kwargs, "lora_rank": 8})
    with pytest.raises(stepwise.StepwiseError, match="LoRA trains on the packed trainer"):
        stepwise.rl(policy, PROBLEMS, tmp_path / "autograd", **{**kwargs, "trainer": "autograd"})
    with pytest.raises(ValueError, match="lora_targets"):
        stepwise.rl(policy, PROBLEMS, tmp_path / "bad", **{**kwargs, "lora_targets": "lm_head"})


def test_rl_refuses_what_it_cannot_do(tmp_path, fixtures):
    policy = fixtures / "qwen2-policy"
    with pytest.raises(ValueError, match="outcome, orm:DIR, prm:DIR or prime"):
        stepwise.rl(policy, PROBLEMS, tmp_path / "a", reward="oracle")
    with pytest.raises(ValueError, match="problem `c`: field `gold_answer`: missing"):
        stepwise.rl(policy, PROBLEMS + [{"id": "c", "question": "What is 1 + 1?"}], tmp_path / "b")
    with pytest.raises(ValueError, match="use auto, autograd or packed"):
        stepwise.rl(policy, PROBLEMS, tmp_path / "t", trainer="jax")
    with pytest.raises(ValueError, match="prime_filter"):
        stepwise.rl(policy, PROBLEMS, tmp_path / "c", reward="prime", prime_filter=(0.9, 0.1))
    # Another run's folder is not mixed into this one.
    stepwise.rl(policy, PROBLEMS, tmp_path / "d", updates=1, prompts=1, group_size=2, max_tokens=4)
    with pytest.raises(stepwise.StepwiseError, match="other RL settings"):
        stepwise.rl(policy, PROBLEMS, tmp_path / "d", updates=1, prompts=1, group_size=2, max_tokens=4, lr=1e-3)
