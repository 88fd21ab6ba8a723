"""Every provisioned alert rule replayed on a timeline of faults, against the real store.

Shared by ``tests/sinks/test_alert_timeline.py`` and ``bench/alerts.py``. A timeline is a
set of scenarios, each a simulated job diagnosed by the real detectors as the stream worker
runs them (:class:`detectors.JobDiagnoser` per step, :class:`streams.hangs.HangTracker` with
its one-minute re-send schedule for hangs); what the worker would publish is written through
the sink's own path (``sinks.to_arrow`` and ``insert_arrow`` with the sink's deduplication
token) into ClickHouse at the time it would arrive. Every rule of the provisioning file is
then evaluated at each tick of its group's interval exactly as Grafana would
(:mod:`argus.sinks.grafana.evaluation`: its time range, reduce, threshold with hysteresis,
``for``, ``keepFiringFor``, ``noDataState``, ``execErrState``, missing series), and the
alert instances are checked against what was injected: one instance per fault that must
page, nothing else firing.

The timeline lies in 2030 so that it shares a store with other data without meeting it
(every rule's query is bounded by its time range).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from argus.detectors import JobDiagnoser
from argus.producers.simulator import (
    COMPUTE_STRAGGLER,
    GC_PAUSE,
    ClusterSimulator,
    Fault,
    HangScenario,
    HangSimulator,
    Layout,
    PhaseTimes,
)
from argus.schemas import Anomaly
from argus.sinks import Store, to_arrow
from argus.sinks.grafana.evaluation import EvaluationError, RuleEvaluator, RuleModel, numbers
from argus.sinks.grafana.macros import expand
from argus.sinks.store import dedup_settings
from argus.streams.hangs import HangTracker

__all__ = [
    "LAG_S",
    "START",
    "Expected",
    "FaultResult",
    "Scenario",
    "TimelineReport",
    "hang_job",
    "rule_models",
    "run_timeline",
    "scenarios",
    "step_job",
]

START = datetime(2030, 6, 1, tzinfo=UTC)
STEP_SCALE = 24.0
"""Simulated phases ×24: a step of about 10 s, a large model's (the detectors count steps)."""
LAG_S = 5.0
"""From a record's time to its row in the store (worker, Kafka, sink batch)."""
LAYOUT = Layout(dp=4, tp=8, pp=1)


@dataclass(frozen=True)
class Expected:
    """A fault that must page: the rule, the job and the suspect its instance names."""

    rule: str
    job: str
    suspect: str


@dataclass
class Scenario:
    """One job on the timeline: what the worker publishes, when (ns), and what must page."""

    name: str
    job: str
    what: str
    records: list[tuple[int, Any]] = field(default_factory=list)
    expected: list[Expected] = field(default_factory=list)


def _phases() -> PhaseTimes:
    base = PhaseTimes()
    return dataclasses.replace(
        base,
        **{
            f.name: getattr(base, f.name) * STEP_SCALE
            for f in dataclasses.fields(base)
            if isinstance(getattr(base, f.name), float)
        },
    )


def _ns(t: datetime) -> int:
    return int(t.timestamp()) * 10**9


def step_job(
    name: str,
    job: str,
    what: str,
    faults: Sequence[Fault],
    *,
    steps: int,
    seed: int,
    pages: Iterable[str] = (),
) -> Scenario:
    """A job whose steps the real diagnosis reads step by step: its step summaries and every
    anomaly version it emits, at the step's end (its last versions at the job's end)."""
    sim = ClusterSimulator(
        LAYOUT,
        seed=seed,
        job=job,
        faults=faults,
        start_ns=_ns(START),
        checkpoint_every=0,
        phases=_phases(),
    )
    diagnoser = JobDiagnoser(job)
    sc = Scenario(name, job, what, expected=[Expected("argus-slow-rank", job, s) for s in pages])
    end = _ns(START)
    for s in sim.run(steps):
        result = diagnoser.step(s.batch)
        end = int(s.batch["end_ns"].max())
        sc.records.append((end, result.summary))
        sc.records.extend((end, a) for a in result.anomalies)
    sc.records.extend((end, a) for a in diagnoser.flush())
    return sc


