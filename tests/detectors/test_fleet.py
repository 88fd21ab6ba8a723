"""detectors/fleet.py: the fleet test. A healthy fleet names nobody, a node well above the
fleet's rate with exposure is named, a node that hosted little cannot top the list by one
anomaly, and bad nodes do not raise the rate the others are judged by."""

from __future__ import annotations

import numpy as np
import pytest

from argus.detectors.fleet import FleetConfig, fleet_rate, holm, node_health

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
