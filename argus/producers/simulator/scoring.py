"""The fault matcher: reported anomalies against the faults injected on purpose.

One pure function, :func:`match_faults`, shared by the demo's check and the diagnosis
benchmark (``bench/diagnosis.py``), so both count a hit, a false alarm and a window the
same way. It reads only plain attributes, so it takes stored rows as well as
:class:`argus.schemas.Anomaly` records, and :class:`argus.producers.simulator.Label` (or
any object with the same fields) as the ground truth.

The rule, for one job run:

* **same place**: the anomaly's suspect is the label's (``rank:3``, ``node-00300``,
  ``node-1<->node-2``, ``pp:1``), or its ranks overlap the label's culprit ranks (a host
  anomaly listing the eight ranks of a host covers the eight per-rank labels of a slow
  host), or both are group-level (``job``, ``stage``, ``dp_group``: a fault of the whole
  pipeline or of the data-parallel replicas has no culprit rank);
* **same time**: the windows ``[start_step, end_step]`` and ``[first_step, last_step]``
  overlap (``slack`` steps of tolerance on each side);
* a match is **right** when the anomaly's class is the label's kind (or one the caller
  accepts for it); its **IoU** is that of the two step windows, both inclusive.

An anomaly may match several labels and a label several anomalies (fragments: each has its
own, smaller IoU). What is left over is the verdict: **extras** (anomalies at no injected
fault's place and time: false alarms), **wrong** (anomalies matched only with another class)
and **misses** (labels without a right match).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "GROUP_KINDS",
    "AnomalyLike",
    "Evidenced",
    "LabelLike",
    "Match",
    "Scoring",
    "kernel_named_right",
    "match_faults",
    "named_kernels",
    "window_iou",
]

GROUP_KINDS = frozenset({"job", "stage", "dp_group"})
"""Suspect kinds of faults with no culprit rank: any two of them are at the same place."""


class Placed(Protocol):
    """Where an anomaly or a label points: its suspect and the culprit ranks."""

    @property
    def suspect_kind(self) -> str: ...
    @property
    def suspect(self) -> str: ...
    @property
    def ranks(self) -> Sequence[int]: ...


class AnomalyLike(Placed, Protocol):
    """What the matcher reads of an anomaly (an Anomaly record or a stored row)."""

    @property
    def start_step(self) -> int: ...
    @property
    def end_step(self) -> int: ...
    @property
    def cause(self) -> str: ...


class LabelLike(Placed, Protocol):
    """What the matcher reads of a ground-truth label (``producers.simulator.Label``)."""

    @property
    def kind(self) -> str: ...
    @property
    def first_step(self) -> int: ...
    @property
    def last_step(self) -> int: ...


@dataclass(frozen=True)
class Match:
    """An anomaly at the place and time of an injected fault (indices into the inputs)."""

    anomaly: int
    label: int
    right: bool
    """The anomaly's class is the label's kind (or one accepted for it)."""
    iou: float
    """Intersection over union of the two inclusive step windows."""


@dataclass(frozen=True)
class Scoring:
    """The matches of one job run and what is left over (indices into the inputs)."""

    matches: tuple[Match, ...]
    extras: tuple[int, ...]
    """Anomalies at no injected fault's place and time."""
    wrong: tuple[int, ...]
    """Anomalies matched to faults, but never with the right class."""
    misses: tuple[int, ...]
    """Labels without a right match."""
    n_labels: int = 0

    def anomalies_per_fault(self) -> list[int]:
        """Per label, how many anomalies rightly match it (1: one anomaly per fault)."""
        counts = [0] * self.n_labels
        for m in self.matches:
            if m.right:
                counts[m.label] += 1
        return counts

    def of_label(self, label: int) -> list[Match]:
        """The matches of one label, right ones first, best window first."""
        return sorted((m for m in self.matches if m.label == label), key=lambda m: (not m.right, -m.iou))

    def of_anomaly(self, anomaly: int) -> list[Match]:
        """The matches of one anomaly, right ones first, best window first."""
        return sorted((m for m in self.matches if m.anomaly == anomaly), key=lambda m: (not m.right, -m.iou))

    @property
    def right_anomalies(self) -> frozenset[int]:
        """Anomalies with at least one right match (true positives of their class)."""
        return frozenset(m.anomaly for m in self.matches if m.right)

    @property
    def iou_min(self) -> float:
        """The smallest IoU of the right matches (1.0 when there is none)."""
        return min((m.iou for m in self.matches if m.right), default=1.0)

    def ok(self, min_iou: float = 0.8) -> bool:
        """No extra, no wrong class, no miss, and every right match's window IoU ≥ ``min_iou``."""
        return not (self.extras or self.wrong or self.misses) and self.iou_min >= min_iou


