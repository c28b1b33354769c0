"""stepwise in verl: outcome grading and process rewards for PPO/GRPO.

Versions: verl 0.7 to 0.9 (its reward loop; tested against verl 0.9.1 with its own loaders, config
and ``DataProto``), and verl 0.5 to 0.6 (the older ``verl.workers.reward_manager`` registry, whose
``__call__`` returns the token-level reward tensor). Two ways in, both set from verl's config:

1. **A reward function** (verl's ``custom_reward_function``): ``compute_score`` grades the
   answer (stepwise's grader, lenient by default) and, when a PRM is set (``STEPWISE_PRM``, a
   folder or server URL, or :func:`make_compute_score`), scores every step. It returns verl's
   dict: ``score`` (the outcome, 1.0 or 0.0), ``acc``, and per-step summaries (``prm_min``,
   ``prm_mean``, ``prm_first_error``, ``num_steps``), all scalars so verl's metrics take them::

       reward.custom_reward_function.path=pkg://stepwise.integrations.verl
       reward.custom_reward_function.name=compute_score

   (the file's path, ``<site-packages>/stepwise/integrations/verl.py``, loads too). For code
   (``STEPWISE_CODE_PROBLEMS``: HumanEval's or MBPP's JSONL, or :func:`make_code_compute_score`)
   the response is the program's completion, ``ground_truth`` the problem's ``task_id``, and
   ``score`` whether its tests pass in stepwise's sandbox, with ``test_pass_rate`` beside it.

2. **A reward manager** (:class:`StepwiseRewardManager`) that rewards each step: the step's PRM
   score at the token that ends it (``credit``: ``return_to_go`` or PURE's ``min``), the outcome
   at the last token. In verl 0.7+::

       reward.reward_manager.source=importlib
       reward.reward_manager.module.path=pkg://stepwise.integrations.verl
       reward.reward_manager.name=StepwiseRewardManager

   (or ``source=register``, ``name=stepwise`` where ``stepwise.integrations.verl`` is imported
   in the workers). verl 0.7+ carries one reward per response from a reward manager to its
   trainer (its agent loop puts it at the last token), so the manager returns the sum of the
   response's step rewards and outcome: what GRPO, RLOO and REINFORCE++'s baseline compute from
   token-level rewards (they sum them per response); in verl 0.5-0.6
   (``reward_model.reward_manager=stepwise``) the manager returns the token-level tensor itself,
   for the token-level estimators (GAE, REINFORCE++). Settings come from the environment
   (``STEPWISE_PRM``, ``STEPWISE_SEPARATOR``, ``STEPWISE_CREDIT``, ``STEPWISE_STEP_WEIGHT``,
   ``STEPWISE_OUTCOME_WEIGHT``, ``STEPWISE_GRADER``; set them in Ray's ``runtime_env``) or from
   keyword arguments, :func:`make_reward_manager` binding them into a class.
"""

from __future__ import annotations

import asyncio
import os
from importlib import metadata, util
from typing import Any, Dict, List, Optional, Sequence, Tuple

# Absolute, not relative: verl loads a reward function's file by its path, outside any package.
from stepwise import PRM, extract_answer, grade, run_tests, split_steps, step_rewards

__all__ = ["compute_score", "make_compute_score", "make_code_compute_score", "step_token_ends",
           "StepwiseRewardManager", "make_reward_manager", "VERL_VERSION"]