def hang_job(
    name: str,
    job: str,
    what: str,
    kind: str,
    *,
    at_s: float,
    stop_s: float,
    until_s: float,
    pause_s: float = 90.0,
    tick_s: float = 5.0,
) -> Scenario:
    """A job whose heartbeats the worker's hang stage reads every ``tick_s``: the anomalies it
    sends (when first named, then every minute), until the job is stopped at ``stop_s``."""
    sim = HangSimulator(
        LAYOUT,
        HangScenario(kind, at_s=at_s, rank=13, pause_s=pause_s),
        job=job,
        start_ns=_ns(START),
        step_s=STEP_SCALE * 0.42,
    )
    labels = sim.labels
    rule = {"hang": "argus-hang", "lost_rank": "argus-lost-rank"}
    sc = Scenario(name, job, what, expected=[Expected(rule[lab.cause], job, lab.suspect) for lab in labels])
    tracker = HangTracker()
    stop_ns = _ns(START) + int(stop_s * 1e9)
    for now_ns, beats in sim.ticks(tick_s, until_s):
        if beats and now_ns <= stop_ns:
            tracker.observe([(b, None) for b in beats])
        for anomaly, _first in tracker.due(now_ns, now_ns / 1e9):
            sc.records.append((now_ns, anomaly))
            tracker.mark_sent(anomaly.id, now_ns / 1e9)
    return sc


def scenarios(tag: str, minutes: int = 60) -> list[Scenario]:
    """The timeline's jobs (``tag`` makes their names unique): a straggler that grows, closes
    and recurs; a second job's straggler at the same time; warn-only anomalies; transients;
    a quiet job; a hang of 20 minutes; a lost rank; a declared checkpoint. A timeline shorter
    than 60 minutes keeps the jobs whose faults fit in it."""
    steps = int(minutes * 60 / 10.0)
    cs = COMPUTE_STRAGGLER
    out = [
        step_job(
            "straggler",
            f"llm/grow-{tag}",
            "rank 5 slow 15 min, well 5 min, slow again 10 min",
            [Fault(cs, 40, 90, ranks=(5,)), Fault(cs, 160, 60, ranks=(5,))],
            steps=steps,
            seed=1,
            pages=["rank:5"],
        ),
        step_job(
            "second job",
            f"vision/other-{tag}",
            "rank 12 slow 15 min, meanwhile",
            [Fault(cs, 60, 90, ranks=(12,))],
            steps=steps,
            seed=2,
            pages=["rank:12"],
        ),
        step_job(
            "warn only",
            f"warn-{tag}",
            "rank 3 slow from the start (persistent), rank 7 one GC pause",
            [Fault(cs, 0, steps, ranks=(3,)), Fault(GC_PAUSE, 100, 1, ranks=(7,))],
            steps=steps,
            seed=3,
        ),
        step_job(
            "transients",
            f"blips-{tag}",
            "rank 9 slow in single steps",
            [Fault(cs, s, 1, ranks=(9,)) for s in (80, 150, 230)],
            steps=steps,
            seed=4,
        ),
        step_job("quiet", f"quiet-{tag}", "no fault", [], steps=steps, seed=5),
    ]
    if minutes >= 30:
        out.append(
            hang_job(
                "hang",
                f"llm/hang-{tag}",
                "rank 13 never enters its all-reduce at 5 min; job stopped at 25 min",
                "collective_hang",
                at_s=300,
                stop_s=1500,
                until_s=minutes * 60,
            )
        )
        out.append(
            hang_job(
                "checkpoint",
                f"ckpt-{tag}",
                "declared 10-minute checkpoint at 8 min",
                "declared_checkpoint",
                at_s=480,
                stop_s=minutes * 60,
                until_s=minutes * 60,
                pause_s=600,
            )
        )
    if minutes >= 45:
        out.append(
            hang_job(
                "lost rank",
                f"lost-{tag}",
                "rank 13's process dies at 28 min; job stopped at 38 min",
                "process_death",
                at_s=1680,
                stop_s=2280,
                until_s=minutes * 60,
            )
        )
    return out


