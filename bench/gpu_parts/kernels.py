"""The ``cupti`` part: CUPTI kernel activity through the agent's collector, the sketches it
emitted against numpy's exact quantiles of the same records; without CUDA, records shaped
like cupti-python's built here."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from argus.producers.collectors.cupti import (
    KIND_CONCURRENT_KERNEL,
    KIND_EXTERNAL_CORRELATION,
    Activity,
    ActivityArrays,
    activity_arrays,
    join_arrays,
    step_events,
)
from argus.producers.sketch._synthetic import kineto_kernel_event
from argus.schemas import KernelNames, KernelSketch, encode
from argus.schemas.kernel_codec import decode_payload

from .model import ListSink, Size, build, new_agent, sync_device, train_step

PROBS = (0.5, 0.9, 0.99)
QCOLS = [2, 4, 6]  # p50, p90, p99 in the codec's seven quantiles
MIN_CALLS = 20


def sketch_accuracy(raw: Sequence[Any], emitted: Sequence[Any]) -> dict[str, Any]:
    """The sketches' error against the exact durations of the same activity records.

    ``raw``: what the collector was fed; ``emitted``: its ``KernelNames`` and
    ``KernelSketch`` records, in order. Counts and totals must match exactly; quantile
    errors are relative, for kernels with at least ``MIN_CALLS`` calls in a step.
    """
    a = _columns(raw)
    by_step = step_events(a)
    names: dict[int, str] = {}
    for rec in emitted:
        if isinstance(rec, KernelNames):
            names.update(zip(rec.ids, rec.names, strict=True))
    sketches = sorted((r for r in emitted if isinstance(r, KernelSketch)), key=lambda r: r.step)
    errs: list[np.ndarray] = []
    raw_bytes, enc_bytes, per_step, exact = [], [], [], True
    names_bytes = sum(len(encode(r)) for r in emitted if isinstance(r, KernelNames))
    prev = None
    for sk in sketches:
        dec = decode_payload(sk.payload, prev if sk.base_step >= 0 else None)
        prev = dec
        rows = by_step.get(sk.step)
        if rows is None:
            continue
        dur = a.end_ns[rows] - a.start_ns[rows]
        step_names = [a.names[i] for i in rows]
        per_step.append(len(rows))
        enc_bytes.append(len(encode(sk)))
        raw_bytes.append(
            sum(
                len(kineto_kernel_event(n, s / 1e3, d / 1e3, int(st), int(c)))
                for n, s, d, st, c in zip(
                    step_names,
                    a.start_ns[rows],
                    dur,
                    a.stream_ids[rows],
                    a.correlation_ids[rows],
                    strict=True,
                )
            )
        )
        groups: dict[str, list[int]] = defaultdict(list)
        for n, d in zip(step_names, dur.tolist(), strict=True):
            groups[n].append(d)
        row_of = {names.get(int(k), ""): j for j, k in enumerate(dec.ids)}
        for n, ds in groups.items():
            j = row_of.get(n)
            if j is None or int(dec.count[j]) != len(ds) or int(dec.total_ns[j]) != sum(ds):
                exact = False
                continue
            if len(ds) >= MIN_CALLS:
                truth = np.quantile(np.array(ds, dtype=np.float64), PROBS)
                errs.append(np.abs(dec.quantiles_ns[j][QCOLS] / np.maximum(truth, 1) - 1))
    e = np.vstack(errs) if errs else np.full((1, 3), np.nan)
    mean_enc = (float(np.mean(enc_bytes)) + names_bytes / max(len(enc_bytes), 1)) if enc_bytes else math.nan
    return {
        "steps_compared": len(per_step),
        "kernels_per_step": float(np.median(per_step)) if per_step else 0.0,
        "kernels_compared": len(errs),
        "counts_totals_exact": exact and bool(per_step),
        "sketch_p50_err_max": float(e[:, 0].max()),
        "sketch_p90_err_max": float(e[:, 1].max()),
        "sketch_p99_err_max": float(e[:, 2].max()),
        "sketch_p99_err_mean": float(e[:, 2].mean()),
        "raw_bytes_per_step": float(np.mean(raw_bytes)) if raw_bytes else math.nan,
        "sketch_bytes_per_step": mean_enc,
        "sketch_ratio": float(np.mean(raw_bytes)) / mean_enc if enc_bytes else math.nan,
    }


def _columns(raw: Sequence[Any]) -> ActivityArrays:
    """Records (shaped like cupti-python's) or the collector's column chunks, as one."""
    if raw and isinstance(raw[0], ActivityArrays):
        return join_arrays(list(raw))
    return activity_arrays(raw)


def cupti_shaped(steps: int, seed: int = 0) -> list[Activity]:
    """CUPTI records as the collector copies them (kernels tagged with their step)."""
    rng = np.random.default_rng(seed)
    out, corr, t = [], 1, 1_000_000
    for s in range(steps):
        for k in range(200):
            name = f"kernel_{k % 8}"
            d = int(rng.lognormal(10 + k % 8 / 4, 0.3))
            out.append(
                Activity(KIND_EXTERNAL_CORRELATION, correlation_id=corr, external_kind=3, external_id=s)
            )
            out.append(Activity(KIND_CONCURRENT_KERNEL, name, t, t + d, 7, corr))
            corr, t = corr + 1, t + d + 500
    return out


def part_cupti(size: Size, device: str) -> dict[str, Any]:
    """Kernel activity through the agent's collector, sketches against the same records: the
    agent's default (one step traced in ``kernel_every``) first, its figures the part's, then
    every step traced."""
    if device != "cuda":
        return {"cuda": False, **sketch_accuracy(*_pure_sketches(size.steps))}
    model, opt, data = build(size, device)
    for i in range(3):
        train_step(model, opt, data[i % len(data)])
    sync_device(device)
    res = _cupti_run(model, opt, data, size, device)
    res["every_step"] = _cupti_run(model, opt, data, size, device, kernel_every=1)
    return res


def _cupti_run(model: Any, opt: Any, data: Any, size: Size, device: str, **cfg: Any) -> dict[str, Any]:
    sink = ListSink()
    agent = new_agent(sink, **cfg)
    agent.install(model, opt)
    if agent.cupti is None:
        agent.close()
        return {"error": f"CUPTI absent: {agent.absent.get('cupti')}"}
    raw: list[ActivityArrays] = []
    feed = agent.cupti._feed

    def tee(a: Any, current_step: int, lag: int, final: bool) -> Any:
        raw.append(a)
        return feed(a, current_step, lag, final)

    agent.cupti._feed = tee
    t0 = time.perf_counter()
    for i in range(size.steps):
        train_step(model, opt, data[i % len(data)])
    sync_device(device)
    step_ms = (time.perf_counter() - t0) * 1e3 / size.steps
    time.sleep(1.5)  # a publishing round drains what the last steps left
    buffer_dropped = agent.cupti.buffer_dropped()
    untagged_before = agent.cupti.dropped_records
    c = agent.cupti
    agent.close()
    emitted = [r for _, r in sink.items if isinstance(r, KernelNames | KernelSketch)]
    acc = sketch_accuracy(raw, emitted)
    return {
        "cuda": True,
        "tagging": agent.config.cupti_tagging,
        "kernel_every": agent.config.kernel_every,
        **acc,
        "step_ms": step_ms,
        "steps": size.steps,
        "cupti_dropped": buffer_dropped,
        "cupti_untagged": untagged_before,
        "cupti_untraced": c.untraced_records,
        "toggles": c.toggles,
        "toggle_us_mean": c.toggle_ns / max(c.toggles, 1) / 1e3,
        "records_seen": sum(len(a) for a in raw),
        "agent_absent": dict(agent.absent),
    }


def _pure_sketches(steps: int) -> tuple[list[Activity], list[Any]]:
    from argus.producers.collectors.cupti import CuptiCollector

    raw = cupti_shaped(max(steps, 3))
    c = CuptiCollector("gpu-check", 0, 0)
    return raw, c.feed(raw, current_step=10**6, lag=0, final=True)
