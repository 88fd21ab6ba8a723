"""Diagnosis quality and speed on the simulator's fault suites: realistic noise and clean.

Two suites side by side, each with every fault class alone and mixed, at 1,024 and 16,384
ranks (1,024 only with --quick): the **realistic** one (heavy-tailed jitter, static
offsets, warm-up, unannotated evaluation and checkpoint steps, GC pauses; plus flapping,
drifting, whole-host and multi-rank stragglers, up to 40 % of a pipeline stage), which
decides the defaults, and the **clean** one the detectors were first built on. Quiet
realistic jobs (no fault; 3,000 steps at 1,024 ranks; kernel sketches and stacks at hand,
as live) count false anomalies and transients. The kernel-level classes (one GPU's GEMMs
slower, NCCL slow on one link, a host starving its data loaders) add precision, recall and
``kernel_named_accuracy``: of the faults found, the share whose anomaly is ``level=kernel``
and names the slowed kernel family or frame. Anomalies are matched to the injected faults by :mod:`argus.producers.simulator.scoring` (the
demo's matcher). Also: the time to analyse one step at 16,384 and 100,000 ranks; the hang
classes on every hang scenario, with the delay from the hang to the alarm (1 s detector
tick) and the alarms on a declared long checkpoint; ``trace_filter_2rank`` (HTA's masked
straggler) through ``import-trace --local``. The **noise space**: quiet and faulty jobs
drawn at random from wide ranges of background and fault (:func:`draw_job`), each through
the live engine or the ``--steps-csv`` path without hosts; recall by SNR band, shape, who
and path, false anomalies by severity, anomalies per fault, window IoU, one-step anomalies,
detection delay (docs/benchmarks.md has the ranges, the SNR and the matching rules). Prints
a table per suite, then one JSON line.

    .venv/bin/python bench/diagnosis.py [--quick] [--procs N]
    .venv/bin/python bench/diagnosis.py --smoke        # the noise space alone, < 1 minute
    .venv/bin/python bench/diagnosis.py --space-only [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from argus.csvlogs import diagnose_log
from argus.detectors import (
    HANG_CAUSES,
    PIPELINE_BUBBLE,
    DiagnoserConfig,
    HangState,
    JobDiagnoser,
    detect_hang,
    hang_anomalies,
)
from argus.producers.simulator import (
    CLEAN,
    COMPUTE_STRAGGLER,
    FAULT_KINDS,
    HANG_SCENARIOS,
    HOST_CPU_CONTENTION,
    KERNEL_NAMES,
    LINK_DEGRADATION,
    ONE_OFF_KINDS,
    PIPELINE_STAGE_IMBALANCE,
    REALISTIC,
    Background,
    ClusterSimulator,
    Fault,
    HangScenario,
    HangSimulator,
    Label,
    Layout,
    Noise,
    draw_job,
    random_fault,
)
from argus.producers.simulator.scoring import kernel_named_right, match_faults, window_iou
from argus.schemas import Anomaly

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = {
    1024: Layout(dp=16, tp=8, pp=8),
    16384: Layout(dp=64, tp=8, pp=32),
    100_000: Layout(dp=125, tp=8, pp=100),
}
JOB_LEVEL_FROM = DiagnoserConfig().iter_min_steps
"""Steps after the warm-up before the job level can call a step anomalous (it learns how
the job's pace varies first): a job-level fault starts this much later."""
REALISTIC_KINDS = ("flapping", "drift", "host", "multi")
"""The realistic suite's straggler shapes, beside every class of the clean suite."""
KERNEL_KINDS = ("kernel:gemm", "kernel:nccl_link", "stack:dataloader_host")
"""Kernel-level causes (realistic noise): one GPU's GEMMs slower (thermal throttling), NCCL
slow on one link, a host whose CPU starves its data loaders."""


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


def suspects_of(a: Anomaly) -> int:
    """Named suspects of an anomaly: its ranks (rank, link) or one host / group / stage / job."""
    return len(a.ranks) if a.suspect_kind in ("rank", "link") else 1


@dataclass
class Tally:
    anomalies: int = 0
    true_pos: int = 0
    labels: int = 0
    recalled: int = 0
    located: int = 0
    located_right: int = 0
    delays: list[int] = field(default_factory=list)
    suspects: list[int] = field(default_factory=list)
    hang_delays: list[float] = field(default_factory=list)
    ious: list[float] = field(default_factory=list)
    per_fault: list[int] = field(default_factory=list)

    def rates(self) -> tuple[float, float, float, int]:
        """Precision, recall, class accuracy (0 when undefined) and the most suspects."""
        p = self.true_pos / self.anomalies if self.anomalies else 0.0
        r = self.recalled / self.labels if self.labels else 0.0
        acc = self.located_right / self.located if self.located else 0.0
        return p, r, acc, max(self.suspects) if self.suspects else 0


def score(runs: list[Run], tallies: dict[str, Tally]) -> None:
    """Add runs to per-class tallies (matching by :func:`argus.producers.simulator.scoring.match_faults`)."""
    for run in runs:
        sc = match_faults(run.anomalies, run.labels, slack=3)
        right = sc.right_anomalies
        for i, a in enumerate(run.anomalies):
            t = tallies[a.cause]
            t.anomalies += 1
            t.suspects.append(suspects_of(a))
            t.true_pos += i in right
        per_fault = sc.anomalies_per_fault()
        for j, lab in enumerate(run.labels):
            t = tallies[lab.kind]
            t.labels += 1
            ms = sc.of_label(j)
            t.located += bool(ms)
            good = [m for m in ms if m.right]
            if good:
                t.located_right += 1
                t.recalled += 1
                t.ious.append(max(m.iou for m in good))
                t.per_fault.append(per_fault[j])
                t.delays.append(
                    min(run.detected_step[run.anomalies[m.anomaly].id] for m in good) - lab.first_step
                )


def realistic_fault(kind: str, layout: Layout, rng: np.random.Generator, first: int) -> Fault:
    """The realistic suite's straggler shapes (labelled compute_straggler)."""
    n = layout.n_ranks
    if kind == "flapping":  # slow on every third step
        rank = int(rng.integers(0, n))
        return Fault(COMPUTE_STRAGGLER, first, int(rng.integers(60, 200)), (rank,), magnitude=1.5, every=3)
    if kind == "drift":  # slows gradually to 1.3x
        rank = int(rng.integers(0, n))
        return Fault(COMPUTE_STRAGGLER, first, int(rng.integers(200, 600)), (rank,), magnitude=1.3, ramp=True)
    if kind == "host":  # a whole host 1.15x slower
        return Fault(
            COMPUTE_STRAGGLER,
            first,
            int(rng.integers(60, 200)),
            host=int(rng.integers(0, layout.n_hosts)),
            magnitude=1.15,
        )
    if kind == "multi":  # 40 % of one pipeline stage 1.2x slower
        stage = np.flatnonzero(layout.coords["pp"] == int(rng.integers(0, layout.pp)))
        ranks = tuple(sorted(int(r) for r in rng.choice(stage, int(0.4 * len(stage)), replace=False)))
        return Fault(COMPUTE_STRAGGLER, first, int(rng.integers(40, 120)), ranks, magnitude=1.2)
    raise ValueError(kind)


def kernel_fault(kind: str, layout: Layout, rng: np.random.Generator, first: int) -> Fault:
    """A kernel-level fault of ``kind`` (one of :data:`KERNEL_KINDS`), realistic magnitude."""
    steps = int(rng.integers(12, 31))
    if kind == "kernel:gemm":
        rank = int(rng.integers(0, layout.n_ranks))
        return Fault(
            COMPUTE_STRAGGLER, first, steps, (rank,), magnitude=float(rng.uniform(1.25, 1.4)), kernel="gemm"
        )
    if kind == "kernel:nccl_link":
        return random_fault(LINK_DEGRADATION, layout, rng, first)
    if kind == "stack:dataloader_host":
        host = int(rng.integers(0, layout.n_hosts))
        return Fault(HOST_CPU_CONTENTION, first, steps, host=host, magnitude=float(rng.uniform(80.0, 300.0)))
    raise ValueError(kind)


@dataclass
class KernelTally:
    """Per kernel-level class: anomalies, right ones, labels recalled, and recalled labels
    whose anomaly is at kernel level and names the right kernel family (or frame)."""

    anomalies: int = 0
    right: int = 0
    labels: int = 0
    recalled: int = 0
    named: int = 0


def kernel_suite(n_ranks: int, seeds: int, base_seed: int, tallies: dict[str, KernelTally]) -> None:
    """Every kernel-level class ``seeds`` times under realistic noise, kernels and stacks
    flowing; tallied by class."""
    layout = LAYOUTS[n_ranks]
    for k, kind in enumerate(KERNEL_KINDS):
        for i in range(seeds):
            seed = base_seed + 70_000 + 1000 * k + i
            rng = np.random.default_rng(seed)
            f = kernel_fault(kind, layout, rng, int(rng.integers(30, 50)))
            run = simulate(layout, seed, [f], f.first_step + f.steps + 8, noise=REALISTIC)
            sc = match_faults(run.anomalies, run.labels, slack=3)
            t = tallies[kind]
            t.anomalies += len(run.anomalies)
            t.right += len(sc.right_anomalies)
            for j, lab in enumerate(run.labels):
                t.labels += 1
                good = [run.anomalies[m.anomaly] for m in sc.of_label(j) if m.right]
                if good:
                    t.recalled += 1
                    t.named += any(a.level == "kernel" and kernel_named_right(a, lab.kernel) for a in good)


def suite(n_ranks: int, seeds: int, mixed: int, base_seed: int, noise: Noise) -> list[Run]:
    """Every class alone (``seeds`` runs each) and ``mixed`` runs of all classes; under
    realistic noise also every realistic straggler shape alone."""
    layout = LAYOUTS[n_ranks]
    realistic = noise is not CLEAN
    runs: list[Run] = []
    start = 30 if realistic else 20  # past the realistic warm-up
    for k, kind in enumerate(FAULT_KINDS):
        for i in range(seeds):
            seed = base_seed + 1000 * k + i
            rng = np.random.default_rng(seed)
            first = 5 if kind == PIPELINE_STAGE_IMBALANCE else int(rng.integers(start, start + 20))
            if kind == PIPELINE_BUBBLE:  # a job-level fault: once the job level has its baseline
                first += JOB_LEVEL_FROM
            f = random_fault(kind, layout, rng, first)
            end = first + f.steps
            if kind in ONE_OFF_KINDS:
                end = max(end, 52) if kind == "checkpoint_stall" else end
            runs.append(simulate(layout, seed, [f], end + 8, noise=noise))
    if realistic:
        for k, kind in enumerate(REALISTIC_KINDS):
            for i in range(seeds):
                seed = base_seed + 50_000 + 1000 * k + i
                rng = np.random.default_rng(seed)
                f = realistic_fault(kind, layout, rng, int(rng.integers(start, start + 60)))
                run = simulate(layout, seed, [f], f.first_step + f.steps + 12, noise=noise, kernels=False)
                if kind == "multi":
                    run.multi = f.ranks
                runs.append(run)
    for i in range(mixed):
        seed = base_seed + 99_000 + i
        rng = np.random.default_rng(seed)
        faults: list[Fault] = []
        step = start + JOB_LEVEL_FROM
        for kind in rng.permutation(FAULT_KINDS).tolist():
            f = random_fault(kind, layout, rng, step)
            faults.append(f)
            step += f.steps + 6
            if kind not in ONE_OFF_KINDS:  # a one-off stall elsewhere during a persistent fault
                stall = random_fault(
                    str(rng.choice(["gc_pause", "dataloader_stall", "jit_compile_stall"])),
                    layout,
                    rng,
                    step - f.steps // 2 - 6,
                )
                faults.append(stall)
        runs.append(simulate(layout, seed, faults, step + 8, noise=noise))
    return runs


def multi_recall(runs: list[Run]) -> float:
    """Of the ranks of multi-rank stragglers, the share named by a right anomaly."""
    slowed = named = 0
    for run in runs:
        if not run.multi:
            continue
        slowed += len(run.multi)
        got = {r for a in run.anomalies if a.cause == COMPUTE_STRAGGLER for r in a.ranks}
        named += len(set(run.multi) & got)
    return named / slowed if slowed else 0.0


HANG_AT_S, HANG_WINDOW_S = 40.0, 30.0


def hang_suite(n_ranks: int, seeds: int, tallies: dict[str, Tally]) -> tuple[int, int, list[float]]:
    """Every hang scenario ``seeds`` times: tallies per class (delays in seconds), plus the
    declared-checkpoint runs and their alarms, and the detector's ms per tick."""
    layout = LAYOUTS[n_ranks]
    checkpoints = alarms = 0
    tick_ms: list[float] = []
    for k, kind in enumerate(HANG_SCENARIOS):
        for i in range(seeds):
            sim = HangSimulator(layout, HangScenario(kind, at_s=HANG_AT_S), seed=n_ranks + 100 * k + i)
            state = HangState(sim.job)
            found: dict[str, tuple[Anomaly, float]] = {}
            for now, beats in sim.ticks(1.0, HANG_AT_S + HANG_WINDOW_S + 1, from_s=HANG_AT_S - 12.0):
                state.observe(beats)
                t0 = time.perf_counter()
                verdict = detect_hang(state, now)
                tick_ms.append((time.perf_counter() - t0) * 1e3)
                for a in hang_anomalies(verdict):
                    found.setdefault(a.id, (a, (now - sim.hang_ns) / 1e9))
            if kind == "declared_checkpoint":
                checkpoints += 1
                alarms += len(found)
            for a, _ in found.values():
                t = tallies[a.cause]
                t.anomalies += 1
                t.suspects.append(suspects_of(a))
                if any(lab.cause == a.cause and lab.suspect == a.suspect for lab in sim.labels):
                    t.true_pos += 1
            for lab in sim.labels:
                t = tallies[lab.cause]
                t.labels += 1
                near = [
                    (a, d)
                    for a, d in found.values()
                    if a.suspect == lab.suspect or set(a.ranks) & set(lab.ranks)
                ]
                right = [d for a, d in near if a.cause == lab.cause and lab.collective in a.summary]
                t.located += bool(near)
                if right and min(right) <= HANG_WINDOW_S:
                    t.located_right += 1
                    t.recalled += 1
                    t.hang_delays.append(min(right))
    return checkpoints, alarms, tick_ms


def quiet(n_ranks: int, steps: int, seed: int, noise: Noise) -> tuple[int, int, int]:
    """Anomalies and transients on fault-free runs totalling ``steps`` steps, and the
    rank-steps they covered."""
    layout = LAYOUTS[n_ranks]
    alarms = transients = 0
    per_run = min(3000, steps)
    for i in range(max(steps // per_run, 1)):
        run = simulate(layout, seed + i, [], per_run, noise=noise)  # kernels flow, as live
        alarms += len(run.anomalies)
        transients += run.transients
    return alarms, transients, steps * layout.n_ranks


def two_rank_suspect() -> tuple[int, list[str]]:
    """``trace_filter_2rank`` (HTA's masked straggler) through ``import-trace --local``: 1
    when rank 1 alone is named (bench/import_vs_hta.py's check)."""
    spec = importlib.util.spec_from_file_location("bench_import_vs_hta", REPO / "bench" / "import_vs_hta.py")
    if spec is None or spec.loader is None:
        return 0, ["bench/import_vs_hta.py not found"]
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with tempfile.TemporaryDirectory() as tmp:
        return mod.two_rank_suspect(Path(tmp))  # type: ignore[no-any-return]


def time_step(n_ranks: int, reps: int = 15) -> float:
    """Median ms to diagnose one step of ``n_ranks`` ranks (one straggler present)."""
    layout = LAYOUTS[n_ranks]
    sim = ClusterSimulator(
        layout, seed=7, faults=[Fault("compute_straggler", 10, 100, (123,), magnitude=1.5)]
    )
    diag = JobDiagnoser("timing")
    steps = list(sim.run(10 + reps))
    times = []
    for s in steps:
        t0 = time.perf_counter()
        diag.step(s.batch)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times[10:]))


SPACE_SNR_BOUND = 10.0
"""A fault of the noise space is *detectable* from this signal-to-noise ratio on
(:meth:`argus.producers.simulator.SpaceJob.snr`: its effect summed over its window against
the rank's own residual noise)."""
SNR_BANDS = (0.0, 5.0, 10.0, 20.0, 50.0, np.inf)
SPACE_SLACK = 3
"""Steps (log windows) of tolerance on each side when an anomaly's window meets a fault's."""
SPACE_SIZES = {"full": (200, 300), "quick": (40, 60), "smoke": (6, 10)}
"""Quiet and faulty jobs of the noise space per bench size."""


@dataclass
class SpaceFaultResult:
    """How one fault of the noise space was diagnosed."""

    seed: int
    """The job's (``--space-job SEED`` shows it)."""
    shape: str
    who: str
    size: str
    path: str
    magnitude: float
    snr: float
    matched: int
    """Anomalies at its place and time (1: one anomaly per fault)."""
    named: float
    """Share of its ranks named by those anomalies (1 when one names its group)."""
    iou: float
    """The best window IoU of those anomalies (0: none)."""
    delay: int | None
    """Live single-rank faults reaching 1.2x: steps from that onset to the first emission."""
    classes: tuple[str, ...] = ()
    """The classes of the anomalies at it."""

    @property
    def found(self) -> bool:
        """At least half of its ranks (or its group) named by an anomaly at its time."""
        return self.matched > 0 and self.named >= 0.5

    @property
    def detectable(self) -> bool:
        """Above the SNR bound."""
        return self.snr >= SPACE_SNR_BOUND


@dataclass
class SpaceJobResult:
    """One job of the noise space: the anomalies no fault explains (severity, one step
    long) and every fault's result."""

    seed: int
    quiet: bool
    size: str
    path: str
    steps: int
    extras: list[tuple[str, bool, str]]
    """Per anomaly no fault explains: severity, one step long, class."""
    faults: list[SpaceFaultResult]
    seconds: float
    traits: tuple[str, ...] = ()
    """The background's notable components (:func:`space_traits`)."""


def space_traits(bg: Background) -> tuple[str, ...]:
    """A background's notable components, to tell which phenomenon false anomalies follow."""
    marks = {
        "heavy tails (df<3)": bg.df < 3,
        "strong AR (>0.7)": bg.ar > 0.7,
        "jitter >2%": bg.jitter > 0.02,
        "offsets >6%": bg.offset > 0.06,
        "speed groups": bg.slow_group > 1,
        "shared step factor": bg.shared_sd > 0.01,
        "replica/stage factor": bg.group_sd > 0.01,
        "host blips": bg.blip_rate > 0,
        "rank spikes": bg.spike_rate > 0,
        "GC pauses": bg.gc_rate > 0,
        "eval steps": bg.eval_every > 0,
        "unannotated ckpt": bg.ckpt_every > 0,
        "missing samples": bg.missing > 0,
    }
    return tuple(k for k, v in marks.items() if v)


def _space_window(at: np.ndarray, step_t: np.ndarray, step: int) -> int:
    """The engine step (log window) in which a job step shows."""
    return max(int(np.searchsorted(at, step_t[step], side="right")) - 1, 0)


def space_job(seed: int, faulty: bool) -> SpaceJobResult:
    """Draw one job of the noise space, diagnose it with the real engine (live step batches,
    or its step log through ``argus diagnose --steps-csv``'s path without hosts) and match
    the anomalies to its faults, any class: same time (windows meet, ``SPACE_SLACK`` steps
    of tolerance) and same place (the anomaly names the fault's group, or at least half of
    the ranks it names are the fault's: a host anomaly is no finding of one rank's fault)."""
    t0 = time.perf_counter()
    job = draw_job(seed, faulty=faulty)
    emitted: dict[str, int] = {}
    if job.path == "live":
        run = engine_run(job.simulator(), job.steps, kernels=False)
        anomalies, emitted, steps = run.anomalies, run.detected_step, job.steps
        windows = [(f.first_step, f.last_step) for f in job.faults]
    else:
        log = job.log()
        res = diagnose_log(log.rank, log.t, log.value, by_time=log.by_time, job=job.name)
        anomalies, steps = res.anomalies, len(res.labels)
        windows = [
            (
                _space_window(res.labels, log.step_t, f.first_step),
                _space_window(res.labels, log.step_t, f.last_step),
            )
            for f in job.faults
        ]
    size = "small" if job.small else "1024"
    matched_any: set[int] = set()
    results = []
    for f, (lo, hi) in zip(job.faults, windows, strict=True):
        culprits = set(f.ranks)
        mine = [
            i
            for i, a in enumerate(anomalies)
            if a.start_step <= hi + SPACE_SLACK
            and a.end_step >= lo - SPACE_SLACK
            and (a.suspect == f.group or 2 * len(culprits & set(a.ranks)) >= max(len(a.ranks), 1))
        ]
        matched_any.update(mine)
        if any(anomalies[i].suspect == f.group for i in mine):
            named = 1.0
        else:
            named = len(culprits & {r for i in mine for r in anomalies[i].ranks}) / len(culprits)
        iou = max(
            (window_iou(anomalies[i].start_step, anomalies[i].end_step, lo, hi) for i in mine), default=0.0
        )
        delay = None
        onset = f.onset(1.2)
        fresh = [i for i in mine if anomalies[i].start_step >= lo - SPACE_SLACK]  # opened for this fault
        if job.path == "live" and f.who == "rank" and onset is not None and fresh:
            delay = min(emitted[anomalies[i].id] for i in fresh) - onset
        results.append(
            SpaceFaultResult(
                seed,
                f.shape,
                f.who,
                size,
                job.path,
                f.magnitude,
                job.snr(f),
                len(mine),
                named,
                iou,
                delay,
                tuple(anomalies[i].cause for i in mine),
            )
        )
    extras = [
        (a.severity, a.start_step == a.end_step, a.cause)
        for i, a in enumerate(anomalies)
        if i not in matched_any
    ]
    return SpaceJobResult(
        seed,
        not faulty,
        size,
        job.path,
        steps,
        extras,
        results,
        time.perf_counter() - t0,
        space_traits(job.background),
    )


def _space_one(arg: tuple[int, bool]) -> SpaceJobResult:
    return space_job(*arg)


def space_suite(quiet_jobs: int, faulty_jobs: int, procs: int = 1) -> list[SpaceJobResult]:
    """The noise space's quiet and faulty jobs (seeded: the same jobs every run)."""
    work = [(7_000_000 + i, False) for i in range(quiet_jobs)] + [
        (8_000_000 + i, True) for i in range(faulty_jobs)
    ]
    if procs <= 1:
        return [space_job(*w) for w in work]
    with ProcessPoolExecutor(procs) as pool:
        return list(pool.map(_space_one, work, chunksize=2))


def show_space_job(seed: int) -> None:
    """Print one job of the noise space: its background, faults, and what the engine found
    (``--space-job SEED``; seeds from 8,000,000 are the faulty jobs)."""
    faulty = seed >= 8_000_000
    job = draw_job(seed, faulty=faulty)
    lay = job.layout
    print(
        f"job {seed}: {lay.n_ranks} ranks (dp {lay.dp}, tp {lay.tp}, pp {lay.pp}, {lay.gpus_per_host}/host), "
        f"{job.steps} steps, seen as {job.path}"
        + (f" (a sample every {job.sample_every:.1f} steps)" if job.path == "csv_time" else "")
    )
    print(f"background: {job.background}")
    for f in job.faults:
        print(
            f"fault: {f.shape} on {f.who} {f.group} ({len(f.ranks)} ranks: {list(f.ranks)[:16]}), steps "
            f"{f.first_step}-{f.last_step}, {f.magnitude:.2f}x, period {f.period}, SNR {job.snr(f):.1f}"
        )
    if job.path == "live":
        run = engine_run(job.simulator(), job.steps, kernels=False)
        anomalies, emitted = run.anomalies, run.detected_step
    else:
        log = job.log()
        res = diagnose_log(log.rank, log.t, log.value, by_time=log.by_time, job=job.name)
        anomalies, emitted = res.anomalies, {}
        for f in job.faults:
            lo, hi = (_space_window(res.labels, log.step_t, s) for s in (f.first_step, f.last_step))
            print(f"  (fault {f.group}: windows {lo}-{hi} of the log's {len(res.labels)})")
    for a in sorted(anomalies, key=lambda a: a.start_step):
        at = f", emitted at {emitted[a.id]}" if a.id in emitted else ""
        print(
            f"anomaly {a.start_step}-{a.end_step}{at}: {a.cause} {a.severity} {a.suspect_kind} {a.suspect} "
            f"ranks {list(a.ranks)[:16]}{'...' if len(a.ranks) > 16 else ''}: {a.summary[:160]}"
        )
    result = space_job(seed, faulty)
    for fr in result.faults:
        print(
            f"scored: {fr.shape} {fr.who}: matched {fr.matched}, named {fr.named:.2f}, IoU {fr.iou:.2f}, delay {fr.delay}"
        )
    counts: dict[str, int] = defaultdict(int)
    for sev, one, cause in result.extras:
        counts[f"{cause} {sev}{' one step' if one else ''}"] += 1
    print("unexplained: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def _space_rows(title: str, groups: dict[str, list[SpaceFaultResult]]) -> None:
    """One block of the noise-space table: per group, faults, recall (all and detectable),
    anomalies per fault, IoU p10 and median, delay p50/p95 (live single-rank >= 1.2x)."""
    print(
        f"{title:16s} {'n':>4s} {'det':>4s} {'recall':>6s} {'rec det':>7s} {'per f max':>9s} "
        f"{'IoU p10':>7s} {'IoU p50':>7s} {'delay p50':>9s} {'p95':>5s}"
    )
    for key in sorted(groups):
        fs = groups[key]
        det = [f for f in fs if f.detectable]
        found = [f for f in fs if f.found]
        ious = [f.iou for f in found]
        delays = [float(f.delay) for f in found if f.delay is not None]
        rec = len(found) / len(fs) if fs else float("nan")
        rec_det = sum(f.found for f in det) / len(det) if det else float("nan")
        print(
            f"{key:16s} {len(fs):4d} {len(det):4d} {rec:6.3f} {rec_det:7.3f} "
            f"{max((f.matched for f in found), default=0):9d} {_pct(ious, 10):7.3f} {_pct(ious, 50):7.3f} "
            f"{_pct(delays, 50):9.1f} {_pct(delays, 95):5.1f}"
        )


def space_table(jobs: list[SpaceJobResult]) -> dict[str, object]:
    """Print the noise-space table; its figures for the last-line JSON."""
    quiet = [j for j in jobs if j.quiet]
    faults = [f for j in jobs for f in j.faults]
    q_steps = sum(j.steps for j in quiet)
    q_sev: dict[str, int] = defaultdict(int)
    for j in quiet:
        for sev, _, _ in j.extras:
            q_sev[sev] += 1
    f_sev: dict[str, int] = defaultdict(int)
    for j in jobs:
        if not j.quiet:
            for sev, _, _ in j.extras:
                f_sev[sev] += 1
    f_steps = sum(j.steps for j in jobs if not j.quiet)
    small_pages = sum(sev == "page" for j in jobs if j.size == "small" for sev, _, _ in j.extras)
    one_step = sum(one for j in jobs for _, one, _ in j.extras)
    causes: dict[str, int] = defaultdict(int)
    for j in jobs:
        for _, one, cause in j.extras:
            causes[f"{cause}{' (one step)' if one else ''}"] += 1
    q_false = sum(q_sev.values())
    by_size: dict[str, int] = defaultdict(int)
    for j in jobs:
        by_size[f"{'quiet' if j.quiet else 'faulty'} {j.size} {j.path}"] += 1
    print(
        f"\nnoise space: {len(quiet)} quiet jobs ({q_steps:,} steps), {len(jobs) - len(quiet)} faulty jobs "
        f"({len(faults)} faults), detectable from SNR {SPACE_SNR_BOUND:g}; "
        + ", ".join(f"{k}: {v}" for k, v in sorted(by_size.items()))
    )
    print(
        f"false anomalies on quiet jobs: {q_false} ({q_false * 10_000 / max(q_steps, 1):.2f} per 10k steps; "
        + ", ".join(f"{k} {q_sev[k]}" for k in ("page", "warn", "info"))
        + f"); unexplained on faulty jobs: {sum(f_sev.values())} in {f_steps:,} steps ("
        + ", ".join(f"{k} {f_sev[k]}" for k in ("page", "warn", "info"))
        + f"); pages on small jobs: {small_pages}; one-step anomalies: {one_step}"
    )
    if causes:
        print("unexplained anomalies by class: " + ", ".join(f"{k} {v}" for k, v in sorted(causes.items())))
    print(
        f"{'quiet jobs':16s} {'jobs':>4s} {'steps':>7s} {'page':>5s} {'warn':>5s} {'info':>5s} {'per 10k':>8s} {'one step':>8s}"
    )
    kinds = sorted({f"{j.size} {j.path}" for j in quiet})
    for kind in kinds:
        js = [j for j in quiet if f"{j.size} {j.path}" == kind]
        st = sum(j.steps for j in js)
        sevs = [e[0] for j in js for e in j.extras]
        print(
            f"{kind:16s} {len(js):4d} {st:7,d} {sevs.count('page'):5d} {sevs.count('warn'):5d} {sevs.count('info'):5d} "
            f"{len(sevs) * 10_000 / max(st, 1):8.2f} {sum(e[1] for j in js for e in j.extras):8d}"
        )
    rates = []
    for trait in sorted({t for j in quiet for t in j.traits}):
        with_, without = [j for j in quiet if trait in j.traits], [j for j in quiet if trait not in j.traits]
        per = [
            sum(len(j.extras) for j in g) * 10_000 / max(sum(j.steps for j in g), 1) for g in (with_, without)
        ]
        rates.append(f"{trait} {per[0]:.1f} ({len(with_)}) vs {per[1]:.1f}")
    if rates:
        print(
            "false anomalies per 10k steps on quiet jobs with a component (jobs) vs without: "
            + "; ".join(rates)
        )
    bands: dict[str, list[SpaceFaultResult]] = defaultdict(list)
    for f in faults:
        k = int(np.searchsorted(SNR_BANDS, f.snr, side="right")) - 1
        lo, hi = SNR_BANDS[k], SNR_BANDS[k + 1]
        bands[f"snr {lo:>3.0f}-{hi:<3.0f}" if np.isfinite(hi) else f"snr {lo:>3.0f}+"].append(f)
    by: dict[str, dict[str, list[SpaceFaultResult]]] = {"shape": {}, "who": {}, "size/path": {}}
    for f in faults:
        by["shape"].setdefault(f.shape, []).append(f)
        by["who"].setdefault(f.who, []).append(f)
        by["size/path"].setdefault(f"{f.size} {f.path}", []).append(f)
    print(
        "(n: faults, det: above the SNR bound; recall: at least half its ranks or its group named at its time; "
        "delay: live single-rank faults from where they reach 1.2x)"
    )
    _space_rows("SNR band", bands)
    for title, groups in by.items():
        _space_rows(title, groups)
    at_faults: dict[str, int] = defaultdict(int)
    for f in faults:
        for cause in f.classes:
            at_faults[cause] += 1
    if at_faults:
        print(
            "classes of the anomalies at faults: "
            + ", ".join(f"{k} {v}" for k, v in sorted(at_faults.items()))
        )
    snrs = [f.snr for f in faults]
    print(f"fault SNR: p10 {_pct(snrs, 10):.1f}, median {_pct(snrs, 50):.1f}, p90 {_pct(snrs, 90):.1f}")
    missed = sorted((f for f in faults if f.detectable and not f.found), key=lambda f: -f.snr)
    if missed:
        print(
            "detectable faults missed (bench/diagnosis.py --space-job SEED shows one): "
            + "; ".join(
                f"{f.seed} {f.shape} {f.who} {f.size} {f.path} {f.magnitude:.2f}x SNR {f.snr:.0f}"
                for f in missed[:12]
            )
        )
    noisy = sorted((j for j in jobs if j.extras), key=lambda j: -len(j.extras))
    if noisy:
        print("most unexplained anomalies: " + ", ".join(f"{j.seed} ({len(j.extras)})" for j in noisy[:8]))
    secs = [j.seconds for j in jobs]
    slow = max(jobs, key=lambda j: j.seconds)
    print(
        f"seconds per job: median {_pct(secs, 50):.1f}, max {slow.seconds:.1f} ({slow.seed}, {slow.size} {slow.path})"
    )
    det = [f for f in faults if f.detectable]
    found = [f for f in faults if f.found]
    step_delays = [
        float(f.delay) for f in found if f.delay is not None and f.shape == "step" and f.magnitude >= 1.2
    ]
    delay_shape = {}
    for shape in sorted(by["shape"]):
        ds = [float(f.delay) for f in by["shape"][shape] if f.found and f.delay is not None]
        delay_shape[shape] = [round(_pct(ds, 50), 1), round(_pct(ds, 95), 1)] if ds else None
    found_det = [f for f in det if f.found]
    return {
        "space_false_pages": q_sev["page"],
        "space_false_anomalies_per_10k_steps": round(q_false * 10_000 / max(q_steps, 1), 3),
        "space_recall_detectable": round(len(found_det) / len(det), 4) if det else None,
        "space_anomalies_per_fault_max": max((f.matched for f in found), default=0),
        "space_window_iou_p10": round(_pct([f.iou for f in found_det], 10), 4) if found_det else None,
        "small_job_false_pages": small_pages,
        "delay_steps_p95_1p2x": round(_pct(step_delays, 95), 1) if step_delays else None,
        "one_step_anomalies": one_step,
        "space_snr_bound": SPACE_SNR_BOUND,
        "space_recall_by_snr": {
            k.split(" ", 1)[1].replace(" ", ""): round(sum(f.found for f in v) / len(v), 4)
            for k, v in sorted(
                bands.items(), key=lambda kv: float(kv[0].split()[1].split("-")[0].rstrip("+"))
            )
        },
        "space_recall_by_shape": {
            k: round(sum(f.found for f in v if f.detectable) / max(sum(f.detectable for f in v), 1), 4)
            for k, v in sorted(by["shape"].items())
        },
        "space_delay_by_shape": delay_shape,
        "space_jobs": [len(quiet), len(jobs) - len(quiet)],
    }


def table(title: str, tallies: dict[str, Tally], kinds: tuple[str, ...]) -> dict[str, float]:
    """Print one suite's table; its minima (precision, recall, class accuracy, IoU) and maxima."""
    print(f"\n{title}")
    print(
        f"{'class':28s} {'prec':>6s} {'recall':>6s} {'acc':>6s} {'n':>4s} {'IoU min':>7s} {'per fault':>9s} "
        f"{'delay max':>9s} {'susp max':>8s}"
    )
    precs, recs, accs, ious, per, susp = [], [], [], [], [], []
    for kind in kinds:
        t = tallies[kind]
        p, r, acc, smax = t.rates()
        iou = min(t.ious) if t.ious else 0.0
        pf = max(t.per_fault) if t.per_fault else 0
        dmax = max(t.delays) if t.delays else -1
        precs.append(p)
        recs.append(r)
        accs.append(acc)
        ious.append(iou)
        per.append(pf)
        susp.append(smax)
        print(f"{kind:28s} {p:6.3f} {r:6.3f} {acc:6.3f} {t.labels:4d} {iou:7.3f} {pf:9d} {dmax:9d} {smax:8d}")
    other = {k: v.anomalies for k, v in tallies.items() if k not in kinds}
    if other:
        print(f"anomalies of other classes (false alarms): {other}")
    return {
        "precision_min": min(precs),
        "recall_min": min(recs),
        "class_accuracy_min": min(accs),
        "iou_min": min(ious),
        "per_fault_max": max(per),
        "suspects_max": max(susp),
        "other": float(sum(other.values())),
    }


def _cores() -> int:
    """The cores this process may run on (a container's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,024 ranks only, a smaller noise space")
    ap.add_argument(
        "--smoke", action="store_true", help="the noise space only, 6 quiet and 10 faulty jobs (< 1 minute)"
    )
    ap.add_argument(
        "--space-only", action="store_true", help="the noise space only (its keys alone in the JSON)"
    )
    ap.add_argument(
        "--procs",
        type=int,
        default=max(1, min(8, _cores() - 1)),
        help="processes for the noise space's jobs (default: one per core but one, at most 8; 1 on 2 cores)",
    )
    ap.add_argument("--space-job", type=int, metavar="SEED", help="show one job of the noise space and stop")
    args = ap.parse_args()
    if args.space_job is not None:
        show_space_job(args.space_job)
        return
    t_start = time.perf_counter()
    space_size = "smoke" if args.smoke else "quick" if args.quick else "full"
    space_jobs = space_suite(*SPACE_SIZES[space_size], procs=args.procs)
    space_s = time.perf_counter() - t_start
    if args.smoke or args.space_only:
        space = space_table(space_jobs)
        print(f"noise space wall time {space_s:.0f} s")
        print(json.dumps(space))
        return
    sizes = [1024] if args.quick else [1024, 16384]
    suites: dict[str, dict[str, Tally]] = {}
    multi: list[Run] = []
    for name, noise in (("realistic", REALISTIC), ("clean", CLEAN)):
        tallies: dict[str, Tally] = defaultdict(Tally)
        for n in sizes:
            seeds, mixed = (6, 2) if n == 1024 else (2, 1)
            if args.quick:
                seeds, mixed = 2, 1
            runs = suite(n, seeds, mixed, base_seed=n, noise=noise)
            score(runs, tallies)
            if name == "realistic":
                multi += runs
        suites[name] = tallies
    kernel_tallies: dict[str, KernelTally] = defaultdict(KernelTally)
    for n in sizes:
        kernel_suite(n, 3 if args.quick else (6 if n == 1024 else 2), n, kernel_tallies)
    hang_tallies: dict[str, Tally] = defaultdict(Tally)
    ckpt_runs = ckpt_alarms = 0
    hang_tick: dict[int, float] = {}
    for n in sizes:
        runs_, alarms_, ticks = hang_suite(n, 2 if args.quick else (4 if n == 1024 else 2), hang_tallies)
        ckpt_runs, ckpt_alarms = ckpt_runs + runs_, ckpt_alarms + alarms_
        hang_tick[n] = float(np.percentile(ticks, 99))
    q_steps = 3000
    q_alarms, q_trans, q_rank_steps = quiet(1024, q_steps, 5_000_000, REALISTIC)
    if not args.quick:
        a16, t16, rs16 = quiet(16384, 300, 6_000_000, REALISTIC)
        q_alarms, q_trans, q_rank_steps, q_steps = (
            q_alarms + a16,
            q_trans + t16,
            q_rank_steps + rs16,
            q_steps + 300,
        )
    clean_alarms, _, _ = quiet(1024, 3000 if args.quick else 10_000, 5_000_000, CLEAN)
    ms16 = time_step(16384)
    ms100 = time_step(100_000)
    suspect, two_rank_lines = two_rank_suspect()
    kinds = tuple(FAULT_KINDS)
    real = table("realistic noise (decides the defaults)", suites["realistic"], kinds)
    clean = table("clean noise", suites["clean"], kinds)
    print(
        f"\n{'hang class':28s} {'prec':>6s} {'recall':>6s} {'acc':>6s} {'n':>4s} {'alarm s max':>11s} {'alarm s avg':>11s} {'susp max':>8s}"
    )
    hang_prec, hang_rec, hang_delay, hang_susp = [], [], [], []
    for kind in HANG_CAUSES:
        t = hang_tallies[kind]
        p, r, acc, smax = t.rates()
        hmax = max(t.hang_delays) if t.hang_delays else -1.0
        havg = float(np.mean(t.hang_delays)) if t.hang_delays else -1.0
        hang_prec.append(p)
        hang_rec.append(r)
        hang_delay.append(hmax)
        hang_susp.append(smax)
        print(f"{kind:28s} {p:6.3f} {r:6.3f} {acc:6.3f} {t.labels:4d} {hmax:11.1f} {havg:11.1f} {smax:8d}")
    print(f"\n{'kernel-level class':28s} {'prec':>6s} {'recall':>6s} {'named':>6s} {'n':>4s}")
    k_prec, k_rec, k_named = [], [], []
    for kind in KERNEL_KINDS:
        kt = kernel_tallies[kind]
        p = kt.right / kt.anomalies if kt.anomalies else 0.0
        r = kt.recalled / kt.labels if kt.labels else 0.0
        nm = kt.named / kt.recalled if kt.recalled else 0.0
        k_prec.append(p)
        k_rec.append(r)
        k_named.append(nm)
        print(f"{kind:28s} {p:6.3f} {r:6.3f} {nm:6.3f} {kt.labels:4d}")
    print(
        "(named: of the faults found, the anomaly is level=kernel and names the slowed kernel family or frame)"
    )
    print(f"declared long checkpoints: {ckpt_alarms} alarm(s) in {ckpt_runs} runs")
    print("hang detector p99 ms per tick: " + ", ".join(f"{n:,} ranks {v:.1f}" for n, v in hang_tick.items()))
    print(
        f"quiet realistic jobs: {q_alarms} anomalies in {q_steps:,} steps, {q_trans} transients in "
        f"{q_rank_steps:,} rank-steps; clean: {clean_alarms} anomalies"
    )
    mr = multi_recall(multi)
    print(f"multi-rank stragglers (40 % of a stage, 1.2x): {mr:.3f} of the slowed ranks named")
    print(f"trace_filter_2rank through import-trace: suspect rank 1 = {suspect}")
    for line in two_rank_lines:
        print("   " + line)
    print(f"ms per step: 16,384 ranks {ms16:.1f}, 100,000 ranks {ms100:.1f}")
    space = space_table(space_jobs)
    print(f"wall time {time.perf_counter() - t_start:.0f} s (noise space {space_s:.0f} s)")
    out = {
        "realistic_false_per_10k_steps": round(q_alarms * 10_000 / q_steps, 3),
        "realistic_transients_per_10k_rank_steps": round(q_trans * 10_000 / q_rank_steps, 3),
        "realistic_precision_min": round(real["precision_min"], 4),
        "realistic_recall_min": round(real["recall_min"], 4),
        "realistic_class_accuracy_min": round(real["class_accuracy_min"], 4),
        "window_iou_min": round(min(real["iou_min"], clean["iou_min"]), 4),
        "anomalies_per_fault_max": int(max(real["per_fault_max"], clean["per_fault_max"])),
        "multi_straggler_recall": round(mr, 4),
        "hta_2rank_suspect": suspect,
        "precision_min": round(clean["precision_min"], 4),
        "recall_min": round(clean["recall_min"], 4),
        "class_accuracy_min": round(clean["class_accuracy_min"], 4),
        "suspects_max": int(max(real["suspects_max"], clean["suspects_max"])),
        "false_alarms_per_10k_steps": round(clean_alarms * 10_000 / (3000 if args.quick else 10_000), 3),
        "ms_per_step_100k": round(ms100, 2),
        "ms_per_step_16k": round(ms16, 2),
        "kernel_precision_min": round(min(k_prec), 4),
        "kernel_recall_min": round(min(k_rec), 4),
        "kernel_named_accuracy": round(min(k_named), 4),
        "hang_precision_min": round(min(hang_prec), 4),
        "hang_recall_min": round(min(hang_rec), 4),
        "hang_alarm_s_max": round(max(hang_delay), 1),
        "hang_suspects_max": int(max(hang_susp)),
        "hang_checkpoint_alarms": ckpt_alarms,
        "hang_tick_ms_p99": {str(n): round(v, 2) for n, v in hang_tick.items()},
        "ranks": sizes,
        **space,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
