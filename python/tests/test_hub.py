"""Models by Hugging Face id from Python: ``stepwise.download`` finds a model already in the
Hugging Face cache (the layout ``hf download`` writes) without the network, and ``PRM`` reads the
same id; a folder is refused. (The download itself, against a Hub lookalike, is tested in
crates/stepwise-cli/tests/hub.rs.)"""

import shutil

import pytest

import stepwise

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_download_finds_a_cached_model_offline(fixtures, tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--test-org--tiny-prm"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(fixtures / "qwen2-tokcls", snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert stepwise.download("test-org/tiny-prm") == str(snapshot)
    steps = ["2 + 3 = 5.", "The answer is 5."]
    assert stepwise.PRM("test-org/tiny-prm").score("What is 2 + 3?", steps) == stepwise.PRM(
        snapshot).score("What is 2 + 3?", steps)
    with pytest.raises(stepwise.StepwiseError, match="a folder here"):
        stepwise.download(str(snapshot))
    with pytest.raises(stepwise.StepwiseError, match="stepwise download test-org/other"):
        stepwise.download("test-org/other")
