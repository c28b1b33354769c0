"""The command line shipped in the package: `pip install` puts `stepwise` beside the interpreter,
and `python -m stepwise` runs the same Rust command line, with its exit statuses."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def shipped():
    """The `stepwise` script pip installed beside this interpreter (not a dev build on the PATH)."""
    script = Path(sys.executable).parent / ("stepwise.exe" if os.name == "nt" else "stepwise")
    if not script.exists():
        pytest.skip("the package is not installed as a wheel here (no `stepwise` script)")
    return str(script)


def test_the_installed_command_runs_the_command_line(tmp_path):
    out = subprocess.run([shipped(), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("stepwise ")
    data = tmp_path / "answers.jsonl"
    data.write_text(json.dumps({"given": "The answer is \\boxed{12}", "ground_truth": "12"}) + "\n")
    graded = subprocess.run([shipped(), "grade", str(data)], check=True, capture_output=True, text=True)
    assert json.loads(graded.stdout.splitlines()[0])["correct"] is True
    assert "graded 1: 1 correct" in graded.stderr


def test_python_m_stepwise_gives_the_command_lines_statuses(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "stepwise", "convert", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "--to" in ok.stdout
    usage = subprocess.run([sys.executable, "-m", "stepwise", "no-such-command"], capture_output=True, text=True)
    assert usage.returncode == 2 and "unrecognized subcommand" in usage.stderr
    missing = subprocess.run([sys.executable, "-m", "stepwise", "stats", str(tmp_path / "absent.jsonl")],
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "absent.jsonl" in missing.stderr
