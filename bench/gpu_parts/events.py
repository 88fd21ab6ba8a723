"""The ``events`` part: the agent's CUDA-event phase times against torch.profiler's on the
same steps."""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .model import ListSink, Size, build, new_agent, steps_of, sync_device, train_step


def profiler_phase_ms(trace: dict[str, Any], phases: Sequence[str]) -> dict[str, list[float]]:
    """GPU milliseconds of each ``record_function`` range named in ``phases``, in order, as a
    pair of CUDA events around the range measures them: from when the GPU could reach the
    start (the range's CPU start, or the end of the device work launched before it, if
    later) to the end of the last device activity launched inside the range (its runtime
    calls, on any thread, matched to kernels, copies and sets by correlation id). Kineto
    puts CPU and GPU events on one clock."""
    events = trace.get("traceEvents", [])
    ranges: dict[str, list[tuple[float, float]]] = {p: [] for p in phases}
    launches: list[tuple[float, int]] = []
    device: dict[int, tuple[float, float]] = {}
    for e in events:
        cat, args = e.get("cat", ""), e.get("args") or {}
        if cat == "user_annotation" and e.get("name") in ranges:
            ranges[e["name"]].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches.append((float(e["ts"]), int(args["correlation"])))
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in args:
            c = int(args["correlation"])
            s, t = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
            old = device.get(c)
            device[c] = (s, t) if old is None else (min(old[0], s), max(old[1], t))
    launches.sort()
    ts = np.array([t for t, _ in launches])
    ends = np.array([device[c][1] if c in device else -np.inf for _, c in launches])
    busy_until = np.maximum.accumulate(ends) if len(ends) else ends  # by launch order
    out: dict[str, list[float]] = {}
    for p, rs in ranges.items():
        spans = []
        for a, b in sorted(rs):
            lo, hi = np.searchsorted(ts, a), np.searchsorted(ts, b, side="right")
            dev = [device[c] for _, c in launches[lo:hi] if c in device]
            if not dev:
                spans.append(0.0)
                continue
            start = max(a, float(busy_until[lo - 1])) if lo > 0 else a
            spans.append((max(d[1] for d in dev) - min(start, min(d[0] for d in dev))) / 1e3)
        out[p] = spans
    return out


def part_events(size: Size, device: str) -> dict[str, Any]:
    """The agent's CUDA-event phase times against torch.profiler's on the same steps."""
    import torch

    model, opt, data = build(size, device)
    for i in range(3):
        train_step(model, opt, data[i % len(data)], marks=True)
    sync_device(device)
    sink = ListSink()
    agent = new_agent(sink, cupti=False)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with tempfile.TemporaryDirectory() as tmp:
        with torch.profiler.profile(activities=acts) as prof:
            agent.install(model, opt)
            for i in range(size.steps):
                train_step(model, opt, data[i % len(data)], marks=True)
            sync_device(device)
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    time.sleep(1.5)
    agent.close()
    phases = ("argus.forward", "argus.backward", "argus.optimizer")
    prof_ms = profiler_phase_ms(trace, phases)
    rows = steps_of(sink)
    skip = 2  # the first steps warm both up
    out: dict[str, Any] = {"cuda": device == "cuda", "steps": size.steps, "agent_gpu_clock": agent.gpu}
    worst = 0.0
    for p in phases:
        col = p.split(".")[1] + "_ms"
        ours = [float(rows[s][col][0]) for s in sorted(rows) if s >= skip]
        theirs = prof_ms[p][skip : skip + len(ours)]
        n = min(len(ours), len(theirs))
        if n == 0:
            out[f"{col}_pct"] = None
            worst = math.inf
            continue
        a, b = sum(ours[:n]), sum(theirs[:n])
        pct = (a / b - 1) * 100 if b > 0 else math.inf
        out[f"{col}_agent"], out[f"{col}_profiler"], out[f"{col}_pct"] = a / n, b / n, pct
        worst = max(worst, abs(pct))
    out["event_vs_profiler_pct"] = worst
    return out
