"""Every panel's and alert rule's SQL, macros expanded, on chDB with simulated jobs."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from argus.detectors import HangState, JobDiagnoser, detect_hang, hang_anomalies
from argus.producers.simulator import (
    COMPUTE_STRAGGLER,
    ClusterSimulator,
    Fault,
    HangScenario,
    HangSimulator,
    Layout,
)
from argus.schemas import Anomaly, GpuSample, KernelSketch, StepSummary
from argus.sinks import to_arrow
from argus.sinks.grafana import ALERTS, DASHBOARDS, all_panels, expand, percent_encode, rendered_files
from argus.sinks.grafana.macros import MacroError
from argus.sinks.grafana.provisioning import DATASOURCE_TYPE, DATASOURCE_UID
from argus.sinks.grafana.queries import ACTIVE_S
from argus.sinks.kernels import kernel_table

REPO = Path(__file__).resolve().parents[2]
STRAGGLER = 21
STEPS = 60


def load_job(store: Any, job: str, *, fault: bool, start: datetime) -> None:
    """A simulated job, diagnosed by the real detectors, stored as the sink would store it."""
    faults = [Fault(COMPUTE_STRAGGLER, first_step=25, steps=STEPS, ranks=(STRAGGLER,))] if fault else []
    sim = ClusterSimulator(
        Layout(dp=4, tp=8, pp=2),
        seed=3,
        job=job,
        faults=faults,
        checkpoint_every=0,
        start_ns=int(start.timestamp() * 1e9),
    )
    diagnoser = JobDiagnoser(job)
    batches, stacks, kernels, summaries, anomalies, gpus = [], [], [], [], {}, []
    for s in sim.run(STEPS):
        batches.append(s.batch)
        result = diagnoser.step(s.batch, kernels=s.kernel_stats, stacks=s.stacks)
        summaries.append(result.summary)
        anomalies.update({a.id: a for a in result.anomalies})
        if s.step % 10 == 0:
            stacks.extend(s.stacks([STRAGGLER, 3]).values())
            for rank, stats in s.kernel_stats([STRAGGLER, 3]).items():
                kernels.append(kernel_table(KernelSketch(job, 0, rank, s.step, 1, -1, b""), stats, {}))
            host = str(s.batch["host"][STRAGGLER])
            gpus.append(
                GpuSample(
                    host,
                    str(s.batch["gpu_uuid"][STRAGGLER]),
                    STRAGGLER % 8,
                    int(s.batch["end_ns"].max()),
                    gpu_util=97.0,
                    sm_clock_mhz=1410.0,
                    power_w=390.0,
                    temp_c=71.0,
                )
            )
    anomalies.update({a.id: a for a in diagnoser.flush()})
    for records in (batches, stacks, summaries, list(anomalies.values()), gpus):
        if records:
            table, data = to_arrow(records)
            store.insert_arrow(table, data)
    for data in kernels:
        store.insert_arrow("kernels", data)


@pytest.fixture(scope="module")
def jobs(store, unique_module: str) -> dict[str, Any]:
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(minutes=8)
    names = {"slow": f"gf-slow-{unique_module}", "clean": f"gf-clean-{unique_module}"}
    load_job(store, names["slow"], fault=True, start=start)
    load_job(store, names["clean"], fault=False, start=start)
    return {"names": names, "start": start - timedelta(minutes=1), "end": now + timedelta(minutes=5)}


@pytest.fixture(scope="module")
def unique_module() -> str:
    return str(int(time.time() * 1000))[-9:]


def run_panel(
    store: Any, sql: str, jobs: dict[str, Any], interval_s: int = 30, **variables: str
) -> tuple[list[str], list[tuple]]:
    expanded = expand(sql, start=jobs["start"], end=jobs["end"], interval_s=interval_s, variables=variables)
    table = store.query_arrow(expanded)
    names = table.column_names
    return names, list(zip(*(c.to_pylist() for c in table.columns), strict=True)) if names else []


@pytest.mark.parametrize(
    ("dashboard", "panel"), all_panels(), ids=lambda x: getattr(x, "key", getattr(x, "uid", ""))
)
def test_every_panel_runs_and_returns_rows(store, jobs, dashboard, panel) -> None:
    kernel = store.query_rows(f"SELECT any(name) FROM kernels WHERE job = '{jobs['names']['slow']}'")[0][0]
    names, rows = run_panel(
        store, panel.sql, jobs, job=jobs["names"]["slow"], rank=str(STRAGGLER), kernel=kernel
    )
    assert names, panel.key
    if panel.key == "missing_ranks":  # every rank reported every step: a flat zero line
        assert rows and all(r[1] == 0 for r in rows)
        return
    if panel.key == "hangs":  # a straggler is not a hang (see test_the_hang_panel_...)
        assert rows == []
        return
    if panel.key in (
        "suspect_nodes",
        "suspect_anomalies",
    ):  # no fleet recording here: tests/sinks/test_fleet.py
        assert rows == []
        return
    assert rows, f"{dashboard.uid}/{panel.key} returned no rows"
    if panel.kind == "timeseries":
        times = [r[0] for r in rows]
        assert names[0] == "t" and times == sorted(times)
    if panel.kind == "flamegraph":
        assert names == ["level", "value", "self", "label"]
        levels = [r[0] for r in rows]
        assert levels[0] == 0 and max(levels) > 2
        assert rows[0][1] == sum(r[2] for r in rows)  # the root holds every sample


def test_the_flame_graph_has_one_root_when_stacks_were_cut_at_max_depth(
    store, jobs, unique_module: str
) -> None:
    """Stacks deeper than the agent's max_depth lose their root frames, so two stacks can start
    at different frames: the panel still gets one level-0 row, holding every sample."""
    job = f"gf-deep-{unique_module}"
    t = int((jobs["start"] + timedelta(minutes=2)).timestamp())
    store.execute(
        "INSERT INTO stacks (job, run, rank, step, time, stack, count) VALUES "
        f"('{job}', 0, 0, 1, toDateTime64({t}, 3), 'train.py:main;model.py:forward;gemm', 5), "
        f"('{job}', 0, 0, 1, toDateTime64({t}, 3), 'model.py:forward;attention;softmax', 3)"
    )
    panel = dict((p.key, p) for _, p in all_panels())["stacks"]
    _, rows = run_panel(store, panel.sql, jobs, job=job, rank="0")
    assert [r for r in rows if r[0] == 0] == [(0, 8, 0, "all")]
    assert sorted(r[3] for r in rows if r[0] == 1) == ["model.py:forward", "train.py:main"]


def test_the_straggler_tops_the_slow_ranks_panel(store, jobs) -> None:
    panel = dict((p.key, p) for _, p in all_panels())["slow_ranks"]
    names, rows = run_panel(store, panel.sql, jobs, job=jobs["names"]["slow"])
    assert rows[0][names.index("rank")] == STRAGGLER
    assert rows[0][names.index("z")] > 6 > rows[1][names.index("z")]
    names, rows = run_panel(store, panel.sql, jobs, job=jobs["names"]["clean"])
    assert max(r[names.index("z")] for r in rows) < 6


def test_the_heatmap_shows_the_straggler_row(store, jobs) -> None:
    panel = dict((p.key, p) for _, p in all_panels())["busy_heatmap"]
    names, rows = run_panel(store, panel.sql, jobs, interval_s=1, job=jobs["names"]["slow"])
    last = max(r[names.index("t")] for r in rows)  # the fault is on in the job's last minute
    cells = {
        r[names.index("rank_group")]: r[names.index("busy_ms")] for r in rows if r[names.index("t")] == last
    }
    assert max(cells, key=cells.__getitem__) == str(STRAGGLER)  # the brightest cell of the last column
    assert names[names.index("rank_group")] == "rank_group" and all(isinstance(c, str) for c in cells)


def firing(store: Any, uid: str, at: datetime) -> list[dict[str, Any]]:
    """The rows of a rule's query, run over its relativeTimeRange ending at ``at``, that fire."""
    rule = next(r for r in ALERTS if r.uid == uid)
    window = {"start": at - timedelta(seconds=rule.window_s), "end": at}
    names, rows = run_panel(store, rule.sql, window)
    return [dict(zip(names, r, strict=True)) for r in rows if r[names.index(rule.value)] > rule.fire_above]


