"""Assemble the parts of a step (one StepBatch per host or per rank) into the whole step.

Pure bookkeeping, no Kafka and no clock of its own (the caller passes ``now``): a step of a
job is complete when every rank it expects has arrived, or when it has waited long
enough — then the ranks that never arrived are reported as missing (a hung or lost rank is
a finding too). The expected world is what the job showed before (the largest rank + 1
seen in any step of its run, trusted once one step of the run completed by waiting), so the
first step of a job completes by waiting and a part of a step never sets the world alone.

Grouping the parts, learning the world and the release rule (every rank, ``max_wait_s``,
the ``max_open`` bound, forgetting jobs beyond ``max_jobs``) are the merging core this
shares with the node relay (:class:`~schemas.PartMerger`, its ranks counted ``dense``);
what is the worker's is here: the tokens acknowledged only with their step's outputs,
steps completing by settling or when a later step is as large, late parts, absurd ranks,
far-future steps, release in step order, and dropping open steps at a rebalance.

A rank number is a claim of its sender, so the world learned from it is bounded by what was
seen (:func:`~schemas.dense_world`): a rank counts only if at least half of the ranks below it came
in the same step. One record claiming rank 1,048,575 in a job of 8 ranks leaves the world
at 8 (it would otherwise list a million missing ranks in every step summary), and the
missing list is capped at ``max_missing`` entries whatever the world. A part whose ranks
all lie beyond any plausible world (``2 × max(world, ranks in the step) + rank_slack``) is
not diagnosed: it comes back in ``rejected`` (reason ``absurd_rank`` for the caller's dead
letter); a rank like that inside a part with real ranks (a relay's merged part) is
diagnosed as one more rank but never grows the world.

A step far ahead of the job's frontier (the last completed step) is not a step of this
job's timeline but a claim: further than the job could have run since its frontier moved,
at its observed pace (:class:`~streams.ordering.Pace`), or more than ``max_steps_ahead``
past it, it is released at once as ``far_future`` (the caller dead-letters it), so it can
neither pose as the job's latest step nor, released "in order" later, make every real step
look old.

Steps are released as they complete, which is not always step order (a worker catching
up after a restart reads many partitions at once): the temporal stage puts them back in
order (:func:`streams.ordering.next_in_order`).

At a rebalance the caller drops the steps still waiting (:meth:`StepAssembler.drop_open`):
their parts were not acknowledged, so whoever owns the partition next reads them again.

Memory is bounded by configuration: at most ``max_open`` steps wait at once; beyond
that the oldest is completed early with what it has; at most ``max_jobs`` jobs are
remembered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.schemas import JobRun, PartGroup, PartMerger, StepBatch, dense_world

from .ordering import Pace

__all__ = ["AssemblyConfig", "CompleteStep", "StepAssembler"]


@dataclass(frozen=True)
class AssemblyConfig:
    """When a step counts as complete."""

    settle_s: float = 5.0
    """A step whose job has moved on (a later step is arriving) completes after this much quiet."""
    max_wait_s: float = 30.0
    """A step completes at the latest this long after its first part."""
    quiet_s: float = 2.0
    """A step no smaller than a later step, and short of no rank the later one has, completes
    after this much quiet (a job's first steps, a lost rank). Longer than a healthy rank's
    publishing rhythm: an agent sends its finished steps in rounds, every second, each rank
    at its own phase (plus a node relay's 0.2 s), so the parts of one step come up to ~1.2 s
    apart, one rank's round of steps ahead of the others'."""
    max_open: int = 4096
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


@dataclass(slots=True)
class _Timeline:
    """A job run's steps, beyond what the merger knows of it: the latest step a part came
    for, the last completed (the frontier), the steps completed lately (an insertion-ordered
    set: a deque scan per part was the worker's cost that grew with the job's length)."""

    latest: int = -1
    frontier: int | None = None
    completed: dict[int, None] = field(default_factory=dict)
    pace: Pace = field(default_factory=Pace)


_Held = list[tuple[StepBatch, Any]]  # a step's parts, each with its caller's token


COMPLETIONS = {
    "all_ranks": "every rank in",
    "peers_done": "every rank a later step had",
    "settled": "the job moved on",
    "timeout": "ranks missing after the wait",
    "late": "arrived after its step was diagnosed",
    "far_future": "stamped too far ahead",
    "absurd_rank": "impossible rank",
}
"""How a step completes (``CompleteStep.reason``, ``argus_worker_steps_total``'s label), in words."""


@dataclass(frozen=True)
class CompleteStep:
    """A whole step: the concatenated batch, the ranks that never came, and the caller's
    tokens (e.g. Kafka events to acknowledge) of every part."""

    batch: StepBatch
    missing: tuple[int, ...]
    tokens: tuple[Any, ...]
    reason: str  # a key of COMPLETIONS
    rejected: tuple[Any, ...] = ()
    """Tokens of parts that claim only implausible ranks (to dead-letter, then acknowledge)."""


def _has_all_it_will(group: PartGroup[Any], later: PartGroup[Any]) -> bool:
    """A later step of the job has as many ranks as ``group`` and, once the world is known,
    none that ``group`` lacks. A step whose parts are still being read (its partition just
    changed owner, a backlog behind it) is short of ranks its later steps have: it waits."""
    if len(later.ranks) < len(group.ranks):
        return False
    return not group.job.world or later.ranks <= group.ranks


class StepAssembler:
    """Collect step parts until steps complete; see the module docstring."""

    def __init__(self, config: AssemblyConfig | None = None) -> None:
        self.config = cfg = config or AssemblyConfig()
        self._timelines: dict[tuple[str, int], _Timeline] = {}
        self._parts: PartMerger[tuple[StepBatch, Any], _Held] = PartMerger(
            max_wait_s=cfg.max_wait_s,
            max_open=cfg.max_open,
            max_jobs=cfg.max_jobs,
            dense=True,
            new=list,
            put=list.append,
            on_forget=self._forgotten,
        )
        self._out: list[CompleteStep] = []

    @property
    def open_steps(self) -> int:
        """Steps waiting now."""
        return len(self._parts.groups)

    def world(self, job: str, run: int) -> int:
        """Ranks the job is expected to have (0 while unknown)."""
        return self._parts.world((job, run))

    def add(self, part: StepBatch, token: Any, now: float) -> list[CompleteStep]:
        """Add one part; return the steps it completes (possibly none).

        A part of a step that already completed (a late straggler's record) is returned as
        its own one-part step marked ``late`` so its token is still acknowledged.
        """
        job_run = (part.job, part.run)
        job = self._parts.touch(job_run, now)
        line = self._timelines.get(job_run)
        if line is None:
            line = self._timelines[job_run] = _Timeline()
        if line.frontier is not None and (
            part.step > line.frontier + self.config.max_steps_ahead or line.pace.too_far(part.step, now)
        ):
            return [CompleteStep(part, (), (token,), "far_future")]
        if part.step > line.latest:
            line.latest = part.step
        key = (part.job, part.run, part.step)
        if part.step in line.completed and key not in self._parts.groups:
            if int(part["rank"].min()) >= 2 * job.world + self.config.rank_slack:
                return [CompleteStep(part, (), (), "absurd_rank", (token,))]  # refused, late or not
            self._grow_world(job, part)
            return [CompleteStep(part, (), (token,), "late")]
        for reason, group in self._parts.add(key, (part, token), part["rank"].tolist(), now, job):
            self._complete(group, reason, now)
        return self._released()

    def _grow_world(self, job: JobRun, late: StepBatch) -> None:
        """A late part with ranks beyond the world: its step completed short (the world was
        learned from a step that had not all its ranks yet), so the world grows, at most to
        twice its size per part (a rank number is a claim; see :func:`~schemas.dense_world`)."""
        top = int(late["rank"].max()) + 1
        if job.world and job.world < top <= 2 * job.world:
            self._parts.learn(job, top)

    def _forgotten(self, job_run: tuple[str, int]) -> None:
        """The merger forgot the job run (least recently seen beyond ``max_jobs``): so do we."""
        self._timelines.pop(job_run, None)

    def due(self, now: float) -> list[CompleteStep]:
        """Steps that completed by waiting: settled after their job moved on, or timed out."""
        parts, cfg = self._parts, self.config
        largest: dict[tuple[str, int], PartGroup[Any]] = {}  # per job: the later open step with most ranks
        ready: list[tuple[tuple[Any, ...], str]] = []
        for key, group in sorted(parts.groups.items(), reverse=True):
            job_run = key[:2]
            later = largest.get(job_run)
            if later is None or len(later.ranks) < len(group.ranks):
                largest[job_run] = group
            if parts.whole(group):  # the world became known after it arrived
                ready.append((key, "all_ranks"))
            elif (
                later is not None and _has_all_it_will(group, later) and now - group.last_seen >= cfg.quiet_s
            ):
                # A later step has no rank this one lacks: this one has all it will get (how
                # a job's first steps complete before its world size is known, and how steps
                # without a lost rank complete at once). The worker does not check this while
                # it is inside a batch of parts.
                ready.append((key, "peers_done"))
            elif parts.waited(group, now):
                ready.append((key, "timeout"))
            elif self._timelines[job_run].latest > key[2] and now - group.last_seen >= cfg.settle_s:
                ready.append((key, "settled"))
        for key, reason in reversed(ready):  # released in step order, as the temporal stage wants them
            self._complete(parts.release(key), reason, now)
        return self._released()

    def drop_open(self) -> list[Any]:
        """Forget every step still waiting, its parts unacknowledged (a rebalance: the
        partitions go to their next owner, which reads those parts again from the last
        committed offset; completing them here, short of the parts still unread, would
        give a step twice). Returns the dropped parts' tokens."""
        return [token for group in self._parts.drop() for _, token in group.parts]

    def drain(self, now: float = 0.0) -> Iterator[CompleteStep]:
        """Complete and release everything that waits (shutdown)."""
        for key in sorted(self._parts.groups):
            self._complete(self._parts.release(key), "timeout", now)
        yield from self._released()

    def _released(self) -> list[CompleteStep]:
        out, self._out = self._out, []
        return out

    def _complete(self, group: PartGroup[_Held], reason: str, now: float) -> None:
        """A released step: its implausible parts rejected, the rest one batch; the job's world,
        frontier and completed steps learn from it."""
        job, step, held = group.job, group.key[2], group.parts
        bound = 2 * max(job.world, len(group.ranks)) + self.config.rank_slack
        plausible = [int(p["rank"].min()) < bound for p, _ in held]
        rejected = tuple(t for (_, t), ok in zip(held, plausible, strict=True) if not ok)
        if rejected:
            if not any(plausible):
                batch = StepBatch.concat([p for p, _ in held])
                self._out.append(CompleteStep(batch, (), (), "absurd_rank", rejected))
                return
            held = [pt for pt, ok in zip(held, plausible, strict=True) if ok]
        batch = StepBatch.concat([p for p, _ in held])
        world = self._parts.learn(job, dense_world(batch["rank"]))
        line = self._timelines[group.key[:2]]
        line.frontier = step if line.frontier is None else max(line.frontier, step)
        line.pace.advance(step, now)
        present = np.zeros(world, dtype=bool)
        present[batch["rank"][batch["rank"] < world]] = True
        missing = tuple(np.flatnonzero(~present)[: self.config.max_missing].tolist())
        done = line.completed
        done[step] = None
        if len(done) > self.config.remember_steps:
            del done[next(iter(done))]
        self._out.append(CompleteStep(batch, missing, tuple(t for _, t in held), reason, rejected))
