"""A fleet from Python: `stepwise.Policy` and `stepwise.PRM` given a file of server URLs (two
`stepwise serve` processes) sample and score what the local checkpoints do, and a file with a bad
entry is refused naming its line."""

import pytest
from conftest import start_serve

import stepwise


def serve(fixtures):
    return start_serve("--model", fixtures / "qwen2-policy", "--prm", fixtures / "qwen2-prm")


def test_a_server_file_serves_as_the_local_checkpoints_do(fixtures, tmp_path):
    servers = [serve(fixtures) for _ in range(2)]
    try:
        listing = tmp_path / "servers.txt"
        listing.write_text("# two servers\n" + "\n".join(url for _, url in servers) + "\n")
        question, steps = "What is 2 + 3?", ["2 + 3 = 5", "The answer is 5"]
        local_prm, fleet_prm = stepwise.PRM(str(fixtures / "qwen2-prm")), stepwise.PRM(str(listing))
        assert fleet_prm.score(question, steps) == pytest.approx(local_prm.score(question, steps), abs=1e-6)
        # A batch is split over the servers, one request each, and comes back in order.
        batch = [(f"What is {i} + 1?", [f"{i} + 1 = {i + 1}", f"The answer is {i + 1}"]) for i in range(7)]
        for got, want in zip(fleet_prm.score_batch(batch), local_prm.score_batch(batch)):
            assert got == pytest.approx(want, abs=1e-6)
        # Records: batches side by side over the servers (two in flight each), in input order.
        recs = [{"id": f"s{i}", "question": q, "steps": [{"text": t} for t in st]} for i, (q, st) in enumerate(batch)]
        seen = []
        got = fleet_prm.score_records(recs, batch_size=2, progress=lambda done, total: seen.append((done, total)))
        want = local_prm.score_records(recs, batch_size=2)
        assert [r["id"] for r in got] == [r["id"] for r in recs]
        for g, w in zip(got, want):
            assert g["scores"]["prm"] == pytest.approx(w["scores"]["prm"], abs=1e-6)
        assert seen and seen[-1] == (7, 7) and [d for d, _ in seen] == sorted(d for d, _ in seen)
        local = stepwise.Policy(str(fixtures / "qwen2-policy"), max_tokens=12)
        fleet = stepwise.Policy(str(listing), max_tokens=12, served_model="qwen2-policy")
        for seed in range(4):
            assert fleet.generate(question, n=2, seed=seed) == local.generate(question, n=2, seed=seed)
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=30)
    listing.write_text("http://127.0.0.1:1\ngpu2:8000\n")
    with pytest.raises(stepwise.StepwiseError, match=r"servers.txt:2: `gpu2:8000` is not an http"):
        stepwise.Policy(str(listing))


def test_a_served_judge_is_weighed_as_the_local_one(fixtures):
    # Each answer goes after the solution as token ids ending with the end of text, and its
    # log-probabilities come back echoed (`echo` with `logprobs`, as vLLM gives them too).
    proc, url = serve(fixtures)
    try:
        items = [("What is 2 + 3?", ["2 + 3 = 5", "The answer is 5."]), ("What is 4 * 2?", ["4 * 2 = 6"])]
        local = stepwise.Policy(str(fixtures / "qwen2-policy"), separator="\n")
        served = stepwise.Policy(url, separator="\n", server_tokenizer=str(fixtures / "qwen2-policy"))
        for got, want in zip(stepwise.judge_scores(served, items), stepwise.judge_scores(local, items)):
            assert got == pytest.approx(want, abs=1e-3)
        # Without the tokenizer an answer cannot end with the end of text: a clear error.
        with pytest.raises(stepwise.StepwiseError, match="server-tokenizer"):
            stepwise.judge_scores(stepwise.Policy(url, separator="\n"), items)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_policy_loglikelihood_is_the_same_locally_and_served(fixtures):
    # Options weighed after a question and steps: one packed pass locally, echoed by the server.
    proc, url = serve(fixtures)
    try:
        options = ["The answer is 5", "The answer is 6", "5"]
        local = stepwise.Policy(str(fixtures / "qwen2-policy"), separator="\n")
        served = stepwise.Policy(url, separator="\n", server_tokenizer=str(fixtures / "qwen2-policy"))
        for end in (False, True):
            here = local.loglikelihood("What is 2 + 3?", options, prefix=["2 + 3 = 5"], end=end)
            there = served.loglikelihood("What is 2 + 3?", options, prefix=["2 + 3 = 5"], end=end)
            assert len(here) == 3 and all(x < 0 for x in here)
            assert there == pytest.approx(here, abs=1e-3)
        # The end token's own log-probability is added: an option ending there is less likely.
        with_end = local.loglikelihood("What is 2 + 3?", options, end=True)
        assert all(e < o for e, o in zip(with_end, local.loglikelihood("What is 2 + 3?", options)))
        # A longer option holds the shorter one's tokens and more: it cannot be likelier.
        short, longer = local.loglikelihood("What is 2 + 3?", ["The answer", "The answer is 5"])
        assert longer < short
        assert local.loglikelihood("What is 2 + 3?", []) == []
        with pytest.raises(stepwise.StepwiseError, match="server-tokenizer"):
            stepwise.Policy(url, separator="\n").loglikelihood("What is 2 + 3?", options, end=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
