"""The noise space of ``bench/diagnosis.py``: quiet and faulty jobs drawn at random
(:func:`argus.producers.simulator.draw_job`), each diagnosed (:func:`space_job`), run
(:func:`space_suite`), shown one at a time (:func:`show_space_job`, ``--space-job SEED``)
and tabled (:func:`space_table`)."""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from argus.csvlogs import diagnose_log
from argus.producers.simulator import Background, draw_job
from argus.producers.simulator.scoring import window_iou

from .engine import engine_run

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
    on_events: tuple[int, int] = (0, 0)
    """Anomalies no fault explains, and pages of them, that lie on a stretch of the
    background's own noise the size of a fault (:func:`noise_events`): counted among the
    false ones all the same."""


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


EVENT_FACTOR = 1.5
EVENT_STEPS = 3


def noise_events(own: np.ndarray) -> list[tuple[int, int, int]]:
    """Stretches of the background's own noise the size of a fault: a rank's own factor at
    ``EVENT_FACTOR`` or more for ``EVENT_STEPS`` steps or more in a row (heavy-tailed shocks
    of strongly autocorrelated noise reach the generator's 3x cap and stay there for a score
    of steps: no fault is labelled there, but a rank ran that slow). ``own``: steps × ranks.
    Returns (rank, first step, last step)."""
    out = []
    hot = own >= EVENT_FACTOR
    for r in np.flatnonzero(hot.sum(axis=0) >= EVENT_STEPS).tolist():
        edges = np.flatnonzero(np.diff(np.concatenate(([0], hot[:, r].astype(np.int8), [0]))))
        for lo, hi in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
            if hi - lo >= EVENT_STEPS:
                out.append((int(r), lo, hi - 1))
    return out


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
    events = noise_events(job.own)
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
        events = [
            (r, _space_window(res.labels, log.step_t, lo), _space_window(res.labels, log.step_t, hi))
            for r, lo, hi in events
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
    unexplained = [a for i, a in enumerate(anomalies) if i not in matched_any]
    extras = [(a.severity, a.start_step == a.end_step, a.cause) for a in unexplained]
    on = [
        a.severity
        for a in unexplained
        if any(
            r in a.ranks and a.start_step <= hi + SPACE_SLACK and a.end_step >= lo - SPACE_SLACK
            for r, lo, hi in events
        )
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
        (len(on), on.count("page")),
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
    q_events = sum(j.on_events[1] for j in quiet)
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
    print(
        f"of those on quiet jobs, {sum(j.on_events[0] for j in quiet)} ({q_events} pages) lie on a stretch of "
        f"the background's own noise the size of a fault (a rank at {EVENT_FACTOR:g}x or more for "
        f"{EVENT_STEPS}+ steps, no fault labelled there); on faulty jobs "
        f"{sum(j.on_events[0] for j in jobs if not j.quiet)} ({sum(j.on_events[1] for j in jobs if not j.quiet)} pages)"
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
        "space_false_pages_on_noise_events": q_events,
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
