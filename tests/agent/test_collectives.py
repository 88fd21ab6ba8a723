"""Acceptance: collective time under DDP, FSDP2 and direct torch.distributed calls, two real
gloo ranks on the CPU, checked against torch.profiler in the same run; a rank slowed under
DDP is diagnosed as a compute straggler with its peers' collective wait as evidence."""

from __future__ import annotations

from typing import Any

import pytest

from tests.agent.rank_worker import launch
from tests.frameworks.common import batches

pytestmark = pytest.mark.slow

WARMUP, STEPS = 4, 14
COLLECTIVES = ("all_reduce_ms", "all_gather_ms", "reduce_scatter_ms")


def check_against_profiler(
    results: list[dict[str, Any]], columns: tuple[str, ...], tolerance: float = 0.2, key: str = "all"
) -> None:
    """Collective time > 0 on every step after warm-up, and its total within ``tolerance``
    (20 %) of the collective time the profiler saw over the same steps (from the warm-up on):
    ``key`` of :func:`profiled_collective_ms`."""
    for r in results:
        rows = sorted(r["records"], key=lambda x: x["step"])
        assert [x["step"] for x in rows] == list(range(STEPS))
        for x in rows[WARMUP:]:
            assert sum(x[c] for c in columns) > 0, (r["rank"], x)
            assert x["samples"] == 16
            wall = (x["end_ns"] - x["start_ns"]) / 1e6
            phases = ("forward_ms", "backward_ms", "optimizer_ms", "gc_ms", *COLLECTIVES)
            assert sum(x[c] for c in phases) <= wall * 1.01 + 0.5  # exclusive times fit in the step
        ours = sum(x[c] for x in rows[WARMUP:] for c in columns)
        profiled = r["profiler_ms"][key]
        assert profiled > 0
        assert abs(ours - profiled) <= tolerance * profiled, (r["rank"], ours, r["profiler_ms"])


def measured(
    args: list[str], tmp_path, columns: tuple[str, ...], tolerance: float = 0.2, key: str = "all"
) -> list[dict[str, Any]]:
    """Two gloo ranks run ``args``; their collective time checked against the profiler's.
    A second run is allowed once: on two shared cores a scheduling stall in one run can
    hold a completion callback past gloo's own op (both runs' figures are in the error)."""
    results = launch(2, args, tmp_path)
    try:
        check_against_profiler(results, columns, tolerance, key)
    except AssertionError as first:
        again = tmp_path / "again"
        again.mkdir()
        results = launch(2, args, again)
        try:
            check_against_profiler(results, columns, tolerance, key)
        except AssertionError as second:
            raise AssertionError(f"twice out of bounds: {first} / {second}") from None
    return results


def test_ddp_all_reduce_wait_matches_the_profiler(tmp_path):
    # DDP overlaps its buckets' all-reduces with backward; what a rank waits for is the time
    # backward goes on after its last autograd node (DDP's finalizer): the profiler's events
    # give that window, and collectives run for most of it
    args = ["--mode", "ddp", "--dim", "512", "--steps", str(STEPS), "--profile-from", str(WARMUP)]
    results = measured(args, tmp_path, ("all_reduce_ms",), key="backward_wait")
    for r in results:
        assert "ddp" not in r["notes"]
        rows = r["records"][WARMUP:]
        assert all(x["all_gather_ms"] == 0 and x["reduce_scatter_ms"] == 0 for x in rows)
        profiled = r["profiler_ms"]
        assert profiled["backward_wait_in_collectives"] >= 0.6 * profiled["backward_wait"], profiled
        assert sum(x["all_reduce_ms"] for x in rows) <= 1.2 * profiled["all"]  # never more than ran


def test_fsdp2_all_gather_and_reduce_scatter_match_the_profiler_and_the_mesh_names_dp(tmp_path):
    args = ["--mode", "fsdp", "--dim", "512", "--steps", str(STEPS), "--profile-from", str(WARMUP)]
    results = measured(args, tmp_path, COLLECTIVES)
    for r in results:
        rows = r["records"][WARMUP:]
        assert all(x["all_gather_ms"] > 0 and x["reduce_scatter_ms"] > 0 for x in rows)
        # the layout came from the DTensor parameters' mesh ("dp_shard",)
        assert r["info"]["layout"] == "mesh"
        assert all(x["dp"] == r["rank"] and x["tp"] == 0 for x in rows)


def test_direct_calls_sync_and_async_match_the_profiler_and_a_2d_mesh_gives_dp_and_tp(tmp_path):
    args = ["--mode", "direct", "--dim", "512", "--steps", str(STEPS), "--profile-from", str(WARMUP)]
    results = measured([*args, "--mesh", "dp,tp"], tmp_path, ("all_reduce_ms",))
    for r in results:
        assert r["info"]["layout"] == "mesh"
        assert (r["info"]["dp"], r["info"]["tp"]) == (0, r["rank"])  # a (1, 2) mesh


