"""Logs into the one engine (``argus diagnose --steps-csv``): a log read into step batches
by :mod:`argus.producers.csvlogs`, run through the same :class:`JobDiagnoser` as a live job,
and its costs scaled back to the log's own unit."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Unpack

import numpy as np

from argus.detectors import DiagnoserConfig, JobDiagnoser
from argus.producers.csvlogs import TYPICAL_MS, LogOptions, log_batches
from argus.schemas import Anomaly, StepBatch

__all__ = ["LogDiagnosis", "diagnose_log"]

_RATE_NAME = re.compile(r"(per_?s(ec(ond)?)?|/s|_ps|throughput|tflops|mfu|_s_per_gpu)$", re.IGNORECASE)
"""Column names that read as a rate (tokens_per_s, samples/s, tflops, mfu, …)."""


@dataclass(frozen=True)
class LogDiagnosis:
    """What the engine found in a log: the anomalies (windows as window indexes, costs in
    the log's own unit), the start label of every window, the transients per suspect (and
    the windows of the last few), and notes for the reader (a log too short to call
    anything)."""

    anomalies: list[Anomaly]
    labels: np.ndarray
    transients: dict[str, int]
    scale: float = 1.0
    notes: tuple[str, ...] = ()
    higher_is_better: bool = False
    transient_at: dict[str, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    transient_kinds: dict[str, str] = dataclasses.field(default_factory=dict)
    levels: dict[str, float] = dataclasses.field(default_factory=dict)
    """Per anomaly id, its suspect's slowdown as the log shows it (:func:`_levels`)."""

    def slowdown(self, a: Anomaly) -> float:
        """What the suspect adds to a typical step, as a fraction of it (unit-free): as the
        log shows it over the anomaly's window where it can (:func:`_levels`), else the
        engine's cost of a step."""
        level = self.levels.get(a.id)
        return level if level is not None else a.step_ms_added * self.scale / TYPICAL_MS

    def added(self, a: Anomaly) -> float:
        """What the suspect changes the value by, in the log's own unit: time added for a
        time; for a throughput (``higher_is_better``) the rate it loses, negative (a rank
        at 600 samples/s among ranks at 1,000: -400)."""
        f = self.slowdown(a)
        if not self.higher_is_better:
            return f * TYPICAL_MS / self.scale
        return -(self.scale / TYPICAL_MS) * f / (1 + f)

    def start(self, a: Anomaly) -> float:
        """The anomaly's first window, in the log's time or step unit."""
        return self.label(a.start_step)

    def end(self, a: Anomaly) -> float:
        """The anomaly's last window, in the log's time or step unit."""
        return self.label(a.end_step)

    def label(self, window: int) -> float:
        """A window index in the log's time or step unit."""
        return float(self.labels[min(max(window, 0), len(self.labels) - 1)])


def diagnose_log(
    rank: np.ndarray,
    t: np.ndarray,
    value: np.ndarray,
    *,
    by_time: bool,
    config: DiagnoserConfig | None = None,
    **options: Unpack[LogOptions],
) -> LogDiagnosis:
    """Diagnose a log (as :func:`log_batches` reads it) with the one engine
    (:class:`JobDiagnoser`), as a live job would be.

    A log of one phase (``metric`` names one, e.g. ``dataloader_ms``) has no step time to
    weigh a one-step spike against: such spikes stay transients, and only sustained
    findings are anomalies."""
    log = log_batches(rank, t, value, by_time=by_time, **options)
    batches, scale = log.batches, log.scale
    cfg = config or DiagnoserConfig()
    if log.phase is not None:
        cfg = dataclasses.replace(cfg, min_cost_frac=math.inf)
    diag = JobDiagnoser(batches[0].job, 0, cfg)
    final: dict[str, Anomaly] = {}
    for b in batches:
        for a in diag.step(b).anomalies:
            final[a.id] = a
    for a in diag.flush():
        final[a.id] = a
    out = [
        dataclasses.replace(a, step_ms_added=a.step_ms_added / scale, gpu_hours_lost=a.gpu_hours_lost / scale)
        for a in sorted(final.values(), key=lambda a: (a.start_step, a.suspect))
    ]
    needed = cfg.warmup_steps + cfg.iter_min_steps + cfg.min_steps
    few = f"{len(batches)} window(s): too few for the peers' test (it needs about {needed})"
    notes: tuple[str, ...] = (
        (
            f"{few}; what is found is each rank's change against its own past"
            if cfg.change_points
            else f"{few}: too few to call anything",
        )
        if len(batches) < needed
        else ()
    )
    metric = options.get("metric", "")
    if not options.get("higher_is_better", False) and _RATE_NAME.search(metric or ""):
        notes += (
            f"{metric!r} looks like a throughput: read as a time, a slow rank's lower values look "
            "fast; pass --higher-is-better if higher is better",
        )
    higher = bool(options.get("higher_is_better", False))
    state = diag.state
    return LogDiagnosis(
        out,
        log.labels,
        dict(state.transients),
        scale,
        notes,
        higher,
        dict(state.transient_at),
        dict(state.transient_kinds),
        _levels(batches, out),
    )


def _levels(batches: list[StepBatch], anomalies: list[Anomaly]) -> dict[str, float]:
    """Each anomaly's slowdown as the log shows it: over its window, the mean of its ranks'
    values over the median of the other ranks' in each window, less one. Uncapped, where
    the engine's cost of a step stops at the step (a worker 6x slower read +100 %, and
    +67 % where its change's size is clipped). Not for the job's own anomalies (against its
    usual level) nor for slow every k-th step (what a slow step adds: the engine's)."""
    at = {b.step: b for b in batches}
    out: dict[str, float] = {}
    for a in anomalies:
        if a.suspect_kind == "job" or a.evidence.get("period_steps") or not a.ranks:
            continue
        ratios = []
        for w in range(a.start_step, a.end_step + 1):
            b = at.get(w)
            if b is None:
                continue
            mine = np.isin(b.columns["rank"], a.ranks)
            if mine.any() and (~mine).any():
                ratios.append(float(np.mean(b.step_ms[mine]) / np.median(b.step_ms[~mine])))
        if ratios and np.isfinite(ratios).all():
            out[a.id] = max(float(np.mean(ratios)) - 1.0, 0.0)
    return out
