"""`argus import-trace` streams files: results in order with a bounded number in flight,
and step records kept compact until the diagnosis."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from argus.cli.import_trace import StepParts, collect_imports, iter_imports
from argus.schemas import StepBatch, StepRecord
from tests.argus.test_import_trace import _rank_trace


def test_files_come_back_in_order_whatever_the_window(tmp_path: Path) -> None:
    paths = []
    for r in range(7):
        path = tmp_path / f"rank-{r}.json"
        path.write_text(json.dumps(_rank_trace(r, steps=6, slow_rank=3, slow_from=2, t0=1.7e15)))
        paths.append(str(path))
    streamed = [(s.rank, len(recs)) for recs, s in iter_imports(paths, job="w", workers=2)]
    assert [r for r, _ in streamed] == list(range(7))  # 7 files, at most 4 in flight
    records, summaries = collect_imports(iter_imports(paths, job="w", workers=1))
    assert [s.rank for s in summaries] == list(range(7)) and len(records) == sum(n for _, n in streamed)


def test_step_parts_are_joined_as_they_come_and_give_whole_steps() -> None:
    parts = StepParts(every=4)
    for rank in range(10):
        for step in (2, 1):
            t = 1_800_000_000_000_000_000 + step * 10**9
            parts.add(
                StepBatch.from_records([StepRecord("j", 0, step, rank, start_ns=t, end_ns=t + 1000 + rank)])
            )
    assert all(len(v) <= 5 for v in parts._parts.values())
    steps = parts.steps()
    assert [b.step for b in steps] == [1, 2]
    assert all(np.array_equal(np.sort(b["rank"]), np.arange(10)) for b in steps)
