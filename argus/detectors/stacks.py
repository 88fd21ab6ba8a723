"""Differential observability over call stacks: what a suspect does that its peers do not."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from argus.schemas import StackSample

__all__ = ["StackDelta", "stack_diff"]


@dataclass(frozen=True)
class StackDelta:
    """A frame whose share of samples differs: the suspect's share, the peers' mean share
    and the difference (positive: the suspect spends more time there). ``frame`` is the
    sampled leaf with its caller (``caller;leaf``: ``queues.py:get`` alone does not say it
    is the data loader waiting)."""

    frame: str
    share: float
    peer_share: float

    @property
    def delta(self) -> float:
        """Suspect share minus peer share."""
        return self.share - self.peer_share


def _shares(s: StackSample) -> dict[str, float]:
    total = float(sum(s.counts)) or 1.0
    out: dict[str, float] = {}
    for stack, n in zip(s.stacks, s.counts, strict=True):
        leaf = ";".join(stack.rsplit(";", 2)[-2:])
        out[leaf] = out.get(leaf, 0.0) + n / total
    return out


def stack_diff(suspect: StackSample, peers: Sequence[StackSample], *, top: int = 3) -> tuple[StackDelta, ...]:
    """The ``top`` frames the suspect samples more than its peers, largest first.

    Shares are per sample window (counts / total), peers averaged; frames are the last two
    elements of each folded stack (``caller;leaf``, each ``file:function``).
    """
    mine = _shares(suspect)
    theirs: dict[str, float] = {}
    for p in peers:
        for k, v in _shares(p).items():
            theirs[k] = theirs.get(k, 0.0) + v / max(len(peers), 1)
    deltas = [StackDelta(k, v, theirs.get(k, 0.0)) for k, v in mine.items()]
    deltas = [d for d in deltas if d.delta > 0]
    deltas.sort(key=lambda d: -d.delta)
    return tuple(deltas[:top])