def test_a_rank_slowed_60ms_under_ddp_is_a_compute_straggler_with_its_peers_waiting(tmp_path):
    from argus.detectors import diagnose

    slow = 1
    args = ["--mode", "ddp", "--steps", "30", "--base-ms", "10", "--slow-rank", str(slow), "--slow-ms", "60"]
    steps = batches(launch(3, args, tmp_path))
    assert len(steps) == 30
    mid = steps[15]
    peers = mid["rank"] != slow
    # the peers wait for the straggler in DDP's all-reduce, inside their backward
    assert (mid["all_reduce_ms"][peers] > 40).all()
    assert mid["all_reduce_ms"][slow] < 20
    assert (mid["backward_ms"] < 20).all()
    anomalies = diagnose(steps)
    found = [(a.cause, a.ranks, a.evidence) for a in anomalies]
    stragglers = [a for a in anomalies if a.cause == "compute_straggler"]
    assert {r for a in stragglers for r in a.ranks} == {slow}, found
    assert stragglers[0].evidence["peers_wait_ms"] > 20, found


def test_a_rank_slowed_for_a_stretch_under_ddp_is_one_straggler_over_that_stretch(tmp_path):
    # a fault in the middle of a run, on the agent's own records: one anomaly whose window
    # is the slowed steps (30-54), not cut short and not running on past them
    from argus.detectors import diagnose

    args = ["--mode", "ddp", "--steps", "90", "--base-ms", "10", "--slow-rank", "1", "--slow-ms", "60"]
    steps = batches(launch(3, [*args, "--slow-from", "30", "--slow-until", "55"], tmp_path))
    assert len(steps) == 90
    anomalies = diagnose(steps)
    found = [(a.cause, a.ranks, a.start_step, a.end_step) for a in anomalies]
    assert [(a.cause, list(a.ranks)) for a in anomalies] == [("compute_straggler", [1])], found
    assert abs(anomalies[0].start_step - 30) <= 1 and abs(anomalies[0].end_step - 54) <= 1, found


def test_a_rank_slowed_60ms_under_fsdp2_is_a_compute_straggler_with_its_peers_waiting(tmp_path):
    from tests.frameworks.common import check_straggler

    args = ["--mode", "fsdp", "--steps", "24", "--base-ms", "5", "--slow-rank", "1", "--slow-ms", "60"]
    steps = batches(launch(2, args, tmp_path))
    assert len(steps) == 24
    check_straggler(steps, slow=1, waits=("all_gather_ms", "reduce_scatter_ms"))


def test_functional_collectives_match_the_profiler(tmp_path):
    # torch.distributed._functional_collectives on gloo: AsyncCollectiveTensor results,
    # waited for by .wait() or on first use; an all-gather per step beside the all-reduces
    args = ["--mode", "funcol", "--dim", "512", "--steps", str(STEPS), "--profile-from", str(WARMUP)]
    # a functional collective's span ends when its result is waited for, which on a loaded
    # machine comes later than gloo's own op (measured 22 % over once in CI's 2 busy cores):
    # the 20 % is for DDP and FSDP; here the bound is 35 %
    results = measured(args, tmp_path, ("all_reduce_ms", "all_gather_ms"), tolerance=0.35)
    for r in results:
        rows = r["records"][WARMUP:]
        assert all(x["all_reduce_ms"] > 0 and x["all_gather_ms"] > 0 for x in rows), rows
        assert not any(x["reduce_scatter_ms"] for x in rows)


def test_ddp_with_the_agent_averages_gradients_like_ddps_own_all_reduce(tmp_path):
    # each rank trains on its own batch; a twin DDP using torch's C++ ALLREDUCE hook gets the
    # same batches and weights: the gradients must be the same with the agent timing DDP
    args = ["--mode", "ddp", "--dim", "64", "--steps", "4", "--check-grads"]
    results = launch(2, args, tmp_path)
    for r in results:
        assert r["grad_diff"] < 1e-6, r["grad_diff"]
        assert all(x["all_reduce_ms"] > 0 for x in r["records"][1:])


def test_ddp_with_a_builtin_cpp_hook_is_timed_like_the_default_path(tmp_path):
    # a C++ built-in hook (ALLREDUCE, FP16_COMPRESS) calls no Python: the wait is timed the same way
    results = launch(2, ["--mode", "ddp", "--dim", "64", "--steps", "6", "--builtin-hook"], tmp_path)
    for r in results:
        assert "ddp" not in r["notes"]
        assert all(x["all_reduce_ms"] > 0 for x in r["records"][1:]), r["records"]
