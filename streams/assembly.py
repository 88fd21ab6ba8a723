"""Assemble the parts of a step (one StepBatch per host or per rank) into the whole step.

Pure bookkeeping, no Kafka and no clock of its own (the caller passes ``now``): a step of a
job is complete when every rank it expects has arrived, or when it has waited long
enough — then the ranks that never arrived are reported as missing (a hung or lost rank is
a finding too). The expected world is what the job showed before (the largest rank + 1
seen in any part of its run, trusted once one step of the run completed by waiting), so the
first step of a job completes by waiting and a part of a step never sets the world alone.

Steps are released as they complete, which is not always step order (a worker catching
up after a restart reads many partitions at once): the temporal stage puts them back in
order (:func:`streams.ordering.next_in_order`).

Memory is bounded by configuration: at most ``max_open_steps`` steps wait at once; beyond
that the oldest is completed early with what it has.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.schemas import StepBatch

__all__ = ["AssemblyConfig", "CompleteStep", "StepAssembler"]

_StepKey = tuple[str, int, int]  # job, run, step


@dataclass(frozen=True)
class AssemblyConfig:
    """When a step counts as complete."""

    settle_s: float = 5.0
    """A step whose job has moved on (a later step is arriving) completes after this much quiet."""
    max_wait_s: float = 30.0
    quiet_s: float = 0.25
    """A step as large as a later step completes after this much quiet (unknown world)."""
    """A step completes at the latest this long after its first part."""
    max_open_steps: int = 4096
    """Steps waiting at once, over all jobs (memory bound)."""
    remember_steps: int = 4096
    """Completed steps remembered per job, to tell a late part from a new step."""


@dataclass
class _Open:
    parts: list[StepBatch] = field(default_factory=list)
    tokens: list[Any] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    first_seen: float = 0.0
    last_seen: float = 0.0


@dataclass(frozen=True)
class CompleteStep:
    """A whole step: the concatenated batch, the ranks that never came, and the caller's
    tokens (e.g. Kafka events to acknowledge) of every part."""

    batch: StepBatch
    missing: tuple[int, ...]
    tokens: tuple[Any, ...]
    reason: str  # all_ranks | settled | timeout | overflow


class StepAssembler:
    """Collect step parts until steps complete; see the module docstring."""

    def __init__(self, config: AssemblyConfig | None = None) -> None:
        self.config = config or AssemblyConfig()
        self._open: dict[_StepKey, _Open] = {}
        self._world: dict[tuple[str, int], int] = {}
        self._seen_world: dict[tuple[str, int], int] = {}
        self._latest: dict[tuple[str, int], int] = {}
        # Per job, the steps completed lately (an insertion-ordered set: a deque scan per part
        # was the worker's cost that grew with the job's length).
        self._completed: dict[tuple[str, int], dict[int, None]] = {}
        self._out: list[CompleteStep] = []

    @property
    def open_steps(self) -> int:
        """Steps waiting now."""
        return len(self._open)

    def world(self, job: str, run: int) -> int:
        """Ranks the job is expected to have (0 while unknown)."""
        return self._world.get((job, run), 0)

    def add(self, part: StepBatch, token: Any, now: float) -> list[CompleteStep]:
        """Add one part; return the steps it completes (possibly none).

        A part of a step that already completed (a late straggler's record) is returned as
        its own one-part step marked ``late`` so its token is still acknowledged.
        """
        job_run = (part.job, part.run)
        self._seen_world[job_run] = max(self._seen_world.get(job_run, 0), int(part["rank"].max()) + 1)
        self._latest[job_run] = max(self._latest.get(job_run, -1), part.step)
        key = (part.job, part.run, part.step)
        entry = self._open.get(key)
        if entry is None and part.step in self._completed.get(job_run, {}):
            return [CompleteStep(part, (), (token,), "late")]
        if entry is None:
            entry = self._open[key] = _Open(first_seen=now)
        entry.parts.append(part)
        entry.tokens.append(token)
        entry.ranks.update(part["rank"].tolist())
        entry.last_seen = now
        if job_run in self._world:
            self._world[job_run] = self._seen_world[job_run]
        world = self._world.get(job_run, 0)
        if world and len(entry.ranks) >= world:
            self._complete(key, "all_ranks")
        if len(self._open) > self.config.max_open_steps:
            oldest = min(self._open, key=lambda k: self._open[k].first_seen)
            self._complete(oldest, "overflow")
        return self._released()

    def due(self, now: float) -> list[CompleteStep]:
        """Steps that completed by waiting: settled after their job moved on, or timed out."""
        most_later: dict[tuple[str, int], int] = {}  # per job: most ranks any open step has
        ready: list[tuple[_StepKey, str]] = []
        for key, entry in sorted(self._open.items(), reverse=True):
            job_run = key[:2]
            later = most_later.get(job_run, 0)
            most_later[job_run] = max(later, len(entry.ranks))
            moved_on = self._latest.get(job_run, -1) > key[2]
            world = self._world.get(job_run, 0)
            if world and len(entry.ranks) >= world:  # the world became known after it arrived
                ready.append((key, "all_ranks"))
            elif later >= len(entry.ranks) and now - entry.last_seen >= self.config.quiet_s:
                # A later step already has as many ranks as this one: this one has all it will get
                # (how a job's first steps complete before its world size is known).
                ready.append((key, "peers_done"))
            elif now - entry.first_seen >= self.config.max_wait_s:
                ready.append((key, "timeout"))
            elif moved_on and now - entry.last_seen >= self.config.settle_s:
                ready.append((key, "settled"))
        for key, reason in reversed(ready):  # released in step order, as the temporal stage wants them
            self._complete(key, reason)
        return self._released()

    def drain(self) -> Iterator[CompleteStep]:
        """Complete and release everything that waits (shutdown)."""
        for key in sorted(self._open):
            self._complete(key, "timeout")
        yield from self._released()

    def _released(self) -> list[CompleteStep]:
        out, self._out = self._out, []
        return out

    def _complete(self, key: _StepKey, reason: str) -> None:
        entry = self._open.pop(key)
        batch = StepBatch.concat(entry.parts)
        job_run = key[:2]
        world = max(self._seen_world.get(job_run, 0), int(batch["rank"].max()) + 1)
        self._world[job_run] = world
        present = np.zeros(world, dtype=bool)
        present[batch["rank"][batch["rank"] < world]] = True
        missing = tuple(int(r) for r in np.flatnonzero(~present))
        done = self._completed.setdefault(job_run, {})
        done[key[2]] = None
        if len(done) > self.config.remember_steps:
            del done[next(iter(done))]
        self._out.append(CompleteStep(batch, missing, tuple(entry.tokens), reason))
