"""The hang stage's bookkeeping: heartbeats kept per job, each hang anomaly sent when first
named and then every ``update_s``, a silent job forgotten after ``job_ttl_s``."""

from __future__ import annotations

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
