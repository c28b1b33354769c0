import json

import pytest

import stepwise
from conftest import short


def expected(fixtures):
    return json.loads((fixtures / "expected.json").read_text())["cases"]


@pytest.mark.parametrize("case", ["qwen2-prm", "qwen2-tokcls", "llama-shepherd"])
def test_scores_match_transformers(fixtures, case):
    # f32 arithmetic, as transformers made the fixture's numbers.
    prm = stepwise.PRM(str(fixtures / case), device="cpu", dtype="f32")
    assert prm.device == "cpu"
    for item in expected(fixtures)[case]["items"]:
        got = prm.score(item["problem"], item["steps"])
        want = item["step_rewards"]
        assert len(got) == len(want)
        assert max(abs(a - b) for a, b in zip(got, want)) < 2e-4


def test_score_batch_takes_dicts_pairs_and_records_and_equals_score(fixtures, processbench):
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"), max_batch_tokens=600)
    recs = short(stepwise.read(processbench))
    texts = [[s["text"] for s in r["steps"]] for r in recs]
    one_by_one = [prm.score(r["question"], t) for r, t in zip(recs, texts)]
    as_pairs = prm.score_batch([(r["question"], t) for r, t in zip(recs, texts)])
    as_dicts = prm.score_batch([{"question": r["question"], "steps": r["steps"]} for r in recs])
    for a, b, c in zip(one_by_one, as_pairs, as_dicts):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-6
        assert max(abs(x - y) for x, y in zip(a, c)) < 1e-6
    scored = prm.score_records(recs, name="mine")
    for r, want in zip(scored, one_by_one):
        assert r["scores"]["mine"] == pytest.approx(want, abs=1e-6)


def test_scores_are_the_command_lines(fixtures, processbench, tmp_path):
    """`stepwise score` and `PRM.score_records` write the same numbers for the same records."""
    import shutil
    import subprocess

    binary = shutil.which("stepwise")
    if binary is None:
        pytest.fail("no stepwise command: pip install ./python (or cargo build -p stepwise-cli)")
    recs = short(stepwise.read(processbench))
    stepwise.write(recs, tmp_path / "in.jsonl")
    subprocess.run([binary, "score", "--model", str(fixtures / "qwen2-prm"), "--input", str(tmp_path / "in.jsonl"),
                    "--output", str(tmp_path / "out.jsonl"), "--device", "cpu"], check=True, capture_output=True)
    cli = [r["scores"]["prm"] for r in stepwise.read(tmp_path / "out.jsonl")]
    py = [r["scores"]["prm"] for r in stepwise.PRM(str(fixtures / "qwen2-prm"), device="cpu").score_records(recs)]
    assert py == cli


def test_a_record_too_long_for_the_prm_costs_only_itself(fixtures, processbench, tmp_path):
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    recs = short(stepwise.read(processbench), n=6)
    recs[3] = dict(recs[3], id="too-long", steps=[{"text": "1 + 1 = 2. " * 1500}])  # > 2,048 positions
    with pytest.raises(stepwise.StepwiseError, match=r"record 4 \(`too-long`\)") as raised:
        prm.score_records(recs, batch_size=2)
    kept = raised.value.records
    assert [r["id"] for r in kept] == [r["id"] for r in recs[:3]]
    assert all(len(r["scores"]["prm"]) == len(r["steps"]) for r in kept)
    with pytest.warns(UserWarning, match="1 of 6 records could not be scored"):
        out = prm.score_records(recs, batch_size=2, on_error="skip")
    assert [("prm" in r.get("scores", {})) for r in out] == [True, True, True, False, True, True]
    assert "positions" in out[3]["meta"]["score_errors"]["prm"]
    # A path is records too, and the scores equal those of the records read from it.
    stepwise.write(recs[:3], tmp_path / "three.jsonl")
    assert prm.score_records(tmp_path / "three.jsonl") == prm.score_records(recs[:3])
    with pytest.raises(ValueError, match="on_error"):
        prm.score_records(recs, on_error="ignore")


def test_score_records_to_an_output_resumes_after_a_cut(fixtures, processbench, tmp_path):
    """`output=`: a journal; a call cut off (here: the file as a kill leaves it, a torn last line)
    and made again scores only the rest, to the records of an uninterrupted call; a call with
    another name on it is refused; a record that stopped a call is scored on the next."""
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    recs = short(stepwise.read(processbench), n=10)
    whole = prm.score_records(recs, batch_size=3, output=tmp_path / "whole.jsonl")
    assert whole == prm.score_records(recs, batch_size=3)
    lines = (tmp_path / "whole.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 10
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:4]) + lines[4][:30])
    (tmp_path / "cut.jsonl.settings.json").write_text((tmp_path / "whole.jsonl.settings.json").read_text())
    seen = []
    again = prm.score_records(recs, batch_size=3, output=cut, progress=lambda d, t: seen.append(d))
    assert again == whole and cut.read_text() == "".join(lines)
    assert seen[0] > 4 and seen[-1] == 10, seen
    with pytest.raises(stepwise.StepwiseError, match="other settings"):
        prm.score_records(recs, name="other", output=cut)
    with pytest.raises(stepwise.StepwiseError, match="must be a .jsonl"):
        prm.score_records(recs, output=tmp_path / "out.parquet")
    # A record too long for the PRM stops the call after the ones before it, which stay written.
    bad = recs[:3] + [dict(recs[3], id="too-long", steps=[{"text": "1 + 1 = 2. " * 1500}])]
    with pytest.raises(stepwise.StepwiseError, match=r"record 4 \(`too-long`\)"):
        prm.score_records(bad, batch_size=2, output=tmp_path / "bad.jsonl")
    assert len((tmp_path / "bad.jsonl").read_text().splitlines()) == 3
    with pytest.warns(UserWarning, match="1 of 4 records"):
        out = prm.score_records(bad, batch_size=2, on_error="skip", output=tmp_path / "bad.jsonl")
    assert [r["id"] for r in out] == [r["id"] for r in bad]


