"""The fault suites of ``bench/diagnosis.py``: every class alone and mixed (realistic and
clean noise), the realistic straggler shapes, the kernel-level classes, the hang classes,
quiet jobs, the time per step, ``trace_filter_2rank``, and the tally and table per class."""

from __future__ import annotations

import importlib.util
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from argus.detectors import (
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
    LINK_DEGRADATION,
    ONE_OFF_KINDS,
    PIPELINE_STAGE_IMBALANCE,
    REALISTIC,
    ClusterSimulator,
    Fault,
    HangScenario,
    HangSimulator,
    Layout,
    Noise,
    random_fault,
)
from argus.producers.simulator.scoring import kernel_named_right, match_faults
from argus.schemas import Anomaly

from .engine import LAYOUTS, Run, simulate

REPO = Path(__file__).resolve().parents[2]
JOB_LEVEL_FROM = DiagnoserConfig().iter_min_steps
"""Steps after the warm-up before the job level can call a step anomalous (it learns how
the job's pace varies first): a job-level fault starts this much later."""
REALISTIC_KINDS = ("flapping", "drift", "host", "multi")
"""The realistic suite's straggler shapes, beside every class of the clean suite."""
KERNEL_KINDS = ("kernel:gemm", "kernel:nccl_link", "stack:dataloader_host")
"""Kernel-level causes (realistic noise): one GPU's GEMMs slower (thermal throttling), NCCL
slow on one link, a host whose CPU starves its data loaders."""


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
