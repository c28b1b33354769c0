"""`stepwise.ray` on a local Ray cluster of two nodes (a head and a second node, each with one CPU,
started with `ray start` on this machine): stages over shards give the records one process gives,
a second call on the same output writes only the shards it lacks, a worker killed with SIGKILL
mid-job costs a retry and never a lost or doubled record, and rows that are not records are named.

Ray comes from PyPI (`pip install stepwise[ray]`); CI runs this file in the environment verl's
install gives (STEPWISE_REQUIRE_RAY=1), elsewhere it is skipped where Ray is not installed."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import stepwise
from conftest import short

if os.environ.get("STEPWISE_REQUIRE_RAY"):
    import ray
else:
    ray = pytest.importorskip("ray")
import stepwise.ray as sray  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HUMANEVAL = REPO / "data" / "humaneval" / "HumanEval.jsonl"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """The address of a two-node cluster (one CPU each), stopped at the end."""
    exe = str(Path(sys.executable).parent / "ray")
    # A throw-away cluster on this machine: without token authentication (a token file a local
    # `ray.init()` once left in ~/.ray would be required of the second node otherwise).
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    port = free_port()
    common = ["--num-cpus=1", "--object-store-memory=200000000", "--disable-usage-stats"]
    subprocess.run([exe, "start", "--head", f"--port={port}", "--include-dashboard=false", *common], env=env,
                   check=True, capture_output=True)
    address = f"127.0.0.1:{port}"
    try:
        subprocess.run([exe, "start", f"--address={address}", *common], env=env, check=True, capture_output=True)
        ray.init(address=address, logging_level="WARNING")
        ray.data.DataContext.get_current().enable_progress_bars = False
        deadline = time.time() + 60
        while sum(n["Alive"] for n in ray.nodes()) < 2:
            assert time.time() < deadline, "the second node did not join"
            time.sleep(0.5)
        yield address
    finally:
        ray.shutdown()
        subprocess.run([exe, "stop", "--force"], env=env, capture_output=True)


def records(processbench, n):
    recs = short(stepwise.read(processbench), n)
    for i, r in enumerate(recs):  # more than 12: the same records again, other ids
        r["id"] = f"r{i}"
    return recs


def test_score_over_two_nodes_gives_one_process_scores_and_resumes(cluster, fixtures, processbench, tmp_path):
    recs = records(processbench, 12) + [dict(r, id=f"again-{r['id']}") for r in records(processbench, 12)]
    data = tmp_path / "in"
    data.mkdir()
    stepwise.write(recs[:10], data / "a.parquet")
    stepwise.write(recs[10:], data / "b.jsonl")
    prm = str(fixtures / "qwen2-prm")
    out = tmp_path / "scored"
    summary = sray.score(data, out, prm=prm, shard_size=4, actors=2)
    assert (summary["shards"], summary["skipped"], summary["written"]) == (3 + 4, 0, 24)
    want = stepwise.PRM(prm).score_records(recs)
    got = sray.read(out)
    assert [r["id"] for r in got] == [r["id"] for r in want]
    for g, w in zip(got, want):
        assert g["scores"]["prm"] == pytest.approx(w["scores"]["prm"], abs=1e-5)
        assert g["steps"] == w["steps"]
    # Started again: only the missing shard is written.
    os.remove(out / "part-00004.parquet")
    again = sray.score(data, out, prm=prm, shard_size=4, actors=2)
    assert (again["skipped"], again["written"]) == (6, 4)
    assert [r["scores"] for r in sray.read(out)] == [r["scores"] for r in got]
    # A model per node: the map's entry for each node's address (both nodes have this machine's);
    # a map that misses a node is refused before any actor starts.
    address = ray.nodes()[0]["NodeManagerAddress"]
    per_node = sray.score(data, tmp_path / "per-node", prm={address: prm}, shard_size=12, actors=1)
    assert per_node["written"] == 24
    assert [r["scores"] for r in sray.read(tmp_path / "per-node")] == [r["scores"] for r in got]
    with pytest.raises(stepwise.StepwiseError, match=f"no server for node {address}"):
        sray.score(data, tmp_path / "no-node", prm={"10.9.9.9": prm}, shard_size=12, actors=1)
    # Other settings on the same output are refused, naming what differs.
    with pytest.raises(stepwise.StepwiseError, match="other options"):
        sray.score(data, out, prm=prm, name="other", shard_size=4)
    assert not list(out.glob(".part-*"))


def test_score_on_a_server_takes_shards_side_by_side(cluster, fixtures, processbench, tmp_path):
    """A PRM on servers: each actor scores two shards at once (threads), and the rows are one
    process's."""
    exe = shutil.which("stepwise")
    assert exe, "the stepwise command: pip install ./python (or a dev build on the PATH)"
    server = subprocess.Popen([exe, "serve", "--prm", str(fixtures / "qwen2-prm"), "--port", "0", "--host",
                               "127.0.0.1"], stderr=subprocess.PIPE, text=True)
    try:
        url = next(line.split("listening on ")[1].strip() for line in server.stderr if "listening on " in line)
        recs = records(processbench, 24)
        summary = sray.score(recs, tmp_path / "served", prm=url, shard_size=3, actors=1)
        assert (summary["shards"], summary["written"]) == (8, 24)
        want = stepwise.PRM(str(fixtures / "qwen2-prm")).score_records(recs)
        for g, w in zip(sray.read(tmp_path / "served"), want):
            assert g["id"] == w["id"] and g["scores"]["prm"] == pytest.approx(w["scores"]["prm"], abs=1e-5)
        with pytest.raises(stepwise.StepwiseError, match="shards_at_once must be at least 1"):
            sray.score(recs, tmp_path / "none", prm=url, shards_at_once=0)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_annotate_and_search_over_shards_equal_one_call(cluster, fixtures, processbench, tmp_path):
    policy_path = str(fixtures / "qwen2-policy")
    popts = {"max_tokens": 12}
    recs = [dict(r, gold_answer="18") for r in records(processbench, 6)]
    sray.annotate(recs, tmp_path / "mc", policy=policy_path, method="mc", rollouts=2, seed=3, policy_options=popts,
                  shard_size=2, actors=2)
    want = stepwise.annotate(recs, stepwise.Policy(policy_path, **popts), method="mc", rollouts=2, seed=3,
                             progress=False)
    assert [r["steps"] for r in sray.read(tmp_path / "mc")] == [r["steps"] for r in want]
    problems = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
    prm = str(fixtures / "qwen2-prm")
    sray.search(problems, tmp_path / "beam", policy=policy_path, prm=prm, method="beam", n=4, width=2, max_steps=3,
                policy_options=popts, shard_size=2, actors=2)
    want = stepwise.search(problems, stepwise.Policy(policy_path, **popts), stepwise.PRM(prm), method="beam", n=4,
                           width=2, max_steps=3, progress=False)
    got = sray.read(tmp_path / "beam")
    assert [(r["id"], [s["text"] for s in r["steps"]], r.get("correct")) for r in got] == \
        [(r["id"], [s["text"] for s in r["steps"]], r.get("correct")) for r in want]


