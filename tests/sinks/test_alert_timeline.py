"""The provisioned alert rules replayed minute by minute on an hour of faults (argus.alert_timeline).

Jobs diagnosed by the real detectors (a straggler that grows, closes and recurs; a second
job's straggler meanwhile; warn-only anomalies; transients; a quiet job; a 20-minute hang; a
lost rank; a declared checkpoint), their records written through the sink's path into chDB as
they would arrive, every rule of deploy/grafana's alerting file evaluated as Grafana does,
with ClickHouse unreachable from Grafana for two minutes (15-17) on the way.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from argus.alert_timeline import LAG_S, START, TimelineReport, rule_models, run_timeline, scenarios
from argus.sinks.grafana.queries import ACTIVE_S, RESENT_S

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "grafana" / "provisioning" / "alerting" / "argus.yaml"
MINUTES = 60
OUTAGE = (15.0, 17.0)


@pytest.fixture(scope="module")
def timeline(store: Any) -> tuple[TimelineReport, list[Any], list[Any]]:
    tag = uuid.uuid4().hex[:8]
    rules = rule_models(yaml.safe_load(RULES.read_text()))
    scs = scenarios(tag, MINUTES)
    return run_timeline(store, scs, rules, minutes=MINUTES, tag=tag, outage=OUTAGE), scs, rules


def test_every_stored_page_is_one_alert_instance_and_one_page(timeline) -> None:
    report, _, _ = timeline
    rules = {f.rule for f in report.faults}
    assert rules == {"argus-slow-rank", "argus-hang", "argus-lost-rank"}, report.faults
    for f in report.faults:
        assert (f.instances, f.pages) == (1, 1), f
    assert report.errors == []


def test_a_page_fires_within_its_pending_period_and_one_evaluation(timeline) -> None:
    report, _, rules = timeline
    by_uid = {r.uid: r for r in rules}
    for f in report.faults:
        r = by_uid[f.rule]
        assert f.fired is not None, f
        if OUTAGE[0] - 1 <= minute(f.confirmed) < OUTAGE[1]:  # no evaluation succeeds meanwhile
            assert minute(f.fired) == OUTAGE[1] + r.for_s / 60, f
        else:
            assert f.fire_delay_evals is not None and f.fire_delay_evals <= r.for_s / r.interval_s + 1, f


def minute(t: datetime) -> float:
    return (t - START).total_seconds() / 60


def test_a_page_resolves_within_its_stated_bound_after_the_anomaly_closes(timeline) -> None:
    """Bound: how long the rule still reads the anomaly as current (the suspect seen slow
    ACTIVE_S ago; a hang re-sent RESENT_S ago) + keepFiringFor + one evaluation."""
    report, _, rules = timeline
    by_uid = {r.uid: r for r in rules}
    closed = [f for f in report.faults if f.scenario != "warn only"]  # that one lasts the hour
    assert {f.scenario for f in closed} >= {"straggler", "hang", "lost rank"}
    for f in closed:
        r = by_uid[f.rule]
        hold = ACTIVE_S if f.rule == "argus-slow-rank" else RESENT_S
        bound = (hold + r.keep_firing_s + r.interval_s + LAG_S) / 60
        assert f.resolve_delay_min is not None and 0 < f.resolve_delay_min <= bound, (f, bound)


def test_nothing_fires_for_warn_info_transients_a_checkpoint_or_a_quiet_job(timeline) -> None:
    report, _, _ = timeline
    assert report.false_pages == []
    quiet = {"transients", "quiet", "checkpoint"}
    assert not [row for row in report.table if row["scenario"] in quiet and row["instances"]]


def test_the_straggler_that_recurs_stays_one_page_and_the_hangs_page_their_suspects(timeline) -> None:
    report, scs, _ = timeline
    grow = [r for r in report.table if r["scenario"] == "straggler" and r["rule"] == "argus-slow-rank"]
    assert len(grow[0]["fired_at"]) == 1 and len(grow[0]["resolved_at"]) == 1
    # hangs are deterministic: the injected suspect is what pages, nothing else
    for name in ("hang", "lost rank"):
        (sc,) = [s for s in scs if s.name == name]
        (e,) = sc.expected
        fired = [f for f in report.faults if f.scenario == name]
        assert [(f.rule, f.suspect) for f in fired] == [(e.rule, e.suspect)]
    assert not [d for d in report.detector["not_paged"] if "argus-hang" in d or "argus-lost-rank" in d]


def test_a_store_outage_neither_opens_nor_closes_a_page(timeline) -> None:
    """execErrState KeepLast: the straggler's page, firing before the outage, fires through it."""
    report, _, _ = timeline
    for row in report.table:
        for t in row["fired_at"] + row["resolved_at"]:
            assert not (OUTAGE[0] <= t < OUTAGE[1]), row  # the evaluations that failed
    grow = next(r for r in report.table if r["scenario"] == "straggler" and r["rule"] == "argus-slow-rank")
    assert grow["fired_at"][0] < OUTAGE[0] < OUTAGE[1] < grow["resolved_at"][0]


OLD_HANG_SQL = """SELECT job, cause, suspect, argMax(summary, time) AS detail, max(evidence['stalled_s']) AS stalled_s
FROM anomalies WHERE level = 'hang' AND $__timeFilter(time)
GROUP BY job, cause, suspect ORDER BY stalled_s DESC LIMIT 100"""


def test_the_harness_catches_a_label_that_changes_during_one_hang(store: Any) -> None:
    """The hang rule of main at 58fdf91 labelled its instance with the latest summary ("no step
    for N s"), re-stored every minute: on the same timeline one hang is many instances."""
    tag = uuid.uuid4().hex[:8]
    doc = yaml.safe_load(RULES.read_text())
    group = doc["groups"][0]
    old = next(r for r in group["rules"] if r["uid"] == "argus-hang")
    old = {**old, "keepFiringFor": "2m", "labels": {"severity": "page"}}
    old["data"] = [
        {**q, "model": {**q["model"], "rawSql": OLD_HANG_SQL}, "relativeTimeRange": {"from": 600, "to": 0}}
        if q["datasourceUid"] != "__expr__"
        else q
        for q in old["data"]
    ]
    rules = rule_models({"groups": [{**group, "rules": [old]}]})
    scs = [s for s in scenarios(tag, 30) if s.name == "hang"]
    report = run_timeline(store, scs, rules, minutes=30, tag=tag)
    (row,) = [r for r in report.table if r["scenario"] == "hang"]
    assert row["instances"] > 5 and len(row["fired_at"]) == row["instances"]
