import threading
import time

import pytest

import stepwise


def test_scalars_and_lists():
    assert stepwise.grade("\\frac{1}{2}", "0.5") is True
    assert stepwise.grade("0.4", "0.5") is False
    assert stepwise.grade(12, "12") is True
    assert stepwise.grade(["4", "5", "\\boxed{4}"], "4") == [True, False, True]
    assert stepwise.grade(["1/2", "3"], ["0.5", "4"]) == [True, False]
    # PRM800K's grader is strict where lenient is right.
    assert stepwise.grade("2^{10}", "1024", mode="lenient") is True
    assert stepwise.grade("2^{10}", "1024", mode="prm800k") is False


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="2 answers but 3"):
        stepwise.grade(["1", "2"], ["1", "2", "3"])
    with pytest.raises(ValueError, match="mode"):
        stepwise.grade("1", "1", mode="sympy")
    with pytest.raises(ValueError):
        stepwise.grade({"a": 1}, "1")


def test_answers_and_steps_are_read_from_text():
    assert stepwise.extract_answer("so x = \\boxed{\\frac{3}{4}}.") == "\\frac{3}{4}"
    assert stepwise.extract_answer("no answer here") is None
    # after a line break, leading spaces are indentation and stay; trailing ones go
    assert stepwise.split_steps("a\n\n b \n\nc", "\n\n") == ["a", " b", "c"]
    assert stepwise.split_steps("a| b |c", "|") == ["a", "b", "c"]


def test_grading_a_long_list_releases_the_gil():
    pairs = [str(i % 97) + "/7" for i in range(200_000)]
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    start = time.perf_counter()
    verdicts = stepwise.grade(pairs, "1")
    end = time.perf_counter()
    stop.set()
    t.join()
    assert len(verdicts) == len(pairs)
    # The other thread ran while Rust graded.
    assert sum(start < x < end for x in ticks) >= 3