def last_step_time(store: Any, job: str) -> datetime:
    (t,) = store.query_rows(f"SELECT toUnixTimestamp(max(time)) FROM step_summaries WHERE job = '{job}'")[0]
    return datetime.fromtimestamp(t, UTC)


def test_slow_rank_alert_fires_for_the_straggler_only(store, jobs) -> None:
    at = last_step_time(store, jobs["names"]["slow"]) + timedelta(seconds=60)
    firing = [(f["job"], f["suspect"], f["cause"]) for f in firing_rows(store, at)]
    assert (jobs["names"]["slow"], f"rank:{STRAGGLER}", "compute_straggler") in firing
    assert all(job != jobs["names"]["clean"] for job, _, _ in firing)
    assert len([f for f in firing if f[0] == jobs["names"]["slow"]]) == 1
    rule = next(r for r in ALERTS if r.uid == "argus-slow-rank")
    assert "{{ $labels.suspect }}" in rule.summary and "{{ $labels.cause }}" in rule.summary
    # the suspect last seen slow more than ACTIVE_S ago: the rule no longer fires for it
    later = at + timedelta(seconds=ACTIVE_S + 60)
    assert not [f for f in firing_rows(store, later) if f["job"] == jobs["names"]["slow"]]


def firing_rows(store: Any, at: datetime) -> list[dict[str, Any]]:
    return firing(store, "argus-slow-rank", at)


