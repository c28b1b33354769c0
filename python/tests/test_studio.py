"""stepwise.Studio: a labelling studio started from Python, labelled through its HTTP API (as
the page and scripts do), its labels read back as records in stepwise's and PRM800K's shapes."""

import urllib.error

import pytest
from conftest import studio_call as call

import stepwise


def records(n):
    return [{"id": f"r{i}", "question": f"What is {i} + 1?", "gold_answer": str(i + 1),
             "final_answer": str(i + 1 + i % 2),
             "steps": [{"text": f"{i} + 1 = {i + 1 + i % 2}"}, {"text": f"The answer is {i + 1 + i % 2}."}]}
            for i in range(n)]


def test_a_studio_from_python_labels_and_reads_back(tmp_path):
    with stepwise.Studio(tmp_path / "labels.sqlite", records(4), policy="convincing-wrong", qc_every=0) as studio:
        assert studio.url.startswith("http://127.0.0.1:")
        studio.add_user("lin", "labeller", "lin-password")
        assert studio.add_records(records(5)) == 1  # four were there already
        token = call(studio.url, "POST", "/api/login", body={"name": "lin", "password": "lin-password"})["token"]
        # Convincing wrong answers first: the odd records' answers are wrong.
        first = call(studio.url, "POST", "/api/projects/default/next", token)["record"]
        view = call(studio.url, "GET", f"/api/records/{first}", token)
        assert view["correct"] is False
        call(studio.url, "PUT", f"/api/records/{first}/steps/0", token, {"rating": -1, "comment": "off by one"})
        call(studio.url, "POST", f"/api/records/{first}/finish", token, {"finish_reason": "found_error"})
        labelled = studio.ratings()
        assert [r["id"] for r in labelled] == [view["ext_id"]]
        assert labelled[0]["steps"][0]["label"] == {"rating": "bad", "source": {"kind": "human"}}
        assert labelled[0]["meta"]["studio"]["labellings"][0]["comments"] == {"0": "off by one"}
        prm800k = studio.ratings("prm800k")
        assert prm800k[0]["labeler"] == "lin" and prm800k[0]["label"]["finish_reason"] == "found_error"
        assert studio.dashboard()["finished"] == 1
        left = studio.unassigned()
        assert len(left) == 4
        for r in left:
            r["scores"] = {"prm": [0.5] * len(r["steps"])}
        assert studio.next_generation(left) == 1
        assert len(studio.ratings(include_unlabelled=True)) == 5
    # Closed: the server is gone, the labels are not.
    with pytest.raises(urllib.error.URLError):
        call(studio.url, "GET", "/api/me")
    again = stepwise.Studio(tmp_path / "labels.sqlite", serve=False)
    assert again.url is None and len(again.ratings()) == 1


def test_guidelines_set_from_python_reach_the_api(tmp_path):
    with stepwise.Studio(tmp_path / "labels.sqlite", records(1), qc_every=0) as studio:
        assert studio.guidelines == ""
        studio.guidelines = "A slip in arithmetic is −1: $2 + 2 = 5$."
        studio.add_user("lin", "labeller", "lin-password")
        token = call(studio.url, "POST", "/api/login", body={"name": "lin", "password": "lin-password"})["token"]
        seen = call(studio.url, "GET", "/api/projects/default/guidelines", token)
        assert seen["text"] == studio.guidelines and seen["set_by"] == "python"
        with pytest.raises(ValueError, match="at most 60000"):
            studio.guidelines = "x" * 60_001
        studio.guidelines = ""
        assert call(studio.url, "GET", "/api/projects/default/guidelines", token)["updated"] is None


def test_bad_settings_and_records_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown policy"):
        stepwise.Studio(tmp_path / "a.sqlite", policy="random")
    with pytest.raises(ValueError, match="unknown role"):
        stepwise.Studio(tmp_path / "b.sqlite", serve=False).add_user("x", "boss", "long-password")
    studio = stepwise.Studio(tmp_path / "c.sqlite", serve=False)
    bad = records(3)
    bad[1]["steps"] = "not a list"
    with pytest.raises(stepwise.StepwiseError, match="record 2"):
        studio.add_records(bad)
    assert studio.ratings(include_unlabelled=True) == []
