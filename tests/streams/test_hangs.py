"""The hang stage's bookkeeping: heartbeats kept per job, each hang anomaly sent when first
named and then every ``update_s``, a silent job forgotten after ``job_ttl_s``."""

from __future__ import annotations

import dataclasses

from argus.producers.simulator import HangScenario, HangSimulator, Layout
from argus.schemas import Heartbeat, HeartbeatBatch
from argus.streams import HangTracker
from argus.streams._side_inputs import _cut_line

S = 10**9


def test_a_hang_is_due_once_then_again_each_update_and_a_silent_job_is_forgotten() -> None:
    sim = HangSimulator(
        Layout(dp=2, tp=4, pp=1), HangScenario("collective_hang", at_s=20.0, rank=5), job="h", heartbeat_s=1.0
    )
    tracker = HangTracker(update_s=60.0, job_ttl_s=600.0)
    now_ns = sim.hang_ns + 30 * S
    taken, refused = tracker.observe([(b, i) for i, b in enumerate(sim.beats(sim.start_ns, now_ns))])
    assert taken > 0 and refused == [] and tracker.jobs == 1
    assert list(tracker.due(sim.hang_ns + 2 * S, now=0.0)) == []  # under the threshold
    due = list(tracker.due(now_ns, now=0.0))
    assert [(a.suspect, first) for a, first in due] == [("rank:5", True)]
    tracker.mark_sent(due[0][0].id, 0.0)
    assert list(tracker.due(now_ns, now=59.0)) == []
    assert [(a.suspect, first) for a, first in tracker.due(now_ns, now=60.0)] == [("rank:5", False)]
    tracker.prune(now=601.0)
    assert tracker.sent == {}
    assert list(tracker.due(now_ns + 601 * S, now=602.0)) == [] and tracker.jobs == 0


def _skewed(beats: list, host: str, skew_s: float) -> list:
    """The heartbeats as sent by hosts whose clocks differ: ``host``'s run ``skew_s`` ahead."""
    return [
        dataclasses.replace(b, time_ns=b.time_ns + int(skew_s * S)) if b.host == host else b for b in beats
    ]


def _pages(scenario: HangScenario, skew_s: float, *, skewed_host: int, until_s: float = 60.0) -> list:
    """Every hang anomaly a tracker names over ``until_s`` seconds of the job, fed each
    second what was sent in that second (the receiver's clock is the true one)."""
    sim = HangSimulator(Layout(dp=4, tp=4, pp=1, gpus_per_host=4), scenario, job="skew", heartbeat_s=1.0)
    host = Layout.host_name(skewed_host)
    tracker = HangTracker(update_s=3600.0)
    named = []
    for now_ns, beats in sim.ticks(1.0, until_s):
        tracker.observe([(b, 0) for b in _skewed(beats, host, skew_s)], arrival_ns=now_ns)
        for anomaly, first in tracker.due(now_ns, now=now_ns / S):
            tracker.mark_sent(anomaly.id, now_ns / S)
            if first:
                named.append((anomaly.cause, anomaly.suspect_kind, anomaly.suspect))
    return named


def test_skewed_host_clocks_neither_page_nor_hide_a_hang() -> None:
    """Issue 34, item 6: liveness on the receiver's clock (per-host offsets learned from the
    stream), never on a sender's wall clock alone. Before: a healthy job with one host 60 s
    behind was paged as lost every few seconds; a hung rank whose host ran 1 h ahead was
    never named; 60 s behind, the hang was reported as that host lost."""
    healthy = HangScenario("collective_hang", at_s=10_000.0, rank=5)
    assert _pages(healthy, -60.0, skewed_host=1) == []
    assert _pages(healthy, 3600.0, skewed_host=1) == []
    hung = HangScenario("collective_hang", at_s=20.0, rank=5)  # rank 5 lives on host 1
    for skew in (0.0, 3600.0, -60.0):
        named = _pages(hung, skew, skewed_host=1)
        assert [(c, s) for c, _, s in named] == [("hang", "rank:5")], (skew, named)
    lost = HangScenario("host_silent", at_s=20.0, host=1)
    for skew in (0.0, 3600.0, -60.0):
        named = _pages(lost, skew, skewed_host=1)
        assert [(c, k) for c, k, _ in named] == [("lost_rank", "host")], (skew, named)


def _fake_job(job: str, ranks: int, now_ns: int, frame: str) -> HeartbeatBatch:
    """One node batch claiming ``ranks`` ranks, each with a 2 KB stack ending in ``frame``."""
    stack = ";".join(f"lib/module_{i}.py:function_{i}" for i in range(64))[:2000] + ";" + frame
    return HeartbeatBatch.from_beats(
        [Heartbeat(job, 0, r, f"host-{r // 8}", now_ns, 10, stack=stack) for r in range(ranks)]
    )


def test_heartbeat_stacks_are_bounded_per_job_and_in_all_and_keep_their_innermost_frames() -> None:
    """Issue 34, item 12: 102,400 fake ranks with 2 KB stacks took a worker from 114 to 549
    MB, a second fake job to 865 MB. Here (smaller, budgets to match) the stacks a tracker
    keeps stay within the per-job and total budgets, and each still ends in its rank's
    innermost frame (what the hang's summary names); the ``hang:`` log line is bounded."""
    tracker = HangTracker(max_job_stack_bytes=1 << 20, max_stack_bytes=3 << 19)
    frame = "torch/utils/data/dataloader.py:__next__"
    now = 1_767_225_600 * S
    for job in ("fake-a", "fake-b"):
        tracker.observe([(_fake_job(job, 10_240, now, frame), 0)], arrival_ns=now)
    kept = {key: sum(map(len, st.stack.tolist())) for key, st in tracker.states.items()}
    assert all(n <= (1 << 20) + 10_240 * 2 for n in kept.values()), kept  # 20 MB claimed per job
    assert sum(kept.values()) <= (3 << 19) + 2 * 10_240 * 2, kept
    assert all(st.stack[st.seen].tolist()[0].endswith(frame) for st in tracker.states.values())
    summary = "rank 5 never entered all_reduce; it is in " + "x" * 12_000 + "\nforged line"
    line = _cut_line(summary)
    assert len(line) <= 420 and "\n" not in line
