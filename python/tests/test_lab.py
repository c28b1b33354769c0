import stepwise


def test_lab_run_returns_the_metrics(tmp_path):
    metrics = stepwise.lab.run(preset="quick", seed=1, out=tmp_path / "run",
                               sets=["search_problems=0", "rl_updates=0"])
    assert 0.0 <= metrics["policy_accuracy"] <= 1.0
    assert (tmp_path / "run" / "metrics.json").exists()
    assert (tmp_path / "run" / "report.md").exists()
    # Resumed from its folder: the same metrics, no stage run again.
    again = stepwise.lab.run(preset="quick", seed=1, out=tmp_path / "run",
                             sets=["search_problems=0", "rl_updates=0"])
    assert again["policy_accuracy"] == metrics["policy_accuracy"]
