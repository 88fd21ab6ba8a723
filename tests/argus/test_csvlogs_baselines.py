"""Speed groups in a small job's log, sampled irregularly: the baseline, never a page; a
job-wide slow stretch moves their excess in milliseconds, not their share of the step."""

from __future__ import annotations

import numpy as np

from argus.csvlogs import diagnose_log


def _log(late_fault: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """6 workers of one job for ~2,000 s, each writing its step time every 2-5 s (one sample
    in a hundred lost); workers 0, 3 and 4 run 3.4x slower from the start (another GPU
    kind); every worker 1.8x slower from 900 to 1,100 s (the whole job: data, a shared
    file system); with ``late_fault``, worker 1 1.5x slower from 1,400 s on."""
    rng = np.random.default_rng(11)
    ranks, times, values = [], [], []
    for r in range(6):
        t = rng.uniform(0, 3)
        level = 0.0
        while t < 2000:
            level = 0.6 * level + rng.normal(0, 0.01)
            v = 0.33 * (3.4 if r in (0, 3, 4) else 1.0) * (1 + level)
            if 900 <= t < 1100:
                v *= 1.8
            if late_fault and r == 1 and t >= 1400:
                v *= 1.5
            if rng.random() > 0.01:
                ranks.append(r)
                times.append(t)
                values.append(v)
            t += rng.uniform(2, 5)
    order = np.argsort(times)
    return np.array(ranks)[order], np.array(times)[order], np.array(values)[order]


def test_a_speed_group_through_a_job_wide_slow_stretch_is_quiet() -> None:
    res = diagnose_log(*_log(False), by_time=True, job="speed-groups")
    assert [(a.cause, a.suspect, a.severity) for a in res.anomalies] == []


def test_a_late_slowdown_of_a_fast_worker_still_pages() -> None:
    res = diagnose_log(*_log(True), by_time=True, job="speed-groups-fault")
    assert [(a.suspect, a.severity) for a in res.anomalies] == [("rank:1", "page")], res.anomalies
