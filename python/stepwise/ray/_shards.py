"""The job of `stepwise.ray`: the input cut into shards, the shards not yet written over a Ray
Data actor pool, each written whole or not at all."""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from stepwise import StepwiseError
from stepwise.ray._stages import (_STAGES, Model, Source, _check_node_maps, _records_of_rows, _records_of_table,
                                  _table_of)

log = logging.getLogger("stepwise")

_SUFFIXES = (".parquet", ".jsonl", ".json")


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
