"""The diagnosis on step records the agent made of a real DDP job (gloo, 3 ranks sharing 2
CPU cores, steps of 3-7 ms that alternate between two speeds), rank 2 slowed by 80 ms in
forward for steps 40-79 (``tests/agent/rank_worker.py --mode ddp --steps 120 --dim 128
--base-ms 2 --slow-rank 2 --slow-ms 80 --slow-from 40 --slow-until 80``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from argus.detectors import diagnose
from tests.frameworks.common import batches

DATA = Path(__file__).resolve().parents[1] / "data" / "ddp_3_ranks_rank2_slowed_40_79.json.gz"


def test_a_fault_that_began_mid_run_on_a_job_with_two_speeds_pages() -> None:
    # runs of fast steps are the job's own noise here, not the end of a warm-up: a fault that
    # began after one is not "since the job's start" (a warning that never pages)
    steps = batches([{"records": json.loads(gzip.decompress(DATA.read_bytes()))}])
    assert len(steps) == 120
    (a,) = diagnose(steps)
    assert (a.cause, list(a.ranks), a.start_step, a.end_step) == ("compute_straggler", [2], 40, 79)
    assert a.severity == "page" and "persistent" not in a.evidence, (a.severity, a.summary)
