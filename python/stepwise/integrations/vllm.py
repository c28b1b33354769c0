"""A vLLM ``LLM`` (offline inference, in this process) as a stepwise policy, for
:func:`stepwise.annotate` and :func:`stepwise.search`.

>>> from vllm import LLM
>>> from stepwise.integrations.vllm import VllmPolicy
>>> policy = VllmPolicy(LLM("Qwen/Qwen2.5-Math-1.5B-Instruct"), temperature=0.7, max_tokens=1024)
>>> stepwise.annotate(records, policy, method="mc", rollouts=8, output="mc.jsonl")

The prompt is laid out as ``stepwise.Policy``'s text layout: the question, the separator, then
each step so far followed by the separator; one step stops at the separator.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence


class VllmPolicy:
    """``llm`` (a ``vllm.LLM``) continuing solutions; ``chat_template`` (a function of the question
    returning the prompt's head) replaces the plain question when given."""

    def __init__(self, llm: Any, temperature: float = 0.7, top_p: float = 1.0, max_tokens: int = 512,
                 separator: str = "\n", chat_template: Optional[Any] = None) -> None:
        self.llm = llm
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.separator = separator
        self.chat_template = chat_template

    def prompt(self, question: str, prefix: Sequence[str]) -> str:
        head = self.chat_template(question) if self.chat_template else question + self.separator
        return head + "".join(step + self.separator for step in prefix)

    def sampling_params(self, n: int, until: str, seed: int) -> Any:
        from vllm import SamplingParams

        stop = [self.separator] if until == "step" else None
        return SamplingParams(n=n, temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens,
                              seed=seed, stop=stop)

    def continue_from(self, question: str, prefix: List[str], n: int, until: str, seed: int) -> List[Dict[str, Any]]:
        """What stepwise asks of a policy: ``n`` continuations, by one step or to the end."""
        request = self.llm.generate([self.prompt(question, prefix)], self.sampling_params(n, until, seed),
                                    use_tqdm=False)[0]
        out = []
        for c in request.outputs:
            # vLLM names the stop string that ended the text (None: the end of sequence).
            at_separator = c.finish_reason == "stop" and c.stop_reason == self.separator
            out.append({"text": c.text, "finished": until == "end" or not at_separator,
                        "token_ids": list(c.token_ids)})
        return out
