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


def test_problem_files_are_read_as_the_command_line_reads_them(repo, tmp_path):
    gsm8k = repo / "data" / "gsm8k" / "test.jsonl"
    problems = stepwise.read_problems(gsm8k)
    assert len(problems) == len(gsm8k.read_text().splitlines())
    first = problems[0]
    assert first["question"].startswith("Janet")
    assert first["answer"] == "18"  # GSM8K's `#### 18`
    math500 = stepwise.read_problems(str(repo / "data" / "math500" / "test.jsonl"))
    assert math500[0]["question"] and math500[0]["answer"]
    # As solutions they are refused once, in Python's words, pointing at read_problems.
    with pytest.raises(stepwise.StepwiseError) as e:
        stepwise.read(gsm8k)
    message = str(e.value)
    assert "read_problems" in message and "--from" not in message
    assert message.count("a problem, not a solution") == 1, message
    with pytest.raises(FileNotFoundError):
        stepwise.read_problems(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "2"}\n{"answer": "3"}\n')
    with pytest.raises(stepwise.StepwiseError, match=r"bad.jsonl:2.*question"):
        stepwise.read_problems(bad)


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
    # TRL's conversational layout, both ways: the prompt stays messages.
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    conv = datasets.Dataset.from_dict({"prompt": [chat], "completions": [["2+2=4", "So 4."]],
                                       "labels": [[True, True]]})
    read_back = stepwise.from_hf(conv)
    assert read_back[0]["question"] == "2+2?"
    again = stepwise.to_hf(read_back, layout="trl")
    assert again[0]["prompt"] == chat and again[0]["completions"] == ["2+2=4", "So 4."]
