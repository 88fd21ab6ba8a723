"""The diagnosis on step records the agent made of real DDP jobs (gloo, ranks sharing 2 CPU
cores):

- 3 ranks, steps of 3-7 ms that alternate between two speeds, rank 2 slowed by 80 ms in
  forward for steps 40-79 (``tests/agent/rank_worker.py --mode ddp --steps 120 --dim 128
  --base-ms 2 --slow-rank 2 --slow-ms 80 --slow-from 40 --slow-until 80``);
- 2 ranks, steps of ~25 ms, rank 1 sleeping 50 ms in the training loop outside every timer
  for steps 20-45 (``--mode ddp --steps 80 --base-ms 10 --slow-rank 1 --slow-ms 50
  --slow-in loop --slow-from 20 --slow-until 46``), and the same job with no rank slowed;
- 4 ranks, the same slowdown (4 processes on 2 cores while other tests ran: after the
  fault, rank 1's compute came out 5-35 ms over its peers' in a step now and then).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from argus.detectors import diagnose
from tests.frameworks.common import batches

DATA = Path(__file__).resolve().parents[1] / "data" / "ddp_3_ranks_rank2_slowed_40_79.json.gz"
PAIR = DATA.with_name("ddp_2_ranks_rank1_sleeps_in_loop_20_45.json.gz")
PAIR_QUIET = DATA.with_name("ddp_2_ranks_quiet.json.gz")
FOUR = DATA.with_name("ddp_4_ranks_rank1_sleeps_in_loop_20_45.json.gz")


def _steps(path: Path) -> list:
    return batches([{"records": json.loads(gzip.decompress(path.read_bytes()))}])


def test_a_fault_that_began_mid_run_on_a_job_with_two_speeds_pages() -> None:
    # runs of fast steps are the job's own noise here, not the end of a warm-up: a fault that
    # began after one is not "since the job's start" (a warning that never pages)
    steps = batches([{"records": json.loads(gzip.decompress(DATA.read_bytes()))}])
    assert len(steps) == 120
    (a,) = diagnose(steps)
    assert (a.cause, list(a.ranks), a.start_step, a.end_step) == ("compute_straggler", [2], 40, 79)
    assert a.severity == "page" and "persistent" not in a.evidence, (a.severity, a.summary)


def test_a_late_rank_of_two_is_named_with_its_peers_wait_as_evidence() -> None:
    # two ranks have no spread to score against (a MAD of two is half their difference),
    # and the median of two is half the late rank's: the step looked like everyone's
    # slowdown (no rank findings) and the job's tripled steps went unreported
    steps = _steps(PAIR)
    assert len(steps) == 80
    (a,) = diagnose(steps)
    assert (a.cause, list(a.ranks), a.start_step, a.end_step) == ("masked_compute_straggler", [1], 20, 45)
    assert a.evidence["peers_wait_ms"] > 40 and a.evidence["unaccounted_ms_excess"] > 40, a.evidence


def test_a_quiet_job_of_two_ranks_raises_nothing() -> None:
    # their waits differ by up to ~8 ms from step to step (scheduling on 2 shared cores)
    assert diagnose(_steps(PAIR_QUIET)) == []


def test_noise_on_the_late_rank_after_its_fault_does_not_carry_the_window_on() -> None:
    # sightings at 46, 49 and 52 (compute 6 ms over on a busy host, not the 50 ms fault)
    # had kept the anomaly open to step 52
    (a,) = diagnose(_steps(FOUR))
    assert (a.cause, list(a.ranks)) == ("masked_compute_straggler", [1]), a.summary
    assert abs(a.start_step - 20) <= 1 and a.end_step == 45, (a.start_step, a.end_step)
