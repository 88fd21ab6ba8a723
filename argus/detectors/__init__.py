"""The diagnosis: pure functions over step batches, kernel statistics and stacks.

Hangs and fail-stops: :mod:`~detectors.hang` (latest heartbeats + now → suspects).
Progressive, as in docs/architecture.md#engine: :mod:`~detectors.iteration` (job step time),
:mod:`~detectors.cross_rank` (robust z-scores within the layout's groups),
:mod:`~detectors.kernel` and :mod:`~detectors.stacks` (only for suspects),
:mod:`~detectors.rootcause` (one class per suspect, with evidence),
:mod:`~detectors.changepoint` (each rank against its own past, online: a change has an
onset and an end) with :mod:`~detectors.common_cause` (one finding per common cause) and
:mod:`~detectors.cost`; :class:`JobDiagnoser` / :func:`diagnose_step` drive them once per
step with small serializable state; logs become step batches (``argus.csvlogs``) for the same engine.
No I/O, no clock, no Kafka.
"""

from __future__ import annotations

from argus.schemas import causes
from argus.schemas.causes import *  # noqa: F403  the root-cause classes, re-exported

from ._classes import DECIDING_FIGURE, ROOT_CAUSES
from ._config import DiagnoserConfig
from ._finding import Finding
from .changepoint import ChangeState, RankResiduals, step_residuals, track
from .common_cause import cause_findings
from .cost import gpu_hours, step_ms_added
from .cross_rank import METRICS, CrossRankResult, cross_rank, rank_metrics
from .deepen import Deepening, deepen_ranks
from .facade import (
    Deepen,
    Episode,
    JobDiagnoser,
    JobState,
    KernelSource,
    StackSource,
    StepFindings,
    StepResult,
    anomaly_id,
    apply_findings,
    check_shape,
    diagnose,
    diagnose_step,
    refresh,
    step_findings,
)
from .hang import (
    HangConfig,
    HangFinding,
    HangState,
    HangVerdict,
    detect_hang,
    hang_anomalies,
    observe_heartbeats,
    stack_where,
)
from .iteration import IterationState, IterationVerdict, attribute, iteration_level, update_baseline
from .kernel import DegradedKernel, KernelFinding, common_ids, kernel_family, kernel_level
from .rootcause import classify_ranks, stage_imbalance
from .stacks import StackDelta, stack_diff

__all__ = [
    *causes.__all__,
    "DECIDING_FIGURE",
    "METRICS",
    "ROOT_CAUSES",
    "ChangeState",
    "CrossRankResult",
    "Deepen",
    "Deepening",
    "DegradedKernel",
    "DiagnoserConfig",
    "Episode",
    "Finding",
    "HangConfig",
    "HangFinding",
    "HangState",
    "HangVerdict",
    "IterationState",
    "IterationVerdict",
    "JobDiagnoser",
    "JobState",
    "KernelFinding",
    "KernelSource",
    "RankResiduals",
    "StackDelta",
    "StackSource",
    "StepFindings",
    "StepResult",
    "anomaly_id",
    "apply_findings",
    "attribute",
    "cause_findings",
    "check_shape",
    "classify_ranks",
    "common_ids",
    "cross_rank",
    "deepen_ranks",
    "detect_hang",
    "diagnose",
    "diagnose_step",
    "gpu_hours",
    "hang_anomalies",
    "iteration_level",
    "kernel_family",
    "kernel_level",
    "observe_heartbeats",
    "rank_metrics",
    "refresh",
    "stack_diff",
    "stack_where",
    "stage_imbalance",
    "step_findings",
    "step_ms_added",
    "step_residuals",
    "track",
    "update_baseline",
]
