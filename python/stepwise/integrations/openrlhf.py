"""stepwise in OpenRLHF.

OpenRLHF takes rewards from a server (``--reward.remote_url http://host:port/get_reward``) or from a
Python file defining ``reward_func(queries, prompts, labels)`` (``--reward.remote_url file.py``).
Both compute the same rewards, in the same Rust code:

- ``stepwise serve --prm PRM`` answers ``POST /get_reward``: ``{"query", "prompts", "labels"}``
  in, ``{"rewards", "scores", "extra_logs", "step_scores"}`` out;
- :func:`reward_func` runs in the trainer's process with the PRM named by ``STEPWISE_PRM`` (a
  folder or a server URL): point ``--reward.remote_url`` at a file containing
  ``from stepwise.integrations.openrlhf import reward_func``.

A response's reward is its steps' PRM scores aggregated (``min`` by default), plus 1 when its
answer (``\\boxed{}``, "The answer is") grades equal to its label. The response is the query after
its prompt, end-of-turn marks removed; the question is the last user turn of the chat-templated
prompt. Both are found by the chat template of the PRM's tokenizer (the server's: the policy's,
else the PRM's), rendered to learn where its turns begin and end; without one, Qwen's and Llama
3's marks are recognised.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from stepwise import PRM  # absolute: OpenRLHF loads a reward file by its path
from stepwise._stepwise import openrlhf_rewards

__all__ = ["reward_func", "make_reward_func"]


def make_reward_func(prm: Optional[PRM] = None, separator: str = "\n\n", aggregate: str = "min",
                     outcome_weight: float = 1.0, mode: str = "lenient"):
    """An OpenRLHF ``reward_func(queries, prompts, labels)`` over ``prm`` (None: outcome only)."""

    def reward_func(queries: List[str], prompts: Optional[List[str]] = None,
                    labels: Optional[List[Any]] = None, **kwargs: Any) -> Dict[str, Any]:
        out = openrlhf_rewards(list(queries), None if prompts is None else list(prompts),
                               None if labels is None else [None if x is None else str(x) for x in labels],
                               prm, separator, aggregate, outcome_weight, mode)
        try:  # OpenRLHF's trainer takes tensors
            import torch

            out["rewards"] = torch.tensor(out["rewards"], dtype=torch.float32)
            out["scores"] = torch.tensor(out["scores"], dtype=torch.float32)
            out["extra_logs"] = {k: torch.tensor(v, dtype=torch.float32) for k, v in out["extra_logs"].items()}
        except ImportError:
            pass
        return out

    return reward_func


_CACHE: Dict[str, Any] = {}


def reward_func(queries: List[str], prompts: Optional[List[str]] = None, labels: Optional[List[Any]] = None,
                **kwargs: Any) -> Dict[str, Any]:
    """OpenRLHF's custom reward function, configured by ``STEPWISE_PRM`` (folder or URL; unset:
    outcome only), ``STEPWISE_SEPARATOR`` (default a blank line) and ``STEPWISE_AGGREGATE``."""
    key = os.environ.get("STEPWISE_PRM", "")
    if key not in _CACHE:
        prm = PRM(key, device=os.environ.get("STEPWISE_DEVICE", "auto")) if key else None
        _CACHE[key] = make_reward_func(prm, os.environ.get("STEPWISE_SEPARATOR", "\n\n"),
                                       os.environ.get("STEPWISE_AGGREGATE", "min"))
    return _CACHE[key](queries, prompts, labels, **kwargs)
