"""Stack sampling as the agent does it always on: a low base rate counted per time window,
and a burst of samples in a window of its own for a step that runs long."""

from __future__ import annotations

import threading
import time

import pytest

from argus.producers.agent import AgentConfig, RankAgent, RankInfo, StackFolder, StackWindow
from argus.schemas import STACKS, STEPS, StackSample
from tests.helpers.sinks import ListSink


def _a_slow_part_of_the_step(seconds: float) -> None:
    time.sleep(seconds)


def test_a_slow_step_gets_its_own_stack_sample_and_fast_steps_share_a_window():
    sink = ListSink()
    cfg = AgentConfig(stack_hz=5, slow_stack_hz=100, slow_factor=1.5, stack_window_s=60, cupti=False)
    agent = RankAgent(sink, RankInfo("job-s", 0, 0, 1, 0, "h"), cfg)
    agent.install()
    slow_step = 30
    try:
        for i in range(40):
            agent.begin_step()
            time.sleep(0.01)
            if i == slow_step:  # many times the median step: the sampler bursts
                _a_slow_part_of_the_step(1.5)
            agent.end_step()
        time.sleep(0.3)
    finally:
        agent.close()
    steps = [r for t, _k, r in sink.records if t == STEPS]
    assert len(steps) == 40
    stacks = [r for t, _k, r in sink.records if t == STACKS]
    assert all(isinstance(s, StackSample) for s in stacks)
    # not one record per step: fast steps share the time window
    assert len(stacks) < 10, [(s.step, sum(s.counts)) for s in stacks]
    own = [s for s in stacks if s.step == slow_step]
    assert own, [(s.step, sum(s.counts)) for s in stacks]
    assert any("_a_slow_part_of_the_step" in st for s in own for st in s.stacks)
    assert sum(own[0].counts) > 1  # sampled at the burst rate, not once per base tick


def test_keys_fold_like_strings_and_windows_fold_their_keys():
    folder = StackFolder()
    ready, done = threading.Event(), threading.Event()

    def inner_work() -> None:
        ready.set()
        done.wait(5)

    t = threading.Thread(target=inner_work)
    t.start()
    ready.wait(5)
    try:
        key = folder.sample_key(t.ident or 0)
        text = folder.sample(t.ident or 0)
    finally:
        done.set()
        t.join()
    assert key is not None and isinstance(key, tuple) and all(isinstance(i, int) for i in key)
    assert folder.folded(key) == text
    assert "test_stacks.py:inner_work;threading.py:wait" in (text or "")
    w = StackWindow(3, 0)
    w.add(key)
    w.add(key)
    assert w.folded(folder) == [f"{text} 2"] and len(w) == 2


def test_the_sampling_interval_follows_the_cpu_budget():
    from argus.producers.agent._agent import paced_interval

    lo, hi = 0.1, 1.0
    assert paced_interval(0.1, 0.003, 1.0, 0.001, lo, hi) == pytest.approx(0.3)  # 3x over budget
    assert paced_interval(0.4, 0.0005, 1.0, 0.001, lo, hi) == pytest.approx(0.2)  # 2x under
    assert paced_interval(0.2, 0.1, 1.0, 0.001, lo, hi) == pytest.approx(0.8)  # at most 4x a window
    assert paced_interval(0.1, 0.0001, 1.0, 0.001, lo, hi) == lo  # never faster than stack_hz
    assert paced_interval(0.5, 1.0, 1.0, 0.001, lo, hi) == hi  # nor slower than min_stack_hz
    assert paced_interval(0.3, 0.001, 1.0, 0.001, lo, hi) == 0.3  # on budget: kept
    assert paced_interval(0.3, 0.5, 0.0, 0.001, lo, hi) == 0.3  # no time passed: kept


def test_an_agent_over_its_cpu_budget_samples_less_often():
    sink = ListSink()
    info = RankInfo("job-b", 0, 0, 1, 0, "h")
    thrifty = RankAgent(sink, info, AgentConfig(stack_hz=100, cpu_budget=1e-6, cupti=False))
    ample = RankAgent(sink, info, AgentConfig(stack_hz=100, cpu_budget=1.0, cupti=False))
    thrifty.install()
    ample.install()
    try:
        deadline = time.monotonic() + 1.2  # past the first pacing round (PACE_S: at 0.5 s)
        while time.monotonic() < deadline:
            sum(range(10_000))
    finally:
        thrifty.close()
        ample.close()
    assert thrifty.stack_interval_s == pytest.approx(0.04)  # far over a budget of ~0: 4x longer
    assert ample.stack_interval_s == 0.01  # within budget: stack_hz


_GC_DURING_A_SAMPLE = """
import gc, threading
from argus.producers.agent import StackFolder

folder = StackFolder()
me = threading.get_ident()


class Holder:
    pass


def deeper(n):
    return deeper(n - 1) if n else folder.sample_key(me)


# Garbage that holds a threading.local, and thresholds that start collections at every
# alignment with the frame objects a sample makes: on Python 3.11, sys._current_frames()
# alone deadlocks here (a collection inside it frees the local, which takes the lock the
# call holds)
for threshold in range(2, 40):
    gc.set_threshold(threshold, 10, 10)
    for i in range(300):
        h = Holder()
        h.me, h.local = h, threading.local()
        del h
        assert deeper(i % 7)
print("sampled", gc.isenabled())
"""


def test_a_garbage_collection_during_a_stack_sample_does_not_deadlock_the_process():
    import subprocess
    import sys

    # in a child process: a deadlock fails the test instead of hanging the run (the child
    # takes ~2 s; 120 s is for a loaded machine)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _GC_DURING_A_SAMPLE], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a stack sample deadlocked the process during a garbage collection")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["sampled", "True"]


def test_sampling_leaves_the_collector_as_it_was():
    import gc

    from argus.producers.agent._stacks import current_frames

    me = threading.get_ident()
    assert gc.isenabled()
    assert me in current_frames()
    assert gc.isenabled()
    gc.disable()
    try:
        assert me in current_frames()
        assert not gc.isenabled()
    finally:
        gc.enable()
