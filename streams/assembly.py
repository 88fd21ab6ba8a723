"""Assemble the parts of a step (one StepBatch per host or per rank) into the whole step.

Pure bookkeeping, no Kafka and no clock of its own (the caller passes ``now``): a step of a
job is complete when every rank it expects has arrived, or when it has waited long
enough — then the ranks that never arrived are reported as missing (a hung or lost rank is
a finding too). The expected world is what the job showed before (the largest rank + 1
seen in any step of its run, trusted once one step of the run completed by waiting), so the
first step of a job completes by waiting and a part of a step never sets the world alone.

A rank number is a claim of its sender, so the world learned from it is bounded by what was
seen (:func:`dense_world`): a rank counts only if at least half of the ranks below it came
in the same step. One record claiming rank 1,048,575 in a job of 8 ranks leaves the world
at 8 (it would otherwise list a million missing ranks in every step summary), and the
missing list is capped at ``max_missing`` entries whatever the world. A part whose ranks
all lie beyond any plausible world (``2 × max(world, ranks in the step) + rank_slack``) is
not diagnosed: it comes back in ``rejected`` (reason ``absurd_rank`` for the caller's dead
letter); a rank like that inside a part with real ranks (a relay's merged part) is
diagnosed as one more rank but never grows the world.

A step far ahead of the job's frontier (more than ``max_steps_ahead`` past the last
completed step) is not a step of this job's timeline but a claim: it is released at once
as ``far_future`` (the caller dead-letters it), so it can neither pose as the job's latest
step nor, released "in order" later, make every real step look old.

Steps are released as they complete, which is not always step order (a worker catching
up after a restart reads many partitions at once): the temporal stage puts them back in
order (:func:`streams.ordering.next_in_order`).

At a rebalance the caller drops the steps still waiting (:meth:`StepAssembler.drop_open`):
their parts were not acknowledged, so whoever owns the partition next reads them again.

Memory is bounded by configuration: at most ``max_open_steps`` steps wait at once; beyond
that the oldest is completed early with what it has; at most ``max_jobs`` jobs are
remembered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.schemas import StepBatch

__all__ = ["AssemblyConfig", "CompleteStep", "StepAssembler", "dense_world"]

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
    max_steps_ahead: int = 100_000
    """A part this many steps past the job's last completed step is rejected (``far_future``)."""
    max_missing: int = 65_536
    """Missing ranks listed per step at most (the validation limit of a list field)."""
    rank_slack: int = 1024
    """Ranks below this are always plausible (a single rank of a large job, e.g. one imported trace)."""
    max_jobs: int = 65_536
    """Jobs remembered (world, frontier, completed steps); the least recently seen is
    forgotten beyond that, so records naming ever new jobs cannot grow the worker."""


def dense_world(ranks: np.ndarray) -> int:
    """The world size a step's ranks support: the largest ``r + 1`` over its ranks ``r`` such
    that at least half of the ranks below ``r + 1`` are present (0 for no such rank)."""
    r = np.unique(np.asarray(ranks, dtype=np.int64))
    ok = np.flatnonzero(r < 2 * np.arange(1, len(r) + 1))
    return int(r[ok[-1]]) + 1 if len(ok) else 0


@dataclass
class _Open:
    parts: list[StepBatch] = field(default_factory=list)
    tokens: list[Any] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    outside: set[int] = field(default_factory=set)  # ranks beyond the world: not counted for completion
    first_seen: float = 0.0
    last_seen: float = 0.0


@dataclass(frozen=True)
class CompleteStep:
    """A whole step: the concatenated batch, the ranks that never came, and the caller's
    tokens (e.g. Kafka events to acknowledge) of every part."""

    batch: StepBatch
    missing: tuple[int, ...]
    tokens: tuple[Any, ...]
    reason: str  # all_ranks | peers_done | settled | timeout | overflow | late | far_future | absurd_rank
    rejected: tuple[Any, ...] = ()
    """Tokens of parts that claim only implausible ranks (to dead-letter, then acknowledge)."""


