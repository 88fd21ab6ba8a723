"""Parts into wholes: the one merging core of the node relay and the stream worker.

A *part* carries some ranks of one job run: a ``StepBatch`` of one rank or of one node, a
``Heartbeat``. The node relay merges the parts of its node's ranks into one message
(``producers.relay``); the stream worker merges the parts of every node into the whole step
(``streams.assembly``). Both do it the same way, here:

* **Grouping.** Parts are held per key, a tuple that starts with the job run (``(job, run,
  step)`` for a step, ``(job, run)`` for a heartbeat period), with when the first and the
  latest part came and the ranks they carry (a rank sent twice counts once). What a group
  keeps of its parts is the caller's (``new`` and ``put``: a list, the latest heartbeat of
  each rank, parts with the tokens to acknowledge them by).
* **The world** — how many ranks a whole group of the job run has — is learned, never told:
  unknown (0) until the caller lets a released group teach it (:meth:`PartMerger.learn`:
  the caller may first refuse a group, e.g. one of only implausible ranks), then the most
  any group showed; a group still open that shows more grows a known world at once (it has
  that many ranks: it is whole). Ranks count one of two ways. ``dense``: the ranks of a
  whole job, ``0 .. world - 1``; a group shows :func:`dense_world` of its ranks (a rank
  number is a claim of its sender: it counts only with half the ranks below it present)
  and a rank at or beyond the world completes nothing. Not dense: a node's share of a
  job, any rank numbers; a group shows how many ranks it has.
* **The release rule.** A group is released as soon as it is whole (its ranks inside the
  world reach a known world: ``all_ranks``), at the latest ``max_wait_s`` after its first
  part (``timeout``), and the oldest early while more than ``max_open`` groups or
  ``max_ranks`` ranks are held (``overflow``).
* **Forgetting.** A job run not seen for ``forget_s``, and beyond ``max_jobs`` the least
  recently seen, is forgotten (never one with groups held): records naming ever new jobs
  cannot grow the merger.

Pure bookkeeping: no clock (the caller passes ``now``, non-decreasing seconds), no I/O, no
Kafka. The callers keep what is theirs: how a released group becomes a message (the
relay), acknowledgement tokens, late parts, absurd ranks, step order (the worker).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

__all__ = ["JobRun", "PartGroup", "PartMerger", "dense_world"]

P = TypeVar("P")
S = TypeVar("S")
JobKey = tuple[str, int]  # job, run


def dense_world(ranks: Iterable[int] | np.ndarray) -> int:
    """The world size a step's ranks support: the largest ``r + 1`` over its ranks ``r`` such
    that at least half of the ranks below ``r + 1`` are present (0 for no such rank)."""
    if not isinstance(ranks, np.ndarray):
        ranks = np.fromiter(ranks, dtype=np.int64)
    r = np.unique(np.asarray(ranks, dtype=np.int64))
    ok = np.flatnonzero(r < 2 * np.arange(1, len(r) + 1))
    return int(r[ok[-1]]) + 1 if len(ok) else 0


@dataclass(slots=True)
class JobRun:
    """What the merger knows of one job run: its ``world`` (ranks a whole group has; 0: not
    known yet), ``claimed`` (the most ranks any group showed, open or released: the world,
    once it is known), ``seen_s`` (when a part of it last came) and ``held`` (its groups held
    now: a job run with groups held is never forgotten)."""

    world: int = 0
    claimed: int = 0
    seen_s: float = 0.0
    held: int = 0


@dataclass(slots=True)
class PartGroup(Generic[S]):
    """The parts of one key held: the caller's keeping of them, their ranks, when they came."""

    key: tuple[Any, ...]
    job: JobRun
    parts: S
    first_seen: float
    last_seen: float
    ranks: set[int] = field(default_factory=set)
    outside: set[int] = field(default_factory=set)
    """Dense only: ranks at or beyond the world when they came (they complete nothing)."""


