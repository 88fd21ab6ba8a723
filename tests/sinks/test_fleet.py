"""sinks/fleet.py over migration 008's rollups, in the real chDB store: what each host hosted,
what implicated it (each anomaly once, its latest version, a link's cost split between its
ends), its NVML health, and the fleet's GPU-hours lost by day and cause."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from argus.detectors.fleet import NODE_CAUSES, NODE_SUSPECT_KINDS
from argus.sinks.fleet import lost_by_cause_day, node_evidence, node_table
from tests.helpers.fleet import SmallFleet, small_fleet

_KW: dict[str, Any] = {"causes": NODE_CAUSES, "kinds": NODE_SUSPECT_KINDS}


def _t(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


@pytest.fixture
def fleet(store: Any, unique: str) -> SmallFleet:
    # a day of its own, far from other tests' data: lost_by_cause_day is fleet-wide
    t0 = 1_900_000_000 * 10**9 + (int(unique, 16) % 5000) * 86_400 * 10**9
    return small_fleet(store, f"t{unique}", t0 - t0 % (86_400 * 10**9))


def test_each_host_gets_its_gpu_hours_and_the_jobs_that_implicated_it(store: Any, fleet: SmallFleet) -> None:
    nodes = node_table(store, _t(fleet.start_ns), _t(fleet.end_ns), **_KW)
    mine = [i for i, h in enumerate(nodes.hosts) if h in fleet.hosts]
    assert sorted(nodes.hosts[mine]) == sorted(h for h, s in fleet.exposure_s.items() if s > 0)
    for i in mine:  # 20 steps of 1 s on 8 GPUs per job hosted
        assert nodes.gpu_hours[i] == pytest.approx(fleet.exposure_s[nodes.hosts[i]] / 3600, rel=1e-6)
    assert nodes.jobs[nodes.index(fleet.bad)] == 5
    assert nodes.jobs[nodes.index(fleet.unlucky)] == 1
    implicated = {str(nodes.hosts[i]) for i in mine if nodes.jobs[i]}
    assert len(implicated) == 3  # the bad host and both ends of the link: the stage and GC pause place none


def test_the_window_bounds_both_exposure_and_anomalies(store: Any, fleet: SmallFleet) -> None:
    until = _t(fleet.start_ns) + timedelta(hours=3)  # jobs 0, 1 and 2
    nodes = node_table(store, _t(fleet.start_ns), until, **_KW)
    bad = nodes.index(fleet.bad)
    assert nodes.jobs[bad] == 3
    assert nodes.gpu_hours[bad] == pytest.approx(3 * 8 * 20 / 3600)
    with pytest.raises(ValueError, match="before it starts"):
        node_table(store, until, _t(fleet.start_ns), **_KW)
    only_links = node_table(
        store, _t(fleet.start_ns), _t(fleet.end_ns), causes={"link_degradation"}, kinds={"link"}
    )
    assert only_links.jobs[only_links.index(fleet.bad)] == 0
    assert only_links.jobs[only_links.index(fleet.unlucky)] == 1


def test_health_events_count_xids_throttling_and_the_rise_of_error_counters(
    store: Any, fleet: SmallFleet
) -> None:
    idle = fleet.unlucky  # its GPUs report "GPU idle" (no throttling) and flat counters (no error)
    ev = node_evidence(store, _t(fleet.start_ns), _t(fleet.end_ns), [fleet.bad, idle], **_KW)
    bad = ev[fleet.bad]
    assert (bad.xid_samples, bad.throttled_samples, bad.ecc_errors, bad.link_errors) == (1, 2, 2, 0)
    assert (ev[idle].xid_samples, ev[idle].throttled_samples, ev[idle].ecc_errors) == (0, 0, 0)


def test_evidence_names_jobs_classes_the_gpu_and_the_costliest_anomaly_first(
    store: Any, fleet: SmallFleet
) -> None:
    ev = node_evidence(store, _t(fleet.start_ns), _t(fleet.end_ns), [fleet.bad, fleet.unlucky], **_KW)
    bad = ev[fleet.bad]
    assert bad.jobs == tuple(fleet.jobs[:5])
    # five anomalies; the first stored twice counts once, at its latest cost
    assert (bad.anomalies, bad.gpu_hours_lost) == (5, pytest.approx(0.04 + 4 * 0.01))
    assert ev[fleet.unlucky].gpu_hours_lost == pytest.approx(0.01)  # half the link
    assert bad.causes == {"compute_straggler": 5}
    assert bad.gpus == {f"GPU-{fleet.bad}-3": 5}
    assert bad.ids[0] == fleet.bad_ids[0] and sorted(bad.ids) == sorted(fleet.bad_ids)
    assert bad.xids == (79,)
    assert ev[fleet.unlucky].causes == {"link_degradation": 1}
    assert node_evidence(store, _t(fleet.start_ns), _t(fleet.end_ns), [], **_KW) == {}
    with pytest.raises(ValueError, match="comma"):
        node_evidence(store, _t(fleet.start_ns), _t(fleet.end_ns), ["a,b"], **_KW)


def test_lost_gpu_hours_by_day_and_cause_count_every_anomaly_once(store: Any, fleet: SmallFleet) -> None:
    lost = lost_by_cause_day(store, _t(fleet.start_ns), _t(fleet.end_ns))
    by_cause = {x.cause: (x.anomalies, round(x.gpu_hours_lost, 6)) for x in lost}
    assert by_cause == {
        "compute_straggler": (5, 0.08),
        "link_degradation": (1, 0.02),
        "pipeline_stage_imbalance": (1, 0.5),
        "gc_pause": (1, 0.001),
    }
    assert {x.day for x in lost} == {_t(fleet.start_ns).date().isoformat()}
    only = lost_by_cause_day(store, _t(fleet.start_ns), _t(fleet.end_ns), causes=["gc_pause"])
    assert [(x.cause, x.anomalies) for x in only] == [("gc_pause", 1)]


def test_the_fleet_dashboard_and_the_ticket_rule_read_the_recorded_suspects(store: Any, unique: str) -> None:
    """Every panel of Argus / Fleet and the node-suspect rule, macros expanded, on a fleet of 60
    hosts after `argus fleet --record`'s recording (the model itself: argus.fleet)."""
    from argus.fleet import fleet_view, record
    from argus.sinks.grafana import ALERTS, expand
    from argus.sinks.grafana.queries import FLEET

    t0 = 1_900_000_000 * 10**9 + (5000 + int(unique, 16) % 5000) * 86_400 * 10**9
    fleet = small_fleet(store, f"d{unique}", t0 - t0 % (86_400 * 10**9), n_hosts=60, n_jobs=40, bad_jobs=8)
    start, end = _t(fleet.start_ns), _t(fleet.end_ns)
    view = fleet_view(store, since=start, until=end)
    assert [n.host for n in view.suspects] == [fleet.bad]
    assert record(store, view) == 1

    def run(sql: str) -> list[dict[str, Any]]:
        table = store.query_arrow(
            expand(sql, start=start, end=end + timedelta(minutes=1), interval_s=60, variables={})
        )
        rows = zip(*(c.to_pylist() for c in table.columns), strict=True)
        return [dict(zip(table.column_names, r, strict=True)) for r in rows]

    panels = {p.key: run(p.sql) for p in FLEET.panels}
    heat: dict[str, float] = {}
    for r in panels["host_day_lost"]:
        heat[r["host"]] = heat.get(r["host"], 0.0) + r["gpu_hours_lost"]
    assert heat[fleet.bad] == pytest.approx(0.04 + 6 * 0.01) and heat[fleet.unlucky] == pytest.approx(0.01)
    (suspect,) = [r for r in panels["suspect_nodes"] if r["host"] in fleet.hosts]
    assert (
        suspect["host"] == fleet.bad and suspect["jobs"] == 7 and fleet.bad_ids[0] in suspect["anomaly_ids"]
    )
    listed = [r for r in panels["suspect_anomalies"] if r["host"] in fleet.hosts]
    assert sorted(r["anomaly"] for r in listed) == sorted(fleet.bad_ids)
    lost = {k: sum(r[k] for r in panels["lost_by_cause"]) for k in ("compute_straggler", "gc_pause")}
    assert lost == {"compute_straggler": pytest.approx(0.10), "gc_pause": pytest.approx(0.001)}
    (rule,) = [r for r in ALERTS if r.uid == "argus-node-suspect"]
    firing = {r["host"]: r["suspect"] for r in run(rule.sql) if r["host"] in fleet.hosts}
    assert firing == {fleet.bad: 1.0}
