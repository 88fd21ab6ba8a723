"""Speed groups in a small job's log, sampled irregularly: the baseline, never a page; a
job-wide slow stretch moves their excess in milliseconds, not their share of the step."""

from __future__ import annotations

import numpy as np
import pytest

from argus.csvlogs import diagnose_log
from argus.producers.simulator import draw_job


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


def _offset_log(seed: int, late: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8 workers, 600 steps of ~3 s with 4 % lognormal noise, a 2x warm-up, 1 % hiccups of
    1.3-1.9x and an evaluation step every 150; workers 3 and 6 25 % and 22 % slower all
    along (a new user's log, session 19); worker 3 ``late`` times slower again from step 400."""
    rng = np.random.default_rng(seed)
    ranks, steps, values = [], [], []
    for r in range(8):
        for s in range(600):
            v = 3000 * np.exp(rng.normal(0, 0.04)) * {3: 1.25, 6: 1.22}.get(r, 1.0)
            v *= 2.0 if s < 5 else 1.0
            v *= rng.uniform(1.3, 1.9) if rng.random() < 0.01 else 1.0
            v *= 2.5 if s % 150 == 149 else 1.0
            v *= late if r == 3 and s >= 400 else 1.0
            ranks.append(r)
            steps.append(s)
            values.append(v)
    return np.array(ranks), np.array(steps), np.array(values)


def test_workers_a_quarter_slower_all_along_are_never_paged() -> None:
    """A worker flagged in only half the steps is still slow since the start (the steps it
    did not stand out in count, not its first sighting), and its own spread past the
    threshold now and then is no change from it."""
    pages = [
        (seed, a.suspect, a.start_step)
        for seed in range(1, 11)
        for a in diagnose_log(*_offset_log(seed), by_time=False, job=f"offsets-{seed}").anomalies
        if a.severity == "page"
    ]
    assert pages == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_quarter_slower_worker_slowing_more_late_pages_from_then(seed: int) -> None:
    """The same worker 15 % slower again from step 400: one page, from then to the end."""
    found = diagnose_log(*_offset_log(seed, late=1.15), by_time=False, job=f"late-{seed}").anomalies
    pages = [(a.suspect, a.start_step, a.end_step) for a in found if a.severity == "page"]
    assert len(pages) == 1 and pages[0][0] == "rank:3", found
    assert abs(pages[0][1] - 400) <= 5 and pages[0][2] >= 570, found


def test_a_speed_group_hidden_while_others_slow_is_still_the_baseline_after() -> None:
    """A drawn job of the noise space (seed 8,000,071): 14 workers, about half of them
    2.5x slower all along, a shared step factor; 5 of the others 1.39x slower for steps
    573-722 of 1,323. While they are slow the slower kind is not flagged and its silent
    baselines closed; after, they paged as six new faults to the end of the log. Now the
    baseline back is the baseline, and the five are one anomaly over their window (two
    speeds among up to 16 ranks: the fast side is the faster kind's; their changes began
    together)."""
    from argus.producers.simulator import draw_job

    job = draw_job(8_000_071, faulty=True)
    log = job.log()
    res = diagnose_log(log.rank, log.t, log.value, by_time=log.by_time, job=job.name)
    (fault,) = job.faults
    assert sorted(fault.ranks) == [0, 1, 4, 9, 13]
    found = [(a.suspect, a.start_step, a.end_step) for a in res.anomalies]
    assert [f[0] for f in found] == ["ranks:0-1,4,9,13"], found
    assert all(abs(f[1] - 573) <= 5 and abs(f[2] - 722) <= 30 for f in found), found


def _space_log(seed: int) -> tuple[list[tuple[str, int, int]], object]:
    from argus.producers.simulator import draw_job

    job = draw_job(seed, faulty=True)
    log = job.log()
    res = diagnose_log(log.rank, log.t, log.value, by_time=log.by_time, job=job.name)
    return [(a.suspect, a.start_step, a.end_step) for a in res.anomalies], job


def test_a_short_sawtooth_in_a_log_sampled_by_time_is_found() -> None:
    """Rank 5 of 8 in a sawtooth up to 1.86x for 38 steps, a sample every ~9 steps: four
    samples at +40 % each added a clipped step to its test less the reference and never
    reached the threshold; a shift that large now opens in about three."""
    found, job = _space_log(8_000_266)
    (fault,) = job.faults
    assert list(fault.ranks) == [5] and fault.shape == "sawtooth"
    assert [f[0] for f in found] == ["rank:5"], found


def test_hosts_slow_every_fourth_step_in_a_log_without_hosts_are_not_32_anomalies() -> None:
    """32 ranks of four hosts 2.85x slower on every fourth step (a log of 1,024 ranks
    without a host column): each rank's sightings confirmed in the same step, 31 anomalies
    of one rank beside one of the ranks. Ranks confirmed together that began together and
    stood out in the same steps are one cause."""
    found, job = _space_log(8_000_096)
    every_k = next(f for f in job.faults if f.shape == "every_k")
    mine = [f for f in found if f[0] != "rank:138"]
    assert 1 <= len(mine) <= 2, found
    assert all(abs(f[1] - every_k.first_step) <= 8 for f in mine), found


def _warmup_log(seed: int, late: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """128 ranks, 400 steps of ~500 ms with 3 % noise, every rank 2.2x slower over a 30-step
    warm-up but ranks 17 and 90, done warming up from step 5 (their first samples as fast
    as the others' last); rank 17 ``late`` times slower from step 250."""
    rng = np.random.default_rng(seed)
    steps = np.arange(400)
    warm = 1.0 + 1.2 * np.exp(-steps / 10.0) * (steps < 30)
    ranks, times, values = [], [], []
    for r in range(128):
        w = np.where(steps < 5, warm, 1.0) if r in (17, 90) else warm
        v = 500.0 * w * np.exp(rng.normal(0, 0.03, len(steps)))
        if r == 17:
            v = v * np.where(steps >= 250, late, 1.0)
        ranks.append(np.full(len(steps), r))
        times.append(steps)
        values.append(v)
    return np.concatenate(ranks), np.concatenate(times), np.concatenate(values)


@pytest.mark.parametrize("seed", [1, 2])
def test_ranks_done_warming_up_first_are_not_slow_when_the_others_catch_up(seed: int) -> None:
    res = diagnose_log(*_warmup_log(seed), by_time=False, job="early-warm")
    assert [(a.suspect, a.severity) for a in res.anomalies] == [], res.anomalies


def test_a_rank_done_warming_up_first_still_pages_when_it_slows_later() -> None:
    res = diagnose_log(*_warmup_log(1, late=1.3), by_time=False, job="early-warm-fault")
    assert [(a.suspect, a.severity, a.start_step) for a in res.anomalies] == [("rank:17", "page", 250)], (
        res.anomalies
    )


def _kinds_log(
    n_ranks: int, slow: set[int], factor: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n_ranks`` ranks, 300 steps of ~400 ms with 3 % AR(0.5) noise; the ``slow`` ranks
    ``factor`` times slower all along (another GPU kind)."""
    rng = np.random.default_rng(seed)
    ranks, steps, values = [], [], []
    for r in range(n_ranks):
        level, v = 0.0, np.empty(300)
        for s in range(300):
            level = 0.5 * level + rng.normal(0, 0.026)
            v[s] = 400.0 * (factor if r in slow else 1.0) * np.exp(level)
        ranks.append(np.full(300, r))
        steps.append(np.arange(300))
        values.append(v)
    return np.concatenate(ranks), np.concatenate(steps), np.concatenate(values)


@pytest.mark.parametrize("seed", [3, 4])
def test_a_speed_group_of_scattered_ranks_in_a_log_without_hosts_is_the_baseline(seed: int) -> None:
    """40 of 256 ranks, scattered, 1.3x slower from the first step: named together as one
    group, they were one suspect and a warning "since the start"; a group is a speed group."""
    slow = set(np.random.default_rng(seed).choice(256, 40, replace=False).tolist())
    res = diagnose_log(*_kinds_log(256, slow, 1.3, seed), by_time=False, job="kinds")
    assert [(a.suspect, a.severity) for a in res.anomalies] == [], res.anomalies


@pytest.mark.parametrize("seed", [3, 4])
def test_a_small_jobs_workers_far_slower_from_the_start_are_its_baseline(seed: int) -> None:
    """Two of six workers 3x slower from the first step (another GPU kind): they were a
    warning "since the start" until their own past had learned them (24 samples), then
    silent; now they wait for that. One worker alone so slow is still a warning."""
    res = diagnose_log(*_kinds_log(6, {1, 4}, 3.0, seed), by_time=False, job="small-kinds")
    assert [(a.suspect, a.severity) for a in res.anomalies] == [], res.anomalies
    res = diagnose_log(*_kinds_log(6, {4}, 3.0, seed), by_time=False, job="small-kind")
    assert [(a.suspect, a.severity) for a in res.anomalies] == [("rank:4", "warn")], res.anomalies


@pytest.mark.parametrize("seed", [7_000_115, 7_000_133])
def test_a_jobs_evaluation_every_k_steps_is_its_schedule_not_an_anomaly(seed: int) -> None:
    """Quiet jobs of the noise space, 5-7 workers each writing its step time every ~9 steps
    (the mean since its last sample), the whole job 2-5x slower on one step every so many
    (an unannotated evaluation): the job slow on every k-th window was a warning "slow every
    21 (33) steps"; it is the job's schedule, counted as transients, no anomaly."""
    job = draw_job(seed, faulty=False)
    assert job.path == "csv_time" and job.background.eval_every > 0
    log = job.log()
    res = diagnose_log(log.rank, log.t, log.value, by_time=True)
    assert res.anomalies == [], [(a.suspect, a.start_step, a.summary) for a in res.anomalies]
    assert res.transients.get("job", 0) > 0, res.transients


@pytest.mark.parametrize(
    ("seed", "rank", "shape"), [(8_000_264, 1, "step"), (8_000_215, 10, "sawtooth"), (8_000_181, 9, "ramp")]
)
def test_a_short_large_fault_in_a_small_jobs_log_opens_in_three_samples(
    seed: int, rank: int, shape: str
) -> None:
    """Small jobs' logs sampled by time, one rank slowed 1.3-1.9x for 4-6 samples (the last
    four of one log at 1.6-1.9x): a sample added at most 0.15 to its test, four of them
    under its threshold of 0.5; in a small job, where the own past leads, a shift of 0.2 or
    more now adds that much a sample and opens in three."""
    found, job = _space_log(seed)
    fault = next(f for f in job.faults if f.shape == shape)
    assert list(fault.ranks) == [rank]
    assert f"rank:{rank}" in [f[0] for f in found], found


def test_a_heavy_tailed_shock_falling_back_does_not_open_a_change() -> None:
    """A small job's noise of t(1.5) near AR 0.66: rank 0 1.5x and 1.8x for two samples,
    then 1.2x and 1.07x (no fault there). The noise model's autocorrelation lay under the
    fading test's gate, and the two samples opened a change: a page of four steps. A
    building change whose last deviation fell under half its peak waits; the job's fault
    (rank 5 flapping 1.41x) is still found."""
    found, _ = _space_log(8_000_086)
    assert [f[0] for f in found] == ["rank:5"], found


def test_a_small_jobs_worker_slower_all_along_does_not_page_while_its_own_past_learns() -> None:
    """A job of the noise space: 11 workers, one of two in a speed group 1.19x slower than
    its peers all along (jitter 4.7 %), crossing their line in about half the steps: first
    seen seven steps past the warm-up, it was not "since the start" and paged over steps
    12-27, before its own change points had learned it. In a small job its own past leads:
    a warning at most; the job's fault (three workers 1.18x from step 187) still pages."""
    job = draw_job(8_000_105, faulty=True)
    log = job.log()
    res = diagnose_log(log.rank, log.t, log.value, by_time=log.by_time)
    found = [(a.suspect, a.severity) for a in res.anomalies]
    assert ("ranks:0,6,9", "page") in found and ("rank:10", "page") not in found, found


def test_half_a_small_job_slow_every_other_step_is_no_global_step() -> None:
    """A job of the noise space: two of four workers 3.5x slower on every other step over
    steps 200-270. The typical rank's work (the median of four) rose past the global
    ratio on each slow step, which was then taken for a step where every rank is slow (an
    evaluation), where no rank stands out: the fault went unseen. The fast quarter's work
    is not slow there: one anomaly, the two workers, its window."""
    job = draw_job(8_000_037, faulty=True)
    log = job.log()
    res = diagnose_log(log.rank, log.t, log.value, by_time=log.by_time)
    (a,) = res.anomalies
    assert list(a.ranks) == [1, 3] and abs(a.start_step - 200) <= 3 and abs(a.end_step - 270) <= 3, a


@pytest.mark.parametrize(
    ("seed", "rank", "start", "end"), [(8_000_094, 1, 86, 195), (8_000_131, 4, 336, 700)]
)
def test_a_flapping_rank_of_a_slow_host_is_one_anomaly_over_its_flapping(
    seed: int, rank: int, start: int, end: int
) -> None:
    """Jobs of the noise space: a worker of a host slower since the start flaps, 1.2-1.4x
    slower on and off at random for hundreds of steps (stretches of one to forty steps).
    Its change's closing sum gathered in a long stretch off what its next stretch on did
    not undo: no sighting while it stood, and the next stretch off closed it. The anomaly
    was its first stretches only (86-130 of 86-247; 336-569 of 336-950). A step at the
    change's size again halves that sum: one anomaly over its flapping."""
    job = draw_job(seed, faulty=True)
    log = job.log()
    res = diagnose_log(log.rank, log.t, log.value, by_time=log.by_time)
    (a,) = [a for a in res.anomalies if rank in a.ranks]
    assert a.suspect == f"rank:{rank}" and abs(a.start_step - start) <= 3 and a.end_step >= end, a


def test_a_shock_of_autocorrelated_noise_dying_away_does_not_page() -> None:
    """A quiet job of the noise space: six workers, noise of autocorrelation 0.8 with
    t(1.5) innovations. One shock put a worker at 1.21x, then 1.17x, 1.14x, ... (back in ten
    steps): its change opened and paged at once. A fault that fades pages no one; what is
    left is at most a warning."""
    job = draw_job(7_000_187, faulty=False)
    log = job.log()
    res = diagnose_log(log.rank, log.t, log.value, by_time=log.by_time)
    assert all(a.severity != "page" for a in res.anomalies), res.anomalies


def test_two_evaluation_spikes_of_a_sampled_log_four_samples_apart_open_nothing() -> None:
    """A job of the noise space, its log sampled every few steps: four workers' evaluation
    spikes four samples apart, each clipped, gather 0.3 between them: no change opens from
    fewer than three samples adding evidence (it was a one-step anomaly). (Job 8,000,238's
    two workers 1.13x for five samples, found at 0.5 % jitter while every rank's residual
    moved with which peers reported, gather 0.30 and 0.27 now that it holds their own
    noise: just under the evidence one rank needs.)"""
    job = draw_job(8_000_142, faulty=True)
    log = job.log()
    res = diagnose_log(log.rank, log.t, log.value, by_time=log.by_time)
    assert [a for a in res.anomalies if a.start_step == a.end_step] == []
    assert [(a.ranks, a.start_step, a.end_step) for a in res.anomalies] == [(tuple(range(8, 16)), 170, 248)]
