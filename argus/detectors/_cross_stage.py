"""The cross-rank half of a step's diagnosis (stateless): the step's rank and stage
findings, its job reference, its summary record and the healthy peers of its suspects,
as one :class:`~argus.schemas.StepFindings`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from argus.schemas import StepBatch, StepFindings, StepSummary, ValidationError

from ._config import DiagnoserConfig
from ._finding import Finding
from .changepoint import step_residuals
from .cross_rank import METRICS, OWN_WORK, CrossRankResult, clean_step_ms, cross_rank, job_reference
from .rootcause import classify_ranks, stage_imbalance

_PEER_SAMPLE = 4096


_MAX_PEERED = 64


def _peer_table(
    batch: StepBatch, cr: CrossRankResult, ranks: Sequence[int], k: int, column: str
) -> dict[int, tuple[int, ...]]:
    """For each of ``ranks`` (the first ``_MAX_PEERED``), up to ``k`` unflagged ranks of its
    group, spread over the group: looked for in a strided sample of the step's rows first
    (a few thousand rows, not the whole job), in every row only when the sample has too few,
    and among the group's other ranks, flagged or not, when none is unflagged."""
    if k <= 0 or not len(ranks):
        return {}
    rank_col, groups = batch["rank"], batch[column]
    n = len(rank_col)
    sample = np.arange(0, n, max(1, n // _PEER_SAMPLE))
    flagged = np.zeros(n, bool)
    flagged[cr.rows] = True
    by_group: dict[Any, tuple[int, ...]] = {}
    out: dict[int, tuple[int, ...]] = {}
    for r in list(dict.fromkeys(int(x) for x in ranks))[:_MAX_PEERED]:
        row = r if r < n and rank_col[r] == r else int(next(iter(np.flatnonzero(rank_col == r)), -1))
        if row < 0:
            continue
        g = groups[row]
        if g not in by_group:
            cand = sample[groups[sample] == g]
            cand = cand[~flagged[cand]]
            if len(cand) < k:
                cand = np.flatnonzero((groups == g) & ~flagged)
            by_group[g] = _spread(rank_col[cand], k)
        # the group's other ranks all stand out: in a group of two, the one waiting for the
        # suspect is flagged too, and its kernels are still the reference
        out[r] = by_group[g] or _spread(rank_col[(groups == g) & (rank_col != r)], k)
    return out


def _spread(ranks: np.ndarray, k: int) -> tuple[int, ...]:
    if len(ranks) > k:
        ranks = ranks[np.linspace(0, len(ranks) - 1, k).astype(int)]
    return tuple(int(x) for x in ranks)


_DEEP_KINDS = frozenset({"rank", "link", "host", "ranks"})


def check_shape(sf: StepFindings) -> None:
    """Raise :class:`ValidationError` unless ``sf`` fits these detectors' temporal half: one
    job reference per :data:`METRICS`. Findings read from a topic passed the schema's range
    checks, but another build (or a hostile producer) may have made them."""
    if len(sf.job_median) != len(METRICS):
        raise ValidationError(
            f"StepFindings: job_median holds {len(sf.job_median)} metrics, these detectors {len(METRICS)}"
        )
    res = sf.residuals
    if (
        res is not None
        and len(res.phase)
        and not (int(res.phase.min()) >= 0 and int(res.phase.max()) < len(OWN_WORK))
    ):
        raise ValidationError(
            f"StepFindings: a residual's phase is not one of the {len(OWN_WORK)} own-work phases"
        )


def cross_rank_stage(
    batch: StepBatch, cfg: DiagnoserConfig, missing: Sequence[int]
) -> tuple[StepFindings, CrossRankResult]:
    cr = cross_rank(batch, cfg)
    findings: list[Finding] = []
    if batch.step >= cfg.warmup_steps:
        if len(cr.rows):
            dp = batch["dp"]
            replicas = int(dp.max()) + 1 if len(dp) else 0
            findings += classify_ranks(cr, batch["host"][cr.rows], dp[cr.rows], cfg, replicas=replicas)
        findings += stage_imbalance(cr, cfg.group_column, cfg)
    reference = job_reference(cr)
    wanted = [r for f in findings if f.suspect_kind in _DEEP_KINDS for r in f.ranks[:3]]
    peers = _peer_table(batch, cr, wanted, cfg.kernel_peers, cfg.group_column)
    sf = StepFindings(
        job=batch.job,
        run=batch.run,
        step=batch.step,
        end_ns=int(batch["end_ns"].max()),
        n_ranks=cr.n_ranks,
        step_ms=cr.step_ms,
        job_median=reference,
        findings=tuple(findings),
        summary=_summary(batch, cr, findings, missing),
        weak=tuple(cr.weak.tolist()),
        job_ms=clean_step_ms(reference),
        peers=peers,
        residuals=step_residuals(batch, cfg)
        if cfg.change_points and len(batch) <= cfg.cp_max_ranks
        else None,
    )
    return sf, cr


def _summary(
    batch: StepBatch, cr: CrossRankResult, findings: Sequence[Finding], missing: Sequence[int] = ()
) -> StepSummary:
    jm = dict(zip(METRICS, cr.job_median.tolist(), strict=True))
    suspects = sorted({r for f in findings for r in f.ranks})[:64]
    step_ms = (batch["end_ns"] - batch["start_ns"]) / 1e6
    return StepSummary(
        job=batch.job,
        run=batch.run,
        step=batch.step,
        end_ns=int(batch["end_ns"].max()),
        ranks=len(batch),
        missing=tuple(int(r) for r in missing),
        step_ms_median=cr.step_ms,
        step_ms_p99=float(np.percentile(step_ms, 99)),
        step_ms_max=float(step_ms.max()),
        compute_ms_median=jm["compute_ms"],
        collective_ms_median=jm["collective_ms"],
        dataloader_ms_median=jm["dataloader_ms"],
        checkpoint_ms_max=float(batch["checkpoint_ms"].max()),
        tokens=int(batch["tokens"].sum()),
        suspects=tuple(suspects),
    )
