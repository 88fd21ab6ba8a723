"""The noise space: reproducible draws over wide ranges, faults with their ground truth,
the signal-to-noise ratio, and the two ways a job is seen (live batches, a step log)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from argus.producers.simulator import PATHS, SHAPES, Background, Layout, draw_job
from argus.producers.simulator._space import COMPUTE_MS, STEP_MS

QUIET_BG = Background(
    jitter=0.02,
    ar=0.0,
    df=np.inf,
    shared_sd=0.0,
    shared_ar=0.0,
    group_by="dp",
    group_sd=0.0,
    offset=0.0,
    slow_group=1.0,
    slow_share=0.0,
    blip_rate=0.0,
    blip=(0.0, 0.0),
    spike_rate=0.0,
    spike=(0.0, 0.0),
    warmup=0,
    warmup_factor=1.0,
    eval_every=0,
    eval_factor=1.0,
    ckpt_every=0,
    ckpt=0.0,
    gc_rate=0.0,
    gc=0.0,
    missing=0.0,
    annotated_ckpt_every=0,
)
"""Gaussian jitter of 2 % and nothing else."""


def _same_job(a: object, b: object) -> bool:
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif f.name == "faults":
            if [(g.label(), g.shape, g.magnitude) for g in x] != [
                (g.label(), g.shape, g.magnitude) for g in y
            ]:
                return False
        elif x != y:
            return False
    return True


def test_a_seed_is_one_job() -> None:
    assert _same_job(draw_job(11, faulty=True), draw_job(11, faulty=True))
    assert not _same_job(draw_job(11, faulty=True), draw_job(12, faulty=True))


def test_the_space_spans_its_ranges() -> None:
    jobs = [draw_job(s, faulty=True) for s in range(120)]
    sizes = {j.layout.n_ranks for j in jobs}
    assert 1024 in sizes and {n for n in sizes if n < 32} and all(n == 1024 or 4 <= n <= 16 for n in sizes)
    assert {j.path for j in jobs} == set(PATHS)
    assert all(j.path != "csv_time" or j.small for j in jobs)  # a big job's log is by step
    bgs = [j.background for j in jobs]
    jit = [b.jitter for b in bgs]
    assert 0.005 <= min(jit) < 0.01 and 0.03 < max(jit) <= 0.05
    assert any(b.ar == 0 for b in bgs) and max(b.ar for b in bgs) > 0.8
    assert any(np.isinf(b.df) for b in bgs) and min(b.df for b in bgs) < 2.5
    assert max(b.offset for b in bgs) > 0.1 and all(b.offset <= 0.12 for b in bgs)
    assert any(b.slow_group > 2 for b in bgs) and any(b.slow_group == 1 for b in bgs)
    for attr in (
        "shared_sd",
        "group_sd",
        "blip_rate",
        "spike_rate",
        "eval_every",
        "ckpt_every",
        "gc_rate",
        "missing",
    ):
        values = [getattr(b, attr) for b in bgs]
        assert any(v == 0 for v in values) and any(v > 0 for v in values), attr
    faults = [f for j in jobs for f in j.faults]
    assert {f.shape for f in faults} == set(SHAPES)
    assert {f.who for f in faults} == {"rank", "host", "hosts", "replica", "stage", "ranks"}
    assert any(len(j.faults) == 2 for j in jobs)


def test_faults_and_their_ground_truth() -> None:
    for seed in range(60):
        job = draw_job(seed, faulty=True)
        lay = job.layout
        seen: set[int] = set()
        for f in job.faults:
            assert not seen & set(f.ranks)  # two faults of a job never share a rank
            seen |= set(f.ranks)
            inside = f.factor[f.first_step : f.last_step + 1]
            assert f.factor[f.first_step] > 1 and f.factor[f.last_step] > 1
            assert np.all(f.factor[f.last_step + 1 :] == 1)
            if f.shape == "ramp":  # the label's onset: where the drift adds 5 %
                assert f.factor[f.first_step] >= 1.05 > f.factor[f.first_step - 1]
            else:
                assert np.all(f.factor[: f.first_step] == 1)
            assert (
                1 + 0.8 * (f.magnitude - 1) <= inside.max() <= f.magnitude + 1e-9
            )  # a sawtooth's top on a step or not
            assert 0 < f.first_step <= f.last_step < job.steps
            if f.who == "host":
                assert f.ranks == lay.ranks_of_host(lay.host_of(f.ranks[0]))
                assert f.group == Layout.host_name(lay.host_of(f.ranks[0]))
            if f.who == "replica" and lay.pp > 1:
                assert f.group == f"dp:{lay.coords['dp'][f.ranks[0]]}"
            if f.who == "stage":
                assert f.group == f"pp:{lay.coords['pp'][f.ranks[0]]}"
                assert len(f.ranks) == lay.n_ranks // lay.pp
            if f.who == "ranks":
                assert 2 <= len(f.ranks) <= lay.n_ranks // 2
            if f.shape == "every_k":
                slow = np.flatnonzero(inside > 1)
                assert np.all(np.diff(slow) == f.period)
            lab = f.label()
            assert (lab.first_step, lab.last_step, lab.ranks, lab.suspect) == (
                f.first_step,
                f.last_step,
                f.ranks,
                f.group,
            )
    assert draw_job(3, faulty=False).faults == ()


def test_snr_is_the_shift_over_the_noise() -> None:
    # a constant shift delta over n steps on a rank with 2 % Gaussian jitter: delta*sqrt(n)/0.02
    for seed in range(6):
        job = draw_job(
            seed, faulty=True, size="small", path="live", shape="step", background=QUIET_BG, n_faults=1
        )
        f = job.faults[0]
        n = f.last_step - f.first_step + 1
        expected = (f.magnitude - 1) * np.sqrt(n) / 0.02
        assert job.snr(f) == pytest.approx(expected, rel=0.15)


def test_snr_counts_autocorrelated_noise_as_less_evidence() -> None:
    white = draw_job(5, faulty=True, size="small", path="live", shape="step", background=QUIET_BG, n_faults=1)
    red = draw_job(
        5,
        faulty=True,
        size="small",
        path="live",
        shape="step",
        background=dataclasses.replace(QUIET_BG, ar=0.8),
    )
    # same fault (same draws), noise with lag-1 autocorrelation 0.8: sqrt(1.8/0.2) = 3 times less
    assert red.faults[0].magnitude == white.faults[0].magnitude
    assert red.snr(red.faults[0]) == pytest.approx(white.snr(white.faults[0]) / 3, rel=0.3)


def test_the_live_job_carries_noise_and_fault() -> None:
    job = draw_job(4, faulty=True, size="small", path="live", shape="step", background=QUIET_BG, n_faults=1)
    f = job.faults[0]
    sim = job.simulator()
    steps = list(sim.run(job.steps))
    compute = np.array(
        [s.batch["forward_ms"] + s.batch["backward_ms"] + s.batch["optimizer_ms"] for s in steps]
    )
    r = f.ranks[0]
    others = [x for x in range(job.layout.n_ranks) if x not in f.ranks]
    during = compute[f.first_step : f.last_step + 1]
    ratio = np.median(during[:, r] / np.median(during[:, others], axis=1))
    assert ratio == pytest.approx(f.magnitude, rel=0.03)
    before = compute[20 : f.first_step, r] / np.median(compute[20 : f.first_step][:, others], axis=1)
    assert np.std(before) == pytest.approx(0.02 * np.sqrt(2), rel=0.3)  # two ranks' 2 % jitter


def test_missing_samples_are_dropped_rows() -> None:
    bg = dataclasses.replace(QUIET_BG, missing=0.2)
    job = draw_job(8, faulty=False, size="small", path="live", background=bg)
    sim = job.simulator()
    rows = [len(s.batch) for s in sim.run(200)]
    assert sum(rows) == int(job.present[:200].sum())
    assert 0.7 < sum(rows) / (200 * job.layout.n_ranks) < 0.9


def test_a_step_log_has_rank_step_value_and_no_host() -> None:
    job = draw_job(9, faulty=True, size="big", path="csv_steps", background=QUIET_BG)
    log = job.log()
    assert not log.by_time and len(log.value) == job.steps * 1024
    busy = job.busy_ms()
    assert np.allclose(log.value, busy[log.t.astype(int), log.rank])
    assert np.median(busy) == pytest.approx(STEP_MS, rel=0.01)
    assert COMPUTE_MS < STEP_MS


def test_a_time_sampled_log_averages_each_ranks_irregular_samples() -> None:
    job = draw_job(10, faulty=False, size="small", path="csv_time")
    log = job.log()
    assert log.by_time and 2 <= job.sample_every <= 10
    busy = job.busy_ms()
    per_rank = np.bincount(log.rank)
    expected = job.steps / job.sample_every
    assert np.all(per_rank > 0.7 * expected * (1 - job.background.missing) - 2)
    assert np.all(per_rank < 1.3 * expected + 2)
    for r in range(job.layout.n_ranks):
        t = log.t[log.rank == r]
        gaps = np.diff(t)
        assert np.std(gaps) > 0  # irregular
    # every value is a mean of the rank's steps: within the rank's range
    for r in range(job.layout.n_ranks):
        v = log.value[log.rank == r]
        assert busy[:, r].min() - 1e-9 <= v.min() and v.max() <= busy[:, r].max() + 1e-9
    assert np.all(np.diff(log.step_t) > 0)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="size"):
        draw_job(1, faulty=True, size="huge")
    with pytest.raises(ValueError, match="path"):
        draw_job(1, faulty=True, path="kafka")
    with pytest.raises(ValueError, match="shape"):
        draw_job(1, faulty=True, shape="zigzag")
