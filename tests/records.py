"""Records of every type for tests that need valid ones (the codec's round trips, the
sink, the worker, the fuzzers): one definition, imported, never copied. ``RECORDS`` are
the types the sink stores; ``WORKER_RECORDS`` travel only between the stream workers'
stages (the step-findings topic)."""

from __future__ import annotations

import numpy as np

from argus.detectors import METRICS
from argus.schemas import (
    Anomaly,
    DeadLetter,
    Finding,
    GpuSample,
    Heartbeat,
    JobOrder,
    KernelNames,
    KernelSketch,
    StackSample,
    StepBatch,
    StepFindings,
    StepRecord,
    StepSummary,
)

__all__ = ["RECORDS", "T0", "WORKER_RECORDS", "step_batch"]

T0 = 1_800_000_000 * 10**9


def step_batch(n: int = 8, step: int = 3) -> StepBatch:
    """A valid StepBatch of ``n`` ranks of job-a, run 1."""
    recs = [
        StepRecord(
            "job-a",
            1,
            step,
            r,
            host=f"node{r // 8}",
            gpu_uuid=f"GPU-{r}",
            dp=r % 4,
            tp=r // 4,
            pp=0,
            start_ns=T0,
            end_ns=T0 + 120_000_000 + r,
            forward_ms=30.5,
            backward_ms=61.0,
            optimizer_ms=4.0,
            all_reduce_ms=12.25,
            p2p_ms=1.5,
            samples=32,
            tokens=65536,
        )
        for r in range(n)
    ]
    return StepBatch.from_records(recs)


RECORDS = [
    KernelSketch("job-a", 1, 5, 10, 1, 9, b"\x01\x02\x03"),
    KernelNames("job-a", 1, 5, (0, 1), ("ampere_sgemm_128x64_nn", "ncclDevKernel_AllReduce_Sum_f32_RING_LL")),
    StackSample(
        "job-a",
        1,
        5,
        10,
        T0,
        T0 + 10**9,
        ("train.py:main;model.forward", "train.py:main;loader.next"),
        (40, 10),
    ),
    GpuSample("node0", "GPU-0", 0, T0, gpu_util=99.0, sm_clock_mhz=1410.0, power_w=400.0, temp_c=70.0, xid=0),
    Heartbeat(
        "job-a",
        1,
        5,
        "node0",
        T0,
        10,
        ("dp0",),
        (42,),
        (41,),
        ("all_reduce",),
        (1 << 20,),
        "main;step;all_reduce",
    ),
    StepSummary("job-a", 1, 10, T0, 1024, (7,), 120.0, 130.0, 180.0, 90.0, 20.0, 1.0, 0.0, 1 << 20, (3,)),
    Anomaly(
        "a1",
        "job-a",
        1,
        10,
        12,
        "cross_rank",
        "rank",
        "5",
        (5,),
        "compute_straggler",
        7.5,
        {"forward_ms_z": 9.1, "forward_ms": 45.0},
        "rank 5 computes 50% longer",
        15.0,
        0.25,
        T0,
    ),
    DeadLetter("argus.steps", 3, 1234, "decode", "bad magic", T0, b"\xff\xfe"),
]

_SUMMARY = next(r for r in RECORDS if isinstance(r, StepSummary))
WORKER_RECORDS = [
    StepFindings(
        _SUMMARY.job,
        _SUMMARY.run,
        _SUMMARY.step,
        _SUMMARY.end_ns,
        _SUMMARY.ranks,
        120.0,
        np.linspace(0.0, 60.0, len(METRICS)),
        (
            Finding(
                "compute_straggler", "cross_rank", "rank", "rank:3", (3,), 7.5, "compute_ms_z",
                {"compute_ms_z": 7.5, "compute_ms": 45.0}, 14.0,
            ),
            Finding("pipeline_stage_imbalance", "cross_rank", "stage", "pp:1", (), 4.0, "compute_ms_z"),
        ),
        _SUMMARY,
        weak=(9,),
        job_ms=118.5,
        peers={3: (1, 2, 4)},
    ),
    JobOrder("job-a", 1, "expire"),
]  # fmt: skip
