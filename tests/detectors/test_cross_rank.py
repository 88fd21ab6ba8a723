"""Cross-rank scores, robust statistics, kernel level and stack diff on their own."""

from __future__ import annotations

import numpy as np

from argus import detectors as d
from argus.detectors._robust import GroupIndex, group_median_scale
from argus.producers.simulator import (
    CLEAN,
    COMPUTE_STRAGGLER,
    GC_PAUSE,
    KERNEL_NAMES,
    ClusterSimulator,
    Fault,
    Layout,
    SimStep,
)

LAYOUT = Layout(dp=8, tp=4, pp=2)


def step_with(fault: Fault, step: int = 12) -> SimStep:
    """One step under the clean noise: single-step figures, exact (a heavy-tailed blip of
    another rank in one step is a transient, which the temporal stage deals with)."""
    sim = ClusterSimulator(LAYOUT, seed=3, faults=[fault], noise=CLEAN)
    return list(sim.run(step + 1))[-1]


def test_group_statistics_equal_and_unequal_groups() -> None:
    x = np.array([[1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 40.0]])
    gi = GroupIndex.of(np.array([1, 1, 1, 0, 0, 0, 0]))
    med, scale = group_median_scale(x, gi, floor_abs=0.0, floor_rel=0.0)
    assert gi.keys.tolist() == [0, 1] and gi.sizes.tolist() == [4, 3]
    assert med.tolist() == [[25.0, 2.0]]
    assert np.allclose(scale, [[1.4826 * 10.0, 1.4826]])
    eq = GroupIndex.of(np.array([0, 0, 1, 1]))
    med2, scale2 = group_median_scale(np.array([[1.0, 1.0, 5.0, 7.0]]), eq, floor_abs=0.5)
    assert med2.tolist() == [[1.0, 6.0]] and scale2[0, 0] == 0.5
    # waits in a group of two: the longer wait is the centre, 2 % of it the scale (a MAD of
    # two values would be half their difference); larger groups keep median and MAD
    waits = np.array([True])
    med3, scale3 = group_median_scale(np.array([[10.0, 60.0, 5.0, 7.0]]), eq, floor_abs=0.5, waits=waits)
    assert med3.tolist() == [[60.0, 7.0]] and np.allclose(scale3, [[1.2, 0.5]])
    med4, _ = group_median_scale(x, gi, floor_abs=0.0, floor_rel=0.0, waits=waits)
    assert med4.tolist() == [[25.0, 2.0]]
    odd = GroupIndex.of(np.array([0, 0, 1, 1, 1]))  # unequal groups: the same rule
    med5, _ = group_median_scale(np.array([[10.0, 60.0, 5.0, 7.0, 9.0]]), odd, waits=waits)
    assert med5.tolist() == [[60.0, 7.0]]


def test_straggler_is_the_only_flagged_rank_even_with_ranks_missing() -> None:
    s = step_with(Fault(COMPUTE_STRAGGLER, 10, 5, (21,), magnitude=1.3))
    cr = d.cross_rank(s.batch)
    assert cr.ranks.tolist() == [21]
    assert cr.pos[cr.metric("compute_ms"), 0] and cr.z[cr.metric("collective_ms"), 0] < -8
    partial = s.batch.take(np.setdiff1d(np.arange(64), [0, 1, 2, 40]))  # unequal stages
    assert d.cross_rank(partial).ranks.tolist() == [21]


def test_kernel_level_against_peers_and_history() -> None:
    s = step_with(Fault(COMPUTE_STRAGGLER, 10, 5, (21,), magnitude=1.5))
    ks = s.kernel_stats([21, 22, 23, 24, 25])
    kf = d.kernel_level(ks[21], [ks[r] for r in (22, 23, 24, 25)], KERNEL_NAMES, rank=21, history=ks[22])
    assert 1.4 <= kf.compute_ratio <= 1.6 and kf.collective_ratio < 1.0
    # a throttled GPU: the compute kernels that take time, GEMMs first (most time added), no NCCL
    names = {k.name for k in kf.degraded}
    assert len(names) >= 4 and not any(n.startswith("nccl") for n in names)
    assert kf.families[0] == "gemm" and all(1.4 <= k.p50_ratio <= 1.6 for k in kf.degraded)
    assert kf.distance > 0.2 and kf.history_distance > 0.2
    healthy = d.kernel_level(ks[22], [ks[r] for r in (23, 24, 25)], KERNEL_NAMES)
    assert healthy.degraded == () and healthy.distance < 0.05
    assert "kernel_compute_ratio" in kf.evidence()


def test_stack_diff_names_what_the_suspect_does_more() -> None:
    s = step_with(Fault(GC_PAUSE, 12, 1, (7,), magnitude=400.0))
    st = s.stacks([7, 8, 9])
    top = d.stack_diff(st[7], [st[8], st[9]])
    assert top[0].frame.endswith(";gc:collect") and top[0].delta > 0.3


def test_cost_figures() -> None:
    assert d.step_ms_added(50.0, 600.0) == 50.0 and d.step_ms_added(-3.0, 600.0) == 0.0
    assert d.gpu_hours(3600.0, 1000) == 1.0
