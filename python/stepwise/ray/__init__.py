"""stepwise on Ray: the pipeline's stages over datasets larger than one machine.

Each stage (`score`, `annotate`, `search`, `grade`, `run_tests`) is a Ray Data pipeline over the
input's rows cut into fixed shards: a pool of actors, each holding the stage's PRM or policy (the
stepwise engine on the actor's device, or a server URL for its node), takes a shard, runs the
stage on it and writes the result as one Parquet file in stepwise's schema
(``output/part-00012.parquet``). A shard's file is written under a temporary name and renamed when
whole, so a file there is always a finished shard; a job started again on its output skips them,
and a worker that dies (a killed process, a lost node) has its shard retried by Ray on another.
The records are the same as one process's: seeds are per record, never per worker.

>>> import ray, stepwise.ray
>>> ray.init()          # or ray.init(address="auto") on a cluster
>>> stepwise.ray.annotate("solutions/", "labelled/", policy="servers.txt", method="mc", rollouts=8)

Inputs are a file, a folder or a glob of files (Parquet, JSONL, JSON; any format stepwise
reads) that every node can read, or records in memory. ``output`` must be a folder every node
can write (a shared file system). The stage classes (`Scorer`, `Annotator`, `Searcher`,
`Grader`, `TestRunner`) also serve as ``map_batches`` UDFs in pipelines of your own.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Dict, List, Optional, Union

from stepwise import StepwiseError
from stepwise.ray._shards import _on_servers, _run
from stepwise.ray._stages import (_STAGES, Annotator, Grader, Model, Scorer, Searcher, Source, TestRunner,
                                  _records_of_table)

__all__ = ["Annotator", "Grader", "Scorer", "Searcher", "TestRunner", "annotate", "grade", "main", "read",
           "run_tests", "score", "search"]


_JOB_DOC = """

    ``source``: a file, folder or glob of files every node can read (or records in memory);
    ``output``: a folder every node can write, one ``part-NNNNN.parquet`` a shard of
    ``shard_size`` rows; a second call on the same output writes only the shards it lacks (and
    refuses other settings). ``actors``: the pool's size (default: as many as the cluster's
    CPUs, or GPUs with ``num_gpus``, allow). Returns a summary: shards, skipped, records,
    written, seconds, records_per_s, workers."""


def score(source: Source, output: Union[str, "os.PathLike[str]"], prm: Model, *, name: str = "prm",
          batch_size: int = 64, on_error: str = "raise", prm_options: Optional[Dict[str, Any]] = None,
          actors: Optional[int] = None, shard_size: int = 256, num_cpus: float = 1, num_gpus: float = 0,
          shards_at_once: Optional[int] = None) -> Dict[str, Any]:
    options = {"prm": prm, "name": name, "batch_size": batch_size, "on_error": on_error, "prm_options": prm_options or {}}
    if shards_at_once is None:
        shards_at_once = 2 if _on_servers(prm) else 1
    if shards_at_once < 1:
        raise StepwiseError(f"shards_at_once must be at least 1, not {shards_at_once}")
    return _run("score", source, output, options, actors=actors, shard_size=shard_size, num_cpus=num_cpus,
                num_gpus=num_gpus, shards_at_once=shards_at_once)


score.__doc__ = ("Score every step of every record with ``prm`` (``scores[name]``). ``shards_at_once``: shards an "
                 "actor scores side by side (default 2 for a PRM on servers, whose calls wait on the network, "
                 "else 1)." + _JOB_DOC)


def annotate(source: Source, output: Union[str, "os.PathLike[str]"], policy: Model, *, method: str = "mc",
             rollouts: int = 8, seed: int = 0, judge: Optional[Model] = None,
             policy_options: Optional[Dict[str, Any]] = None, actors: Optional[int] = None, shard_size: int = 64,
             num_cpus: float = 1, num_gpus: float = 0, **options: Any) -> Dict[str, Any]:
    options = dict(options, policy=policy, method=method, rollouts=rollouts, seed=seed, judge=judge,
                   policy_options=policy_options or {})
    return _run("annotate", source, output, options, actors=actors, shard_size=shard_size, num_cpus=num_cpus,
                num_gpus=num_gpus)


annotate.__doc__ = "Label every step (``stepwise.annotate``'s methods and options)." + _JOB_DOC


def search(problems: Source, output: Union[str, "os.PathLike[str]"], policy: Model, prm: Model, *,
           method: str = "beam", n: int = 8, seed: int = 0, policy_options: Optional[Dict[str, Any]] = None,
           prm_options: Optional[Dict[str, Any]] = None, actors: Optional[int] = None, shard_size: int = 16,
           num_cpus: float = 1, num_gpus: float = 0, **options: Any) -> Dict[str, Any]:
    options = dict(options, policy=policy, prm=prm, method=method, n=n, seed=seed, policy_options=policy_options or {},
                   prm_options=prm_options or {})
    return _run("search", problems, output, options, actors=actors, shard_size=shard_size, num_cpus=num_cpus,
                num_gpus=num_gpus)


search.__doc__ = "Step-level search over problems (``stepwise.search``'s methods and options)." + _JOB_DOC


def grade(source: Source, output: Union[str, "os.PathLike[str]"], *, mode: str = "lenient",
          actors: Optional[int] = None, shard_size: int = 4096) -> Dict[str, Any]:
    return _run("grade", source, output, {"mode": mode}, actors=actors, shard_size=shard_size, num_cpus=1, num_gpus=0)


grade.__doc__ = "Grade final answers (``given``/``ground_truth`` rows or records), each with ``correct``." + _JOB_DOC


def run_tests(problems: Union[str, "os.PathLike[str]"], samples: Source, output: Union[str, "os.PathLike[str]"], *,
              timeout: float = 10.0, on_error: str = "raise", actors: Optional[int] = None,
              shard_size: int = 32) -> Dict[str, Any]:
    options = {"problems": os.path.abspath(os.fspath(problems)), "timeout": timeout, "threads": 1, "on_error": on_error}
    return _run("run_tests", samples, output, options, actors=actors, shard_size=shard_size, num_cpus=1, num_gpus=0)


run_tests.__doc__ = ("Run programs against ``problems``' tests in the sandbox, one a CPU worker at a time."
                     + _JOB_DOC)


def read(output: Union[str, "os.PathLike[str]"]) -> List[Dict[str, Any]]:
    """A job's rows in input order (the shards in order): stepwise's records where the stage
    writes records, plain rows (nested values as JSON text) for `grade` and `run_tests`."""
    import pyarrow.parquet as pq

    output = os.fspath(output)
    parts = sorted(glob.glob(os.path.join(output, "part-*.parquet")))
    with open(os.path.join(output, "_job.json"), encoding="utf-8") as f:
        stage = json.load(f)["stage"]
    out: List[Dict[str, Any]] = []
    for p in parts:
        table = pq.read_table(p)
        out.extend(_records_of_table(table, p) if _STAGES[stage].records_out else table.to_pylist())
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m stepwise.ray`: one stage over a cluster; the summary as JSON on stdout."""
    from stepwise.ray._cli import main as run

    return run(argv)
