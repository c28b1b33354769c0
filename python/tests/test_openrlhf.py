"""stepwise's rewards reached through OpenRLHF 0.11's own rollout code: its
``SingleTurnAgentExecutor`` (what ``--reward.remote_url`` configures) posting to ``stepwise serve``
and loading a ``reward_func`` file, with a stand-in for the vLLM engine (the one piece that needs
a GPU) returning a fixed response.

OpenRLHF pins flash-attn and deepspeed, which do not build without CUDA: CI installs it with
``--no-deps`` beside verl (which brings the PyTorch, transformers and aiohttp it imports).
Skipped where it is not installed; ``STEPWISE_REQUIRE_OPENRLHF=1`` turns the skip into a failure."""

import asyncio
import importlib.util
import os
from types import SimpleNamespace

import pytest

if importlib.util.find_spec("openrlhf") is None:
    if os.environ.get("STEPWISE_REQUIRE_OPENRLHF"):
        raise RuntimeError("STEPWISE_REQUIRE_OPENRLHF is set but openrlhf is not installed")
    pytest.skip("openrlhf is not installed", allow_module_level=True)

from openrlhf.utils.agent import SingleTurnAgentExecutor  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import stepwise  # noqa: E402
from conftest import start_serve  # noqa: E402

PROMPT = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
RIGHT = "2+3 is 5.\n\nThe answer is \\boxed{5}."
WRONG = "2+3 is 6.\n\nThe answer is \\boxed{6}."


class Engine:
    """What the executor needs of OpenRLHF's vLLM engine: ``generate`` giving back the
    response's token ids."""

    def __init__(self, ids):
        self.ids = ids

    async def generate(self, prompt_ids, params, multi_modal_data=None):
        out = SimpleNamespace(token_ids=self.ids, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[out])


def rollout(executor, tok, response):
    params = SimpleNamespace(max_tokens=256, logprobs=None)
    engine = Engine(tok(response, add_special_tokens=False)["input_ids"])
    return asyncio.run(executor.execute(PROMPT, "5", params, 1024, tok, engine))


def expected(prm, response, outcome):
    return min(prm.score("What is 2+3?", stepwise.split_steps(response, "\n\n"))) + outcome


@pytest.fixture()
def tok(fixtures):
    return AutoTokenizer.from_pretrained(str(fixtures / "qwen2-policy"))


def test_openrlhf_posts_to_stepwise_serve(fixtures, tok):
    server, url = start_serve("--prm", fixtures / "qwen2-prm")
    try:
        executor = SingleTurnAgentExecutor(f"{url}/get_reward")
        prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
        right, wrong = rollout(executor, tok, RIGHT), rollout(executor, tok, WRONG)
        # One query a request: the rewards come back as lists of one.
        assert right["reward"][0] == pytest.approx(expected(prm, RIGHT, 1.0), abs=1e-5)
        assert wrong["reward"][0] == pytest.approx(expected(prm, WRONG, 0.0), abs=1e-5)
        assert right["extra_logs"]["acc"] == [1.0] and wrong["extra_logs"]["acc"] == [0.0]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_openrlhf_loads_a_reward_func_file(fixtures, tok, tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWISE_PRM", str(fixtures / "qwen2-prm"))
    path = tmp_path / "reward.py"
    path.write_text("from stepwise.integrations.openrlhf import reward_func\n")
    executor = SingleTurnAgentExecutor(str(path))
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    right = rollout(executor, tok, RIGHT)
    assert float(right["reward"][0]) == pytest.approx(expected(prm, RIGHT, 1.0), abs=1e-5)
