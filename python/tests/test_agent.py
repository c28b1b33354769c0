"""Agents from Python: rooms worlds, trajectories played by Python policies in Python
environments (hostile ones too), labels for actions, and TextWorld games generated here."""

import json
import os
import random

import pytest
import stepwise


class Wanderer:
    """A policy that picks one of a few actions at random (seeded by its arguments)."""

    ACTIONS = ["look", "go north", "go south", "go east", "go west", "open drawer", "take key", "inc"]

    def continue_from(self, question, prefix, n, until, seed):
        rng = random.Random(f"{question}|{len(prefix)}|{seed}")
        return [rng.choice(self.ACTIONS) for _ in range(n)]


class Counter:
    """A tiny environment: `inc` three times wins, `smash` loses, anything else does nothing."""

    def reset(self, problem):
        self.count = 0
        return f"count 0 of {problem['meta']['target']}"

    def step(self, action):
        if action == "smash":
            return "broken", True, False
        if action == "inc":
            self.count += 1
        return f"count {self.count}", self.count >= 3, self.count >= 3

    def judge(self, action):
        return {"inc": "progress", "smash": "ruin"}.get(action, "useless")


class Raising(Counter):
    def step(self, action):
        if self.count >= 1:
            raise RuntimeError("the simulator fell over")
        return super().step(action)


class Nonsense(Counter):
    def step(self, action):
        return {"observation": 42}


class Hanging(Counter):
    """Its second step never answers (a simulator stuck in a loop)."""

    def step(self, action):
        if self.count >= 1:
            while True:
                pass
        self.count += 1
        return "count 1", False, False


def counter_problems():
    return [{"id": f"c{i}", "question": "Count to three.", "meta": {"target": 3}} for i in range(3)]


def test_rooms_play_and_oracle_labels(tmp_path):
    games = stepwise.rooms(6, seed=2)
    assert len(games) == 6 and "world" in games[0]["meta"]
    out = tmp_path / "trajs.jsonl"
    trajs = stepwise.play(games, Wanderer(), n=2, max_actions=8, output=out)
    assert len(trajs) == 12
    t = trajs[0]
    assert t["question"].startswith("Put the ") and "\nObservation: You are in the" in t["question"]
    assert all("observation" in s for s in t["steps"])
    assert t["meta"]["end"] in ("success", "lost", "out_of_actions")
    # Resumed: nothing is played twice, the records are the same.
    again = stepwise.play(games, Wanderer(), n=2, max_actions=8, output=out)
    assert again == trajs
    assert len(out.read_text().splitlines()) == 12
    labelled = stepwise.label_actions(trajs, games, method="oracle")
    kinds = {k for r in labelled for k in r["meta"]["actions"]}
    assert "invalid" in kinds, kinds
    for r in labelled:
        for s, kind in zip(r["steps"], r["meta"]["actions"]):
            assert s["label"]["source"]["kind"] == "oracle"
            assert s["label"]["rating"] == {"progress": "good", "useless": "neutral"}.get(kind, "bad")
    # Written as OpenAI chat messages and read back.
    msgs = stepwise.convert(labelled[:2], "messages")
    assert msgs[0]["messages"][0]["role"] == "user" and msgs[0]["messages"][2]["role"] == "user"
    assert stepwise.read(msgs)[0]["steps"][0]["text"] == labelled[0]["steps"][0]["text"]