def _installed(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


#: The verl this module registered with (None: verl is not installed).
VERL_VERSION: Optional[str] = _installed("verl")
# verl 0.7+ looks reward managers up in its reward loop; 0.5-0.6 in `verl.workers.reward_manager`.
_REWARD_LOOP = VERL_VERSION is not None and util.find_spec("verl.experimental.reward_loop") is not None

_DEFAULT_PRM: Dict[str, Any] = {}


def _env_prm() -> Optional[PRM]:
    """The PRM named by ``STEPWISE_PRM`` (loaded once per process), or None."""
    source = os.environ.get("STEPWISE_PRM")
    if not source:
        return None
    if source not in _DEFAULT_PRM:
        _DEFAULT_PRM[source] = PRM(source, device=os.environ.get("STEPWISE_DEVICE", "auto"))
    return _DEFAULT_PRM[source]


def _question(extra_info: Optional[dict]) -> str:
    info = extra_info or {}
    for key in ("question", "problem", "prompt"):
        if isinstance(info.get(key), str):
            return info[key]
    return ""


def _summary(step_scores: Sequence[float]) -> Dict[str, float]:
    if not step_scores:
        return {"prm_min": 0.0, "prm_mean": 0.0, "prm_first_error": -1.0, "num_steps": 0.0}
    first = next((i for i, s in enumerate(step_scores) if s < 0.5), -1)
    return {
        "prm_min": float(min(step_scores)),
        "prm_mean": float(sum(step_scores) / len(step_scores)),
        "prm_first_error": float(first),
        "num_steps": float(len(step_scores)),
    }


def make_compute_score(prm: Optional[PRM] = None, separator: str = "\n\n", mode: str = "lenient"):
    """A verl ``compute_score`` over ``prm`` (None: grading only), splitting responses into steps
    at ``separator`` and grading with ``mode`` (``lenient`` or ``prm800k``)."""

    def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                      extra_info: Optional[dict] = None, **kwargs: Any) -> Dict[str, float]:
        answer = extract_answer(solution_str) or ""
        correct = bool(grade(answer, str(ground_truth), mode=mode)) if answer else False
        out = {"score": 1.0 if correct else 0.0, "acc": 1.0 if correct else 0.0}
        if prm is not None:
            steps = split_steps(solution_str, separator)
            out.update(_summary(prm.score(_question(extra_info), steps) if steps else []))
        return out

    return compute_score


def make_code_compute_score(problems: Any, timeout: float = 10.0):
    """A verl ``compute_score`` for code: ``solution_str`` is the completion of problem
    ``ground_truth`` (a ``task_id`` of ``problems``, HumanEval's or MBPP's JSONL), run against its
    tests in stepwise's sandbox (a fresh python3 with time, memory, file, process and network
    limits; ``timeout`` seconds)."""

    def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                      extra_info: Optional[dict] = None, **kwargs: Any) -> Dict[str, float]:
        task_id = str(ground_truth)
        if isinstance(extra_info, dict) and isinstance(extra_info.get("task_id"), str):
            task_id = extra_info["task_id"]
        out = run_tests(problems, [{"task_id": task_id, "completion": solution_str}], timeout=timeout)[0]
        passed = 1.0 if out["passed"] else 0.0
        rate = out["tests_passed"] / out["tests_run"] if out["tests_run"] else 0.0
        return {"score": passed, "acc": passed, "test_pass_rate": float(rate)}

    return compute_score


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: Optional[dict] = None, **kwargs: Any) -> Dict[str, float]:
    """verl's reward function: the graded outcome as ``score``, plus per-step PRM summaries when
    ``STEPWISE_PRM`` names a PRM (steps split at ``STEPWISE_SEPARATOR``, default a blank line); for
    code when ``STEPWISE_CODE_PROBLEMS`` names the problems (see :func:`make_code_compute_score`)."""
    code_problems = os.environ.get("STEPWISE_CODE_PROBLEMS")
    if code_problems:
        timeout = float(os.environ.get("STEPWISE_CODE_TIMEOUT", "10"))
        return make_code_compute_score(code_problems, timeout)(data_source, solution_str, ground_truth,
                                                                extra_info, **kwargs)
    fn = make_compute_score(_env_prm(), os.environ.get("STEPWISE_SEPARATOR", "\n\n"),
                            os.environ.get("STEPWISE_GRADER", "lenient"))
    return fn(data_source, solution_str, ground_truth, extra_info, **kwargs)


def step_token_ends(text: str, steps: Sequence[str], offsets: Sequence[Tuple[int, int]]) -> List[int]:
    """The index of the token that ends each step: ``steps`` found in order in ``text`` (the
    decoded response), ``offsets`` each token's ``(start, end)`` characters in ``text`` (a fast
    tokenizer's ``offset_mapping``). A step whose end lies past the last token ends there."""
    ends: List[int] = []
    at, k, last = 0, 0, len(offsets) - 1
    for step in steps:
        found = text.find(step, at)
        end_char = (found if found >= 0 else at) + len(step)
        at = end_char
        while k < last and offsets[k][1] < end_char:
            k += 1
        if ends and k <= ends[-1]:
            if ends[-1] >= last:
                break  # no token left for this step (and those after it)
            k = ends[-1] + 1
        ends.append(k)
    return ends