def test_a_killed_worker_costs_a_retry_never_a_lost_or_doubled_record(cluster, tmp_path):
    problems = [json.loads(line) for line in HUMANEVAL.read_text().splitlines()]
    samples = [{"task_id": p["task_id"], "completion": p["canonical_solution"]} for p in problems[:96]]
    samples[5]["completion"] = "    return None\n"  # one that fails
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    out = tmp_path / "runs"
    job = subprocess.Popen(
        [sys.executable, "-c", "import json, sys, ray, stepwise.ray as s; ray.init(address=sys.argv[1]); "
         "ray.data.DataContext.get_current().enable_progress_bars = False; "
         "print('SUMMARY', json.dumps(s.run_tests(sys.argv[2], sys.argv[3], sys.argv[4], shard_size=4, actors=2)))",
         cluster, str(HUMANEVAL), str(tmp_path / "samples.jsonl"), str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.time() + 240
    while killed is None and time.time() < deadline and job.poll() is None:
        if len(list(out.glob("part-*.parquet"))) >= 2:
            # The oldest: a worker's sandbox keeper (forked from it, never exec'd) carries the
            # worker's name while its program runs, and killing a keeper fails that one program
            # (a verdict of 0 tests run) instead of costing a worker (CI met it under load).
            pids = subprocess.run(["pgrep", "-o", "-f", "MapWorker"], capture_output=True, text=True).stdout.split()
            if pids:
                killed = int(pids[0])
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.05)
    stdout, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr[-3000:]
    assert killed is not None, "the job ended before a worker could be killed"
    done = len(list(out.glob("part-*.parquet")))
    assert done == 24, f"{done} shards of 24"
    summary = json.loads([line for line in stdout.splitlines() if line.startswith("SUMMARY ")][-1][8:])
    assert summary["written"] == 96
    assert summary["workers"] >= 2  # both actors (one on each node), the killed one's replacement too
    got = sray.read(out)
    assert [g["task_id"] for g in got] == [s["task_id"] for s in samples]
    want = stepwise.run_tests(str(HUMANEVAL), samples)
    assert [(g["passed"], g["tests_passed"], g["tests_run"]) for g in got] == \
        [(w["passed"], w["tests_passed"], w["tests_run"]) for w in want]
    assert [g["passed"] for g in got].count(False) == 1


def test_rows_that_are_not_records_are_named_and_no_partial_shard_is_written(cluster, fixtures, processbench,
                                                                             tmp_path):
    recs = records(processbench, 8)
    lines = [json.dumps(r) for r in recs]
    lines[5] = json.dumps({"prompt": "no steps here"})
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(stepwise.StepwiseError, match=r"bad.jsonl: row 5: not a record"):
        sray.score(tmp_path / "bad.jsonl", tmp_path / "out", prm=str(fixtures / "qwen2-prm"), shard_size=4, actors=1)
    assert not (tmp_path / "out" / "part-00001.parquet").exists()
    assert not list((tmp_path / "out").glob(".part-*"))


def test_grade_over_shards(cluster, tmp_path):
    rows = [{"given": "so x = \\boxed{\\frac{1}{2}}", "ground_truth": "0.5"}, {"given": "7", "ground_truth": "8"},
            {"given": "The answer is 12", "ground_truth": "12"}] * 5
    summary = sray.grade(rows, tmp_path / "graded", shard_size=4)
    assert summary["written"] == 15
    got = sray.read(tmp_path / "graded")
    assert [g["correct"] for g in got] == [True, False, True] * 5
    assert got[0]["extracted"] == "\\frac{1}{2}"


def test_the_stage_classes_serve_as_map_batches_udfs(cluster, fixtures, processbench, tmp_path):
    recs = records(processbench, 6)
    stepwise.write(recs, tmp_path / "recs.parquet")
    prm = str(fixtures / "qwen2-prm")
    ds = ray.data.read_parquet(str(tmp_path / "recs.parquet")).map_batches(
        sray.Scorer, fn_constructor_kwargs={"prm": prm}, compute=ray.data.ActorPoolStrategy(size=1),
        batch_format="pyarrow", batch_size=4)
    import pyarrow as pa
    got = stepwise.from_hf(pa.Table.from_pylist(ds.take_all()))  # a table of records as records
    want = stepwise.PRM(prm).score_records(recs)
    assert sorted(r["id"] for r in got) == sorted(r["id"] for r in want)
    by_id = {r["id"]: r["scores"]["prm"] for r in want}
    for r in got:
        assert r["scores"]["prm"] == pytest.approx(by_id[r["id"]], abs=1e-5)


def test_the_command_line_runs_a_stage_resumes_and_names_bad_flags(cluster, fixtures, processbench, tmp_path):
    """`python -m stepwise.ray` (as `ray job submit` runs it): a stage on the cluster, its summary
    as JSON; the same command again writes nothing; a bad flag is one line, not a traceback."""
    recs = records(processbench, 12)
    inp = tmp_path / "in.jsonl"
    stepwise.write(recs, inp)
    prm = str(fixtures / "qwen2-prm")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "stepwise.ray", "--address", cluster, *args],
                              capture_output=True, text=True, timeout=600)

    args = ["score", str(inp), str(tmp_path / "out"), "--prm", prm, "--shard-size", "4", "--actors", "2"]
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["shards"], summary["written"]) == (3, 12)
    assert "shard 3/3 done" in done.stderr
    want = stepwise.PRM(prm).score_records(recs)
    assert [r["scores"] for r in sray.read(tmp_path / "out")] == [r["scores"] for r in want]
    again = json.loads(cli(*args).stdout)
    assert (again["skipped"], again["written"]) == (3, 0)
    bad = cli("score", str(inp), str(tmp_path / "bad"), "--prm", prm, "--shard-size", "0")
    assert bad.returncode == 1 and bad.stderr.strip().endswith("shard_size must be at least 1, not 0"), bad.stderr
    bad = cli("annotate", str(inp), str(tmp_path / "bad2"), "--policy", prm, "--policy-option", "max_tokens")
    assert bad.returncode == 1 and "--policy-option 'max_tokens': expected KEY=VALUE" in bad.stderr, bad.stderr
    assert "run-tests" in subprocess.run([sys.executable, "-m", "stepwise.ray", "--help"], capture_output=True,
                                         text=True).stdout
