import stepwise


# The quick preset on a tiny budget (the loop and its files, not how well the small models learn;
# the command line's test runs the preset as it is).
TINY = ["policy_steps=40", "policy_problems=400", "verifier_base_steps=40", "verifier_steps=4",
        "judge_steps=4", "search_problems=0", "rl_updates=0"]


def test_lab_run_returns_the_metrics(tmp_path):
    metrics = stepwise.lab.run(preset="quick", seed=1, out=tmp_path / "run", sets=TINY)
    assert 0.0 <= metrics["policy_accuracy"] <= 1.0
    assert (tmp_path / "run" / "metrics.json").exists()
    assert (tmp_path / "run" / "report.md").exists()
    # Resumed from its folder: the same metrics, no stage run again.
    again = stepwise.lab.run(preset="quick", seed=1, out=tmp_path / "run", sets=TINY)
    assert again["policy_accuracy"] == metrics["policy_accuracy"]


def test_lab_domains(tmp_path):
    import pytest
    with pytest.raises(ValueError, match="arithmetic, code or agent"):
        stepwise.lab.run(preset="quick", out=tmp_path / "chess", domain="chess")
    # The code domain on a tiny budget: its metrics name it.
    metrics = stepwise.lab.run(preset="quick", seed=2, out=tmp_path / "code", sets=TINY, domain="code")
    assert metrics["domain"] == "code"
    assert 0.0 <= metrics["mc_label_quality"]["hard_accuracy"] <= 1.0


def test_lab_agent_domain(tmp_path):
    # The agent's loop at a tiny size: its metrics name the domain and each of its sections.
    tiny = ["agent_demo_games=40", "agent_policy_steps=10", "agent_label_games=3", "agent_eval_games=3",
            "agent_eval_samples=2", "agent_search_games=0", "agent_verifier_steps=2", "agent_max_actions=6",
            "agent_rl_updates=0"]
    metrics = stepwise.lab.run(preset="quick", seed=3, out=tmp_path / "agent", sets=tiny, domain="agent")
    assert metrics["domain"] == "agent"
    assert set(metrics["labels"]) == {"mc", "binary", "mc_on_binary_actions", "td", "return"}
    assert metrics["search"] is None and metrics["rl"] is None
    assert {"progress_head", "promise_change", "promise"} <= set(metrics["heads"])
    assert 0.0 <= metrics["policy"]["success_rate"] <= 1.0
    assert any(c["method"] == "PRM-MC-min" for c in metrics["bon"]["curves"])
