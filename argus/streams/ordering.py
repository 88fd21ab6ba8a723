"""Put a job's steps back in order for the temporal stage (pure, deterministic).

The cross-rank stage releases steps as they complete; after a restart, or when a worker
catches up and Kafka hands it partitions unevenly, a later step can overtake an earlier one.
The temporal stage holds steps that arrive early and diagnoses them in order. Every step
that had any record completes in the cross-rank stage sooner or later (a missing rank only
delays it to its timeout), so waiting is safe; a step that never comes (no rank reported
it) is given up when the oldest held step has waited ``max_wait_s`` or more than
``max_held`` steps are held. Without such a gap the order, and so the diagnosis, is the
same in every run.

:func:`next_in_order` decides; :class:`Reorderer` keeps the clocks of a worker's held steps
and hands them out one at a time. A step given up on is not forgotten: its range goes
into the job's list of gaps (:func:`add_gap`), so when it does come, late, the temporal stage
tells it from a replayed duplicate (:func:`take_late`) and still sends its summary.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Hashable

__all__ = ["AHEAD_FLOOR", "MAX_GAPS", "Pace", "Reorderer", "add_gap", "next_in_order", "take_late"]

AHEAD_FLOOR = 4096
"""Steps past a job's frontier that are always plausible, whatever its pace: more than a
worker catching up reads out of order (the reorder window holds 1,024)."""

MAX_GAPS = 256
"""Ranges of given-up steps kept per job (the oldest are forgotten beyond: a step of one of
those that still comes is taken for a duplicate)."""

Gaps = list[list[int]]
"""A job's given-up steps: inclusive ``[first, last]`` ranges, ascending and disjoint (a
JSON-able list: it lives in the job's state document)."""


def next_in_order(
    last_step: int,
    held: Collection[int],
    *,
    max_held: int = 1024,
    waited_s: float = 0.0,
    max_wait_s: float = 30.0,
    start_wait_s: float = 5.0,
    held_bytes: int = 0,
    max_held_bytes: int = 16 * 2**20,
) -> int | None:
    """The held step to diagnose next after ``last_step``, or None to wait for more.

    ``waited_s``: how long the oldest held step has waited. A job's first step is not
    always step 0 (a job resumed from a checkpoint, a worker started mid-job), so the first
    step of a job (``last_step < 0``) is the smallest held once it waited ``start_wait_s``.
    ``held_bytes``: the held steps' findings, bounded by ``max_held_bytes`` as their count is
    by ``max_held``. The count bound is wide on purpose: a worker catching up reads its
    partitions unevenly, and steps 64 apart came out of order on a 1,024-rank job replayed
    as fast as the worker took it; a step given up on is diagnosed without the steps before
    it (their summaries follow if they come, :func:`take_late`).
    """
    if not held:
        return None
    first = min(held)
    if first == last_step + 1 or (last_step < 0 and waited_s >= start_wait_s):
        return first
    if len(held) > max_held or held_bytes > max_held_bytes or waited_s >= max_wait_s:
        return first
    return None


class Reorderer:
    """How long each held step of each job has waited, and which held step goes next.

    The set of held steps is the job's (the temporal stage keeps it in the job's state, so
    it survives a restart); the caller passes it in and this class adds to it and takes
    from it. Waiting counts on this process's clock: a step restored from the changelog
    starts waiting afresh, so the steps replayed after it can still come.
    """

    def __init__(
        self,
        *,
        max_held: int = 1024,
        max_held_bytes: int = 16 * 2**20,
        max_wait_s: float = 30.0,
        start_wait_s: float = 5.0,
    ) -> None:
        self.max_held = max_held
        self.max_held_bytes = max_held_bytes
        self.max_wait_s = max_wait_s
        self.start_wait_s = start_wait_s
        self._since: dict[Hashable, dict[int, float]] = {}  # job -> held step -> since (monotonic)

    def knows(self, job: Hashable) -> bool:
        """Whether this process has held steps of ``job`` since it started (or forgot it)."""
        return job in self._since

    def hold(self, job: Hashable, held: set[int], step: int, now: float) -> None:
        """Add ``step`` to the job's ``held`` steps; every held step not yet timed waits from ``now``."""
        held.add(step)
        since = self._since.setdefault(job, {})
        for h in held:
            since.setdefault(h, now)

    def release(
        self, job: Hashable, held: set[int], last_step: int, now: float, held_bytes: int = 0
    ) -> int | None:
        """The held step to diagnose after ``last_step``, taken out of ``held``; None: wait.
        ``held_bytes``: the size of the held steps' findings."""
        since = self._since.setdefault(job, {})
        nxt = next_in_order(
            last_step,
            held,
            max_held=self.max_held,
            waited_s=now - min(since[s] for s in held) if held else 0.0,
            max_wait_s=self.max_wait_s,
            start_wait_s=self.start_wait_s,
            held_bytes=held_bytes,
            max_held_bytes=self.max_held_bytes,
        )
        if nxt is not None:
            held.discard(nxt)
            since.pop(nxt, None)
        return nxt

    def forget(self, job: Hashable) -> None:
        """Drop the job's clocks (its state expired)."""
        self._since.pop(job, None)


