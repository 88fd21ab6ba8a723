"""The diagnosis on realistic noise: quiet jobs stay quiet, each fault is one anomaly with
its whole window (heavy-tailed jitter, static offsets, warm-up, unannotated evaluation and
checkpoint steps and GC pauses are in every run: the simulator's default noise)."""

from __future__ import annotations

import numpy as np

from argus import detectors as d
from argus.producers.simulator import REALISTIC, ClusterSimulator, Fault, Layout
from argus.producers.simulator.scoring import match_faults
from argus.schemas import Anomaly

LAYOUT = Layout(dp=8, tp=8, pp=4)  # 256 ranks, 32 hosts


def run(
    faults: list[Fault], steps: int, seed: int = 1, config: d.DiagnoserConfig | None = None
) -> tuple[list[Anomaly], ClusterSimulator, d.JobDiagnoser]:
    sim = ClusterSimulator(LAYOUT, seed=seed, job="real", faults=faults)
    assert sim.noise is REALISTIC
    diag = d.JobDiagnoser("real", config=config)
    final: dict[str, Anomaly] = {}
    for s in sim.run(steps):
        final.update((a.id, a) for a in diag.step(s.batch).anomalies)
    final.update((a.id, a) for a in diag.flush())
    return sorted(final.values(), key=lambda a: a.start_step), sim, diag


def test_a_quiet_job_with_real_noise_raises_nothing_and_counts_its_blips() -> None:
    """1,100 steps: warm-up, two evaluation steps, a checkpoint, GC pauses, heavy tails."""
    anomalies, _, diag = run([], 1100)
    assert anomalies == []
    assert sum(diag.state.transients.values()) > 0  # the blips were seen, and stayed blips


def test_each_fault_is_one_anomaly_over_its_whole_window() -> None:
    faults = [
        Fault(d.COMPUTE_STRAGGLER, 60, 120, host=5, magnitude=1.15),  # a whole host
        Fault(d.COMPUTE_STRAGGLER, 220, 90, (150,), magnitude=1.5, every=3),  # flapping
        Fault(d.COMPUTE_STRAGGLER, 340, 150, (77,), magnitude=1.3, ramp=True),  # drifting
    ]
    anomalies, sim, _ = run(faults, 520)
    sc = match_faults(anomalies, sim.labels, slack=3)
    assert not sc.extras and not sc.wrong and not sc.misses, [
        (a.suspect, a.start_step, a.end_step) for a in anomalies
    ]
    assert sc.iou_min >= 0.8 and max(sc.anomalies_per_fault()) == 1
    host = [a for a in anomalies if a.suspect_kind == "host"]
    assert [(a.suspect, a.ranks) for a in host] == [("node-00005", tuple(range(40, 48)))]
    assert all(a.severity == "page" for a in anomalies)


def test_forty_percent_of_a_stage_slowed_is_one_anomaly_naming_them() -> None:
    rng = np.random.default_rng(3)
    stage = np.flatnonzero(LAYOUT.coords["pp"] == 2)
    slowed = tuple(sorted(int(r) for r in rng.choice(stage, int(0.4 * len(stage)), replace=False)))
    anomalies, _, _ = run([Fault(d.COMPUTE_STRAGGLER, 80, 100, slowed, magnitude=1.2)], 200)
    (a,) = anomalies
    assert (a.suspect_kind, a.suspect, a.cause) == ("ranks", "pp:2", d.COMPUTE_STRAGGLER)
    assert len(set(a.ranks) & set(slowed)) >= 0.95 * len(slowed) and set(a.ranks) <= set(slowed)
    assert abs(a.start_step - 80) <= 1 and abs(a.end_step - 179) <= 1


def test_a_rank_slow_from_the_start_is_a_warning_and_a_change_from_it_pages() -> None:
    """In a job of many ranks, one rank slow since the start is reported once, as a warning
    (a degraded GPU the kernel level and the fleet view want; a small job's is its baseline,
    tests/argus/test_csvlogs.py); slower again by more than a tenth of a step later is a
    change from it: a page with its own onset."""
    anomalies, _, _ = run([Fault(d.COMPUTE_STRAGGLER, 0, 600, (99,), magnitude=1.1)], 600)
    (a,) = anomalies
    assert a.suspect == "rank:99" and a.severity == "warn" and a.evidence["persistent"] == 1.0
    assert a.start_step <= 15 and a.end_step >= 595 and "since the job's start" in a.summary
    faults = [
        Fault(d.COMPUTE_STRAGGLER, 0, 600, (99,), magnitude=1.1),
        Fault(d.COMPUTE_STRAGGLER, 300, 200, (99,), magnitude=1.3),
    ]
    (change,) = [a for a in run(faults, 600)[0] if a.severity == "page"]
    assert change.suspect == "rank:99" and "persistent" not in change.evidence
    assert abs(change.start_step - 300) <= 2 and abs(change.end_step - 499) <= 3
