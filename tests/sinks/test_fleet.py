"""sinks/fleet.py over migration 008's rollups, in the real chDB store: what each host hosted,
what implicated it (each anomaly once, its latest version, a link's cost split between its
ends), its NVML health, and the fleet's GPU-hours lost by day and cause."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from argus.detectors.fleet import NODE_CAUSES, NODE_SUSPECT_KINDS
from argus.sinks.fleet import gpu_detail, host_health, lost_by_cause_day, node_evidence, node_table
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


def test_exposure_over_days_reads_whole_days_and_the_hours_at_both_ends(store: Any, unique: str) -> None:
    """A host runs a 20-step job (8 GPUs x 20 s) at 06:00, 12:00 and 18:00 of each of four days:
    a window's GPU-hours are those of the jobs whose hour starts in it, whether the window
    holds whole days (node_days) or cuts them (node_hours at its ends)."""
    from argus.sinks import to_arrow
    from tests.helpers.fleet import job_steps

    day = 86_400 * 10**9
    t0 = 1_970_000_000 * 10**9 + (int(unique, 16) % 5000) * day
    t0 -= t0 % day
    host = f"x{unique}-h0"
    starts = [t0 + d * day + h * 3_600 * 10**9 for d in range(4) for h in (6, 12, 18)]
    for i, t in enumerate(starts):
        store.insert_arrow("steps", to_arrow(job_steps(f"x{unique}-j{i}", [host], t))[1])
    per_job = 8 * 20 / 3600
    hours = 3_600 * 10**9
    for since, until in [
        (t0, t0 + 4 * day),  # four whole days
        (t0 + 12 * hours + 59 * 10**9, t0 + 3 * day + 12 * hours),  # its first hour is in; the end cuts a day
        (t0 + 13 * hours, t0 + 3 * day + 12 * hours + 10**6),  # 12:00 of day 3 starts 1 ms before the end
        (t0 + 7 * hours, t0 + 19 * hours),  # within a day
        (t0 + 18 * hours, t0 + 2 * day + 6 * hours),  # two ends and one whole day
    ]:
        want = sum(1 for t in starts if since - since % hours <= t < until) * per_job
        nodes = node_table(store, _t(since), _t(until), **_KW)
        assert nodes.gpu_hours[nodes.index(host)] == pytest.approx(want), (
            (since - t0) / hours,
            (until - t0) / hours,
        )


def test_node_jobs_keeps_one_row_per_host_job_and_hour_and_the_gpus_they_named(
    store: Any, fleet: SmallFleet
) -> None:
    """The ranking's rollup: a later version of an anomaly, stored on its own, is one more row
    until merged, never one more job; merged, the bad host's five jobs are five rows, each
    with the GPU it named."""
    from argus.sinks import to_arrow
    from tests.helpers.fleet import anomaly

    ((job, ranks, ns),) = store.query_rows(
        "SELECT job, ranks, toUnixTimestamp64Nano(time) FROM anomalies WHERE id = {i:String} LIMIT 1",
        {"i": fleet.bad_ids[1]},
    )
    later = anomaly(fleet.bad_ids[1], job, tuple(ranks), "rank", "compute_straggler", ns, 0.03, end_step=30)
    store.insert_arrow("anomalies", to_arrow([later])[1])
    since, until, p = _t(fleet.start_ns), _t(fleet.end_ns), {"h": fleet.bad}
    nodes = node_table(store, since, until, **_KW)
    assert nodes.jobs[nodes.index(fleet.bad)] == 5
    assert nodes.gpu_jobs[nodes.index(fleet.bad)] == 6  # an upper bound until merged
    store.execute("OPTIMIZE TABLE node_jobs FINAL")
    rows = store.query_rows("SELECT job_hash, gpus FROM node_jobs WHERE host = {h:String}", p)
    assert len(rows) == 5 and {tuple(g) for _, g in rows} == {(f"GPU-{fleet.bad}-3",)}
    assert {h for h, _ in rows} == {h for (h,) in store.query_rows(
        "SELECT cityHash64(job) FROM anomaly_nodes WHERE host = {h:String}", p)}  # fmt: skip
    nodes = node_table(store, since, until, **_KW)
    assert nodes.gpu_jobs[nodes.index(fleet.bad)] == 5
    assert nodes.gpu_jobs[nodes.index(fleet.unlucky)] == 1  # its end of the link: one GPU


def test_host_health_and_gpu_detail_count_each_signal_and_the_jobs_on_each_gpu(
    store: Any, fleet: SmallFleet
) -> None:
    since, until = _t(fleet.start_ns), _t(fleet.end_ns)
    hh = host_health(store, since, until)
    i = int(list(hh.hosts).index(fleet.bad))
    # two samples per GPU; GPU 3: throttled in both, an XID 79 in one, ECC counter 0 -> 2
    assert hh.samples[i] == 16 and list(hh.events[i]) == [2, 1, 2, 0]
    j = int(list(hh.hosts).index(fleet.unlucky))
    assert list(hh.events[j]) == [0, 0, 0, 0]  # "GPU idle" is no throttling, a flat counter no error
    detail = gpu_detail(store, since, until, [fleet.bad], **_KW)
    assert [d.gpu for d in detail] == [f"GPU-{fleet.bad}-{g}" for g in range(8)]
    (hot,) = [d for d in detail if d.jobs]
    assert (hot.gpu, hot.samples, hot.events, hot.jobs) == (f"GPU-{fleet.bad}-3", 2, (2, 1, 2, 0), 5)
    assert gpu_detail(store, since, until, [], **_KW) == []


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


def _slow_fleet(
    store: Any, unique: str, slow_of_job: list[tuple[int, int] | None], *, n_hosts: int = 12
) -> tuple[list[str], list[list[str]], int, int]:
    """Small jobs (4 hosts of 8 GPUs, 60 steps of 1 s, one an hour) on ``n_hosts`` hosts with no
    anomaly at all: in job ``j``, the GPU ``slow_of_job[j]`` (host index, GPU) computes 20 %
    slower than its peers from the first step (what a small job takes for its baseline), placed
    in that job whatever the draw; returns the hosts, each job's hosts and the window."""
    import dataclasses

    from argus.sinks import to_arrow
    from tests.helpers.fleet import GPUS, job_steps

    day = 86_400 * 10**9
    t0 = 2_000_000_000 * 10**9 + (int(unique, 16) % 5000) * day
    t0 -= t0 % day
    rng = np.random.default_rng(int(unique, 16) % 2**32)
    hosts = [f"s{unique}-h{i:02d}" for i in range(n_hosts)]
    jobs = []
    for j, slow in enumerate(slow_of_job):
        placed = [str(h) for h in rng.choice(hosts, 4, replace=False)]
        if slow is not None and hosts[slow[0]] not in placed:
            placed[j % 4] = hosts[slow[0]]
        batches = job_steps(f"s{unique}-job{j:02d}", placed, t0 + j * 3_600 * 10**9, steps=60)
        if slow is not None:
            rank = placed.index(hosts[slow[0]]) * GPUS + slow[1]
            out = []
            for b in batches:
                cols = dict(b.columns)
                for phase in ("forward_ms", "backward_ms"):
                    cols[phase] = cols[phase].copy()
                    cols[phase][rank] *= 1.2
                out.append(dataclasses.replace(b, columns=cols))
            batches = out
        store.insert_arrow("steps", to_arrow(batches)[1])
        jobs.append(placed)
    return hosts, jobs, t0, t0 + len(slow_of_job) * 3_600 * 10**9