def add_gap(gaps: Gaps, first: int, last: int, *, max_gaps: int = MAX_GAPS) -> Gaps:
    """Record steps ``first..last`` as given up (the diagnosis went on past them); return
    the oldest ranges dropped to keep at most ``max_gaps``. Gaps come in step order (the
    diagnosis only moves forward), so appending keeps the list sorted."""
    if first > last:
        return []
    if gaps and gaps[-1][1] >= first - 1:
        gaps[-1][1] = max(gaps[-1][1], last)
    else:
        gaps.append([first, last])
    dropped = gaps[: max(0, len(gaps) - max_gaps)]
    del gaps[: len(dropped)]
    return dropped


def take_late(gaps: Gaps, step: int) -> bool:
    """Whether ``step`` was given up (so it comes late, not again); if so it leaves ``gaps``
    (a second copy of it is a duplicate)."""
    i = bisect.bisect_right(gaps, step, key=lambda r: r[0]) - 1
    if i < 0 or not gaps[i][0] <= step <= gaps[i][1]:
        return False
    first, last = gaps[i]
    gaps[i : i + 1] = [r for r in ([first, step - 1], [step + 1, last]) if r[0] <= r[1]]
    return True


class Pace:
    """How fast a job's frontier (its last completed or diagnosed step) moves, on the
    receiver's clock, and so how far ahead of it a step may plausibly be.

    A step number is its sender's claim. One record 50,000 steps ahead of a job of 10
    steps/s, held and then taken for the job's latest step, made every real step after it
    look old (its summaries stopped, its anomaly window was cut). A step is plausible when
    it is at most ``floor`` past the frontier plus twice what the job could have run since
    the frontier moved at its observed pace (step numbers per second since its first step).
    A job whose step numbers jump (a counter of samples, not steps) has a pace to match.
    Plain data (a JSON-able list), so the temporal stage keeps it in the job's state.
    """

    __slots__ = ("first_s", "first_step", "frontier", "frontier_s")

    def __init__(
        self, first_step: int = -1, first_s: float = 0.0, frontier: int = -1, frontier_s: float = 0.0
    ):
        self.first_step, self.first_s, self.frontier, self.frontier_s = (
            first_step,
            first_s,
            frontier,
            frontier_s,
        )

    def to_list(self) -> list[float]:
        """The pace as plain data."""
        return [self.first_step, self.first_s, self.frontier, self.frontier_s]

    @classmethod
    def from_list(cls, data: list[float] | None) -> Pace:
        """Inverse of :meth:`to_list` (a fresh pace for None)."""
        if not data:
            return cls()
        first_step, first_s, frontier, frontier_s = data
        return cls(int(first_step), float(first_s), int(frontier), float(frontier_s))

    def advance(self, step: int, now: float) -> None:
        """The frontier moved to ``step`` at ``now`` (seconds, the receiver's clock)."""
        if self.first_step < 0:
            self.first_step, self.first_s = step, now
        if step > self.frontier:
            self.frontier, self.frontier_s = step, now

    def steps_per_s(self) -> float:
        """Step numbers per second from the first step to the frontier (0 while unknown)."""
        elapsed = self.frontier_s - self.first_s
        return (self.frontier - self.first_step) / elapsed if elapsed >= 1.0 else 0.0

    def too_far(self, step: int, now: float, *, floor: int = AHEAD_FLOOR) -> bool:
        """Whether ``step`` lies further past the frontier than the job could have run."""
        if self.frontier < 0:
            return False
        since = max(0.0, now - self.frontier_s)
        return step - self.frontier > floor + 2.0 * self.steps_per_s() * since