def _offsets(tokenizer: Any, ids: Sequence[int], text: str) -> List[Tuple[int, int]]:
    """Each response token's character span in ``text``: from the tokenizer's offsets when
    re-encoding the text gives back the same ids, else by decoding growing prefixes."""
    try:
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        if list(enc["input_ids"]) == list(ids):
            return [tuple(o) for o in enc["offset_mapping"]]
    except Exception:  # slow tokenizers have no offsets
        pass
    spans, prev = [], 0
    for k in range(len(ids)):
        length = len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True))
        spans.append((prev, length))
        prev = length
    return spans


def _verl_error(what: str, err: Exception) -> ImportError:
    return ImportError(
        f"stepwise.integrations.verl: {what} with verl {VERL_VERSION} failed ({type(err).__name__}: {err}); "
        "stepwise supports verl 0.7-0.9 (the reward loop) and 0.5-0.6 (verl.workers.reward_manager)"
    )


try:
    if _REWARD_LOOP:
        from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase as _Base
    elif VERL_VERSION is not None:
        from verl.workers.reward_manager.abstract import AbstractRewardManager as _Base  # type: ignore
    else:
        _Base = object  # type: ignore
except Exception as _err:  # a verl that is installed but does not import: say which and why
    raise _verl_error("importing the reward manager base class", _err) from _err


def _setting(value: Any, env: str, default: Any, cast: Any = str) -> Any:
    """A keyword argument, else the environment variable ``env``, else ``default``."""
    if value is not None:
        return value
    raw = os.environ.get(env)
    return cast(raw) if raw not in (None, "") else default


