"""The facade: one call per completed step of a job, state kept as small plain data.

A stream worker keeps one :class:`JobState` per (job, run) (e.g. in a Faust table, via
:meth:`JobState.to_dict` / :meth:`JobState.from_dict`) and calls :func:`diagnose_step` (or
:meth:`JobDiagnoser.step`) once per completed step with the step's ``StepBatch``::

    diag = JobDiagnoser("job-1", run=0)
    for batch in steps:
        result = diag.step(batch, kernels=fetch_kernel_stats)
        publish(result.anomalies)        # schemas.Anomaly records
    publish(diag.flush())                # end of job: close what is open

Progressive: iteration level (job step time) and cross-rank level (every rank within its
pp stage) run every step; kernel statistics and stacks are asked for (through the
optional ``kernels``/``stacks`` callables) only for confirmed rank suspects and a few
healthy peers of their stage. Anomalies are emitted when an episode is confirmed (four
sightings, or one costly one-off stall), again every ``update_every`` steps while it lasts
(so a job that simply ends leaves its anomaly's window right), and, with the same id and its
final window and cost, when it closes. Ids hash job, run, cause, suspect and onset step, so a
replay emits the same ids.

This module is the entry point only: it composes the engine's parts, each its own module.
:mod:`~detectors._cross_stage` is the cross-rank half of a step (stateless);
:mod:`~detectors._job_level` the iteration level of the temporal half (the job's baseline,
its warm-up, change points); :mod:`~detectors.episodes` the life of an episode (open,
sight, confirm, escalate, close, recur) over :mod:`~detectors._routing` (which episode a
finding is a sighting of) and :mod:`~detectors._baselines` (what is the job's baseline,
when a fault is confirmed and when it pages); :mod:`~detectors._state` the job's state
(``Episode``, ``JobState``, versioned ``to_dict``/``from_dict``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from argus.schemas import Anomaly, KernelStats, StackSample, StepBatch, StepFindings, StepSummary

from ._baselines import count_flags
from ._config import DiagnoserConfig
from ._cross_stage import check_shape, cross_rank_stage
from ._finding import Finding, anomaly_id
from ._job_level import job_level, with_changes
from ._state import EPISODE_RENAMES, STATE_VERSION, Episode, JobState
from .deepen import Deepening, deepen_ranks
from .episodes import Deepen, deepen_late, flush, forget_stale, refresh, sightings, unsighted
from .iteration import IterationVerdict

__all__ = [
    "EPISODE_RENAMES",
    "STATE_VERSION",
    "Deepen",
    "Episode",
    "JobDiagnoser",
    "JobState",
    "KernelSource",
    "StackSource",
    "StepFindings",
    "StepResult",
    "anomaly_id",
    "apply_findings",
    "check_shape",
    "diagnose",
    "diagnose_step",
    "refresh",
    "step_findings",
]

KernelSource = Callable[[Sequence[int]], Mapping[int, KernelStats]]
"""Given ranks, their KernelStats for the step being diagnosed (missing ranks allowed)."""
StackSource = Callable[[Sequence[int]], Mapping[int, StackSample]]
"""Given ranks, their StackSample for the step being diagnosed (missing ranks allowed)."""


@dataclass(frozen=True)
class StepResult:
    """What one step produced: anomalies to publish (new or closed episodes), every finding
    of the step (confirmed or not), the step's summary record and the iteration verdict
    (transients are counted in the state: ``JobState.transients``)."""

    anomalies: tuple[Anomaly, ...]
    findings: tuple[Finding, ...]
    summary: StepSummary
    iteration: IterationVerdict


def step_findings(
    batch: StepBatch, config: DiagnoserConfig | None = None, *, missing: Sequence[int] = ()
) -> StepFindings:
    """The cross-rank half of a step's diagnosis: needs the whole step, keeps no state.

    ``missing``: ranks the job expected that never reported this step (for the summary).
    """
    return cross_rank_stage(batch, config or DiagnoserConfig(), missing)[0]


def apply_findings(
    state: JobState,
    sf: StepFindings,
    config: DiagnoserConfig | None = None,
    *,
    deepen: Deepen | None = None,
) -> StepResult:
    """The temporal half: fold one step's findings into the job's state (iteration baseline, episodes) and
    return the anomalies to publish; updates ``state`` in place. Steps must come in order; ``deepen`` adds
    kernel/stack evidence when an episode is confirmed (and, while none explains it, on each of the next
    ``deepen_steps`` steps: sketches that come late still deepen it, and the anomaly is sent again,
    ``level="kernel"``; steps without any data for the suspect do not count).

    Severity (docs/architecture.md#engine): a sighting becomes an anomaly once it is sustained (seen in
    ``min_steps`` steps, gaps up to ``close_after`` bridged) or, for a one-off stall, once
    it cost at least ``min_cost_frac`` of a step; otherwise it closes as a transient. On a
    step the whole job is far slower than its baseline (evaluation, checkpoint, warm-up),
    rank findings open no episode, but a confirmed one still open goes on (its rank still
    stands out). A rank already part of an open host or link episode adds to it, so a host
    fault stays one anomaly. An episode that starts with the job is a persistent straggler:
    one anomaly of severity ``warn``, closed only after ``persistent_close_after`` steps
    without a sighting.

    ``sf.residuals`` (every rank's own work, when the change points are on) feed
    each rank's change-point test: an open change is a sighting of its common cause
    (:mod:`detectors.common_cause`), confirmed at once with the change's onset; in a job
    of fewer than ``small_job`` ranks a rank that stands out only against its few peers,
    not against its own past, is no sighting.
    """
    cfg = config or DiagnoserConfig()
    verdict, findings, glob = job_level(state, sf, cfg)
    if sf.residuals is not None:
        findings = with_changes(state, sf, findings, sf.residuals, glob, cfg)
    out, seen = sightings(state, sf, findings, verdict, cfg, deepen)
    if not glob:
        count_flags(state, sf, findings, cfg)
    if deepen is not None:  # sketches that came after the confirming step
        out += deepen_late(state, sf.step, deepen)
    if not glob:  # a global step is no evidence either way
        out += unsighted(state, seen, set(sf.weak), verdict, cfg)
    forget_stale(state, cfg)
    state.last_step = sf.step
    state.last_end_ns = max(state.last_end_ns, sf.end_ns)
    state.n_ranks = max(state.n_ranks, sf.n_ranks)
    return StepResult(tuple(out), tuple(findings), sf.summary, verdict)


def diagnose_step(
    state: JobState,
    batch: StepBatch,
    config: DiagnoserConfig | None = None,
    *,
    kernels: KernelSource | None = None,
    stacks: StackSource | None = None,
    names: Mapping[int, str] | Sequence[str] | None = None,
) -> StepResult:
    """Diagnose one completed step; updates ``state`` in place.

    The composition of :func:`step_findings` (cross-rank, stateless) and
    :func:`apply_findings` (temporal, stateful), with kernel and stack evidence for newly
    confirmed suspects.

    Args:
        state: the job's state (from the previous step, or a new ``JobState(job, run)``).
        batch: every rank's record of the step (a subset is fine; any order).
        config: thresholds.
        kernels, stacks: optional sources of kernel statistics / stack samples, asked only
            for newly confirmed rank suspects and a few of their healthy peers.
        names: kernel id -> name for the kernel level.

    Returns:
        A :class:`StepResult`; publish ``result.anomalies``.
    """
    cfg = config or DiagnoserConfig()
    sf, _ = cross_rank_stage(batch, cfg, ())
    if kernels is None and stacks is None:
        return apply_findings(state, sf, cfg)

    def deepen(suspects: Sequence[int], peers: Sequence[int], since: int) -> Deepening | None:
        ranks = [*suspects, *peers]  # this step's data, which is past ``since``
        ks = kernels(ranks) if kernels is not None else {}
        return deepen_ranks(suspects, peers, ks, stacks(ranks) if stacks is not None else {}, names, cfg)

    return apply_findings(state, sf, cfg, deepen=deepen)


class JobDiagnoser:
    """HTA-style facade over one job run: holds the :class:`JobState` and the config.

    ``step(batch)`` diagnoses one completed step (see :func:`diagnose_step`); ``flush()``
    closes every open episode (end of the job) and returns the final anomalies;
    ``state`` is the plain-data state to persist between steps.
    """

    def __init__(
        self, job: str, run: int = 0, config: DiagnoserConfig | None = None, state: JobState | None = None
    ) -> None:
        self.config = config or DiagnoserConfig()
        self.state = state or JobState.new(job, run, self.config)

    def step(
        self,
        batch: StepBatch,
        *,
        kernels: KernelSource | None = None,
        stacks: StackSource | None = None,
        names: Mapping[int, str] | Sequence[str] | None = None,
    ) -> StepResult:
        """Diagnose one completed step (updates the state)."""
        return diagnose_step(self.state, batch, self.config, kernels=kernels, stacks=stacks, names=names)

    def flush(self, deepen: Deepen | None = None) -> list[Anomaly]:
        """Close every open episode (the end of the job): the final version of each confirmed
        one. A record shorter than ``min_steps`` (a profiler trace of two steps) confirms an
        episode seen in every one of its steps; ``deepen`` gives the kernel level one last
        try at every confirmed rank, link or host episode it has not explained yet."""
        return flush(self.state, self.config, deepen)


def diagnose(
    batches: Iterable[StepBatch],
    config: DiagnoserConfig | None = None,
    *,
    job: str | None = None,
    run: int = 0,
    deepen: Deepen | None = None,
) -> list[Anomaly]:
    """Diagnose a whole run offline: the final version of every anomaly, by onset.

    ``deepen``: the kernel level over the run's kernel sketches and stacks (e.g.
    ``streams.deepening.EvidenceHistory.deepener`` fed with what ``import-trace`` read),
    as in the stream worker.
    """
    diag: JobDiagnoser | None = None
    final: dict[str, Anomaly] = {}
    for b in batches:
        if diag is None:
            diag = JobDiagnoser(job or b.job, b.run if job is None else run, config)
        res = apply_findings(
            diag.state,
            step_findings(b, diag.config),
            diag.config,
            deepen=deepen,
        )
        for a in res.anomalies:
            final[a.id] = a
    if diag is not None:
        for a in diag.flush(deepen):
            final[a.id] = a
    return sorted(final.values(), key=lambda a: (a.start_step, a.cause, a.suspect))