def test_errors_carry_the_rust_message(fixtures, tmp_path):
    with pytest.raises(stepwise.StepwiseError, match="config.json"):
        stepwise.PRM(str(tmp_path))
    prm = stepwise.PRM(str(fixtures / "qwen2-prm"))
    with pytest.raises(stepwise.StepwiseError, match="max_position_embeddings"):
        prm.score("q " * 5000, ["a"])
    with pytest.raises(ValueError, match="item 0"):
        prm.score_batch([{"steps": ["a"]}])
    with pytest.raises(ValueError, match="device"):
        stepwise.PRM(str(fixtures / "qwen2-prm"), device="tpu")
    if not stepwise.cuda_available:
        with pytest.raises(stepwise.StepwiseError, match="without CUDA"):
            stepwise.PRM(str(fixtures / "qwen2-prm"), device="cuda")


@pytest.mark.parametrize("trainer", ["autograd", "packed"])
def test_train_prm_writes_a_prm_that_scores_and_resumes(fixtures, processbench, tmp_path, trainer):
    """Either CPU trainer (candle's autograd, or the packed engine's) writes a PRM that scores,
    and continues its run on the same folder."""
    records = short(stepwise.read(str(processbench)), n=12)
    out = tmp_path / "prm"
    run = stepwise.train_prm(records, out, base=fixtures / "qwen2-prm", steps=6, lr=1e-3, batch_size=4,
                             valid_fraction=0.25, device="cpu", trainer=trainer)
    device = {"autograd": "cpu", "packed": "cpu (packed engine)"}[trainer]
    assert (run["steps"], run["device"]) == (6, device)
    assert run["tokens"] > 0 and run["tokens_per_s"] > 0
    assert run["train_sequences"] + run["valid_sequences"] == 12 and run["valid_sequences"] > 0
    assert set(run["metrics"]) == {"loss", "accuracy", "auroc"}
    prm = stepwise.PRM(str(out), device="cpu")
    scores = prm.score(records[0]["question"], [s["text"] for s in records[0]["steps"]])
    assert len(scores) == len(records[0]["steps"]) and all(0 <= s <= 1 for s in scores)
    # More steps on the same folder continue the run; a path to a file is read as records.
    path = tmp_path / "records.jsonl"
    stepwise.write(records, str(path))
    again = stepwise.train_prm(str(path), out, base=fixtures / "qwen2-prm", steps=8, lr=1e-3, batch_size=4,
                               valid_fraction=0.25, device="cpu", trainer=trainer)
    assert again["steps"] == 8


def test_train_prm_validates_on_fixed_records(fixtures, processbench, tmp_path):
    """valid_records (records, or a path to a file of them) is the validation set, every record of
    `records` trains, as `train-prm --valid-data`."""
    records = short(stepwise.read(str(processbench)), n=16)
    held = tmp_path / "held.jsonl"
    stepwise.write(records[12:], str(held))
    for i, valid in enumerate([records[12:], str(held)]):
        run = stepwise.train_prm(records[:12], tmp_path / f"prm{i}", base=fixtures / "qwen2-prm", steps=2, lr=1e-3,
                                 batch_size=4, valid_records=valid, device="cpu")
        assert (run["train_sequences"], run["valid_sequences"]) == (12, 4)
        assert run["metrics"]["loss"] > 0


def test_train_prm_refuses_bad_arguments(fixtures, tmp_path):
    with pytest.raises(ValueError, match="unknown device"):
        stepwise.train_prm([], tmp_path / "x", base=fixtures / "qwen2-prm", device="tpu")
    with pytest.raises(ValueError, match="unknown trainer"):
        stepwise.train_prm([], tmp_path / "x", base=fixtures / "qwen2-prm", trainer="jax", device="cpu")
    with pytest.raises(stepwise.StepwiseError, match="unknown --head"):
        stepwise.train_prm([], tmp_path / "x", base=fixtures / "qwen2-prm", head="tree", device="cpu")
    with pytest.raises(stepwise.StepwiseError, match="the learning rate must be a positive number"):
        stepwise.train_prm([], tmp_path / "x", base=fixtures / "qwen2-prm", lr=float("nan"), device="cpu")
    assert not (tmp_path / "x").exists()
