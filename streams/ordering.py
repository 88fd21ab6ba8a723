"""Put a job's steps back in order for the temporal stage (pure, deterministic).

The cross-rank stage releases steps as they complete; after a restart, or when a worker
catches up and Kafka hands it partitions unevenly, a later step can overtake an earlier one.
The temporal stage holds steps that arrive early and diagnoses them in order. Every step
that had any record completes in the cross-rank stage sooner or later (a missing rank only
delays it to its timeout), so waiting is safe; a step that never comes (no rank reported
it) is given up when the oldest held step has waited ``max_wait_s`` or more than
``max_held`` steps are held. Without such a gap the order, and so the diagnosis, is the
same in every run.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["next_in_order"]


def next_in_order(
    last_step: int,
    held: Collection[int],
    *,
    max_held: int = 64,
    waited_s: float = 0.0,
    max_wait_s: float = 30.0,
    start_wait_s: float = 5.0,
) -> int | None:
    """The held step to diagnose next after ``last_step``, or None to wait for more.

    ``waited_s``: how long the oldest held step has waited. A job's first step is not
    always step 0 (a job resumed from a checkpoint, a worker started mid-job), so the first
    step of a job (``last_step < 0``) is the smallest held once it waited ``start_wait_s``.
    """
    if not held:
        return None
    first = min(held)
    if first == last_step + 1 or (last_step < 0 and waited_s >= start_wait_s):
        return first
    if len(held) > max_held or waited_s >= max_wait_s:
        return first
    return None
