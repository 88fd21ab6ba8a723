"""Timed spans of one step and their reduction to the step record's columns.

The training thread only appends ``[column, t0, t1, parent]`` lists (:class:`SpanRecorder`);
the agent's thread turns a finished step into exclusive times per column
(:func:`exclusive_ms`: a span's time minus the time of the spans nested in it, so a
collective inside backward counts once, as collective time). On the CPU the clock is
``time.perf_counter_ns``; on a GPU it is a CUDA event recorded on the current stream, read
later with ``query()`` and ``elapsed_time()`` and never synchronized.
"""

from __future__ import annotations

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


def exclusive_ms(columns: Sequence[int], durations_ms: Sequence[float], parents: Sequence[int]) -> np.ndarray:
    """Exclusive milliseconds per column (len(COLUMNS)) from spans with their parent index.

    A span's exclusive time is its duration minus the durations of its direct children
    (parent index, -1 for none), floored at zero; the column totals sum those.
    """
    cols = np.asarray(columns, np.int64)
    dur = np.asarray(durations_ms, np.float64)
    par = np.asarray(parents, np.int64)
    if len(cols) == 0:
        return np.zeros(len(COLUMNS))
    nested = par >= 0
    child = np.bincount(par[nested], weights=dur[nested], minlength=len(dur))
    excl = np.maximum(dur - child, 0.0)
    return np.bincount(cols, weights=excl, minlength=len(COLUMNS))[: len(COLUMNS)]


class SpanRecorder:
    """Begin/end of timed spans from hooks; nesting tracked for the training thread only."""

    def __init__(self, clock: CpuClock | CudaClock, thread_id: int) -> None:
        self.clock = clock
        self.thread_id = thread_id
        self.spans: list[list[Any]] = []
        self._stack: list[int] = []

    def begin(self, column: int) -> tuple[list[list[Any]], int]:
        """Open a span; returns the token :meth:`end` takes."""
        spans = self.spans
        i = len(spans)
        if threading.get_ident() == self.thread_id:
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

    def take(self) -> list[list[Any]]:
        """Hand the step's spans over and start a new list."""
        spans, self.spans = self.spans, []
        self._stack = []
        return spans


def reduce_step(raw: RawStep, clock: CpuClock | CudaClock) -> np.ndarray | None:
    """Exclusive ms per column of a finished step; None while a GPU event is not reached yet.

    An unclosed span ends at the step's end (CPU) or counts zero (GPU).
    """
    cols, durs, pars = [], [], []
    for col, t0, t1, parent in raw.spans:
        if t1 is None:
            t1 = raw.end_mono if isinstance(clock, CpuClock) else t0
        elif not clock.ready(t1):
            return None
        cols.append(col)
        durs.append(clock.ms(t0, t1))
        pars.append(parent)
    return exclusive_ms(cols, durs, pars)
