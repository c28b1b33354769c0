import json

import pytest

import stepwise


def test_reads_a_file_in_any_format(processbench):
    recs = stepwise.read(processbench)
    assert len(recs) == 400
    first = recs[0]
    assert first["id"] == "gsm8k-0"
    assert first["question"].startswith("Sue lives in a fun neighborhood")
    # ProcessBench's label is the first wrong step: good before it, bad at it.
    raw = json.loads(processbench.read_text())[0]
    labels = [s.get("label", {}).get("rating") for s in first["steps"]]
    assert labels[raw["label"]] == "bad"
    assert all(r == "good" for r in labels[: raw["label"]])
    assert stepwise.read(str(processbench), format="processbench")[5] == recs[5]


def test_reads_records_in_memory_in_every_format():
    trl = [{"prompt": "1+1?", "completions": ["1+1=2", "So 2."], "labels": [True, False]}]
    recs = stepwise.read(trl)
    assert [s["text"] for s in recs[0]["steps"]] == ["1+1=2", "So 2."]
    assert [s["label"]["rating"] for s in recs[0]["steps"]] == ["good", "bad"]
    shepherd = {"input": "Q? Step 1: a ки\nStep 2: b ки", "label": "Q? Step 1: a +\nStep 2: b -"}
    assert len(stepwise.read(shepherd)[0]["steps"]) == 2
    # Back to TRL's layout, unchanged.
    assert stepwise.convert(recs, "trl")[0] == {**trl[0], "id": recs[0]["id"]} or \
        {k: stepwise.convert(recs, "trl")[0][k] for k in trl[0]} == trl[0]


def test_bad_records_name_the_record_and_field():
    with pytest.raises(stepwise.StepwiseError, match=r"record 2 \(trl\).*labels"):
        stepwise.read([{"prompt": "a", "completions": ["x"], "labels": [True]},
                       {"prompt": "b", "completions": ["x", "y"], "labels": [True]}])
    with pytest.raises(stepwise.StepwiseError, match="not a format"):
        stepwise.read([{"what": 1}])
    with pytest.raises(stepwise.StepwiseError, match="no_such_file"):
        stepwise.read("no_such_file.jsonl")
    with pytest.raises(ValueError, match="unknown format"):
        stepwise.read([], format="yaml")


def test_writes_and_reads_back_every_file_kind(tmp_path, processbench):
    recs = stepwise.read(processbench)[:20]
    for name, fmt in [("a.jsonl", "stepwise"), ("b.json", "trl"), ("c.parquet", "trl"),
                      ("d.jsonl", "math-shepherd"), ("e.jsonl", "prm800k")]:
        assert stepwise.write(recs, tmp_path / name, format=fmt) == 20
        back = stepwise.read(tmp_path / name)
        assert [[s["text"] for s in r["steps"]] for r in back] == [[s["text"] for s in r["steps"]] for r in recs], name
    assert stepwise.read(tmp_path / "a.jsonl") == recs


def test_to_hf_keeps_trl_columns_and_types_and_reads_back(processbench):
    datasets = pytest.importorskip("datasets")
    recs = stepwise.read(processbench)[:30]
    ds = stepwise.to_hf(recs, layout="trl")
    assert isinstance(ds, datasets.Dataset)
    assert len(ds) == 30
    features = ds.features
    assert features["prompt"].dtype == "string"
    assert features["completions"].feature.dtype == "string"
    assert features["labels"].feature.dtype == "bool"
    assert ds[0]["prompt"] == recs[0]["question"]
    assert ds[0]["completions"] == [s["text"] for s in recs[0]["steps"]]
    back = stepwise.from_hf(ds)
    assert [[s["text"] for s in r["steps"]] for r in back] == [[s["text"] for s in r["steps"]] for r in recs]
    # A shuffled selection reads back in its own order (the dataset's indices are honoured).
    picked = ds.select([5, 2])
    assert [r["question"] for r in stepwise.from_hf(picked)] == [recs[5]["question"], recs[2]["question"]]
    # A dataset made by hand in TRL's layout.
    own = datasets.Dataset.from_dict({"prompt": ["2+2?"], "completions": [["2+2=4"]], "labels": [[True]]})
    assert stepwise.from_hf(own)[0]["steps"][0]["label"]["rating"] == "good"
