"""A provisioned Grafana alert rule evaluated as Grafana evaluates it (pure: no clock, no I/O).

No Grafana server runs here, so the alert-timeline harness (:mod:`argus.alert_timeline`)
evaluates every rule of ``provisioning/alerting/argus.yaml`` with this model: the rule's
query over its ``relativeTimeRange`` (the caller runs it, e.g. on chDB), then the reduce and
threshold expressions, then the instance state machine. It models Grafana v12.1.2, the
release docker-compose pins (the first whose file provisioning reads ``keepFiringFor`` and
``missing_series_evals_to_resolve``: grafana#109710 on release-12.1.2; ``keepFiringFor`` and
the Recovering state came in v12.0, grafana#103248). What it follows was read in
github.com/grafana/grafana, ``pkg/services/ngalert/state/state.go`` (``resultNormal``,
``resultAlerting``, ``resultError``, ``resultNoData``, ``resultKeepLast``, ``transition``)
and ``pkg/services/ngalert/state/manager.go`` (``setNextStateForRule``,
``setNextStateForAll``, ``processMissingSeriesStates``, ``stateIsStale``), in the copies a
code index holds of the v12 line (their commits are not tagged there: where a later release
changes these functions, this model has to follow):

- **Instances** (``state/manager.go`` ``setNextStateForRule``): one per label set of the
  condition's result; its identity (cache id) is the rule's labels plus the result's labels.
  A table frame without a time column becomes numbers: string columns are labels, the one
  numeric column the value (two rows with one label set are an evaluation error in SSE).
- **Reduce** ``last`` of a number is the number itself; **threshold** ``gt`` with an
  ``unloadEvaluator`` is Grafana's hysteresis: an instance already firing keeps its
  condition true until the value meets the unload evaluator (``lt``). Which instances count
  as firing there (the scheduler's loaded dimensions) is taken as Alerting and Recovering;
  the shipped rules' values are 0 or 1, for which either reading gives the same result.
- **State** (``state/state.go`` ``resultAlerting`` / ``resultNormal``): condition true:
  Normal → Pending when ``for`` > 0, else Alerting; Pending → Alerting once
  ``now - StartsAt >= for``; Recovering → Alerting (no Pending). Condition false: Alerting →
  Recovering when ``keepFiringFor`` > 0 (still firing for the Alertmanager), Recovering →
  Normal once ``now - StartsAt(recovering) >= keepFiringFor``, else → Normal.
- **No data** (zero rows) with ``noDataState`` OK / Alerting / KeepLast and **errors** with
  ``execErrState`` OK / Alerting / KeepLast apply to *every* existing instance of the rule
  (``setNextStateForAll``); with no instance yet, one instance with the rule's labels only is
  created. KeepLast keeps Alerting and Normal, and Pending moves on once ``for`` passed
  (``resultKeepLast``). ``Error`` / ``NoData`` states create that instance in that state.
- **Missing series** (``manager.go`` ``processMissingSeriesStates``, ``stateIsStale``): an
  instance absent from a result is resolved (Normal, reason MissingSeries) once it has been
  missing ``missing_series_evals_to_resolve`` intervals (default 2; 1 for Error/NoData).

Firing, as the Alertmanager sees it, is Alerting or Recovering; a *page* is one firing
period of one instance.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa

from .._errors import SinkError

__all__ = [
    "ALERTING",
    "ERROR",
    "NODATA",
    "NORMAL",
    "PENDING",
    "RECOVERING",
    "EvaluationError",
    "Instance",
    "RuleEvaluator",
    "RuleModel",
    "numbers",
    "parse_duration",
]

NORMAL, PENDING, ALERTING, RECOVERING, NODATA, ERROR = (
    "Normal",
    "Pending",
    "Alerting",
    "Recovering",
    "NoData",
    "Error",
)
FIRING = frozenset({ALERTING, RECOVERING})
DEFAULT_MISSING_SERIES_EVALS = 2

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class EvaluationError(SinkError):
    """The rule's query or expressions failed (Grafana: the evaluation's result is Error)."""


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus-style duration as the rules use it (``0s``, ``5m``, ``1h30m``)."""
    m = _DURATION.match(text.strip())
    if text.strip() in ("", "0"):
        return 0.0
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    d, h, mi, s = (int(g or 0) for g in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


@dataclass(frozen=True)
class RuleModel:
    """What of a provisioned rule its evaluation depends on."""

    uid: str
    title: str
    sql: str
    from_s: float
    to_s: float
    interval_s: float
    for_s: float
    keep_firing_s: float
    no_data_state: str
    exec_err_state: str
    missing_series_evals: int
    evaluator: tuple[str, float]
    unload: tuple[str, float] | None
    reducer: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]

    @classmethod
    def from_file(cls, group: Mapping[str, Any], rule: Mapping[str, Any]) -> RuleModel:
        """The rule as a provisioning file (v1) states it, within its group."""
        data = {q["refId"]: q for q in rule["data"]}
        query = next(q for q in rule["data"] if q.get("datasourceUid") != "__expr__")
        cond = data[rule["condition"]]["model"]
        if cond.get("type") != "threshold":
            raise ValueError(f"{rule['uid']}: the condition must be a threshold expression")
        reduce = data[cond["expression"]]["model"]
        if reduce.get("type") != "reduce" or reduce.get("expression") != query["refId"]:
            raise ValueError(f"{rule['uid']}: the threshold must read a reduce of the query")
        (c,) = cond["conditions"]
        ev = c["evaluator"]
        unload = c.get("unloadEvaluator")
        rel = query.get("relativeTimeRange", {})
        return cls(
            uid=rule["uid"],
            title=rule["title"],
            sql=query["model"]["rawSql"],
            from_s=float(rel.get("from", 600)),
            to_s=float(rel.get("to", 0)),
            interval_s=parse_duration(group["interval"]),
            for_s=parse_duration(str(rule.get("for", "0s"))),
            keep_firing_s=parse_duration(str(rule.get("keepFiringFor", "0s"))),
            no_data_state=rule.get("noDataState", "NoData"),
            exec_err_state=rule.get("execErrState", "Error"),
            missing_series_evals=int(
                rule.get("missing_series_evals_to_resolve", DEFAULT_MISSING_SERIES_EVALS)
            ),
            evaluator=(ev["type"], float(ev["params"][0])),
            unload=(unload["type"], float(unload["params"][0])) if unload else None,
            reducer=reduce.get("reducer", "last"),
            labels=dict(rule.get("labels", {})),
            annotations=dict(rule.get("annotations", {})),
        )

    def time_range(self, now: datetime) -> tuple[datetime, datetime]:
        """The query's time range at ``now`` (``relativeTimeRange``)."""
        return now - timedelta(seconds=self.from_s), now - timedelta(seconds=self.to_s)


