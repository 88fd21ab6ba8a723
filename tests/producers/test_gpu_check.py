"""bench/gpu.py's pure parts and its CPU path (the GPU check must not rot between the rare
sessions that have a GPU): sketches against exact quantiles of the same CUPTI-shaped records,
profiler phases from a Kineto-shaped trace, the whole driver with --smoke."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from argus.producers.collectors.cupti import KIND_CONCURRENT_KERNEL, Activity, CuptiCollector
from tests.helpers.bench import load_bench

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"


@pytest.fixture(scope="module")
def gpu() -> Any:
    return load_bench("gpu")


def test_sketches_are_compared_with_the_exact_durations_of_the_same_records(gpu):
    raw = gpu.cupti_shaped(6)
    emitted = CuptiCollector("j", 0, 0).feed(raw, current_step=100, lag=0, final=True)
    acc = gpu.sketch_accuracy(raw, emitted)
    assert acc["steps_compared"] == 6 and acc["kernels_per_step"] == 200
    assert acc["counts_totals_exact"]
    assert acc["kernels_compared"] == 6 * 8  # 25 calls of each of 8 names per step
    assert 0 < acc["sketch_p99_err_max"] <= 0.011
    assert acc["sketch_ratio"] > 50


def test_a_sketch_that_lost_a_kernel_is_not_exact(gpu):
    raw = gpu.cupti_shaped(3)
    emitted = CuptiCollector("j", 0, 0).feed(raw, current_step=100, lag=0, final=True)
    extra = [*raw, Activity(KIND_CONCURRENT_KERNEL, "kernel_0", 10, 20, 7, 1)]  # correlation 1: step 0
    assert not gpu.sketch_accuracy(extra, emitted)["counts_totals_exact"]


def test_profiler_phases_are_measured_as_an_event_pair_around_the_range(gpu):
    ev = [
        {"cat": "user_annotation", "name": "argus.forward", "ts": 100, "dur": 50},
        {"cat": "user_annotation", "name": "argus.backward", "ts": 160, "dur": 50},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 110, "dur": 2, "args": {"correlation": 1}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 120, "dur": 2, "args": {"correlation": 2}},
        # launched on the autograd thread inside the backward range
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 170, "dur": 2, "args": {"correlation": 3}},
        {"cat": "kernel", "name": "a", "ts": 300, "dur": 1000, "args": {"correlation": 1}},
        {"cat": "kernel", "name": "b", "ts": 1400, "dur": 600, "args": {"correlation": 2}},
        {"cat": "gpu_memcpy", "name": "c", "ts": 2100, "dur": 400, "args": {"correlation": 3}},
    ]
    got = gpu.profiler_phase_ms({"traceEvents": ev}, ("argus.forward", "argus.backward", "argus.optimizer"))
    # as a CUDA-event pair: from the range's CPU start (the GPU was idle) to the last kernel's end
    assert got["argus.forward"] == [pytest.approx(1.9)]  # 100 .. 2000 us
    # the GPU reaches the backward's start event only when the forward's work is done
    assert got["argus.backward"] == [pytest.approx(0.5)]  # 2000 .. 2500 us
    assert got["argus.optimizer"] == []


def test_the_check_runs_on_a_machine_without_cuda_and_says_where_it_stopped(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: scripts/gpu-check.sh runs the real thing")
    p = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert (
        sum(line.startswith("gpu-check: stopped where CUDA is needed: no CUDA device") for line in lines) == 1
    )
    last = json.loads(lines[-1])
    assert last["cuda"] is False and last["sketch_p99_err_max"] <= 0.011
    assert (tmp_path / "gpu.jsonl").read_text().count("\n") == 2  # the cupti part's line and the summary


def test_every_part_runs_on_the_cpu(tmp_path):
    """The whole driver, each part in its process, the straggler's two gloo ranks included:
    on the CPU the figures mean nothing, but every code path the GPU run takes is taken."""
    p = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--cpu", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "gpu.jsonl").read_text().splitlines()]
    parts = {r["part"]: r for r in lines[:-1]}
    assert set(parts) == {"cupti", "events", "nvml", "overhead", "straggler"}
    assert not lines[-1]["errors"], lines[-1]["errors"]
    assert parts["events"]["forward_ms_agent"] > 0
    assert parts["overhead"]["agent"]["rounds"] >= 1
    # both ranks' records went through the engine (on a busy CPU the figures are not checked)
    assert parts["straggler"]["gpu_straggler_named"] is False  # no kernels, no kernel evidence
    assert isinstance(parts["straggler"]["anomalies"], list)
    assert np.isfinite(lines[-1]["overhead_gpu_pct"])


def test_the_collector_copies_records_out_of_cuptis_buffer():
    cupti = pytest.importorskip("cupti.cupti")
    r = cupti.ActivityKernel11() if hasattr(cupti, "ActivityKernel11") else cupti.ActivityKernel10()
    r.kind, r.name, r.start, r.end, r.stream_id, r.correlation_id = (
        int(cupti.ActivityKind.CONCURRENT_KERNEL),
        "k",
        10,
        30,
        7,
        5,
    )
    c = CuptiCollector("j", 0, 0)
    c._completed([r])
    (kept,) = c._chunks
    r.start = 99  # the buffer is reused once the callback returns: the copy keeps its value
    assert (kept.names, kept.start_ns.tolist(), kept.end_ns.tolist()) == (["k"], [10], [30])
    assert (kept.stream_ids.tolist(), kept.correlation_ids.tolist()) == ([7], [5])
