"""detectors/fleet.py: the fleet test. A healthy fleet names nobody, a node well above the
fleet's rate with exposure is named, a node that hosted little cannot top the list by one
anomaly, and bad nodes do not raise the rate the others are judged by."""

from __future__ import annotations

import numpy as np
import pytest

from argus.detectors.fleet import (
    FleetConfig,
    corroborate,
    fleet_rate,
    health_test,
    holm,
    node_health,
    slow_test,
)

RATE = 0.02  # implicating jobs per GPU-hour hosted


def _fleet(rng: np.random.Generator, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Exposures spread like a real fleet's (some nodes busy, some nearly idle), healthy counts."""
    exposure = rng.gamma(2.0, 100.0, n)
    return rng.poisson(RATE * exposure), exposure


def test_a_healthy_fleet_names_nobody_week_after_week() -> None:
    rng = np.random.default_rng(11)
    named = 0
    for _ in range(300):
        counts, exposure = _fleet(rng)
        named += int(node_health(counts, exposure).suspect.sum())
    # alpha bounds the chance of any false name per window at 1e-3: 300 windows expect 0.3
    assert named <= 1


def test_a_node_four_times_the_fleet_rate_with_exposure_is_named_and_ranked_first() -> None:
    rng = np.random.default_rng(3)
    counts, exposure = _fleet(rng)
    exposure[17] = 400.0
    counts[17] = rng.poisson(4 * RATE * 400.0)  # 32 expected, 8 for a healthy node
    h = node_health(counts, exposure)
    assert h.suspect[17] and h.suspect.sum() == 1
    assert h.order()[0] == 17
    assert h.confidence[17] > 0.999
    assert h.ratio_low[17] > 2.0
    assert h.expected[17] == pytest.approx(h.rate * 400.0)


def test_one_anomaly_on_a_node_that_hosted_little_does_not_top_the_list() -> None:
    rng = np.random.default_rng(4)
    counts, exposure = _fleet(rng)
    exposure[5], counts[5] = 0.2, 1  # raw rate 5 per GPU-hour: 250x the fleet's
    exposure[9], counts[9] = 300.0, 25  # a truly bad node: 4x the fleet, with exposure
    h = node_health(counts, exposure)
    assert not h.suspect[5] and h.suspect[9]
    assert h.ratio_low[5] < 1.0 < h.ratio_low[9]
    assert list(h.order()).index(9) < list(h.order()).index(5)
    # even three jobs on no exposure at all are not enough without min_jobs and the bound
    exposure[5], counts[5] = 0.2, 2
    assert not node_health(counts, exposure).suspect[5]


def test_bad_nodes_do_not_raise_the_fleet_rate() -> None:
    rng = np.random.default_rng(8)
    counts, exposure = _fleet(rng)
    pooled_healthy = counts.sum() / exposure.sum()
    counts[:5] += 200  # five very bad nodes
    assert counts.sum() / exposure.sum() > 1.5 * pooled_healthy
    assert fleet_rate(counts, exposure) == pytest.approx(pooled_healthy, rel=0.15)
    assert node_health(counts, exposure).suspect[:5].all()


def test_min_jobs_holds_back_a_node_implicated_by_fewer_jobs() -> None:
    counts = np.zeros(100, int)
    exposure = np.full(100, 100.0)
    counts[:20] = 1
    counts[50] = 6  # 0.2 expected: improbable, and 3x the fleet at the 5 % bound
    assert node_health(counts, exposure).suspect[50]
    assert not node_health(counts, exposure, FleetConfig(min_jobs=7)).suspect[50]


def test_holm_adjusts_step_down_and_keeps_order() -> None:
    p = np.array([0.01, 0.04, 0.03, 0.005])
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm(np.array([0.5, 0.9])) == pytest.approx([1.0, 1.0])
    assert len(holm(np.array([]))) == 0


def test_nothing_hosted_or_nothing_seen_names_nobody() -> None:
    h = node_health(np.zeros(4), np.zeros(4))
    assert h.rate == 0.0 and not h.suspect.any()
    h = node_health(np.zeros(4), np.full(4, 10.0))
    assert h.rate == 0.0 and not h.suspect.any()
    assert len(node_health([], []).suspect) == 0


@pytest.mark.parametrize(
    ("counts", "exposure", "match"),
    [([1, 2], [1.0], "one value per node"), ([-1], [1.0], ">= 0"), ([1], [float("nan")], "finite")],
)
def test_bad_input_is_refused_with_a_reason(counts: list[int], exposure: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        node_health(counts, exposure)


def test_a_config_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError):
        FleetConfig(alpha=0.0)
    with pytest.raises(ValueError):
        FleetConfig(min_ratio=0.5)


def test_a_node_failing_one_way_stands_out_in_its_cause_before_the_pooled_count_does() -> None:
    """Healthy nodes' bad luck spreads over causes; a bad node keeps failing one way. With a
    stratum per cause the bad node is named on fewer jobs than with all causes pooled, and a
    healthy fleet split into strata still names nobody."""
    rng = np.random.default_rng(21)
    named = 0
    for _ in range(100):
        exposure = rng.gamma(2.0, 100.0, 250)
        per_cause = rng.poisson(RATE / 4 * exposure[:, None], (250, 4))
        pooled = per_cause.sum(axis=1)
        named += int(node_health(np.column_stack([pooled, per_cause]), exposure).suspect.sum())
    assert named <= 1
    exposure = np.full(250, 50.0)
    per_cause = rng.poisson(RATE / 4 * exposure[:, None], (250, 4))
    per_cause[3] = [0, 7, 0, 0]  # 7 jobs of one cause: a healthy node expects 0.25 of each, 1 in all
    pooled = per_cause.sum(axis=1)
    split = node_health(np.column_stack([pooled, per_cause]), exposure)
    assert split.suspect[3] and split.stratum[3] == 2 and split.count[3] == 7
    assert not node_health(pooled, exposure).suspect[3]


def _health(rng: np.random.Generator, n: int = 250) -> tuple[np.ndarray, np.ndarray]:
    """A week of health samples per host (8 GPUs, every 6 h) with stray events: thermal
    slowdowns at 0.2 % of samples, XIDs at 0.05 %, no ECC or link errors anywhere."""
    samples = np.full(n, 8 * 28.0)
    events = np.column_stack(
        [rng.poisson(0.002 * samples), rng.poisson(0.0005 * samples), np.zeros(n), np.zeros(n)]
    )
    return events, samples


def test_stray_health_events_flag_no_host_week_after_week() -> None:
    rng = np.random.default_rng(31)
    flagged = 0
    for _ in range(300):
        events, samples = _health(rng)
        flagged += int(health_test(events, samples).flagged.sum())
    assert flagged <= 1


def test_a_throttling_gpu_and_a_rising_error_counter_are_flagged_by_their_signal() -> None:
    rng = np.random.default_rng(32)
    events, samples = _health(rng)
    events[7, 0] += 12  # one GPU throttled in 12 of its 28 samples
    events[9, 3] = 40  # a link-error counter rising where no healthy host's does
    t = health_test(events, samples)
    assert set(np.flatnonzero(t.flagged)) == {7, 9}
    assert (t.signal[7], t.signal[9]) == (0, 3)
    assert t.rate[3] > 0.0  # a signal nobody else showed still has a finite rate


def test_one_or_two_events_of_a_signal_nobody_shows_flag_nothing() -> None:
    """Half an event over the fleet keeps a first stray error counter from being infinitely
    improbable; three are improbable, and min_events decides whether that is enough."""
    rng = np.random.default_rng(33)
    events, samples = _health(rng)
    events[4, 2] = 1
    events[5, 3] = 2
    t = health_test(events, samples)
    assert not t.flagged.any()
    assert t.p_adjusted[4] > 1e-3
    events[6, 3] = 3
    assert set(np.flatnonzero(health_test(events, samples).flagged)) == {6}
    assert not health_test(events, samples, FleetConfig(min_events=4)).flagged.any()


def test_a_flagged_gpu_is_corroborated_by_two_jobs_only_when_a_healthy_gpu_would_have_fewer() -> None:
    c = corroborate(np.array([2, 1, 2]), np.array([0.5, 0.5, 20.0]), 0.05)
    # 0.025 jobs expected: two are improbable; one is not enough; 1 expected: two are likely
    assert list(c.suspect) == [True, False, False]
    assert c.expected == pytest.approx([0.025, 0.025, 1.0])
    assert c.p_adjusted[0] < 0.01 < c.p_adjusted[2]
    assert not corroborate(np.array([2]), np.array([0.5]), 0.0).suspect.any()  # no fleet rate: no test
    assert not corroborate(np.array([2]), np.array([0.0]), 0.05).suspect.any()  # hosted nothing
    assert not corroborate(np.array([2]), np.array([0.5]), 0.05, FleetConfig(corroborating_jobs=3)).suspect[0]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: health_test([[1, 2]], [1.0, 2.0]), "one row per host"),
        (lambda: health_test([[-1]], [1.0]), ">= 0"),
        (lambda: corroborate([1, 2], [1.0], 0.1), "one value per GPU"),
        (lambda: corroborate([1], [1.0], float("nan")), "finite"),
        (lambda: FleetConfig(corroborate_alpha=1.0), "corroborate_alpha"),
        (lambda: FleetConfig(min_events=0), "min_events"),
    ],
)
def test_bad_health_input_is_refused_with_a_reason(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def test_the_prior_is_worth_the_same_exposure_in_a_rare_cause_as_in_all_causes_pooled() -> None:
    """A node four jobs found slow the same way, where a healthy node expects 0.025 such jobs:
    judged in its cause beside all causes pooled, the prior weighs the exposure of one pooled
    job (an eighth of a job of that cause), so it is named; a prior worth one job of the rare
    cause itself (the cause alone) holds its 95 % bound under 2x the fleet (about 5 jobs needed)."""
    rng = np.random.default_rng(41)
    exposure = np.full(250, 10.0)
    per_cause = rng.poisson(RATE / 8 * exposure[:, None], (250, 8))
    per_cause[12] = [0, 0, 4, 0, 0, 0, 0, 0]
    pooled = per_cause.sum(axis=1)
    h = node_health(np.column_stack([pooled, per_cause]), exposure)
    assert h.suspect[12] and h.stratum[12] == 3 and h.ratio_low[12] > 2.0
    assert h.suspect.sum() == 1
    alone = node_health(per_cause[:, 2], exposure)
    assert alone.p_adjusted[12] < 1e-3 and alone.ratio_low[12] < 2.0 and not alone.suspect[12]


def test_a_cause_only_a_bad_node_shows_is_rare_among_healthy_nodes_not_untestable() -> None:
    """Four jobs found a node slow in a cause no other node showed: the rate without the
    improbable node is 0, and half a job over the fleet keeps the stratum testable: it is the
    one that decides (without the half job its p-value would be 1)."""
    rng = np.random.default_rng(43)
    exposure = np.full(250, 10.0)
    per_cause = np.column_stack([rng.poisson(RATE / 3 * exposure[:, None], (250, 3)), np.zeros(250, int)])
    per_cause[5, 3] = 4
    pooled = per_cause.sum(axis=1)
    h = node_health(np.column_stack([pooled, per_cause]), exposure)
    assert h.suspect[5] and h.stratum[5] == 4 and h.suspect.sum() == 1
    assert h.rate[4] == pytest.approx(0.5 / exposure.sum())
    assert h.p_value[5] < 1e-6


SLOW = 0.004  # a healthy GPU's chance of being the slow one in a job it hosts


def _gpus(rng: np.random.Generator, n: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Jobs per GPU in a week spread like a fleet's (some GPUs busy, some idle), healthy slow counts."""
    jobs = rng.poisson(rng.gamma(2.0, 6.0, n))
    return rng.binomial(jobs, SLOW), jobs


def test_healthy_gpus_unlucky_now_and_then_are_never_named_week_after_week() -> None:
    rng = np.random.default_rng(21)
    named = 0
    for _ in range(200):
        slow, jobs = _gpus(rng)
        named += int(slow_test(slow, jobs).suspect.sum())
    assert named <= 1  # alpha 1e-3 per window: 200 windows expect 0.2


def test_a_gpu_slow_in_job_after_job_is_named_and_one_that_hosted_little_needs_three_jobs() -> None:
    rng = np.random.default_rng(5)
    slow, jobs = _gpus(rng)
    slow[7], jobs[7] = 5, 6  # the slow one in 5 of its 6 jobs
    slow[8], jobs[8] = 2, 2  # slow in both its jobs: improbable, but only two
    slow[9], jobs[9] = 6, 40  # six of forty: about 40x the fleet
    slow[10], jobs[10] = 3, 40  # three of forty: among 2,000 GPUs, one is that unlucky now and then
    t = slow_test(slow, jobs)
    assert t.suspect[7] and t.suspect[9] and not t.suspect[8] and not t.suspect[10]
    assert t.suspect.sum() == 2
    assert t.confidence[7] > 0.999 and t.ratio_low[7] > t.ratio_low[9] > 2.0
    assert t.expected[7] == pytest.approx(t.rate * 6)
    assert t.rate == pytest.approx(SLOW, rel=0.3)  # the bad GPUs do not raise it


def test_where_being_the_slow_one_is_common_a_gpu_slow_now_and_then_is_not_named() -> None:
    jobs = np.full(500, 30)
    slow = np.full(500, 6)  # every GPU slow in a fifth of its jobs: the workload, not a GPU
    slow[3] = 12
    t = slow_test(slow, jobs)
    assert not t.suspect.any() and t.ratio_low[3] < 2.0


def test_the_gpus_never_slow_can_be_given_as_totals() -> None:
    """A fleet's GPUs that were never the slow one are most of them: their count and job-days
    together test the others as the whole fleet does."""
    rng = np.random.default_rng(9)
    slow, jobs = _gpus(rng)
    slow[11], jobs[11] = 4, 5
    whole = slow_test(slow, jobs)
    hit = slow > 0
    part = slow_test(
        slow[hit], jobs[hit], others=int((~hit & (jobs > 0)).sum()), others_jobs=float(jobs[~hit].sum())
    )
    assert part.rate == pytest.approx(whole.rate)
    assert part.p_adjusted == pytest.approx(whole.p_adjusted[hit])
    assert part.suspect.tolist() == whole.suspect[hit].tolist()
    assert slow_test([], []).suspect.shape == (0,)
    assert not slow_test([0, 0], [0, 0]).suspect.any()


@pytest.mark.parametrize(
    ("slow", "jobs", "kw", "match"),
    [
        ([3], [2], {}, "slow <= jobs"),
        ([1, 2], [3], {}, "one value per GPU"),
        ([-1], [3], {}, "slow <= jobs"),
        ([1], [3], {"others": 2}, "both or neither"),
    ],
)
def test_bad_slow_input_is_refused_with_a_reason(
    slow: list[int], jobs: list[int], kw: dict[str, int], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        slow_test(slow, jobs, **kw)
    with pytest.raises(ValueError, match="slow_frac"):
        FleetConfig(slow_frac=1.5)
