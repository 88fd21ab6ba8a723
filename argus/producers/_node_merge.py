"""The node relay's mergers: a node's ranks' one-row step records into one ``StepBatch`` per
step, and their heartbeats into one ``HeartbeatBatch`` per node (:mod:`argus.producers.relay`
receives and publishes; these only group, by :class:`~argus.schemas.PartMerger`)."""

from __future__ import annotations

from typing import Generic, TypeVar

from argus.schemas import Heartbeat, HeartbeatBatch, PartGroup, PartMerger, StepBatch

__all__ = ["HeartbeatMerger", "StepMerger"]

R = TypeVar("R", StepBatch, Heartbeat)
S = TypeVar("S", list[StepBatch], dict[int, Heartbeat])
Out = TypeVar("Out", StepBatch, HeartbeatBatch)


class _NodeMerger(Generic[R, S, Out]):
    """What the step and heartbeat mergers share: the merging core of relay and worker
    (:class:`~schemas.PartMerger`: parts grouped per key, the job run's rank count on this
    node learned — the most ranks released at once —, a group released when it has that
    many ranks or ``max_wait_s`` after its first record, a job run silent for ``forget_s``
    forgotten), each released group merged into one message."""

    def __init__(self, parts: PartMerger[R, S]) -> None:
        self.parts: PartMerger[R, S] = parts

    @property
    def max_wait_s(self) -> float:
        """How long a group waits for the node's other ranks at most."""
        return self.parts.max_wait_s

    def world(self, job: str, run: int) -> int:
        """The job run's ranks on this node, as learned (0 while unknown)."""
        return self.parts.world((job, run))

    def _merge(self, parts: S) -> Out:
        """A released group's records as one message."""
        raise NotImplementedError

    def due(self, now: float) -> list[Out]:
        """Groups whose first record is ``max_wait_s`` old (or that are whole by now)."""
        return [self._out(group) for _, group in self.parts.due(now)]

    def drain(self) -> list[Out]:
        """Everything held (at shutdown)."""
        return [self._out(group) for group in self.parts.drain()]

    def _out(self, group: PartGroup[S]) -> Out:
        """A released group, merged; its job run learns its rank count on this node from it."""
        self.parts.learn(group.job, self.parts.shows(group))
        return self._merge(group.parts)


class StepMerger(_NodeMerger[StepBatch, list[StepBatch], StepBatch]):
    """Merge the parts of each (job, run, step) that reach this node.

    A job's rank count on the node is learned from what arrives: the most ranks seen in
    one step. A step is released when it has that many, or ``max_wait_s`` after its first
    part, whichever comes first. A job silent for ``forget_s`` is forgotten. At most
    ``max_open`` steps are held (beyond, the oldest is released early).
    """

    def __init__(self, max_wait_s: float = 0.2, max_open: int = 4096, forget_s: float = 3600.0) -> None:
        super().__init__(
            PartMerger(max_wait_s=max_wait_s, max_open=max_open, forget_s=forget_s, new=list, put=list.append)
        )

    @property
    def open_steps(self) -> int:
        """Steps holding parts now."""
        return len(self.parts.groups)

    def add(self, part: StepBatch, now: float) -> list[StepBatch]:
        """Take one part; return the step it completes (at most one) or the oldest when full."""
        released = self.parts.add((part.job, part.run, part.step), part, part["rank"].tolist(), now)
        return [self._out(group) for _, group in released] if released else []

    def _merge(self, parts: list[StepBatch]) -> StepBatch:
        return StepBatch.concat(parts)


def _keep_latest(latest: dict[int, Heartbeat], beat: Heartbeat) -> None:
    """Keep a rank's heartbeat unless a newer one of it is kept already."""
    cur = latest.get(beat.rank)
    if cur is None or beat.time_ns >= cur.time_ns:
        latest[beat.rank] = beat


class HeartbeatMerger(_NodeMerger[Heartbeat, dict[int, Heartbeat], HeartbeatBatch]):
    """Collect the heartbeats of each job run that reach this node into batches.

    The latest heartbeat of each rank is kept; a job's batch is released when every local
    rank of the job (learned: the most ranks seen in one batch) has sent one since the last
    batch, or ``max_wait_s`` after the first, whichever comes first. A job silent for
    ``forget_s`` is forgotten. At most ``max_ranks`` ranks are held in all (beyond, the
    oldest batch is released early).
    """

    def __init__(self, max_wait_s: float = 2.0, max_ranks: int = 65_536, forget_s: float = 3600.0) -> None:
        super().__init__(
            PartMerger(
                max_wait_s=max_wait_s, max_ranks=max_ranks, forget_s=forget_s, new=dict, put=_keep_latest
            )
        )

    @property
    def held(self) -> int:
        """Heartbeats held now."""
        return self.parts.ranks_held

    def add(self, beat: Heartbeat, now: float) -> list[HeartbeatBatch]:
        """Take one heartbeat; return the batch it completes (at most one) or the oldest when full."""
        released = self.parts.add((beat.job, beat.run), beat, [beat.rank], now)
        return [self._out(group) for _, group in released] if released else []

    def _merge(self, parts: dict[int, Heartbeat]) -> HeartbeatBatch:
        return HeartbeatBatch.from_beats([parts[r] for r in sorted(parts)])
