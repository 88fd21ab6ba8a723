"""What the stream workers send, bounded whatever their input claims (pure): a complete
step's findings, its summary inside (:func:`step_outputs`), and any anomaly cut to what
validation allows (:func:`bounded_anomaly`)."""

from __future__ import annotations

import dataclasses

from argus.detectors import DiagnoserConfig, StepFindings, step_findings
from argus.schemas import LIMITS, Anomaly, ValidationError, encode

from .assembly import CompleteStep

__all__ = ["MAX_MESSAGE_BYTES", "bounded_anomaly", "step_outputs"]

MAX_MESSAGE_BYTES = 900_000
"""Largest value the worker sends: below the producer's 1 MiB request limit, with room for
the key and headers."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clamp(value: float, lo: float) -> float:
    return min(max(float(value), lo), 1e30) if value == value else 0.0  # NaN -> 0


def bounded_anomaly(a: Anomaly) -> Anomaly:
    """The anomaly with every field cut to what validation allows (as the step path's
    summary already is): summary 4,096 characters, names and evidence keys 256, at most
    ``LIMITS["max_listed_ranks"]`` ranks (what the engine lists), window and figures
    clamped to their ranges; non-finite evidence dropped. A hang's summary quotes the hung
    frame, which is as long as the rank's stack says."""
    ids, names, last = LIMITS["max_id_len"], LIMITS["max_name_len"], LIMITS["max_step"] - 1
    evidence = {_cut(str(k), ids): float(v) for k, v in a.evidence.items() if abs(float(v)) <= 1e30}
    start = min(max(a.start_step, 0), last)
    return dataclasses.replace(
        a,
        start_step=start,
        end_step=min(max(a.end_step, start), last),
        score=_clamp(a.score, 0.0),
        step_ms_added=_clamp(a.step_ms_added, -1e30),
        gpu_hours_lost=_clamp(a.gpu_hours_lost, -1e30),
        detected_ns=min(max(a.detected_ns, 0), LIMITS["max_time_ns"] - 1),
        id=a.id[:ids],
        suspect=_cut(a.suspect, ids),
        suspect_kind=a.suspect_kind[:ids],
        cause=a.cause[:ids],
        summary=_cut(a.summary, names),
        ranks=tuple(a.ranks[: LIMITS["max_listed_ranks"]]),
        evidence=evidence,
    )


def step_outputs(
    done: CompleteStep, config: DiagnoserConfig, max_bytes: int = MAX_MESSAGE_BYTES
) -> tuple[StepFindings, bytes]:
    """The cross-rank stage's output for one complete step: its findings and their message
    (pure; the worker sends it). The step summary travels inside the findings, checked with
    them, and is encoded once, by the temporal stage that sends it.

    Raises :class:`ValidationError` when the findings (summary included) are out of range or
    their message exceeds ``max_bytes`` (the worker dead-letters the step's parts then).
    """
    sf = step_findings(done.batch, config, missing=done.missing)
    findings = encode(sf)
    if len(findings) > max_bytes:
        raise ValidationError(
            f"step {sf.step} of {sf.job}: findings of {len(findings)} bytes, limit {max_bytes}"
        )
    return sf, findings
