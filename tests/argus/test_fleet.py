"""argus/fleet.py on a real chDB store: a host whose GPU throttles and that two jobs found slow
at that GPU is named on its health (the job counts alone need more jobs); the same throttling
found slow by one job, or two jobs without a health event, name nobody."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from argus.detectors.fleet import NODE_CAUSES, NODE_SUSPECT_KINDS, FleetConfig, health_test
from argus.fleet import fleet_view
from argus.sinks.fleet import gpu_detail, host_health
from tests.helpers.fleet import HealthFleet, health_fleet


def _t(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


@pytest.fixture
def fleet(store: Any, unique: str) -> HealthFleet:
    # a day of its own, far from other tests' data: the health test is fleet-wide
    t0 = 1_980_000_000 * 10**9 + (int(unique, 16) % 5000) * 86_400 * 10**9
    return health_fleet(store, f"h{unique}", t0 - t0 % (86_400 * 10**9))


def test_a_throttling_gpu_two_jobs_found_slow_is_named_on_its_health(store: Any, fleet: HealthFleet) -> None:
    view = fleet_view(store, since=_t(fleet.start_ns), until=_t(fleet.end_ns))
    mine = [n for n in view.suspects if n.host in fleet.hosts]
    assert [n.host for n in mine] == [fleet.throttling]
    (node,) = mine
    assert node.decided_by == f"throttled on {fleet.gpu}"
    assert node.jobs == 2 and node.expected < 0.1 and node.confidence > 0.99
    assert node.evidence.throttled_samples == 5 and node.evidence.gpus == {fleet.gpu: 2}


def test_without_the_health_evidence_two_jobs_are_not_enough(store: Any, fleet: HealthFleet) -> None:
    """The job counts alone (at least 3 jobs) name nobody here, and asking for 3 corroborating
    jobs takes the throttling host off the list: it was the health that named it."""
    since, until = _t(fleet.start_ns), _t(fleet.end_ns)
    strict = fleet_view(store, since=since, until=until, config=FleetConfig(corroborating_jobs=3))
    assert not [n for n in strict.suspects if n.host in fleet.hosts]


def test_the_health_test_flags_both_throttling_hosts_and_no_stray_event(
    store: Any, fleet: HealthFleet
) -> None:
    since, until = _t(fleet.start_ns), _t(fleet.end_ns)
    hh = host_health(store, since, until)
    test = health_test(hh.events, hh.samples)
    flagged = {str(hh.hosts[i]) for i in range(len(hh.hosts)) if test.flagged[i]} & set(fleet.hosts)
    assert flagged == {fleet.throttling, fleet.quiet}  # the quiet one: one job only, not named
    gpus = gpu_detail(
        store, since, until, [fleet.quiet, fleet.jobs_only], causes=NODE_CAUSES, kinds=NODE_SUSPECT_KINDS
    )
    hot = [(d.gpu, d.events[0], d.jobs) for d in gpus if d.events[0]]
    assert hot == [(f"GPU-{fleet.quiet}-5", 5, 1)]
    assert {d.gpu: d.jobs for d in gpus if d.jobs} == {
        f"GPU-{fleet.quiet}-5": 1,
        f"GPU-{fleet.jobs_only}-1": 2,
    }
