"""One small seeded scenario per root-cause class: culprit, class and deciding figure."""

from __future__ import annotations

import pytest

from argus import detectors as d
from argus.producers.simulator import KERNEL_NAMES, ClusterSimulator, Fault, Layout
from argus.schemas import Anomaly, validate

LAYOUT = Layout(dp=8, tp=4, pp=2)  # 64 ranks, 8 hosts

SCENARIOS: dict[str, tuple[Fault, float]] = {
    # fault, the least |value| the deciding figure must show
    d.COMPUTE_STRAGGLER: (Fault(d.COMPUTE_STRAGGLER, 20, 12, (21,), magnitude=1.3), 6.0),
    d.MASKED_COMPUTE_STRAGGLER: (Fault(d.MASKED_COMPUTE_STRAGGLER, 20, 12, (45,), magnitude=1.3), 8.0),
    d.LINK_DEGRADATION: (Fault(d.LINK_DEGRADATION, 20, 12, (9, 17), magnitude=2.5), 6.0),
    d.PIPELINE_BUBBLE: (
        Fault(d.PIPELINE_BUBBLE, 85, 12, magnitude=4.0),
        10.0,
    ),  # the job level's baseline first
    d.PIPELINE_STAGE_IMBALANCE: (Fault(d.PIPELINE_STAGE_IMBALANCE, 20, 12, stage=1, magnitude=1.3), 1.15),
    d.SEQUENCE_LENGTH_IMBALANCE: (Fault(d.SEQUENCE_LENGTH_IMBALANCE, 20, 12, magnitude=1.5), 6.0),
    d.JIT_COMPILE_STALL: (Fault(d.JIT_COMPILE_STALL, 22, 1, (3,), magnitude=900.0), 6.0),
    d.DATALOADER_STALL: (Fault(d.DATALOADER_STALL, 22, 1, (60,), magnitude=1500.0), 6.0),
    d.HOST_CPU_CONTENTION: (Fault(d.HOST_CPU_CONTENTION, 20, 12, host=5), 4.0),
    d.GC_PAUSE: (Fault(d.GC_PAUSE, 22, 1, (33,), magnitude=1200.0), 6.0),
    d.CHECKPOINT_STALL: (Fault(d.CHECKPOINT_STALL, 22, 1, (12,), magnitude=3.0), 6.0),
}


def run(fault: Fault, steps: int = 40) -> tuple[list[Anomaly], dict[str, int], ClusterSimulator]:
    steps = max(steps, fault.first_step + fault.steps + 3)
    sim = ClusterSimulator(LAYOUT, seed=11, job="t", faults=[fault], checkpoint_every=30)
    diag = d.JobDiagnoser("t")
    final: dict[str, Anomaly] = {}
    first: dict[str, int] = {}
    for s in sim.run(steps):
        for a in diag.step(s.batch, kernels=s.kernel_stats, stacks=s.stacks, names=KERNEL_NAMES).anomalies:
            final[a.id] = a
            first.setdefault(a.id, s.step)
    for a in diag.flush():
        final[a.id] = a
    return list(final.values()), first, sim


@pytest.mark.parametrize("cause", list(SCENARIOS))
def test_scenario_names_culprit_class_and_deciding_figure(cause: str) -> None:
    fault, least = SCENARIOS[cause]
    anomalies, first, sim = run(fault)
    (label,) = sim.labels
    assert [a.cause for a in anomalies] == [cause], anomalies
    (a,) = anomalies
    assert a.suspect == label.suspect
    assert set(label.ranks) <= set(a.ranks) or not label.ranks
    assert len(a.ranks) <= 3 or a.suspect_kind == "host"
    key = d.DECIDING_FIGURE[cause]
    assert key in a.evidence and abs(a.evidence[key]) >= least, a.evidence
    assert key in a.summary
    delay = first[a.id] - label.first_step
    assert 0 <= delay <= (0 if cause in d.ONE_OFF_CAUSES else d.DiagnoserConfig().min_steps + 1)
    assert a.start_step == label.first_step and a.end_step >= label.last_step - 1
    assert a.step_ms_added > 0 and a.gpu_hours_lost > 0
    validate(a)


def test_masked_straggler_kernel_level_confirms_the_gpu_computes_most() -> None:
    anomalies, _, _ = run(SCENARIOS[d.MASKED_COMPUTE_STRAGGLER][0])
    (a,) = anomalies
    assert a.level == "kernel"
    assert a.evidence["collective_ms_z"] <= -8 and a.evidence["unaccounted_ms_excess"] > 50
    assert a.evidence["kernel_compute_ratio"] >= 1.2
    assert any(k.startswith("stack:") and "synchronize" in k for k in a.evidence)


def test_link_kernel_level_names_the_slow_collective() -> None:
    (a,), _, _ = run(SCENARIOS[d.LINK_DEGRADATION][0])
    assert a.evidence["kernel_collective_ratio"] > 1.3
    assert any(k.startswith("kernel:ncclDevKernel_AllReduce") for k in a.evidence)