def _stored(
    job: str, cause: str, suspect: str, *, severity: str, level: str, at: datetime, end: int
) -> Anomaly:
    return Anomaly(
        id=f"{job}-{suspect}-{severity}",
        job=job,
        run=0,
        start_step=100,
        end_step=end,
        level=level,
        suspect_kind="rank",
        suspect=suspect,
        ranks=(int(suspect.split(":")[1]),),
        cause=cause,
        score=9.0,
        detected_ns=int(at.timestamp() * 1e9),
        severity=severity,
    )


def _summary(job: str, step: int, at: datetime) -> StepSummary:
    return StepSummary(
        job, 0, step, int(at.timestamp() * 1e9), 8, (), 100.0, 110.0, 120.0, 80.0, 20.0, 1.0, 0.0, 0
    )


def test_slow_rank_alert_pages_only_on_page_severity_anomalies_whose_suspect_is_still_slow(
    store, jobs, unique_module: str
) -> None:
    """It reads the stored anomalies as they are: warn and info never page, nor a hang (its
    own rule), nor an anomaly whose suspect was last seen slow long ago; the latest version's
    severity decides (a straggler later found persistent is downgraded). Labels are what no
    version changes: the anomaly id, job, team, cause, suspect, onset."""
    job = f"team-a/gf-sev-{unique_module}"
    now = datetime.now(UTC).replace(microsecond=0)
    records = [
        _stored(job, "compute_straggler", "rank:1", severity="page", level="cross_rank", at=now, end=130),
        _stored(job, "compute_straggler", "rank:2", severity="warn", level="cross_rank", at=now, end=130),
        _stored(job, "gc_pause", "rank:3", severity="info", level="cross_rank", at=now, end=130),
        _stored(job, "hang", "rank:4", severity="page", level="hang", at=now, end=130),
        _stored(job, "link_degradation", "rank:5", severity="page", level="cross_rank", at=now, end=120),
    ]
    first = _stored(job, "compute_straggler", "rank:6", severity="page", level="cross_rank", at=now, end=110)
    later = dataclasses.replace(first, end_step=130, severity="warn")  # the final version: persistent
    summaries = [_summary(job, 120, now - timedelta(minutes=8)), _summary(job, 130, now)]
    for recs in ([*records, first, later], summaries):
        table, data = to_arrow(recs)
        store.insert_arrow(table, data)
    rows = [f for f in firing_rows(store, now + timedelta(seconds=30)) if f["job"] == job]
    assert [(f["suspect"], f["cause"], f["onset"], f["rank"], f["team"]) for f in rows] == [
        ("rank:1", "compute_straggler", "100", "1", "team-a")
    ]
    assert rows[0]["anomaly"] == f"{job}-rank:1-page"