class StepwiseRewardManager(_Base):  # type: ignore[misc, valid-type]
    """verl reward manager with process rewards (see the module's documentation).

    ``prm`` is a :class:`stepwise.PRM` (default: ``STEPWISE_PRM``, none: outcome only); each
    response is split into steps at ``separator`` (default a blank line); ``credit`` is
    ``return_to_go`` or ``min``; ``step_weight`` scales the step rewards and ``outcome_weight``
    the graded outcome (``mode``: ``lenient`` or ``prm800k``) added at the last token. verl's
    ``compute_score`` is not used: the outcome is stepwise's grade of the extracted answer."""

    def __init__(self, config: Any = None, tokenizer: Any = None, compute_score: Any = None,
                 reward_router_address: Any = None, reward_model_tokenizer: Any = None, *,
                 prm: Optional[PRM] = None, separator: Optional[str] = None, credit: Optional[str] = None,
                 step_weight: Optional[float] = None, outcome_weight: Optional[float] = None,
                 mode: Optional[str] = None, num_examine: int = 0, reward_fn_key: str = "data_source",
                 **kwargs: Any) -> None:
        if tokenizer is None:
            raise TypeError("StepwiseRewardManager needs the policy's tokenizer (tokenizer=...)")
        if _REWARD_LOOP:  # verl 0.7+: the base keeps config, tokenizer and its event loop
            super().__init__(config, tokenizer, compute_score)
        else:  # verl 0.5-0.6: AbstractRewardManager keeps nothing itself
            self.config = config
            self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.reward_fn_key = reward_fn_key
        self.prm = prm if prm is not None else _env_prm()
        self.separator = _setting(separator, "STEPWISE_SEPARATOR", "\n\n")
        self.credit = _setting(credit, "STEPWISE_CREDIT", "return_to_go")
        if self.credit not in ("return_to_go", "min"):
            raise ValueError(f"credit must be 'return_to_go' or 'min', not {self.credit!r}")
        self.step_weight = float(_setting(step_weight, "STEPWISE_STEP_WEIGHT", 1.0, float))
        self.outcome_weight = float(_setting(outcome_weight, "STEPWISE_OUTCOME_WEIGHT", 1.0, float))
        self.mode = _setting(mode, "STEPWISE_GRADER", "lenient")

    def rewards(self, responses: Sequence[Sequence[int]], ground_truths: Sequence[Any],
                questions: Sequence[str]) -> Tuple[List[List[float]], Dict[str, List[float]]]:
        """Per-token rewards of each response (token ids, padding removed), and per-response
        extras (``acc``, ``prm_min``, ``num_steps``): the framework-free core of the manager."""
        texts = [self.tokenizer.decode(list(r), skip_special_tokens=True) for r in responses]
        steps = [split_steps(t, self.separator) for t in texts]
        outcomes = []
        for text, gold in zip(texts, ground_truths):
            answer = extract_answer(text) or ""
            outcomes.append(1.0 if answer and grade(answer, str(gold), mode=self.mode) else 0.0)
        if self.prm is not None:
            scored = self.prm.score_batch([(q, s) for q, s in zip(questions, steps)])
        else:
            scored = [[] for _ in steps]
        out: List[Any] = []
        extra: Dict[str, List[float]] = {"acc": [], "prm_min": [], "num_steps": []}
        for ids, text, st, sc, outcome in zip(responses, texts, steps, scored, outcomes):
            ends = step_token_ends(text, st, _offsets(self.tokenizer, list(ids), text)) if len(ids) else []
            sc = [self.step_weight * s for s in sc[: len(ends)]]
            out.append(step_rewards(len(ids), sc, ends, credit=self.credit,
                                    outcome=self.outcome_weight * outcome))
            extra["acc"].append(outcome)
            extra["prm_min"].append(float(min(sc)) if sc else 0.0)
            extra["num_steps"].append(float(len(st)))
        return out, extra

    def _sample(self, item: Any) -> Tuple[List[int], Any, str]:
        """One ``DataProtoItem``'s response ids (padding removed), ground truth and question (the
        record's ``extra_info`` question, else the decoded prompt)."""
        prompts, responses = item.batch["prompts"], item.batch["responses"]
        mask = item.batch["attention_mask"]
        prompt_len = prompts.shape[-1]
        valid = int(mask[prompt_len:].sum().item())
        gold = item.non_tensor_batch["reward_model"]["ground_truth"]
        question = _question(item.non_tensor_batch.get("extra_info", None))
        if not question:
            valid_prompt = int(mask[:prompt_len].sum().item())
            question = self.tokenizer.decode(prompts[prompt_len - valid_prompt:].tolist(), skip_special_tokens=True)
        return responses[:valid].tolist(), gold, question

    async def run_single(self, data: Any) -> Dict[str, Any]:
        """verl 0.7+'s reward loop: one response's reward (the sum of its step rewards and
        outcome) and its extras."""
        ids, gold, question = self._sample(data[-1])  # a multi-turn output: its last sequence
        loop = asyncio.get_running_loop()  # the PRM scores in a thread (the GIL released): the loop runs on
        per_token, extra = await loop.run_in_executor(None, lambda: self.rewards([ids], [gold], [question]))
        info = {key: values[0] for key, values in extra.items()}
        return {"reward_score": float(sum(per_token[0])), "reward_extra_info": info}

    def __call__(self, data: Any, return_dict: bool = False) -> Any:
        """verl 0.5-0.6: the token-level reward tensor of a batch (and its extras)."""
        import torch

        if "rm_scores" in data.batch.keys():
            scores = data.batch["rm_scores"]
            return {"reward_tensor": scores} if return_dict else scores
        samples = [self._sample(data[i]) for i in range(len(data))]
        per_token, extra = self.rewards(*map(list, zip(*samples))) if samples else ([], {})
        reward_tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        for i, r in enumerate(per_token):
            if r:
                reward_tensor[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra}
        return reward_tensor


def make_reward_manager(**settings: Any) -> type:
    """A :class:`StepwiseRewardManager` class with ``settings`` (``prm``, ``separator``,
    ``credit``, ``step_weight``, ``outcome_weight``, ``mode``) bound, for a module verl loads
    with ``reward.reward_manager.source=importlib``: ``Manager = make_reward_manager(credit="min")``."""
    unknown = set(settings) - {"prm", "separator", "credit", "step_weight", "outcome_weight", "mode"}
    if unknown:
        raise TypeError(f"make_reward_manager: unknown settings {sorted(unknown)}")

    class BoundStepwiseRewardManager(StepwiseRewardManager):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**settings, **kwargs})

    return BoundStepwiseRewardManager


def _register() -> None:
    """``stepwise`` in verl's registry of reward managers, where verl is installed. This file
    can be loaded twice in one process (by name and by path); it registers once."""
    if VERL_VERSION is None:
        return
    try:
        if _REWARD_LOOP:
            from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER as known
            from verl.experimental.reward_loop.reward_manager.registry import register
        else:
            from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY as known  # type: ignore
            from verl.workers.reward_manager.registry import register  # type: ignore
        if "stepwise" not in known:
            register("stepwise")(StepwiseRewardManager)
    except Exception as err:
        raise _verl_error("registering the reward manager 'stepwise'", err) from err


_register()