def test_a_gpu_slower_than_its_peers_from_the_start_of_every_small_job_is_named(
    store: Any, unique: str
) -> None:
    """No anomaly implicates it (each job took it for its baseline), yet the GPU that is the
    slow one in job after job is a suspect, its evidence the jobs it was slow in and by how much."""
    from argus.fleet import SLOWER_THAN_PEERS, fleet_view
    from argus.sinks.fleet import gpu_names, slow_gpus

    hosts, jobs, start, end = _slow_fleet(store, unique, [(5, 3)] * 5 + [None] * 5)
    hosted = sum(hosts[5] in placed for placed in jobs)  # 5, and the healthy jobs it drew
    since, until = _t(start), _t(end)
    slow = slow_gpus(store, since, until, slow_frac=0.08, min_steps=50, min_peers=4)
    (i,) = np.flatnonzero(slow.slow)
    assert (slow.slow[i], slow.jobs[i]) == (5, hosted) and slow.excess[i] == pytest.approx(0.2)
    assert gpu_names(store, since, until, slow, [int(i)]) == {
        int(slow.keys[i]): (hosts[5], f"GPU-{hosts[5]}-3")
    }
    assert slow.others_jobs == 10 * 32 - hosted and slow.others < 12 * 8  # every other GPU's job-days
    view = fleet_view(store, since=since, until=until)
    (node,) = view.suspects
    assert node.host == hosts[5] and node.decided_by == f"{SLOWER_THAN_PEERS} on GPU-{hosts[5]}-3"
    assert node.jobs == 5 and node.confidence > 0.999 and node.evidence.anomalies == 0
    assert node.evidence.slow_gpus == {f"GPU-{hosts[5]}-3": (5, hosted, pytest.approx(0.2))}
    assert (
        node.row()["slower_than_peers"]
        == f"GPU-{hosts[5]}-3: {SLOWER_THAN_PEERS} in 5 of {hosted} jobs, +20 % median"
    )
    # recorded for the dashboard and the alert, with what decided and the slowness
    from argus.fleet import record
    from argus.sinks.grafana import expand
    from argus.sinks.grafana.queries import FLEET

    assert record(store, view) == 1
    (panel,) = [p for p in FLEET.panels if p.key == "suspect_nodes"]
    sql = expand(panel.sql, start=since, end=until + timedelta(minutes=1), interval_s=60, variables={})
    table = store.query_arrow(sql)
    rows = [
        dict(zip(table.column_names, r, strict=True))
        for r in zip(*(c.to_pylist() for c in table.columns), strict=True)
    ]
    (shown,) = [r for r in rows if r["host"] == hosts[5]]
    assert shown["decided_by"] == node.decided_by and shown["jobs"] == 5
    assert shown["slower_than_peers"] == node.row()["slower_than_peers"]
    # a node cause other than a compute straggler's does not weigh it
    assert fleet_view(store, since=since, until=until, cause="link_degradation").suspects == []


