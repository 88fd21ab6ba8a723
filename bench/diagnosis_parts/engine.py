"""The live engine on the simulator, as a stream worker runs it: the layouts of the suites,
one run's anomalies and labels (:class:`Run`), and the run itself."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from argus.detectors import JobDiagnoser
from argus.producers.simulator import KERNEL_NAMES, ClusterSimulator, Fault, Label, Layout, Noise
from argus.schemas import Anomaly

LAYOUTS = {
    1024: Layout(dp=16, tp=8, pp=8),
    16384: Layout(dp=64, tp=8, pp=32),
    100_000: Layout(dp=125, tp=8, pp=100),
}


@dataclass
class Run:
    """Anomalies (final versions, with the step they were first emitted) and labels."""

    anomalies: list[Anomaly]
    detected_step: dict[str, int]
    labels: tuple[Label, ...]
    steps: int
    ms_per_step: list[float] = field(default_factory=list)
    transients: int = 0
    ranks: int = 0
    multi: tuple[int, ...] = ()


def simulate(
    layout: Layout, seed: int, faults: list[Fault], steps: int, *, noise: Noise, kernels: bool = True
) -> Run:
    """Run the simulator and the diagnosis side by side."""
    sim = ClusterSimulator(layout, seed=seed, job=f"bench-{seed}", faults=faults, noise=noise)
    return engine_run(sim, steps, kernels=kernels)


def engine_run(sim: ClusterSimulator, steps: int, *, kernels: bool = True) -> Run:
    """The live engine on ``steps`` steps of a simulator, as a worker runs it."""
    layout = sim.layout
    diag = JobDiagnoser(sim.job, 0)
    final: dict[str, Anomaly] = {}
    first: dict[str, int] = {}
    times: list[float] = []
    for s in sim.run(steps):
        t0 = time.perf_counter()
        res = diag.step(
            s.batch,
            kernels=s.kernel_stats if kernels else None,
            stacks=s.stacks if kernels else None,
            names=KERNEL_NAMES,
        )
        times.append((time.perf_counter() - t0) * 1e3)
        for a in res.anomalies:
            final[a.id] = a
            first.setdefault(a.id, s.step)
    for a in diag.flush():
        final[a.id] = a
    labels = tuple(lab for lab in sim.labels if lab.first_step < steps)  # faults the run reached
    transients = sum(diag.state.transients.values())
    return Run(list(final.values()), first, labels, steps, times, transients, layout.n_ranks)
