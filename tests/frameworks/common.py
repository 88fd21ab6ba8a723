"""Shared checks of the framework tests: step records from JSON, one batch per step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from argus.schemas import StepBatch, StepRecord

REPO = Path(__file__).resolve().parents[2]


def load(out: Path, world: int) -> list[dict[str, Any]]:
    """Each rank's output file."""
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def batches(results: list[dict[str, Any]]) -> list[StepBatch]:
    """Every rank's records, one batch per step."""
    by_step: dict[int, list[StepRecord]] = {}
    for r in results:
        for row in r["records"]:
            by_step.setdefault(row["step"], []).append(StepRecord(**row))
    return [StepBatch.from_records(sorted(by_step[s], key=lambda x: x.rank)) for s in sorted(by_step)]


def check_straggler(steps: list[StepBatch], slow: int, waits: tuple[str, ...] = ("all_reduce_ms",)) -> None:
    """The slowed rank is the one compute straggler, its peers' collective wait (in the
    ``waits`` columns) the evidence."""
    from argus.detectors import diagnose

    mid = steps[len(steps) // 2]
    peers = mid["rank"] != slow
    wait = sum(mid[c] for c in waits)
    assert (wait[peers] > 40).all(), wait
    anomalies = diagnose(steps)
    found = [(a.cause, a.ranks, a.evidence) for a in anomalies]
    stragglers = [a for a in anomalies if a.cause == "compute_straggler"]
    assert {r for a in stragglers for r in a.ranks} == {slow}, found
    assert stragglers[0].evidence["peers_wait_ms"] > 20, found