def test_a_python_environment_plays_forks_by_replay_and_labels():
    probs = counter_problems()

    class Incer:
        def continue_from(self, question, prefix, n, until, seed):
            return [random.Random(seed * 31 + j + len(prefix)).choice(["inc", "inc", "look", "smash"]) for j in range(n)]

    trajs = stepwise.play(probs, Incer(), env=Counter, n=3, max_actions=12, seed=1)
    assert {t["meta"]["end"] for t in trajs} <= {"success", "lost", "out_of_actions"}
    assert any(t["correct"] for t in trajs)
    mc = stepwise.label_actions(trajs, probs, method="mc", env=Counter, policy=Incer(), rollouts=4)
    for r in mc:
        for s in r["steps"]:
            if s["text"] == "smash":
                assert s["label"]["p"] == 0.0
    oracle = stepwise.label_actions(trajs, probs, method="oracle", env=Counter)
    assert {k for r in oracle for k in r["meta"]["actions"]} <= {"progress", "useless", "ruin"}
    # Binary search: every action labelled 1 up to the first after which no rollout reaches the
    # goal, that one 0, the rest unlabelled; a success is its own continuation (all 1).
    binary = stepwise.label_actions(trajs, probs, method="binary", env=Counter, policy=Incer(), rollouts=4)
    assert any(r["meta"]["first_dead"] is not None for r in binary)
    for r in binary:
        dead = r["meta"]["first_dead"]
        ps = [s["label"]["p"] if s.get("label") else None for s in r["steps"]]
        if dead is None:
            assert ps == [1.0] * len(ps), r
        else:
            assert not r["correct"] and ps[:dead] == [1.0] * dead and ps[dead] == 0.0, r
            assert all(p is None for p in ps[dead + 1:]), r
        smashed = [i for i, s in enumerate(r["steps"]) if s["text"] == "smash"]
        if smashed:
            assert dead is not None and dead <= smashed[0], r
    with pytest.raises(ValueError, match="policy"):
        stepwise.label_actions(trajs, probs, method="binary", env=Counter)
    # TD from values: lambda 1 and gamma 1 give the outcome itself.
    for r in trajs:
        r["scores"] = {"prm": [0.5] * len(r["steps"])}
    td = stepwise.label_actions(trajs, probs, method="td", gamma=1.0, lam=1.0)
    for r in td:
        want = 1.0 if r["correct"] else 0.0
        assert all(s["label"]["p"] == want for s in r["steps"]), r
        assert all(s["label"]["source"]["kind"] == "td" for s in r["steps"])


def test_a_progress_head_trains_on_td_labels(tmp_path, fixtures):
    """train_prm(target="progress") learns each action's GAE advantage from TD labels; labels
    without one are refused naming the trajectory and the step."""
    probs = counter_problems()

    class Incer:
        def continue_from(self, question, prefix, n, until, seed):
            return [random.Random(seed * 7 + j + len(prefix)).choice(["inc", "look"]) for j in range(n)]

    trajs = stepwise.play(probs, Incer(), env=Counter, n=2, max_actions=6, seed=2)
    for r in trajs:
        r["scores"] = {"prm": [0.3 + 0.1 * i for i in range(len(r["steps"]))]}
    td = stepwise.label_actions(trajs, probs, method="td", gamma=0.9, lam=0.5)
    run = stepwise.train_prm(td, tmp_path / "progress", base=fixtures / "qwen2-policy", target="progress",
                             steps=2, batch_size=4, separator="|")
    assert run["steps"] == 2 and (tmp_path / "progress" / "model.safetensors").exists()
    oracle = stepwise.label_actions(trajs, probs, method="oracle", env=Counter)
    with pytest.raises(stepwise.StepwiseError, match="step 0: field `label.source.progress`: missing"):
        stepwise.train_prm(oracle, tmp_path / "bad", base=fixtures / "qwen2-policy", target="progress", steps=1)
    with pytest.raises(ValueError, match="promise or progress"):
        stepwise.train_prm(td, tmp_path / "bad2", base=fixtures / "qwen2-policy", target="value", steps=1)


def test_failing_environments_end_their_trajectory_never_the_call():
    probs = counter_problems()[:1]
    raised = stepwise.play(probs, Wanderer(), env=Raising, n=1, max_actions=10)[0]
    assert raised["meta"]["end"] == "failed"
    assert "simulator fell over" in raised["meta"]["error"]
    bad = stepwise.play(probs, Wanderer(), env=Nonsense, n=1)[0]
    assert "expected (observation, done, success)" in bad["meta"]["error"]
    with pytest.raises(ValueError, match="rooms"):
        stepwise.play(probs, Wanderer(), env="nethack")
    with pytest.raises(ValueError, match="step_timeout"):
        stepwise.play(probs, Wanderer(), env=Counter, step_timeout=0)