def rule_models(doc: dict[str, Any]) -> list[RuleModel]:
    """Every rule of a provisioning file (``alert_rules()`` or the YAML read back)."""
    return [RuleModel.from_file(g, r) for g in doc["groups"] for r in g["rules"]]


@dataclass
class FaultResult:
    """What a rule did about one stored anomaly it must page on (a version of severity page)."""

    rule: str
    scenario: str
    anomaly: str
    suspect: str
    instances: int
    pages: int
    confirmed: datetime
    closed: datetime
    fired: datetime | None
    resolved: datetime | None
    fire_delay_evals: int | None
    resolve_delay_min: float | None


@dataclass
class TimelineReport:
    """The paging contract, per stored page anomaly (``faults``) and per rule × scenario
    (``table``); instances firing for anything else (``false_pages``); and how the stored
    anomalies compare with what was injected (``detector``: faults stored without a page,
    page anomalies at no injected fault: the detectors' part, not the rules')."""

    faults: list[FaultResult]
    table: list[dict[str, Any]]
    false_pages: list[dict[str, str]]
    detector: dict[str, list[str]]
    evaluations: int
    errors: list[str]

    def summary(self) -> dict[str, Any]:
        """The headline figures (``bench/alerts.py``'s last line)."""
        delays = [f.fire_delay_evals for f in self.faults if f.fire_delay_evals is not None]
        resolves = [f.resolve_delay_min for f in self.faults if f.resolve_delay_min is not None]
        return {
            "faults": len(self.faults),
            "missed": sum(f.instances == 0 for f in self.faults),
            "alert_instances_per_fault_max": max((f.instances for f in self.faults), default=0),
            "pages_per_fault_max": max((f.pages for f in self.faults), default=0),
            "false_pages": len(self.false_pages),
            "fire_delay_evals_max": max(delays, default=None),
            "resolve_delay_min_max": round(max(resolves), 1) if resolves else None,
            "unresolved": sum(f.resolved is None for f in self.faults),
            "evaluations": self.evaluations,
            "query_errors": len(self.errors),
            "detector_not_paged": len(self.detector["not_paged"]),
            "detector_unexpected_pages": len(self.detector["unexpected"]),
        }


def _insert(store: Store, records: list[Any], token: str) -> None:
    by_type: dict[type, list[Any]] = defaultdict(list)
    for r in records:
        by_type[type(r)].append(r)
    for kind, recs in by_type.items():
        table, data = to_arrow(recs)
        store.insert_arrow(table, data, settings=dedup_settings(f"{token}:{table}:{kind.__name__}"))


def _reads(rule: str, anomaly: Anomaly) -> bool:
    """Whether ``rule`` selects versions of this kind of anomaly (whatever their severity)."""
    if rule == "argus-slow-rank":
        return anomaly.level != "hang"
    return (
        anomaly.level == "hang"
        and {"argus-hang": "hang", "argus-lost-rank": "lost_rank"}.get(rule) == anomaly.cause
    )