def _compare(op: str, value: float, threshold: float) -> bool:
    if math.isnan(value):
        return False
    return {
        "gt": value > threshold,
        "lt": value < threshold,
        "ge": value >= threshold,
        "le": value <= threshold,
        "eq": value == threshold,
        "ne": value != threshold,
    }[op]


def numbers(table: pa.Table) -> dict[tuple[tuple[str, str], ...], float]:
    """A table frame (no time column) as Grafana's server-side expressions read it: one number
    per row, labelled by the row's string columns. Raises :class:`EvaluationError` where
    Grafana's evaluation fails (no or several numeric columns, one label set twice)."""
    strings = [f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    values = [
        f.name
        for f in table.schema
        if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
    ]
    others = set(table.column_names) - set(strings) - set(values)
    if others:
        raise EvaluationError(f"columns neither string nor numeric: {sorted(others)}")
    if len(values) != 1:
        raise EvaluationError(f"one numeric column expected, got {values}")
    out: dict[tuple[tuple[str, str], ...], float] = {}
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    for i in range(table.num_rows):
        key = tuple(sorted((name, str(cols[name][i])) for name in strings))
        if key in out:
            raise EvaluationError(f"duplicate results with labels {dict(key)}")
        v = cols[values[0]][i]
        out[key] = float("nan") if v is None else float(v)
    return out


@dataclass
class Instance:
    """One alert instance: its labels (identity), state, and when it changed."""

    labels: dict[str, str]
    state: str = NORMAL
    starts_at: datetime | None = None
    last_eval: datetime | None = None
    value: float = float("nan")
    fired: list[datetime] = field(default_factory=list)  # each start of a firing period
    resolved: list[datetime] = field(default_factory=list)  # each end of one

    @property
    def firing(self) -> bool:
        return self.state in FIRING


class RuleEvaluator:
    """The state of one rule's instances across evaluations (Grafana's state cache)."""

    def __init__(self, rule: RuleModel) -> None:
        self.rule = rule
        self.instances: dict[tuple[tuple[str, str], ...], Instance] = {}

    def _key(self, result_labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({**self.rule.labels, **dict(result_labels)}.items()))

    def evaluate(
        self, now: datetime, result: Mapping[tuple[tuple[str, str], ...], float] | Exception
    ) -> None:
        """Apply one evaluation at ``now``: the query's numbers (:func:`numbers`) or its error."""
        if isinstance(result, Exception):
            self._all(now, "error")
            return
        if not result:
            self._all(now, "nodata")
            return
        seen = set()
        for labels, value in result.items():
            key = self._key(labels)
            seen.add(key)
            inst = self.instances.get(key)
            if inst is None:
                inst = self.instances[key] = Instance(dict(key))
            inst.value = value
            inst.last_eval = now
            self._transition(inst, now, self._condition(inst, value))
        self._missing(now, seen)

    def _condition(self, inst: Instance, value: float) -> bool:
        op, threshold = self.rule.evaluator
        if inst.firing and self.rule.unload is not None:  # hysteresis: loaded dimensions
            uop, uthreshold = self.rule.unload
            return not _compare(uop, value, uthreshold)
        return _compare(op, value, threshold)

    def _all(self, now: datetime, kind: str) -> None:
        mode = self.rule.exec_err_state if kind == "error" else self.rule.no_data_state
        own = ERROR if kind == "error" else NODATA
        if not self.instances or mode == own:
            key = self._key(())
            inst = self.instances.get(key)
            if inst is None:
                inst = self.instances[key] = Instance(dict(key))
            inst.last_eval = now
            self._set(inst, now, self._special(inst, now, mode, own))
            self._missing(now, {key})
            return
        for inst in self.instances.values():
            inst.last_eval = now
            self._set(inst, now, self._special(inst, now, mode, own))

    def _special(self, inst: Instance, now: datetime, mode: str, own: str) -> str:
        if mode == "Alerting":
            return self._next(inst, now, True)
        if mode in ("OK", "Normal"):
            return self._next(inst, now, False)
        if mode == "KeepLast":
            if inst.state == PENDING:
                return self._next(inst, now, True)
            if inst.state == ALERTING:
                return ALERTING
            return self._next(inst, now, False) if inst.state != NORMAL else NORMAL
        return own

    def _next(self, inst: Instance, now: datetime, condition: bool) -> str:
        r = self.rule
        if condition:
            if inst.state == ALERTING:
                return ALERTING
            if inst.state == PENDING:
                assert inst.starts_at is not None
                return ALERTING if (now - inst.starts_at).total_seconds() >= r.for_s else PENDING
            return PENDING if inst.state != RECOVERING and r.for_s > 0 else ALERTING
        if inst.state == RECOVERING:
            assert inst.starts_at is not None
            return NORMAL if (now - inst.starts_at).total_seconds() >= r.keep_firing_s else RECOVERING
        if inst.state == ALERTING and r.keep_firing_s > 0:
            return RECOVERING
        return NORMAL

    def _transition(self, inst: Instance, now: datetime, condition: bool) -> None:
        self._set(inst, now, self._next(inst, now, condition))

    def _set(self, inst: Instance, now: datetime, state: str) -> None:
        was = inst.state
        if state == was:
            return
        inst.state = state
        inst.starts_at = now
        if state in FIRING and was not in FIRING:
            inst.fired.append(now)
        if state not in FIRING and was in FIRING:
            inst.resolved.append(now)

    def _missing(self, now: datetime, seen: set[tuple[tuple[str, str], ...]]) -> None:
        for key, inst in self.instances.items():
            if key in seen or inst.last_eval is None or inst.state == NORMAL:
                continue
            evals = 1 if inst.state in (ERROR, NODATA) else self.rule.missing_series_evals
            if (now - inst.last_eval).total_seconds() >= evals * self.rule.interval_s:
                self._set(inst, now, NORMAL)

    def firing(self) -> list[Instance]:
        """The instances firing now (Alerting or Recovering)."""
        return [i for i in self.instances.values() if i.firing]