def test_an_environment_that_hangs_ends_its_trajectory_at_the_step_timeout():
    probs = counter_problems()[:2]
    trajs = stepwise.play(probs, Wanderer(), env=Hanging, n=1, max_actions=10, step_timeout=0.5)
    for t in trajs:
        assert t["meta"]["end"] == "failed", t
        assert "did not answer within 0.5 s (step_timeout)" in t["meta"]["error"], t
        assert len(t["steps"]) == 2
    # The interpreter is left as it was: nothing pending surfaces in later Python code.
    total = sum(range(100000))
    assert total == 4999950000
    assert stepwise.play(probs, Wanderer(), env=Counter, n=1, max_actions=3, step_timeout=5)[0]["meta"]["end"] != "failed"
    with pytest.raises(ValueError, match="policy"):
        stepwise.label_actions([], probs, method="mc", env=Counter)


def test_textworld_games_generated_here_are_played_and_labelled(tmp_path):
    if os.environ.get("STEPWISE_REQUIRE_TEXTWORLD"):
        import textworld  # noqa: F401  (CI installs it: the test must run)
    else:
        pytest.importorskip("textworld")
    import stepwise.textworld as tw

    games = tw.make_games(2, seed=3, folder=str(tmp_path / "games"))
    assert all(os.path.isfile(g["meta"]["game"]) for g in games)
    walkthroughs = {g["question"]: g["meta"]["walkthrough_commands"] for g in games}

    class Follower:
        """The walkthrough, with a `look` slipped in at the second turn."""

        def continue_from(self, question, prefix, n, until, seed):
            task = question.split("\nObservation: ")[0]
            done = [p.split("\nObservation: ")[0] for p in prefix if not p.startswith("look")]
            if len(prefix) == 1 and len(done) == 1:
                return ["look"] * n
            steps = walkthroughs[task]
            return [steps[len(done)] if len(done) < len(steps) else "look"] * n

    trajs = stepwise.play(games, Follower(), env=tw.Game, n=1, max_actions=12)
    assert all(t["correct"] for t in trajs), [t["meta"] for t in trajs]
    oracle = stepwise.label_actions(trajs, games, method="oracle", env=tw.Game)
    for r in oracle:
        kinds = r["meta"]["actions"]
        assert kinds[1] == "useless" and kinds.count("progress") == len(kinds) - 1, kinds
    mc = stepwise.label_actions(trajs, games, method="mc", env=tw.Game, policy=Follower(), rollouts=2)
    assert all(s["label"]["p"] == 1.0 for r in mc for s in r["steps"])
    json.dumps(mc)
    # Behind a process boundary (TextWorld's game engine in a process of its own; its forks hold
    # the engine's handle, so they are replayed there): the same trajectories and labels.
    isolated = stepwise.isolated(tw.Game)
    assert stepwise.play(games, Follower(), env=isolated, n=1, max_actions=12) == trajs
    assert stepwise.label_actions(trajs, games, method="oracle", env=isolated) == oracle
    assert stepwise.label_actions(trajs, games, method="mc", env=isolated, policy=Follower(), rollouts=2) == mc
    isolated.close_all()


