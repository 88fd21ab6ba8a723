"""Timed spans of one step and their reduction to the step record's columns.

The training thread only appends ``[column, t0, t1, parent]`` lists (:class:`SpanRecorder`);
the agent's thread turns a finished step into exclusive times per column
(:func:`exclusive_ms`). Collectives are intervals on the step's timeline, possibly
overlapping each other and started or finished on other threads (a DDP bucket's all-reduce
runs while backward goes on; its completion arrives on the backend's thread): a collective
kind's time is the union of its intervals, and every other span's exclusive time is its
duration minus the part covered by any collective, minus its (so reduced) nested spans. A
collective inside backward thus counts once, as collective time, and backward keeps only
the time no collective was in flight. On the CPU the clock is ``time.perf_counter_ns``; on
a GPU it is a CUDA event recorded on the current stream, read later with ``query()`` and
``elapsed_time()`` and never synchronized.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.schemas import COLLECTIVE_COLUMNS, PHASE_COLUMNS

__all__ = [
    "COLUMNS",
    "COLUMN_INDEX",
    "CpuClock",
    "CudaClock",
    "RawStep",
    "SpanRecorder",
    "exclusive_ms",
    "exclusive_ms_small",
    "reduce_step",
]

COLUMNS: tuple[str, ...] = PHASE_COLUMNS + COLLECTIVE_COLUMNS
"""Step-record columns the agent times, in index order."""
COLUMN_INDEX = {name: i for i, name in enumerate(COLUMNS)}


class CpuClock:
    """Monotonic nanoseconds; always ready."""

    now: Callable[[], Any] = staticmethod(time.perf_counter_ns)

    @staticmethod
    def ready(_t: Any) -> bool:
        """Whether a time point can be read (always on the CPU)."""
        return True

    @staticmethod
    def ms(t0: Any, t1: Any) -> float:
        """Milliseconds between two time points."""
        return float(t1 - t0) / 1e6


class CudaClock:
    """CUDA events on the current stream (recorded now, read later without synchronizing)."""

    def __init__(self) -> None:
        import torch

        self._event: Any = torch.cuda.Event

    def now(self) -> Any:
        """Record an event on the current stream."""
        ev = self._event(enable_timing=True)
        ev.record()
        return ev

    @staticmethod
    def ready(t: Any) -> bool:
        """Whether the GPU has reached the event."""
        return bool(t.query())

    @staticmethod
    def ms(t0: Any, t1: Any) -> float:
        """Milliseconds between two completed events."""
        return float(t0.elapsed_time(t1))


@dataclass
class RawStep:
    """A finished step as the training thread left it (the agent's thread reduces it)."""

    step: int
    start_ns: int  # wall clock
    start_mono: int  # perf_counter_ns
    end_mono: int
    spans: list[list[Any]] = field(default_factory=list)
    samples: int = 0
    tokens: int = 0


_FIRST_COLLECTIVE = len(PHASE_COLUMNS)


def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the same time as ``[starts[i], ends[i]]``."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    gap = s[1:] > e[:-1]
    return s[np.concatenate(([True], gap))], e[np.concatenate((gap, [True]))]


def _covered(a: np.ndarray, b: np.ndarray, us: np.ndarray, ue: np.ndarray) -> np.ndarray:
    """Length of ``[a[i], b[i]]`` covered by the disjoint sorted intervals ``[us, ue]``."""
    if len(us) == 0:
        return np.zeros(len(a))
    cum = np.concatenate(([0.0], np.cumsum(ue - us)))

    def upto(x: np.ndarray) -> np.ndarray:  # covered length of (-inf, x]
        i = np.searchsorted(us, x, side="right") - 1
        j = np.maximum(i, 0)
        part = np.clip(x - us[j], 0.0, ue[j] - us[j])
        return np.where(i >= 0, cum[j] + part, 0.0)

    covered: np.ndarray = np.maximum(upto(b) - upto(a), 0.0)
    return covered


def exclusive_ms(
    columns: Sequence[int], starts_ms: Sequence[float], ends_ms: Sequence[float], parents: Sequence[int]
) -> np.ndarray:
    """Exclusive milliseconds per column (len(COLUMNS)) from spans on one timeline.

    Collective columns get the union of their spans' intervals (overlapping buckets count
    once; time when several kinds are in flight is split equally between them, so the
    collective columns add up to the union of all collectives). Any other span gets its
    duration minus the part any collective covers, minus the same quantity of its direct
    children (parent index, -1 for none), floored at zero. A step's few spans take the
    pure-Python path (:func:`exclusive_ms_small`, the same figures without numpy's per-call
    cost); many spans the vectorized one.
    """
    if len(columns) <= SMALL_STEP:
        return np.asarray(exclusive_ms_small(columns, starts_ms, ends_ms, parents))
    return _exclusive_np(columns, starts_ms, ends_ms, parents)


SMALL_STEP = 48
"""Up to this many spans a step is reduced in pure Python."""


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint sorted intervals covering the same time."""
    intervals.sort()
    out: list[tuple[float, float]] = []
    for s, e in intervals:
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def exclusive_ms_small(
    columns: Sequence[int], starts_ms: Sequence[float], ends_ms: Sequence[float], parents: Sequence[int]
) -> list[float]:
    """:func:`exclusive_ms` in pure Python (a list), for a step's handful of spans."""
    n = len(columns)
    out = [0.0] * len(COLUMNS)
    if n == 0:
        return out
    t0 = [float(x) for x in starts_ms]
    t1 = [max(float(e), s) for e, s in zip(ends_ms, t0, strict=True)]
    kinds: dict[int, list[tuple[float, float]]] = {}
    for i in range(n):
        if columns[i] >= _FIRST_COLLECTIVE:
            kinds.setdefault(columns[i], []).append((t0[i], t1[i]))
    own = [b - a for a, b in zip(t0, t1, strict=True)]
    if kinds:
        merged = {c: _merged(v) for c, v in kinds.items()}
        if len(merged) == 1:
            ((c, m),) = merged.items()
            out[c] = sum(e - s for s, e in m)
        else:  # time when several kinds are in flight is shared equally between them
            edges = sorted({x for m in merged.values() for iv in m for x in iv})
            for a, b in itertools.pairwise(edges):
                mid = (a + b) / 2
                active = [c for c, m in merged.items() if any(s <= mid <= e for s, e in m)]
                for c in active:
                    out[c] += (b - a) / len(active)
        union = _merged([iv for v in kinds.values() for iv in v])
        for i in range(n):
            a, b = t0[i], t1[i]
            for s, e in union:
                if s >= b:
                    break
                if e > a:
                    own[i] -= min(b, e) - max(a, s)
    child = [0.0] * n
    for i in range(n):
        p = parents[i]
        if p >= 0 and columns[i] < _FIRST_COLLECTIVE:
            child[p] += own[i]
    for i in range(n):
        c = columns[i]
        if c < _FIRST_COLLECTIVE:
            out[c] += max(own[i] - child[i], 0.0)
    return out


def _exclusive_np(
    columns: Sequence[int], starts_ms: Sequence[float], ends_ms: Sequence[float], parents: Sequence[int]
) -> np.ndarray:
    """:func:`exclusive_ms` vectorized (steps with many spans)."""
    cols = np.asarray(columns, np.int64)
    out = np.zeros(len(COLUMNS))
    if len(cols) == 0:
        return out
    t0 = np.asarray(starts_ms, np.float64)
    t1 = np.maximum(np.asarray(ends_ms, np.float64), t0)
    par = np.asarray(parents, np.int64)
    coll = cols >= _FIRST_COLLECTIVE
    if coll.any():
        kinds = np.unique(cols[coll])
        merged = [_merge(t0[cols == c], t1[cols == c]) for c in kinds]
        if len(kinds) == 1:
            out[kinds[0]] = float((merged[0][1] - merged[0][0]).sum())
        else:  # time when several kinds are in flight is shared equally between them
            edges = np.unique(np.concatenate([np.concatenate(m) for m in merged]))
            mid, length = (edges[1:] + edges[:-1]) / 2, np.diff(edges)
            active = np.array(
                [np.searchsorted(s, mid, "right") > np.searchsorted(e, mid, "left") for s, e in merged]
            )
            share = length / np.maximum(active.sum(axis=0), 1)
            out[kinds] = (active * share).sum(axis=1)
        us, ue = _merge(t0[coll], t1[coll])
        own = (t1 - t0) - _covered(t0, t1, us, ue)
    else:
        own = t1 - t0
    phase = ~coll
    nested = phase & (par >= 0)
    child = np.bincount(par[nested], weights=own[nested], minlength=len(cols))[: len(cols)]
    excl = np.maximum(own - child, 0.0)
    out += np.bincount(cols[phase], weights=excl[phase], minlength=len(COLUMNS))[: len(COLUMNS)]
    return out


class SpanRecorder:
    """Begin/end of timed spans from hooks; nesting tracked for the training thread only."""

    def __init__(self, clock: CpuClock | CudaClock, thread_id: int) -> None:
        self.clock = clock
        self.thread_id = thread_id
        self.spans: list[list[Any]] = []
        self._stack: list[int] = []

    def begin(self, column: int, nest: bool = True) -> tuple[list[list[Any]], int]:
        """Open a span; returns the token :meth:`end` takes.

        On the training thread a span is nested in the open one; with ``nest=False`` (a
        collective, which may end on another thread) it opens no nesting level itself.
        """
        spans = self.spans
        i = len(spans)
        if not nest:
            stack = self._stack
            spans.append([column, self.clock.now(), None, stack[-1] if stack else -1])
        elif threading.get_ident() == self.thread_id:
            stack = self._stack
            spans.append([column, self.clock.now(), None, stack[-1] if stack else -1])
            stack.append(i)
        else:  # another thread (a GC pause it triggered, an async completion): top level
            spans.append([column, self.clock.now(), None, -1])
        return spans, i

    def end(self, token: tuple[list[list[Any]], int]) -> None:
        """Close a span (a span of a step already handed over is ignored)."""
        spans, i = token
        spans[i][2] = self.clock.now()
        if spans is self.spans:
            stack = self._stack
            if stack and stack[-1] == i:
                stack.pop()
            elif i in stack:
                stack.remove(i)

    def end_by(self, token: tuple[list[list[Any]], int]) -> None:
        """Close a span that is not nested (a collective) now, unless it is closed earlier."""
        span = token[0][token[1]]
        t = self.clock.now()
        if span[2] is None or (isinstance(self.clock, CpuClock) and t < span[2]):
            span[2] = t

    def take(self) -> list[list[Any]]:
        """Hand the step's spans over and start a new list."""
        spans, self.spans = self.spans, []
        self._stack = []
        return spans


def reduce_step(raw: RawStep, clock: CpuClock | CudaClock) -> np.ndarray | None:
    """Exclusive ms per column of a finished step; None while a GPU event is not reached yet.

    An unclosed span ends at the step's end (CPU) or counts zero (GPU).
    """
    spans = raw.spans
    if not spans:
        return np.zeros(len(COLUMNS))
    cpu = isinstance(clock, CpuClock)
    ref = spans[0][1]
    cols, starts, ends, pars = [], [], [], []
    for col, t0, t1, parent in spans:
        if t1 is None:
            t1 = raw.end_mono if cpu else t0
        elif not clock.ready(t1):
            return None
        cols.append(col)
        if cpu:
            starts.append((t0 - ref) / 1e6)
            ends.append((t1 - ref) / 1e6)
        else:
            if not clock.ready(t0):
                return None
            starts.append(clock.ms(ref, t0))
            ends.append(clock.ms(ref, t1))
        pars.append(parent)
    return exclusive_ms(cols, starts, ends, pars)
