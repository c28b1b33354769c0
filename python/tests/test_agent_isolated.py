"""Python environments behind a process boundary (``stepwise.isolated``): a simulator that
segfaults on a model's action, blocks inside C past ``step_timeout``, or runs out of its memory
cap ends only its own trajectory, its process gone; labels through an isolated environment
(``fork`` and ``judge`` forwarded) are the labels of the same environment in process."""

import copy
import gc
import multiprocessing
import os
import signal
import time

import pytest
import stepwise
import test_agent


class Counter(test_agent.Counter):
    """test_agent's counter (`inc` three times wins, `smash` loses), forking by copying itself."""

    def fork(self):
        return copy.deepcopy(self)


class Handled(Counter):
    """Its forks hold something no pickle takes (as a simulator's handle)."""

    def fork(self):
        other = copy.deepcopy(self)
        other.handle = lambda: None
        return other


class Segfaulting(Counter):
    """A simulator written in C that crashes on input it was not built for."""

    def step(self, action):
        if action == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().step(action)


class Sleeping(Counter):
    """Its second step blocks inside C (a read that never returns)."""

    def step(self, action):
        if self.count >= 1:
            time.sleep(600)
        self.count += 1
        return "count 1", False, False


class Hungry(Counter):
    def step(self, action):
        if action == "crash":
            self.hoard = bytearray(1 << 30)
        return super().step(action)


class Scripted:
    """`crash` first for a problem that asks for it, then `inc`."""

    def continue_from(self, question, prefix, n, until, seed):
        return ["crash" if "crash" in question and not prefix else "inc"] * n


def problems():
    return [
        {"id": "bad", "question": "Count to three (crash).", "meta": {"target": 3}},
        {"id": "good", "question": "Count to three.", "meta": {"target": 3}},
    ]


def assert_no_children_left(*classes):
    """Every environment's process is back in its class's pool (stopped by `close_all`) or gone
    once its objects are: none leaks. (An object can outlive the call that used it for a moment:
    an exception's traceback holds it until Rust next enters Python.)"""
    deadline = time.monotonic() + 10
    while True:
        gc.collect()
        for cls in classes:
            cls.close_all()
        left = multiprocessing.active_children()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert left == [], left


def test_a_crash_or_a_memory_cap_ends_only_its_trajectory():
    for make, says in [
        (lambda: stepwise.isolated(Segfaulting), "killed by SIGSEGV"),
        (lambda: stepwise.isolated(Hungry, memory_mb=256), "MemoryError"),
    ]:
        env = make()
        for _ in range(2):  # the second time in the processes the first left
            bad, good = stepwise.play(problems(), Scripted(), env=env, n=1, max_actions=5)
            assert bad["meta"]["end"] == "failed" and says in bad["meta"]["error"], bad
            assert good["correct"] and good["meta"]["end"] == "success", good
        assert_no_children_left(env)


def test_a_call_blocked_in_c_is_stopped_at_the_step_timeout():
    start = time.monotonic()
    sleeping = stepwise.isolated(Sleeping)
    (t,) = stepwise.play(problems()[1:], Scripted(), env=sleeping, n=1, max_actions=5, step_timeout=1)
    assert time.monotonic() - start < 60
    assert "did not answer within 1 s (step_timeout)" in t["meta"]["error"], t
    assert_no_children_left(sleeping)
    env = stepwise.isolated(Sleeping, timeout=1, keep=0)()
    env.reset(problems()[1])
    env.step("inc")
    with pytest.raises(TimeoutError):
        env.step("inc")
    with pytest.raises(stepwise.EnvironmentProcessError):
        env.step("inc")


def test_labels_through_an_isolated_environment_are_the_same():
    probs = problems()[1:]

    class Incer:
        def continue_from(self, question, prefix, n, until, seed):
            import random
            return [random.Random(seed * 31 + j + len(prefix)).choice(["inc", "look", "smash"]) for j in range(n)]

    trajs = stepwise.play(probs, Incer(), env=Counter, n=2, max_actions=6, seed=3)
    for env in [Counter, Handled]:  # forks pickled across, and forks replayed there
        isolated = stepwise.isolated(env)
        assert stepwise.play(probs, Incer(), env=isolated, n=2, max_actions=6, seed=3) == trajs
        for method, extra in [("oracle", {}), ("mc", {"policy": Incer(), "rollouts": 2})]:
            here = stepwise.label_actions(trajs, probs, method=method, env=Counter, **extra)
            there = stepwise.label_actions(trajs, probs, method=method, env=isolated, **extra)
            assert there == here, (env, method)
        assert_no_children_left(isolated)


def test_what_cannot_be_isolated_is_refused():
    with pytest.raises(TypeError, match="picklable"):
        stepwise.isolated(lambda: Counter())
    with pytest.raises(ValueError, match="memory_mb"):
        stepwise.isolated(Counter, memory_mb=8)
    with pytest.raises(ValueError, match="timeout"):
        stepwise.isolated(Counter, timeout=0)
    with pytest.raises(ValueError, match="keep"):
        stepwise.isolated(Counter, keep=-1)


def test_agent_rl_through_an_isolated_environment_logs_what_it_logs_in_process(tmp_path, fixtures):
    settings = dict(updates=2, worlds=2, group_size=2, max_tokens=4, max_actions=3, lr=1e-4, seed=3, reward="oracle")
    probs = [{"id": f"c{i}", "question": "Count to three.", "meta": {"target": 3}} for i in range(3)]
    here = stepwise.agent_rl(fixtures / "qwen2-policy", probs, tmp_path / "here", env=Counter, **settings)
    isolated = stepwise.isolated(Counter)
    there = stepwise.agent_rl(fixtures / "qwen2-policy", probs, tmp_path / "there", env=isolated, **settings)
    keys = ("update", "reward", "kl", "sampled_tokens")
    assert [[e[k] for k in keys] for e in there] == [[e[k] for k in keys] for e in here]
    assert_no_children_left(isolated)