def test_a_gpu_slow_in_one_job_only_or_a_slow_worker_that_changes_from_job_to_job_names_nobody(
    store: Any, unique: str
) -> None:
    from argus.fleet import fleet_view
    from argus.sinks.fleet import slow_gpus

    # job 0: one GPU slow once; jobs 1-9: the slow worker is another GPU of another host each time
    slow_of_job = [(0, 1)] + [(j % 12, (3 * j) % 8) for j in range(1, 10)]
    assert len(set(slow_of_job)) == 10
    _, _, start, end = _slow_fleet(store, unique, slow_of_job)
    since, until = _t(start), _t(end)
    slow = slow_gpus(store, since, until, slow_frac=0.08, min_steps=50, min_peers=4)
    assert sorted(slow.slow) == [1] * 10
    assert fleet_view(store, since=since, until=until).suspects == []


def test_slowness_is_judged_against_enough_peers_with_enough_steps(store: Any, unique: str) -> None:
    from argus.sinks.fleet import slow_gpus

    _, _, start, end = _slow_fleet(store, unique, [(2, 6)] * 3)
    since, until = _t(start), _t(end)
    assert slow_gpus(store, since, until, slow_frac=0.08, min_steps=50, min_peers=4).slow.tolist() == [3]
    assert len(slow_gpus(store, since, until, slow_frac=0.25, min_steps=50, min_peers=4)) == 0  # 20 % < 25 %
    assert len(slow_gpus(store, since, until, slow_frac=0.08, min_steps=61, min_peers=4)) == 0  # 60 steps
    assert len(slow_gpus(store, since, until, slow_frac=0.08, min_steps=50, min_peers=33)) == 0  # 32 ranks
    # the window: the first job alone
    first = slow_gpus(store, since, since + timedelta(minutes=30), slow_frac=0.08, min_steps=50, min_peers=4)
    assert (first.slow.tolist(), first.jobs.tolist()) == ([1], [1])
