"""stepwise in verl: outcome grading and process rewards for PPO/GRPO.

Two ways in, both configured from verl's YAML:

1. **A reward function** (verl's ``custom_reward_function``): ``compute_score`` grades the
   answer (stepwise's grader, lenient by default) and, when a PRM is set (``STEPWISE_PRM``, a
   folder or server URL, or :func:`make_compute_score`), scores every step. It returns verl's
   dict: ``score`` (the outcome, 1.0 or 0.0), ``acc``, and per-step summaries (``prm_min``,
   ``prm_mean``, ``prm_first_error``, ``num_steps``), all scalars so verl's metrics take them::

       custom_reward_function:
         path: <site-packages>/stepwise/integrations/verl.py
         name: compute_score

   For code (``STEPWISE_CODE_PROBLEMS``: HumanEval's or MBPP's JSONL, or
   :func:`make_code_compute_score`) the response is the program's completion, ``ground_truth``
   the problem's ``task_id``, and ``score`` whether its tests pass in stepwise's sandbox, with
   ``test_pass_rate`` (the share of its assertions that hold) beside it.

2. **A reward manager** (:class:`StepwiseRewardManager`, registered as ``"stepwise"`` when
   verl is installed: ``reward_model.reward_manager=stepwise``) that writes *dense* rewards: each
   step's PRM score at the token that ends the step (``credit``: ``return_to_go`` or PURE's
   ``min``), the outcome at the last token. verl's token-level advantage estimators
   (``reinforce_plus_plus``, GAE) then credit each step; GRPO sums them per response.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import PRM, extract_answer, grade, run_tests, split_steps, step_rewards

__all__ = ["compute_score", "make_compute_score", "make_code_compute_score", "step_token_ends",
           "StepwiseRewardManager"]

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


class StepwiseRewardManager:
    """verl reward manager with dense process rewards (see the module's documentation).

    ``prm`` is a :class:`stepwise.PRM` (default: ``STEPWISE_PRM``); each response is split into
    steps at ``separator``; ``step_weight`` scales the step rewards and ``outcome_weight`` the
    graded outcome added at the last token."""

    def __init__(self, tokenizer: Any, num_examine: int = 0, compute_score: Any = None,
                 reward_fn_key: str = "data_source", prm: Optional[PRM] = None, separator: str = "\n\n",
                 credit: str = "return_to_go", step_weight: float = 1.0, outcome_weight: float = 1.0,
                 mode: str = "lenient", **kwargs: Any) -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.reward_fn_key = reward_fn_key
        self.prm = prm if prm is not None else _env_prm()
        self.separator = separator
        self.credit = credit
        self.step_weight = step_weight
        self.outcome_weight = outcome_weight
        self.mode = mode

    def rewards(self, responses: Sequence[Sequence[int]], ground_truths: Sequence[Any],
                questions: Sequence[str]) -> Tuple[List[List[float]], Dict[str, List[float]]]:
        """Per-token rewards of each response (token ids, padding removed), and per-response
        extras (``acc``, ``prm_min``, ``num_steps``): the framework-free core of ``__call__``."""
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
        out, extra = [], {"acc": [], "prm_min": [], "num_steps": []}
        for ids, text, st, sc, outcome in zip(responses, texts, steps, scored, outcomes):
            ends = step_token_ends(text, st, _offsets(self.tokenizer, list(ids), text)) if len(ids) else []
            sc = [self.step_weight * s for s in sc[: len(ends)]]
            out.append(step_rewards(len(ids), sc, ends, credit=self.credit,
                                    outcome=self.outcome_weight * outcome))
            extra["acc"].append(outcome)
            extra["prm_min"].append(float(min(sc)) if sc else 0.0)
            extra["num_steps"].append(float(len(st)))
        return out, extra

    def __call__(self, data: Any, return_dict: bool = False) -> Any:
        import torch

        if "rm_scores" in data.batch.keys():
            scores = data.batch["rm_scores"]
            return {"reward_tensor": scores} if return_dict else scores
        prompts = data.batch["prompts"]
        prompt_len = prompts.shape[-1]
        responses_padded = data.batch["responses"]
        mask = data.batch["attention_mask"]
        responses, golds, questions = [], [], []
        for i in range(len(data)):
            valid = int(mask[i][prompt_len:].sum().item())
            responses.append(responses_padded[i][:valid].tolist())
            item = data[i].non_tensor_batch
            golds.append(item["reward_model"]["ground_truth"])
            extra_info = item.get("extra_info", None)
            question = _question(extra_info)
            if not question:
                valid_prompt = int(mask[i][:prompt_len].sum().item())
                question = self.tokenizer.decode(prompts[i][-valid_prompt:].tolist(), skip_special_tokens=True)
            questions.append(question)
        per_token, extra = self.rewards(responses, golds, questions)
        reward_tensor = torch.zeros_like(responses_padded, dtype=torch.float32)
        for i, r in enumerate(per_token):
            if r:
                reward_tensor[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra}
        return reward_tensor


try:  # verl's registry, where installed: reward_model.reward_manager=stepwise
    from verl.workers.reward_manager import register as _register

    _register("stepwise")(StepwiseRewardManager)
except Exception:  # verl absent, or a version without the registry
    pass
