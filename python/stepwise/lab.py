"""The built-in lab: the whole process-supervision loop on a synthetic domain with an exact step
checker (train a policy, sample, annotate, train PRMs and an ORM, evaluate, search, RL), in
minutes on a CPU: arithmetic word problems, (``domain="code"``) straight-line Python programs
checked line by line by executing them, or (``domain="agent"``) an agent's actions in a text
world of rooms, labelled by the oracle, Monte Carlo rollouts and TD(lambda) from a learned value.
Runs are cached and resumable in their folder.

>>> metrics = stepwise.lab.run(preset="quick", seed=1, out="runs/quick")
>>> metrics["policy_accuracy"]
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from ._stepwise import lab_run as _lab_run


def run(preset: str = "quick", seed: int = 1, out: Optional["os.PathLike[str] | str"] = None,
        sets: Optional[Sequence[str]] = None, domain: Optional[str] = None) -> dict:
    """Run (or resume) the lab with ``preset`` (``"quick"``: a few minutes on two cores; ``"standard"``: the
    README's results, about 10 minutes a seed on two cores) and ``seed``, in ``out`` (default
    ``runs/PRESET-seedSEED``, ``runs/PRESET-DOMAIN-seedSEED`` for code and agent), with preset fields
    overridden by ``sets`` (``["eval_samples=64"]``; the agent domain's are ``agent_*``), in
    ``domain`` (``"arithmetic"``, the default, ``"code"`` or ``"agent"``). Returns ``metrics.json`` as a dict (report.md, report.html and the
    plots are in ``out``)."""
    return _lab_run(preset, seed, None if out is None else os.fspath(out), list(sets or []), domain)