def test_the_anomaly_panel_names_the_straggler_with_its_cost(store, jobs) -> None:
    panel = dict((p.key, p) for _, p in all_panels())["anomalies"]
    names, rows = run_panel(store, panel.sql, jobs, job=jobs["names"]["slow"])
    top = [r for r in rows if r[names.index("suspect")] == f"rank:{STRAGGLER}"]
    assert top and top[0][names.index("cause")] == "compute_straggler"
    assert top[0][names.index("gpu_hours_lost")] > 0 and top[0][names.index("evidence")]
    _, clean = run_panel(store, panel.sql, jobs, job=jobs["names"]["clean"])
    assert clean == []


def test_hostile_job_names_stay_inside_their_string(store, jobs) -> None:
    hostile = "x'; DROP TABLE steps; --"
    assert "'" not in percent_encode(hostile) and "\\" not in percent_encode("a\\'b")
    for _, panel in all_panels():
        names, _ = run_panel(store, panel.sql, jobs, job=hostile, rank="0' OR 1=1 --", kernel=hostile)
        assert names
    assert store.query_rows("EXISTS TABLE steps") == [(1,)]


def test_unknown_macros_and_unset_variables_fail() -> None:
    now = datetime.now(UTC)
    with pytest.raises(MacroError, match="unknown macro"):
        expand("SELECT $__timeFilterr(time)", start=now, end=now, interval_s=1)
    with pytest.raises(MacroError, match="no value"):
        expand("SELECT '${job:percentencode}'", start=now, end=now, interval_s=1)


def test_checked_in_provisioning_matches_the_code() -> None:
    for rel, text in rendered_files().items():
        assert (REPO / "deploy" / "grafana" / rel).read_text() == text, f"run `argus grafana export` ({rel})"


