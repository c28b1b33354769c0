"""Where the tests find the public data and the transformers-made fixtures: the repository's own
``data/`` and ``fixtures/`` (the tests run from the source tree's ``python/tests``)."""

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The tests that start `stepwise serve` or the studio run the `stepwise` command: a dev build on
# the PATH when there is one (target/debug in CI), else the one the package installed beside this
# interpreter, so the tests pass in an environment that only ran `pip install ./python`.
if shutil.which("stepwise") is None and (Path(sys.executable).parent / "stepwise").exists():
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="session")
def repo() -> Path:
    assert (REPO / "fixtures" / "hf-tiny").is_dir(), f"no fixtures in {REPO / 'fixtures'}"
    return REPO


@pytest.fixture(scope="session")
def fixtures(repo) -> Path:
    return repo / "fixtures" / "hf-tiny"


@pytest.fixture(scope="session")
def processbench(repo) -> Path:
    return repo / "data" / "processbench" / "gsm8k.json"


def short(records, n=12):
    """The first records cut to fit the fixtures' 512 positions."""
    out = []
    for i, r in enumerate(records[:n]):
        r = dict(r)
        r["question"] = r["question"][: 40 + 5 * i]
        r["steps"] = [dict(s, text=s["text"][:60]) for s in r["steps"][: 1 + i % 3]]
        out.append(r)
    return out


def studio_call(base, method, path, token=None, body=None):
    """One call of the labelling studio's HTTP API (JSON in, JSON out; Bearer token)."""
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", "Bearer " + token)
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def start_serve(*args):
    """`stepwise serve ARGS` on a free loopback port: the process and its URL, once it listens."""
    exe = shutil.which("stepwise")
    assert exe, "the stepwise command: pip install ./python (or a dev build on the PATH)"
    proc = subprocess.Popen([exe, "serve", *map(str, args), "--port", "0", "--host", "127.0.0.1"],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "listening on " in line:
            return proc, line.split("listening on ")[1].strip()
    proc.wait(timeout=30)
    raise AssertionError("stepwise serve did not start")
