"""The kernel level of the progressive diagnosis, for one confirmed suspect: its kernel
statistics and call stacks against a few healthy peers' (one function for every entry
point: the stream worker, ``argus diagnose``, ``import-trace`` and the benchmarks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from argus.schemas import KernelStats, StackSample

from ._config import DiagnoserConfig
from .kernel import kernel_level
from .stacks import stack_diff

__all__ = ["Deepening", "deepen_ranks"]


@dataclass(frozen=True)
class Deepening:
    """What the kernels and stacks say about a suspect.

    ``explained``: a degraded kernel or an over-sampled frame was found (the anomaly
    becomes ``level="kernel"``); ``evidence``: the kernel ratios, degraded kernels and
    families, and over-sampled frames (``stack:<caller;leaf>``: share of samples more than
    the peers); ``summary``: one line naming them; ``rank``: the suspect examined.
    """

    explained: bool
    rank: int
    evidence: dict[str, float] = field(default_factory=dict)
    summary: str = ""


def deepen_ranks(
    suspects: Sequence[int],
    peers: Sequence[int],
    kernels: Mapping[int, KernelStats],
    stacks: Mapping[int, StackSample],
    names: Mapping[int, str] | Sequence[str] | None = None,
    config: DiagnoserConfig | None = None,
) -> Deepening | None:
    """Compare each suspect (at most three) with the peers that have data; the first one
    that its kernels or stacks explain, else the first one with data.

    Args:
        suspects: the anomaly's ranks, most suspect first.
        peers: healthy ranks of the suspects' group.
        kernels: KernelStats by rank (one dictionary of ids, see ``kernel.common_ids``).
        stacks: StackSample by rank.
        names: kernel id -> name.
        config: thresholds (``kernel_degraded_ratio``, ``kernel_min_excess``,
            ``stack_min_delta``).

    Returns:
        None when no suspect has data alongside a peer's (nothing to say yet: ask again
        once its sketches arrive).
    """
    cfg = config or DiagnoserConfig()
    peer_k = [kernels[p] for p in peers if p in kernels]
    peer_s = [stacks[p] for p in peers if p in stacks]
    first: Deepening | None = None
    for rank in list(suspects)[:3]:
        ev: dict[str, float] = {}
        lines: list[str] = []
        explained = False
        seen = False
        if rank in kernels and peer_k:
            seen = True
            kf = kernel_level(
                kernels[rank],
                peer_k,
                names,
                rank=rank,
                degraded_ratio=cfg.kernel_degraded_ratio,
                min_excess=cfg.kernel_min_excess,
            )
            ev.update(kf.evidence())
            if kf.degraded:
                explained = True
                lines.append(kf.describe())
        if rank in stacks and peer_s:
            seen = True
            frames = [d for d in stack_diff(stacks[rank], peer_s, top=2) if d.delta >= cfg.stack_min_delta]
            for d in frames:
                ev[f"stack:{d.frame[:200]}"] = round(d.delta, 4)
            if frames:
                explained = True
                top = frames[0]
                # the agent samples the training thread's stack on a timer, running or waiting
                lines.append(
                    f"in {top.frame[:160]}: {top.share:.0%} of stack samples, peers {top.peer_share:.0%}"
                )
        if not seen:
            continue
        found = Deepening(explained, rank, ev, f"rank {rank}: " + "; ".join(lines) if lines else "")
        if explained:
            return found
        first = first or found
    return first
