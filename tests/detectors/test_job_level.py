"""The job level on noise the simulator does not make: every rank slower at once on a share
of steps (long sequences), a lasting change of the job's pace, a rank that comes and goes.
Logs of step times per rank go through the one engine (``argus.csvlogs.diagnose_log``)."""

from __future__ import annotations

import numpy as np

from argus.csvlogs import diagnose_log


def job(
    steps: int, ranks: int = 64, *, seed: int, long_share: float = 0.3
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step times (ms) per rank: log-normal jitter (1.5 %), ±1 % static offsets, and on a
    ``long_share`` of steps every rank 15-30 % slower (the batch held long sequences)."""
    rng = np.random.default_rng(seed)
    offset = 1 + rng.uniform(-0.01, 0.01, ranks)
    longer = np.where(rng.random(steps) < long_share, rng.uniform(1.15, 1.30, steps), 1.0)
    ms = 800 * offset[None, :] * longer[:, None] * rng.lognormal(0, 0.015, (steps, ranks))
    step = np.repeat(np.arange(steps), ranks)
    rank = np.tile(np.arange(ranks), steps)
    return rank, step, ms


def found(rank: np.ndarray, step: np.ndarray, ms: np.ndarray) -> list[tuple[str, int, int]]:
    res = diagnose_log(rank, step, ms.ravel(), by_time=False)
    return [(a.suspect, a.start_step, a.end_step) for a in res.anomalies]


def test_long_sequence_steps_on_every_rank_are_the_jobs_normal() -> None:
    for seed in (1, 2, 3):
        assert found(*job(1500, seed=seed)) == []


def test_a_lasting_change_of_pace_is_one_anomaly_then_the_new_normal() -> None:
    """+12 % on every rank from step 500 on (a new data shard, a slower switch): one anomaly
    from 500, closed once the baseline took the new pace in; a real slowdown after it is its
    own anomaly with its own window."""
    rank, step, ms = job(2000, seed=4, long_share=0.0)
    ms[500:] *= 1.12
    ms[1400:1600] *= 1.3
    (change, later) = found(rank, step, ms)
    assert change[0] == "job" and abs(change[1] - 500) <= 3 and change[2] < 1000
    assert later[0] == "job" and abs(later[1] - 1400) <= 3 and abs(later[2] - 1599) <= 10


def test_a_flapping_rank_is_one_anomaly_over_its_whole_stretch() -> None:
    """Rank 9: 20 slow steps (1.4x), 30 normal, six times over (steps 300-599)."""
    rank, step, ms = job(900, seed=5, long_share=0.0)
    for start in range(300, 600, 50):
        ms[start : start + 20, 9] *= 1.4
    ((suspect, first, last),) = found(rank, step, ms)
    assert suspect == "rank:9" and abs(first - 300) <= 3 and abs(last - 569) <= 5
