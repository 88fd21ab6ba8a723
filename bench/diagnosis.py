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

The parts are in ``bench/diagnosis_parts/`` (the engine run, the fault suites, the noise
space); this script is the driver.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from argus.detectors import HANG_CAUSES
from argus.producers.simulator import CLEAN, FAULT_KINDS, REALISTIC
from bench.diagnosis_parts.engine import LAYOUTS, Run, engine_run, simulate
from bench.diagnosis_parts.space import (
    SPACE_SIZES,
    SpaceFaultResult,
    SpaceJobResult,
    show_space_job,
    space_job,
    space_suite,
    space_table,
)
from bench.diagnosis_parts.suites import (
    KERNEL_KINDS,
    KernelTally,
    Tally,
    hang_suite,
    kernel_suite,
    multi_recall,
    quiet,
    score,
    suite,
    table,
    time_step,
    two_rank_suspect,
)

__all__ = [  # the parts' names, for anyone who loads this script (tests/helpers/bench.py)
    "KERNEL_KINDS",
    "LAYOUTS",
    "SPACE_SIZES",
    "KernelTally",
    "Run",
    "SpaceFaultResult",
    "SpaceJobResult",
    "Tally",
    "engine_run",
    "hang_suite",
    "kernel_suite",
    "multi_recall",
    "quiet",
    "score",
    "show_space_job",
    "simulate",
    "space_job",
    "space_suite",
    "space_table",
    "suite",
    "table",
    "time_step",
    "two_rank_suspect",
]


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