def run_timeline(
    store: Store,
    scs: Sequence[Scenario],
    rules: Sequence[RuleModel],
    *,
    minutes: int,
    tag: str,
    outage: tuple[float, float] | None = None,
    progress: Callable[[int], None] | None = None,
) -> TimelineReport:
    """Write the scenarios' records as they arrive and evaluate ``rules`` every interval.

    ``outage``: minutes ``[a, b)`` during which every query fails (the store unreachable from
    Grafana): ``execErrState`` decides what the instances do meanwhile.
    """
    pending = sorted(
        ((t + int(LAG_S * 1e9), i, rec) for sc in scs for i, (t, rec) in enumerate(sc.records)),
        key=lambda x: (x[0], x[1]),
    )
    evaluators = {r.uid: RuleEvaluator(r) for r in rules}
    interval = min(r.interval_s for r in rules)
    if any(r.interval_s != interval for r in rules):
        raise ValueError("one evaluation interval for every rule expected (one rule group)")
    ticks = int(minutes * 60 / interval)
    errors: list[str] = []
    at = 0
    for k in range(1, ticks + 1):
        now = START + timedelta(seconds=k * interval)
        batch = []
        while at < len(pending) and pending[at][0] <= _ns(now):
            batch.append(pending[at][2])
            at += 1
        if batch:
            _insert(store, batch, f"alert-timeline:{tag}:{k}")
        for rule in rules:
            result: dict[Any, float] | Exception
            if outage and outage[0] <= k * interval / 60 < outage[1]:
                result = EvaluationError("store unreachable (simulated outage)")
            else:
                start, end = rule.time_range(now)
                try:
                    table: pa.Table = store.query_arrow(expand(rule.sql, start=start, end=end, interval_s=1))
                    result = numbers(table)
                except Exception as exc:  # a query error is Grafana's Error result, not ours to raise
                    errors.append(f"{rule.uid} at {now:%H:%M}: {exc}")
                    result = exc
            evaluators[rule.uid].evaluate(now, result)
        if progress is not None:
            progress(k)
    return _report(scs, evaluators, interval, ticks, errors)


def _minute(t: datetime | None) -> float | None:
    return None if t is None else round((t - START).total_seconds() / 60, 1)


def _when(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9 + LAG_S, UTC)


def _report(
    scs: Sequence[Scenario],
    evaluators: dict[str, RuleEvaluator],
    interval: float,
    ticks: int,
    errors: list[str],
) -> TimelineReport:
    fired = [(uid, inst) for uid, ev in evaluators.items() for inst in ev.instances.values() if inst.fired]
    faults, paged_ids = [], set()
    for sc in scs:
        for uid in evaluators:
            versions: dict[str, list[tuple[int, Anomaly]]] = defaultdict(list)
            for t, rec in sc.records:
                if isinstance(rec, Anomaly) and _reads(uid, rec):
                    versions[rec.id].append((t, rec))
            for aid, vs in versions.items():
                pages = [t for t, rec in vs if rec.severity == "page"]
                if not pages:
                    continue
                paged_ids.add((uid, aid))
                mine = [i for u, i in fired if u == uid and i.labels.get("anomaly") == aid]
                confirmed, closed = _when(min(pages)), _when(max(t for t, _ in vs))
                first = min((t for i in mine for t in i.fired), default=None)
                resolved = (
                    None
                    if any(i.firing for i in mine)
                    else max((t for i in mine for t in i.resolved), default=None)
                )
                faults.append(
                    FaultResult(
                        uid,
                        sc.name,
                        aid,
                        vs[0][1].suspect,
                        len(mine),
                        sum(len(i.fired) for i in mine),
                        confirmed,
                        closed,
                        first,
                        resolved,
                        math.ceil((first - confirmed).total_seconds() / interval) if first else None,
                        (resolved - closed).total_seconds() / 60 if resolved else None,
                    )
                )
    false_pages = [
        {"rule": uid, **i.labels} for uid, i in fired if (uid, i.labels.get("anomaly")) not in paged_ids
    ]
    stored = {(f.rule, sc.job, f.suspect) for sc in scs for f in faults if f.scenario == sc.name}
    wanted = {(e.rule, e.job, e.suspect) for sc in scs for e in sc.expected}
    detector = {
        "not_paged": sorted(f"{r} {j} {s}" for r, j, s in wanted - stored),
        "unexpected": sorted(f"{r} {j} {s}" for r, j, s in stored - wanted),
    }
    table = []
    for uid, ev in evaluators.items():
        for sc in scs:
            insts = [i for i in ev.instances.values() if i.fired and i.labels.get("job") == sc.job]
            table.append(
                {
                    "rule": uid,
                    "scenario": sc.name,
                    "fired_at": [_minute(t) for i in insts for t in i.fired],
                    "resolved_at": [_minute(t) for i in insts for t in i.resolved],
                    "instances": len(insts),
                }
            )
    return TimelineReport(faults, table, false_pages, detector, ticks * len(evaluators), errors)