def test_dashboards_reference_the_datasource_and_their_queries() -> None:
    for d in DASHBOARDS:
        doc = json.loads((REPO / "deploy" / "grafana" / "dashboards" / f"{d.uid}.json").read_text())
        assert [p["targets"][0]["rawSql"] for p in doc["panels"]] == [p.sql for p in d.panels]
        # every panel and variable queries the datasource the user picks; it defaults to ours
        assert all(
            p["datasource"] == {"type": DATASOURCE_TYPE, "uid": "${datasource}"} for p in doc["panels"]
        )
        variables = {v["name"]: v for v in doc["templating"]["list"]}
        assert set(variables) == {"datasource", *d.variables}
        assert variables["datasource"]["query"] == DATASOURCE_TYPE
        assert variables["datasource"]["current"]["value"] == DATASOURCE_UID
        for p in doc["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24


HUNG_RANK = 45


@pytest.fixture(scope="module")
def hang_job(store, jobs, unique_module: str) -> str:
    """A simulated job in which rank 45 never enters its all-reduce, diagnosed every second."""
    job = f"gf-hang-{unique_module}"
    start = datetime.now(UTC) - timedelta(minutes=3)
    sim = HangSimulator(
        Layout(dp=4, tp=8, pp=2),
        HangScenario("collective_hang", at_s=30.0, rank=HUNG_RANK),
        job=job,
        start_ns=int(start.timestamp() * 1e9),
    )
    state = HangState(job)
    found: dict[str, Any] = {}
    for now, beats in sim.ticks(1.0, 60.0):
        state.observe(beats)
        found.update({a.id: a for a in hang_anomalies(detect_hang(state, now))})
    assert found
    table, data = to_arrow(list(found.values()))
    store.insert_arrow(table, data)
    return job


def test_the_hang_panel_names_the_rank_and_the_all_reduce(store, jobs, hang_job) -> None:
    panel = dict((p.key, p) for _, p in all_panels())["hangs"]
    names, rows = run_panel(store, panel.sql, jobs, job=hang_job)
    assert len(rows) == 1
    row = dict(zip(names, rows[0], strict=True))
    assert (row["cause"], row["suspect"], row["ranks"]) == ("hang", f"rank:{HUNG_RANK}", str(HUNG_RANK))
    assert "all_reduce" in row["summary"] and row["waiting_ranks"] == 3 and row["collective_mib"] == 512.0
    assert row["stalled_s"] > 10


def test_hang_alert_pages_with_the_suspect_for_the_hung_job_only(store, jobs, hang_job) -> None:
    mine = [
        f
        for f in firing(store, "argus-hang", datetime.now(UTC))
        if f["job"] in {hang_job, *jobs["names"].values()}
    ]
    assert [(f["job"], f["suspect"], f["cause"]) for f in mine] == [(hang_job, f"rank:{HUNG_RANK}", "hang")]
    assert not [f for f in firing(store, "argus-lost-rank", datetime.now(UTC)) if f["job"] == hang_job]
    rule = next(r for r in ALERTS if r.uid == "argus-hang")
    assert "{{ $labels.suspect }}" in rule.summary
    # no re-send for longer than RESENT_S: the stall is over (steps resumed or the job stopped)
    assert not [
        f
        for f in firing(store, "argus-hang", datetime.now(UTC) + timedelta(minutes=5))
        if f["job"] == hang_job
    ]


def test_lost_rank_alert_pages_from_the_stored_lost_rank_anomaly(store, jobs, unique_module: str) -> None:
    """The worker names a rank whose heartbeats stopped while the job stalls (cause lost_rank):
    that anomaly is the page, not a gap in the step records."""
    job = f"gf-lost-{unique_module}"
    start = datetime.now(UTC) - timedelta(minutes=3)
    sim = HangSimulator(
        Layout(dp=4, tp=8, pp=2),
        HangScenario("process_death", at_s=30.0, rank=HUNG_RANK),
        job=job,
        start_ns=int(start.timestamp() * 1e9),
    )
    state = HangState(job)
    found: dict[str, Any] = {}
    for now, beats in sim.ticks(1.0, 90.0):
        state.observe(beats)
        found.update({a.id: a for a in hang_anomalies(detect_hang(state, now))})
    assert {a.cause for a in found.values()} == {"lost_rank"}
    table, data = to_arrow(list(found.values()))
    store.insert_arrow(table, data)
    mine = [f for f in firing(store, "argus-lost-rank", datetime.now(UTC)) if f["job"] == job]
    assert [(f["suspect"], f["cause"], f["team"]) for f in mine] == [
        (f"rank:{HUNG_RANK}", "lost_rank", "platform")
    ]
    assert not [f for f in firing(store, "argus-hang", datetime.now(UTC)) if f["job"] == job]


def test_the_rank_panel_lists_the_rank_s_kernel_level_anomaly_first(store, jobs) -> None:
    panel = dict((p.key, p) for _, p in all_panels())["rank_anomalies"]
    names, rows = run_panel(store, panel.sql, jobs, job=jobs["names"]["slow"], rank=str(STRAGGLER))
    assert rows and rows[0][names.index("level")] == "kernel"
    assert "kernel_p90:" in rows[0][names.index("evidence")]
    assert {r[names.index("suspect")] for r in rows} == {f"rank:{STRAGGLER}"}
    _, healthy = run_panel(store, panel.sql, jobs, job=jobs["names"]["slow"], rank="3")
    assert healthy == []
