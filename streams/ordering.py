"""Put a job's steps back in order for the temporal stage (pure, deterministic).

The cross-rank stage releases steps as they complete; after a restart, or when partitions
are read unevenly, a later step can overtake an earlier one. The temporal stage holds
steps that arrive early and diagnoses them in order; it waits for a missing step only
until ``max_held`` later steps are held, then accepts the gap (that step was lost). The
rule counts steps, not seconds, so a replay makes the same decisions as the first run.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["next_in_order"]


def next_in_order(last_step: int, held: Collection[int], max_held: int = 8) -> int | None:
    """The held step to diagnose next after ``last_step``, or None to wait for more."""
    if not held:
        return None
    first = min(held)
    if first == last_step + 1 or len(held) > max_held:
        return first
    return None