def test_agent_rl_trains_in_a_python_environment_and_resumes(tmp_path, fixtures):
    """RL for an agent from Python: the fixture policy plays a Python environment with an
    oracle, learns from its verdicts, checkpoints, and a second call on the same folder resumes
    (here: finds every update done) instead of starting over."""
    out = tmp_path / "rl"
    seen = []
    settings = dict(env=Counter, updates=2, worlds=2, group_size=2, max_tokens=4, max_actions=3, lr=1e-4,
                    checkpoint_every=1, seed=3)
    log = stepwise.agent_rl(fixtures / "qwen2-policy", counter_problems(), out, reward="oracle",
                            progress=lambda done, total: seen.append((done, total)), **settings)
    assert [entry["update"] for entry in log] == [1, 2]
    assert all(0.0 <= entry["reward"] <= 1.0 and entry["sampled_tokens"] > 0 for entry in log)
    assert log[-1]["updated_tokens"] > 0
    assert seen[-1] == (2, 2)
    assert [json.loads(line)["update"] for line in (out / "rl_log.jsonl").read_text().splitlines()] == [1, 2]
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    # The folder holds a checkpoint a policy loads from.
    assert stepwise.Policy(out).generate("Count to three.", n=1, seed=1)
    again = stepwise.agent_rl(fixtures / "qwen2-policy", counter_problems(), out, reward="oracle", **settings)
    assert [(e["update"], e["reward"], e["kl"]) for e in again] == [(e["update"], e["reward"], e["kl"]) for e in log]
    # Outcome-only RL watches the oracle beside its reward.
    goal = stepwise.agent_rl(fixtures / "qwen2-policy", counter_problems(), tmp_path / "goal", reward="goal", **settings)
    assert all("oracle" in entry["watched"] for entry in goal)
    # The oracle's verdicts credited action by action.
    own = stepwise.agent_rl(fixtures / "qwen2-policy", counter_problems(), tmp_path / "own", reward="oracle",
                            credit="own", **settings)
    assert [entry["update"] for entry in own] == [1, 2]
    # PRIME: an implicit PRM learns from the goal beside the policy, and is kept in the folder.
    prime = stepwise.agent_rl(fixtures / "qwen2-policy", counter_problems(), tmp_path / "prime", reward="prime",
                              prime_beta=0.1, prime_filter=(0.0, 1.0), **settings)
    assert all("implicit_prm" in entry for entry in prime), prime
    assert (tmp_path / "prime" / "implicit_prm" / "model.safetensors").exists()
    with pytest.raises(ValueError, match="prime_filter"):
        stepwise.agent_rl(fixtures / "qwen2-policy", counter_problems(), tmp_path / "p2", reward="prime",
                          prime_filter=(0.9, 0.1), **settings)


def test_agent_rl_on_the_packed_trainer(tmp_path, fixtures):
    """`trainer="packed"` on the CPU (what a pretrained policy gets there): the policy plays from
    the packed trainer's own weights, the KL reference computes as it does (a KL of exactly 0
    before the first step), and a second call resumes."""
    settings = dict(env=Counter, updates=2, worlds=2, group_size=2, max_tokens=4, max_actions=3, lr=1e-4,
                    checkpoint_every=1, seed=3, trainer="packed", device="cpu")
    out = tmp_path / "packed"
    log = stepwise.agent_rl(fixtures / "qwen2-policy", counter_problems(), out, reward="oracle", **settings)
    assert [entry["update"] for entry in log] == [1, 2]
    assert log[0]["kl"] == 0.0 and all(entry["updated_tokens"] > 0 for entry in log)
    assert stepwise.Policy(out).generate("Count to three.", n=1, seed=1)
    again = stepwise.agent_rl(fixtures / "qwen2-policy", counter_problems(), out, reward="oracle", **settings)
    assert [(e["update"], e["seconds"]) for e in again] == [(e["update"], e["seconds"]) for e in log]
    with pytest.raises(ValueError, match="use auto, autograd or packed"):
        stepwise.agent_rl(fixtures / "qwen2-policy", counter_problems(), tmp_path / "x", env=Counter, trainer="jax")


def test_agent_rl_refuses_what_it_cannot_do(tmp_path, fixtures):
    policy = fixtures / "qwen2-policy"
    with pytest.raises(ValueError, match="goal, oracle, prm:DIR or prime"):
        stepwise.agent_rl(policy, counter_problems(), tmp_path / "a", reward="orm:x", env=Counter)
    with pytest.raises(ValueError, match="silent=True"):
        stepwise.agent_rl(policy, counter_problems(), tmp_path / "b", env=Counter, silent=True)
    with pytest.raises(ValueError, match="credit"):
        stepwise.agent_rl(policy, counter_problems(), tmp_path / "c", env=Counter, credit="sum")
    # A Python environment without judge has no oracle to reward with: the first update says so.
    class Unjudged:
        def reset(self, problem):
            return "a room"

        def step(self, action):
            return "a room", False, False

    with pytest.raises(stepwise.StepwiseError, match="no oracle"):
        stepwise.agent_rl(policy, counter_problems(), tmp_path / "d", env=Unjudged, reward="oracle", updates=1,
                          worlds=1, group_size=2, max_tokens=4, max_actions=2)