class StepAssembler:
    """Collect step parts until steps complete; see the module docstring."""

    def __init__(self, config: AssemblyConfig | None = None) -> None:
        self.config = config or AssemblyConfig()
        self._open: dict[_StepKey, _Open] = {}
        self._world: dict[tuple[str, int], int] = {}
        self._seen_world: dict[tuple[str, int], int] = {}
        self._latest: dict[tuple[str, int], int] = {}
        self._frontier: dict[tuple[str, int], int] = {}  # per job: its last completed step
        # Per job, the steps completed lately (an insertion-ordered set: a deque scan per part
        # was the worker's cost that grew with the job's length).
        self._completed: dict[tuple[str, int], dict[int, None]] = {}
        self._out: list[CompleteStep] = []
        self._jobs: dict[tuple[str, int], None] = {}  # least recently seen first

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
        self._touch(job_run)
        frontier = self._frontier.get(job_run)
        if frontier is not None and part.step > frontier + self.config.max_steps_ahead:
            return [CompleteStep(part, (), (token,), "far_future")]
        self._latest[job_run] = max(self._latest.get(job_run, -1), part.step)
        key = (part.job, part.run, part.step)
        entry = self._open.get(key)
        if entry is None and part.step in self._completed.get(job_run, {}):
            bound = 2 * self._world.get(job_run, 0) + self.config.rank_slack
            if int(part["rank"].min()) >= bound:  # only ranks no world could have: refused, late or not
                return [CompleteStep(part, (), (), "absurd_rank", (token,))]
            self._grow_world(job_run, part)
            return [CompleteStep(part, (), (token,), "late")]
        if entry is None:
            entry = self._open[key] = _Open(first_seen=now)
        entry.parts.append(part)
        entry.tokens.append(token)
        ranks = part["rank"]
        world = self._world.get(job_run, 0)
        if world and int(ranks.max()) >= world:
            entry.outside.update(set(ranks[ranks >= world].tolist()))
        entry.ranks.update(ranks.tolist())
        entry.last_seen = now
        # A claimed rank grows the world only when the step so far has half the ranks below
        # it (cheap here; _complete checks the whole step with dense_world).
        top = int(part["rank"].max()) + 1
        if top <= 2 * len(entry.ranks) and top > self._seen_world.get(job_run, 0):
            self._seen_world[job_run] = top
            if job_run in self._world:
                self._world[job_run] = top
        world = self._world.get(job_run, 0)
        if world and self._inside(entry, world) >= world:
            self._complete(key, "all_ranks")
        if len(self._open) > self.config.max_open_steps:
            oldest = min(self._open, key=lambda k: self._open[k].first_seen)
            self._complete(oldest, "overflow")
        return self._released()

    def _grow_world(self, job_run: tuple[str, int], late: StepBatch) -> None:
        """A late part with ranks beyond the world: its step completed short (the world was
        learned from a step that had not all its ranks yet), so the world grows, at most to
        twice its size per part (a rank number is a claim; see :func:`dense_world`)."""
        world = self._world.get(job_run, 0)
        top = int(late["rank"].max()) + 1
        if world and world < top <= 2 * world:
            self._world[job_run] = self._seen_world[job_run] = top

    @staticmethod
    def _inside(entry: _Open, world: int) -> int:
        """Ranks of the step inside the world (a claimed rank beyond it completes nothing)."""
        if entry.outside and min(entry.outside) < world:  # the world grew since
            entry.outside = {r for r in entry.outside if r >= world}
        return len(entry.ranks) - len(entry.outside)

    def _touch(self, job_run: tuple[str, int]) -> None:
        """Mark the job as seen now; forget the least recently seen job beyond ``max_jobs``."""
        jobs = self._jobs
        if job_run in jobs:
            if next(reversed(jobs)) != job_run:
                del jobs[job_run]
                jobs[job_run] = None
            return
        jobs[job_run] = None
        if len(jobs) > self.config.max_jobs:
            open_jobs = {k[:2] for k in self._open}
            for old in list(jobs)[: len(jobs) - self.config.max_jobs]:
                if old in open_jobs:
                    continue
                del jobs[old]
                for table in (self._world, self._seen_world, self._latest, self._frontier, self._completed):
                    table.pop(old, None)

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
            if world and self._inside(entry, world) >= world:  # the world became known after it arrived
                ready.append((key, "all_ranks"))
            elif later >= len(entry.ranks) and now - entry.last_seen >= self.config.quiet_s:
                # A later step already has as many ranks as this one: this one has all it will
                # get (how a job's first steps complete before its world size is known). The
                # worker does not check this while it is inside a batch of parts.
                ready.append((key, "peers_done"))
            elif now - entry.first_seen >= self.config.max_wait_s:
                ready.append((key, "timeout"))
            elif moved_on and now - entry.last_seen >= self.config.settle_s:
                ready.append((key, "settled"))
        for key, reason in reversed(ready):  # released in step order, as the temporal stage wants them
            self._complete(key, reason)
        return self._released()

    def drop_open(self) -> list[Any]:
        """Forget every step still waiting, its parts unacknowledged (a rebalance: the
        partitions go to their next owner, which reads those parts again from the last
        committed offset; completing them here, short of the parts still unread, would
        give a step twice). Returns the dropped parts' tokens."""
        tokens = [t for entry in self._open.values() for t in entry.tokens]
        self._open.clear()
        return tokens

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
        job_run = key[:2]
        bound = 2 * max(self._world.get(job_run, 0), len(entry.ranks)) + self.config.rank_slack
        plausible = [int(p["rank"].min()) < bound for p in entry.parts]
        rejected = tuple(t for t, ok in zip(entry.tokens, plausible, strict=True) if not ok)
        if rejected:
            if not any(plausible):
                self._out.append(CompleteStep(StepBatch.concat(entry.parts), (), (), "absurd_rank", rejected))
                return
            entry.parts = [p for p, ok in zip(entry.parts, plausible, strict=True) if ok]
            entry.tokens = [t for t, ok in zip(entry.tokens, plausible, strict=True) if ok]
        batch = StepBatch.concat(entry.parts)
        world = max(self._seen_world.get(job_run, 0), dense_world(batch["rank"]))
        self._world[job_run] = self._seen_world[job_run] = world
        self._frontier[job_run] = max(self._frontier.get(job_run, key[2]), key[2])
        present = np.zeros(world, dtype=bool)
        present[batch["rank"][batch["rank"] < world]] = True
        missing = tuple(np.flatnonzero(~present)[: self.config.max_missing].tolist())
        done = self._completed.setdefault(job_run, {})
        done[key[2]] = None
        if len(done) > self.config.remember_steps:
            del done[next(iter(done))]
        self._out.append(CompleteStep(batch, missing, tuple(entry.tokens), reason, rejected))
