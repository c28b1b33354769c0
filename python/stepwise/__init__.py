"""stepwise: process supervision for reasoning models, with a Rust core.

Records in every step-supervision format (PRM800K, Math-Shepherd, TRL, ProcessBench, OmegaPRM,
RLHFlow), grading, process reward models (local on CPU or GPU, or behind servers), policies,
step annotation, step-level search, dense step rewards for RL engines, agents' trajectories
(play, label actions; TextWorld games through `stepwise.textworld`), and the built-in lab.

>>> import stepwise
>>> recs = stepwise.read("processbench/gsm8k.json")
>>> prm = stepwise.PRM("path/to/prm")
>>> prm.score(recs[0]["question"], [s["text"] for s in recs[0]["steps"]])
"""

from __future__ import annotations

import io
from typing import Any, Iterable, Optional

from . import lab
from .isolation import EnvironmentProcessError, isolated
from ._stepwise import (
    DEFAULT_MAX_BATCH_TOKENS,
    PRM,
    Policy,
    StepwiseError,
    Studio,
    __version__,
    annotate,
    convert,
    cuda_available,
    download,
    extract_answer,
    from_arrow_ipc,
    generative_scores,
    judge_scores,
    grade,
    label_actions,
    merge_adapter,
    agent_rl,
    dpo,
    rl,
    pass_at_k,
    play,
    read,
    read_problems,
    rooms,
    run_tests,
    search,
    split_steps,
    step_pairs,
    step_rewards,
    to_arrow_ipc,
    train_prm,
    write,
)

__all__ = [
    "DEFAULT_MAX_BATCH_TOKENS",
    "EnvironmentProcessError",
    "PRM",
    "Policy",
    "StepwiseError",
    "Studio",
    "__version__",
    "annotate",
    "convert",
    "cuda_available",
    "download",
    "extract_answer",
    "from_hf",
    "generative_scores",
    "judge_scores",
    "grade",
    "isolated",
    "lab",
    "label_actions",
    "merge_adapter",
    "agent_rl",
    "dpo",
    "rl",
    "pass_at_k",
    "play",
    "read",
    "read_problems",
    "rooms",
    "run_tests",
    "search",
    "split_steps",
    "step_pairs",
    "step_rewards",
    "to_hf",
    "train_prm",
    "write",
]

_LAYOUTS = {"trl": "trl", "stepwise": "stepwise", "processbench": "processbench", "math-shepherd": "math-shepherd",
            "prm800k": "prm800k", "openr-prm": "openr-prm", "rlhflow": "rlhflow"}


def to_hf(records: Iterable[dict], layout: str = "trl") -> Any:
    """Records (any format stepwise reads) as a ``datasets.Dataset`` in ``layout``'s columns,
    through Arrow (no JSON on the way). ``layout="trl"`` gives TRL's stepwise-supervision columns:
    ``prompt`` (string), ``completions`` (list of strings), ``labels`` (list of booleans).

    >>> ds = stepwise.to_hf(stepwise.read("labelled.jsonl"), layout="trl")
    >>> ds.features["labels"]
    """
    import datasets
    import pyarrow as pa

    fmt = _LAYOUTS.get(layout.lower().replace("_", "-"), layout)
    table = pa.ipc.open_stream(io.BytesIO(to_arrow_ipc(list(records), fmt))).read_all()
    return datasets.Dataset(table)


def from_hf(dataset: Any, format: Optional[str] = None) -> list:
    """A ``datasets.Dataset`` (or ``pyarrow.Table``) of step-labelled rows in any format stepwise
    reads (TRL's ``prompt``/``completions``/``labels``, Math-Shepherd, PRM800K, ...) as stepwise's
    records, through Arrow.

    >>> recs = stepwise.from_hf(datasets.load_dataset("trl-lib/math_shepherd", split="train"))
    """
    import pyarrow as pa

    if isinstance(dataset, pa.Table):
        table = dataset
    else:
        # Materialised through the dataset's own Arrow view (respects select/shuffle indices).
        table = dataset.with_format("arrow")[:]
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return from_arrow_ipc(sink.getvalue(), format)