def window_iou(start: int, end: int, first: int, last: int) -> float:
    """IoU of the inclusive step windows ``[start, end]`` and ``[first, last]`` (0 when disjoint)."""
    inter = min(end, last) - max(start, first) + 1
    if inter <= 0:
        return 0.0
    union = (end - start + 1) + (last - first + 1) - inter
    return inter / union


def _same_place(a: AnomalyLike, lab: LabelLike) -> bool:
    if a.suspect == lab.suspect or set(a.ranks) & set(lab.ranks):
        return True
    return a.suspect_kind in GROUP_KINDS and lab.suspect_kind in GROUP_KINDS


def match_faults(
    anomalies: Sequence[AnomalyLike],
    labels: Sequence[LabelLike],
    *,
    slack: int = 0,
    accept: Mapping[str, Collection[str]] | None = None,
) -> Scoring:
    """Match the anomalies of one job run to its injected faults (see the module docstring).

    Args:
        anomalies: the run's anomalies (final versions), any order.
        labels: the faults injected into that run.
        slack: steps of tolerance on each side when testing that two windows overlap
            (the IoU is always that of the windows as they are).
        accept: per label kind, other anomaly classes that count as right for it (e.g. a
            real run's slowed rank: ``{"compute_straggler": {"masked_compute_straggler"}}``).

    Returns:
        A :class:`Scoring` whose indices refer to ``anomalies`` and ``labels``.
    """
    accept = accept or {}
    matches: list[Match] = []
    for i, a in enumerate(anomalies):
        for j, lab in enumerate(labels):
            if a.start_step > lab.last_step + slack or a.end_step < lab.first_step - slack:
                continue
            if not _same_place(a, lab):
                continue
            ok = a.cause == lab.kind or a.cause in accept.get(lab.kind, ())
            iou = window_iou(a.start_step, a.end_step, lab.first_step, lab.last_step)
            matches.append(Match(i, j, ok, iou))
    matched = {m.anomaly for m in matches}
    right = {m.anomaly for m in matches if m.right}
    found = {m.label for m in matches if m.right}
    return Scoring(
        matches=tuple(matches),
        extras=tuple(i for i in range(len(anomalies)) if i not in matched),
        wrong=tuple(i for i in sorted(matched) if i not in right),
        misses=tuple(j for j in range(len(labels)) if j not in found),
        n_labels=len(labels),
    )


class Evidenced(Protocol):
    """An anomaly's evidence (an Anomaly record or a stored row's)."""

    @property
    def evidence(self) -> Mapping[str, float]: ...


def named_kernels(a: Evidenced) -> tuple[str, ...]:
    """What an anomaly's kernel level names: the degraded kernel families (most time added
    first), then the frames its suspect samples more than its peers (largest first)."""
    ev = a.evidence
    fams = [k.split(":", 1)[1] for k in ev if k.startswith("kernel_family:")]
    frames = sorted((k for k in ev if k.startswith("stack:")), key=lambda k: -ev[k])
    return (*fams, *(f.split(":", 1)[1] for f in frames))


def kernel_named_right(a: Evidenced, expected: str) -> bool:
    """Whether the first thing the kernel level names is ``expected`` (a kernel family, or
    a word of a frame: ``dataloader``)."""
    named = named_kernels(a)
    return bool(named) and (named[0] == expected or (":" not in expected and expected in named[0]))
