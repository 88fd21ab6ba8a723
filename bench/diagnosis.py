"""Diagnosis quality and speed on the simulator's fault suite.

Seeded runs of every fault class alone and mixed, at 1,024 and 16,384 ranks (1,024 only
with --quick), plus fault-free runs of 10,000 steps; the time to analyse one step at
16,384 and 100,000 ranks; the hang classes (``hang``, ``lost_rank``) on every hang scenario
of the simulator, with the delay from the hang to the alarm (seconds, 1 s detector tick)
and the alarms on a declared long checkpoint. Prints a table per class, then one JSON line.

    .venv/bin/python bench/diagnosis.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from argus.detectors import HANG_CAUSES, HangState, JobDiagnoser, detect_hang, hang_anomalies
from argus.producers.simulator import (
    FAULT_KINDS,
    HANG_SCENARIOS,
    KERNEL_NAMES,
    ONE_OFF_KINDS,
    PIPELINE_STAGE_IMBALANCE,
    ClusterSimulator,
    Fault,
    HangScenario,
    HangSimulator,
    Label,
    Layout,
    random_fault,
)
from argus.schemas import Anomaly

LAYOUTS = {
    1024: Layout(dp=16, tp=8, pp=8),
    16384: Layout(dp=64, tp=8, pp=32),
    100_000: Layout(dp=125, tp=8, pp=100),
}
GROUP_KINDS = frozenset({"job", "stage", "dp_group"})


@dataclass
class Run:
    """Anomalies (final versions, with the step they were first emitted) and labels."""

    anomalies: list[Anomaly]
    detected_step: dict[str, int]
    labels: tuple[Label, ...]
    steps: int
    ms_per_step: list[float] = field(default_factory=list)


def simulate(layout: Layout, seed: int, faults: list[Fault], steps: int, kernels: bool = True) -> Run:
    """Run the simulator and the diagnosis side by side."""
    sim = ClusterSimulator(layout, seed=seed, job=f"bench-{seed}", faults=faults)
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
    return Run(list(final.values()), first, labels, steps, times)


def _where(a: Anomaly, lab: Label) -> bool:
    """Same place and time (class aside)."""
    if a.start_step > lab.last_step + 3 or a.end_step < lab.first_step - 1:
        return False
    if a.suspect == lab.suspect or set(a.ranks) & set(lab.ranks):
        return True
    return a.suspect_kind in GROUP_KINDS and lab.suspect_kind in GROUP_KINDS


def suspects_of(a: Anomaly) -> int:
    """Named suspects of an anomaly: its ranks (rank, link, ranks, group) or one host / stage / job."""
    return len(a.ranks) if a.suspect_kind in ("rank", "link", "ranks", "group") else 1


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

    def rates(self) -> tuple[float, float, float, int]:
        """Precision, recall, class accuracy (0 when undefined) and the most suspects."""
        p = self.true_pos / self.anomalies if self.anomalies else 0.0
        r = self.recalled / self.labels if self.labels else 0.0
        acc = self.located_right / self.located if self.located else 0.0
        return p, r, acc, max(self.suspects) if self.suspects else 0


def score(runs: list[Run], tallies: dict[str, Tally]) -> None:
    """Add runs to per-class tallies."""
    for run in runs:
        for a in run.anomalies:
            t = tallies[a.cause]
            t.anomalies += 1
            t.suspects.append(suspects_of(a))
            if any(_where(a, lab) and lab.kind == a.cause for lab in run.labels):
                t.true_pos += 1
        for lab in run.labels:
            t = tallies[lab.kind]
            t.labels += 1
            near = [a for a in run.anomalies if _where(a, lab)]
            if near:
                t.located += 1
            right = [a for a in near if a.cause == lab.kind]
            if right:
                t.located_right += 1
                t.recalled += 1
                t.delays.append(min(run.detected_step[a.id] for a in right) - lab.first_step)


def suite(n_ranks: int, seeds: int, mixed: int, base_seed: int) -> list[Run]:
    """Every class alone (``seeds`` runs each) and ``mixed`` runs of all classes."""
    layout = LAYOUTS[n_ranks]
    runs: list[Run] = []
    for k, kind in enumerate(FAULT_KINDS):
        for i in range(seeds):
            seed = base_seed + 1000 * k + i
            rng = np.random.default_rng(seed)
            first = 5 if kind == PIPELINE_STAGE_IMBALANCE else int(rng.integers(20, 40))
            f = random_fault(kind, layout, rng, first)
            end = first + f.steps
            if kind in ONE_OFF_KINDS:
                end = max(end, 52) if kind == "checkpoint_stall" else end
            runs.append(simulate(layout, seed, [f], end + 8))
    for i in range(mixed):
        seed = base_seed + 99_000 + i
        rng = np.random.default_rng(seed)
        faults: list[Fault] = []
        step = 20
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
        runs.append(simulate(layout, seed, faults, step + 8))
    return runs


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


def fault_free(n_ranks: int, steps: int, seed: int) -> int:
    """Anomalies raised on fault-free runs totalling ``steps`` steps."""
    layout = LAYOUTS[n_ranks]
    alarms = 0
    per_run = 2000
    for i in range(max(steps // per_run, 1)):
        run = simulate(layout, seed + i, [], min(per_run, steps), kernels=False)
        alarms += len(run.anomalies)
    return alarms


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,024 ranks only (< 2 minutes)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    tallies: dict[str, Tally] = defaultdict(Tally)
    sizes = [1024] if args.quick else [1024, 16384]
    for n in sizes:
        seeds, mixed = (8, 3) if n == 1024 else (3, 2)
        if args.quick:
            seeds, mixed = 4, 2
        score(suite(n, seeds, mixed, base_seed=n), tallies)
    hang_tallies: dict[str, Tally] = defaultdict(Tally)
    ckpt_runs = ckpt_alarms = 0
    hang_tick: dict[int, float] = {}
    for n in sizes:
        runs, alarms_, ticks = hang_suite(n, 2 if args.quick else (4 if n == 1024 else 2), hang_tallies)
        ckpt_runs, ckpt_alarms = ckpt_runs + runs, ckpt_alarms + alarms_
        hang_tick[n] = float(np.percentile(ticks, 99))
    free_steps = 10_000
    alarms = fault_free(1024, free_steps, seed=5_000_000)
    ms16 = time_step(16384)
    ms100 = time_step(100_000)
    print(
        f"{'class':28s} {'prec':>6s} {'recall':>6s} {'acc':>6s} {'n':>4s} {'delay max':>9s} {'delay avg':>9s} {'susp max':>8s}"
    )
    precs, recs, accs, susp = [], [], [], []
    for kind in FAULT_KINDS:
        t = tallies[kind]
        p, r, acc, smax = t.rates()
        dmax = max(t.delays) if t.delays else -1
        davg = float(np.mean(t.delays)) if t.delays else -1.0
        precs.append(p)
        recs.append(r)
        accs.append(acc)
        susp.append(smax)
        print(f"{kind:28s} {p:6.3f} {r:6.3f} {acc:6.3f} {t.labels:4d} {dmax:9d} {davg:9.2f} {smax:8d}")
    other = {k: v.anomalies for k, v in tallies.items() if k not in FAULT_KINDS}
    if other:
        print(f"anomalies of other classes (false alarms): {other}")
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
        precs.append(p)
        recs.append(r)
        accs.append(acc)
        susp.append(smax)
        print(f"{kind:28s} {p:6.3f} {r:6.3f} {acc:6.3f} {t.labels:4d} {hmax:11.1f} {havg:11.1f} {smax:8d}")
    hang_other = {k: v.anomalies for k, v in hang_tallies.items() if k not in HANG_CAUSES}
    if hang_other:
        print(f"hang anomalies of other classes: {hang_other}")
    print(f"declared long checkpoints: {ckpt_alarms} alarm(s) in {ckpt_runs} runs")
    print("hang detector p99 ms per tick: " + ", ".join(f"{n:,} ranks {v:.1f}" for n, v in hang_tick.items()))
    print(f"false alarms: {alarms} in {free_steps} fault-free steps at 1,024 ranks")
    print(f"ms per step: 16,384 ranks {ms16:.1f}, 100,000 ranks {ms100:.1f}")
    print(f"wall time {time.perf_counter() - t_start:.0f} s")
    out = {
        "precision_min": round(min(precs), 4),
        "recall_min": round(min(recs), 4),
        "class_accuracy_min": round(min(accs), 4),
        "suspects_max": int(max(susp)),
        "false_alarms_per_10k_steps": round(alarms * 10_000 / free_steps, 3),
        "ms_per_step_100k": round(ms100, 2),
        "ms_per_step_16k": round(ms16, 2),
        "hang_precision_min": round(min(hang_prec), 4),
        "hang_recall_min": round(min(hang_rec), 4),
        "hang_alarm_s_max": round(max(hang_delay), 1),
        "hang_suspects_max": int(max(hang_susp)),
        "hang_checkpoint_alarms": ckpt_alarms,
        "hang_tick_ms_p99": {str(n): round(v, 2) for n, v in hang_tick.items()},
        "ranks": sizes,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
