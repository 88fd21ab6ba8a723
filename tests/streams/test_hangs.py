"""The hang stage's bookkeeping: heartbeats kept per job, each hang anomaly sent when first
named and then every ``update_s``, a silent job forgotten after ``job_ttl_s``."""

from __future__ import annotations

import dataclasses

from argus.producers.simulator import HangScenario, HangSimulator, Layout
from argus.streams import HangTracker

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