class PartMerger(Generic[P, S]):
    """Group parts per key, learn each job run's world, release groups; see the module docstring.

    Args:
        max_wait_s: a group is released at the latest this long after its first part.
        max_open: groups held at most (beyond, the oldest is released early).
        max_ranks: ranks held at most, over all groups (beyond, likewise).
        max_jobs: job runs remembered at most (the least recently seen forgotten beyond).
        forget_s: a job run not seen for this long is forgotten (at :meth:`due`).
        dense: ranks are a whole job's ``0 .. world - 1`` (the worker), not a node's share.
        new: a group's empty keeping of parts (e.g. ``list``).
        put: keeps one part in it (e.g. ``list.append``).
        on_forget: called with each job run forgotten (for the caller's own state of it).
    """

    def __init__(
        self,
        *,
        max_wait_s: float,
        max_open: int = sys.maxsize,
        max_ranks: int = sys.maxsize,
        max_jobs: int = 65_536,
        forget_s: float = math.inf,
        dense: bool = False,
        new: Callable[[], S],
        put: Callable[[S, P], object],
        on_forget: Callable[[JobKey], object] | None = None,
    ) -> None:
        if not max_wait_s > 0 or min(max_open, max_ranks, max_jobs) < 1 or not forget_s > 0:
            raise ValueError("max_wait_s, max_open, max_ranks, max_jobs and forget_s must be positive")
        self.max_wait_s = max_wait_s
        self.max_open = max_open
        self.max_ranks = max_ranks
        self.max_jobs = max_jobs
        self.forget_s = forget_s
        self.dense = dense
        self._new = new
        self._put = put
        self._on_forget = on_forget
        self.groups: dict[tuple[Any, ...], PartGroup[S]] = {}
        """Held now, oldest first."""
        self.ranks_held = 0
        self._jobs: dict[JobKey, JobRun] = {}  # least recently seen first
        self._last: JobRun | None = None  # the last of them

    def world(self, job_run: JobKey) -> int:
        """Ranks a whole group of the job run has (0 while unknown)."""
        job = self._jobs.get(job_run)
        return job.world if job is not None else 0

    def touch(self, job_run: JobKey, now: float) -> JobRun:
        """The job run, marked seen now (made if new; beyond ``max_jobs`` others are forgotten)."""
        jobs = self._jobs
        job = jobs.get(job_run)
        if job is None:
            job = self._last = jobs[job_run] = JobRun(seen_s=now)
            if len(jobs) > self.max_jobs:
                self._forget(now, keep=job_run)
            return job
        if job is not self._last:  # the most recent is last already
            del jobs[job_run]
            jobs[job_run] = self._last = job
        job.seen_s = now
        return job

    def add(
        self, key: tuple[Any, ...], part: P, ranks: list[int], now: float, job: JobRun | None = None
    ) -> list[tuple[str, PartGroup[S]]]:
        """Hold one part carrying ``ranks`` (a key starts with the job run; ``job`` if the
        caller touched it already); return the groups released: its own if it is whole
        now, the oldest ones while more than the bounds are held."""
        groups = self.groups
        group = groups.get(key)
        if job is None:
            if group is not None and group.job is self._last:  # most often: the last part's job run
                job = group.job
                job.seen_s = now
            else:
                job = self.touch(key[:2], now)
        if group is None:
            group = groups[key] = PartGroup(key, job, self._new(), now, now)
            job.held += 1
        else:
            group.last_seen = now
        self._put(group.parts, part)
        have = group.ranks
        before = len(have)
        world = job.world
        if self.dense:
            top = max(ranks) + 1
            if world and top > world:
                group.outside.update(r for r in ranks if r >= world)
            have.update(ranks)
            n = len(have)
            # A claimed rank grows the world only with half the ranks below it in the group.
            shows = top if top <= 2 * n else 0
        else:
            have.update(ranks)
            n = shows = len(have)
        self.ranks_held += n - before
        if shows > job.claimed:
            job.claimed = shows
            if world:
                job.world = world = shows
        # n >= world first: the ranks inside the world are at most n, and counting them costs more
        out = [("all_ranks", self.release(key))] if n >= world > 0 and self.whole(group) else []
        while len(groups) > self.max_open or self.ranks_held > self.max_ranks:
            out.append(("overflow", self.release(next(iter(groups)))))
        return out

    def whole(self, group: PartGroup[S]) -> bool:
        """Whether the group has every rank of its job run's known world."""
        world = group.job.world
        if not world:
            return False
        outside = group.outside
        if outside and min(outside) < world:  # the world grew since they came
            outside = group.outside = {r for r in outside if r >= world}
        return len(group.ranks) - len(outside) >= world

    def waited(self, group: PartGroup[S], now: float) -> bool:
        """Whether the group has waited ``max_wait_s`` since its first part."""
        return now - group.first_seen >= self.max_wait_s

    def due(self, now: float) -> list[tuple[str, PartGroup[S]]]:
        """Forget the job runs silent for ``forget_s``; release the groups that have waited
        ``max_wait_s`` or are whole (their world became known after they came), oldest first."""
        self._forget(now)
        ready: list[tuple[str, tuple[Any, ...]]] = []
        for key, group in self.groups.items():
            if self.waited(group, now):
                ready.append(("timeout", key))
            elif len(group.ranks) >= group.job.world > 0 and self.whole(group):
                ready.append(("all_ranks", key))
        return [(reason, self.release(key)) for reason, key in ready]

    def release(self, key: tuple[Any, ...]) -> PartGroup[S]:
        """Let the group go (the caller then has it :meth:`learn` what it showed)."""
        group = self.groups.pop(key)
        group.job.held -= 1
        self.ranks_held -= len(group.ranks)
        return group

    def shows(self, group: PartGroup[S]) -> int:
        """The world a group's ranks support: :func:`dense_world` of them, or how many they are."""
        return dense_world(group.ranks) if self.dense else len(group.ranks)

    @staticmethod
    def learn(job: JobRun, shows: int) -> int:
        """A released group (or a late part) showed this world: the job run's world is now
        known, the most any showed. Returns it."""
        job.world = job.claimed = max(job.claimed, shows)
        return job.world

    def drain(self) -> list[PartGroup[S]]:
        """Release everything held (shutdown), oldest first."""
        return [self.release(k) for k in list(self.groups)]

    def drop(self) -> list[PartGroup[S]]:
        """Forget every group held, learning nothing from them (a rebalance)."""
        dropped = list(self.groups.values())
        for group in dropped:
            group.job.held -= 1
        self.groups.clear()
        self.ranks_held = 0
        return dropped

    def _forget(self, now: float, keep: JobKey | None = None) -> None:
        """Forget the least recently seen job runs while more than ``max_jobs`` are known,
        and those silent for ``forget_s``; never one with groups held, nor ``keep``."""
        jobs = self._jobs
        excess = len(jobs) - self.max_jobs
        gone: list[JobKey] = []
        for job_run, job in jobs.items():
            if len(gone) >= excess and now - job.seen_s <= self.forget_s:
                break  # the rest were seen later still
            if job_run != keep and not job.held:
                gone.append(job_run)
        for job_run in gone:
            if jobs.pop(job_run) is self._last:
                self._last = None
            if self._on_forget is not None:
                self._on_forget(job_run)
