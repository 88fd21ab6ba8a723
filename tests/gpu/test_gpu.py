"""The GPU layer on a real GPU (run by scripts/gpu-check.sh): CUPTI sketches, CUDA-event phase
timing, NVML and a straggler, each through bench/gpu.py's parts at a small size.

Skipped where torch sees no CUDA device. Speed is not asserted here (bench/gpu.py measures the
overhead); these check that each layer works on the device and what it reports is right.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.helpers.bench import load_bench

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


@pytest.fixture(scope="module")
def gpu() -> Any:
    return load_bench("gpu")


def test_cupti_sketches_match_the_same_records(gpu):
    size = dataclasses.replace(gpu.SIZES["quick"], steps=20)
    res = gpu.part_cupti(size, "cuda")
    assert "error" not in res, res
    every = res["every_step"]
    # as shipped: steps 0 and 16 traced; every step traced: all but the last ones
    assert res["steps_compared"] == 2 and every["steps_compared"] >= 16, res
    for r in (res, every):
        assert r["counts_totals_exact"], r
        assert r["kernels_per_step"] >= 50, r
        assert r["kernels_compared"] > 0, r
        assert r["sketch_p99_err_max"] <= 0.01, r
        assert r["cupti_dropped"] in (0, None), r


def test_cuda_event_phases_agree_with_torch_profiler(gpu):
    size = dataclasses.replace(gpu.SIZES["quick"], steps=12)
    res = gpu.part_events(size, "cuda")
    assert res["agent_gpu_clock"], res
    assert res["event_vs_profiler_pct"] <= 10, res


def test_nvml_reads_the_node_agents_fields_under_load(gpu):
    size = dataclasses.replace(gpu.SIZES["quick"], nvml_s=4.0)
    res = gpu.part_nvml(size, "cuda")
    assert res["nvml"], res
    ok = {k for k, f in res["fields"].items() if f["ok"]}
    assert {"utilization", "sm_clock_mhz", "power_mw", "temp_c"} <= ok, res
    assert res["fields"]["utilization"]["max"] > 0, res  # the matmul load shows


def test_a_gpu_straggler_is_named_with_kernel_evidence(gpu, tmp_path):
    size = dataclasses.replace(gpu.SIZES["quick"], straggler_steps=45)
    res = gpu.part_straggler(size, "cuda", tmp_path)
    assert "error" not in res, res
    assert res["gpu_straggler_named"], res
