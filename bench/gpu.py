"""The GPU layer on a real GPU: CUPTI kernel sketches, CUDA-event phase timing, NVML, the
always-on overhead and a straggler, one JSON line per part.

A small GPT (built here from a config, bf16 autocast, one GPU) is trained with the rank agent
attached (``RankAgent`` as ``argus.attach`` builds it, publishing into memory: the GPU
machine has no broker). Each part runs in a process of its own, so a driver or CUPTI fault
in one cannot take the others down; a part that fails says why in its JSON line.

- ``cupti``: the agent with all three layers; the CUPTI activity records the collector
  received are kept beside the sketches it emitted (a tee on ``CuptiCollector.feed``), so
  the sketches' p50/p90/p99 are compared with numpy's exact quantiles of the *same* records
  (kernels with >= 20 calls in a step, as ``bench/compression.py``); counts and totals must
  be exact. ``sketch_ratio`` is the raw events' bytes as Kineto writes them (JSON) over the
  sketches' and names' bytes. ``cupti_dropped``: records CUPTI dropped for want of a buffer
  (``cuptiActivityGetNumDroppedRecords``) plus records no step tag reached.
- ``events``: the agent's CUDA-event phase times (forward, backward, optimizer: cupti off,
  since Kineto and cupti-python cannot both own CUPTI's activity callbacks) against
  torch.profiler on the *same* steps: each phase is a ``record_function`` range, its GPU time
  the span of the kernels launched inside it (runtime calls matched by correlation id).
- ``nvml``: every field the node agent emits, sampled each second for 30 s while a matmul
  loads the GPU (run beside ``cupti`` and ``events``, which only compare records with
  records); DCGM's name and unit for each; what the driver or container refuses is listed.
- ``overhead``: blocks of steps with the agent (all three layers) and without, side by side
  in rounds off/on/on/off (or the mirror), a fresh agent per block, the first step of a
  block untimed; torch.profiler the same way in a process of its own. Medians of the
  rounds' ratios and their standard errors.
- ``straggler``: two processes on the one GPU (under CUDA MPS where the machine has it:
  without it the GPU time-slices the two contexts and both ranks slow together), data
  parallel by hand (the gradients all-reduced over gloo each step), rank 1 slowed by a GPU
  busy-wait kernel (``torch.cuda._sleep``, which every rank runs, ~10 us on the healthy
  ones) in its forward for a stretch of steps; the records of both agents go through the
  one engine with the kernel level (the stream worker's ``EvidenceHistory``); it must name
  rank 1 with kernel evidence.

Without a CUDA device it runs the part that needs none (the sketch-vs-exact comparison on
cupti-python records built here, through the same code) and says in one line that the rest
needs CUDA. ``--out DIR`` writes ``gpu.jsonl`` (every part's line) there.

    python bench/gpu.py [--quick | --smoke] [--out DIR] [--parts cupti,events,...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pickle
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

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

PARTS = ("cupti", "events", "nvml", "overhead", "straggler")
PROBS = (0.5, 0.9, 0.99)
QCOLS = [2, 4, 6]  # p50, p90, p99 in the codec's seven quantiles
MIN_CALLS = 20
# field -> (DCGM field, unit) for what the node agent emits (producers/collectors/nvml.py)
DCGM = {
    "utilization": ("DCGM_FI_DEV_GPU_UTIL", "%"),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK", "MHz"),
    "power_mw": ("DCGM_FI_DEV_POWER_USAGE", "W"),
    "temp_c": ("DCGM_FI_DEV_GPU_TEMP", "C"),
    "clock_event_reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "bitmask"),
    "ecc_dbe": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "count"),
    "remapped_rows": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "count"),
    "xid_events": ("DCGM_FI_DEV_XID_ERRORS", "xid"),
    "field_138": ("DCGM_FI_PROF_NVLINK_TX_BYTES", "bytes (NVML: KiB)"),
    "field_139": ("DCGM_FI_PROF_NVLINK_RX_BYTES", "bytes (NVML: KiB)"),
    "field_38": ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "count"),
    "field_45": ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "count"),
    "field_52": ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "count"),
    "field_59": ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "count"),
}


@dataclass(frozen=True)
class Size:
    """The model and the run lengths of one size of the check."""

    vocab: int
    dim: int
    layers: int
    heads: int
    seq: int
    batch: int
    steps: int  # cupti and events
    rounds: int  # overhead
    block: int  # steps per overhead block (a multiple of the agent's kernel_every)
    straggler_steps: int
    nvml_s: float


SIZES = {
    "full": Size(16384, 1024, 12, 16, 1024, 8, 64, 10, 32, 90, 30.0),
    "quick": Size(8192, 512, 6, 8, 512, 8, 30, 6, 16, 60, 10.0),
    "smoke": Size(512, 64, 2, 4, 32, 2, 6, 1, 2, 24, 1.0),
}


# -- pure: exact quantiles vs sketches, profiler phases ---------------------------------
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


# -- the model and the loop ----------------------------------------------------------------
def build(size: Size, device: str) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    """The GPT, its AdamW and a few batches of token ids on ``device``."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = size.dim
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            h = size.heads
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(size.vocab, size.dim)
            self.pos = nn.Embedding(size.seq, size.dim)
            self.blocks = nn.Sequential(*[Block() for _ in range(size.layers)])
            self.ln = nn.LayerNorm(size.dim)
            self.head = nn.Linear(size.dim, size.vocab, bias=False)

        def forward(self, idx: Any, targets: Any) -> Any:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            logits = self.head(self.ln(self.blocks(x)))
            return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    torch.manual_seed(0)
    model = GPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    data = [
        (
            torch.randint(0, size.vocab, (size.batch, size.seq), generator=g).to(device),
            torch.randint(0, size.vocab, (size.batch, size.seq), generator=g).to(device),
        )
        for _ in range(4)
    ]
    return model, opt, data


def train_step(
    model: Any,
    opt: Any,
    batch: tuple[Any, Any],
    *,
    marks: bool = False,
    slow: int = 0,
    before_step: Any = None,
) -> None:
    """One step (bf16 autocast on CUDA); ``marks``: each phase in a ``record_function``;
    ``slow``: GPU cycles of busy-wait before the forward (a slowed GPU)."""
    import torch

    mark = torch.profiler.record_function if marks else (lambda _n: contextlib.nullcontext())
    device = batch[0].device.type
    with mark("argus.forward"):
        if slow and device == "cuda":
            torch.cuda._sleep(slow)  # every rank runs it: a kernel the peers share, slower on one
        elif slow:
            time.sleep(slow / 2e9)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(*batch)
    with mark("argus.backward"):
        loss.backward()
    if before_step is not None:
        before_step()
    with mark("argus.optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)


class ListSink:
    """The agent's sink, in memory: (topic, record) in publishing order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def publish(self, topic: str, key: bytes, record: Any) -> None:
        """Keep the record."""
        with self._lock:
            self.items.append((topic, record))


def new_agent(sink: ListSink, rank: int = 0, world: int = 1, **cfg: Any) -> Any:
    """A rank agent as ``argus.attach`` builds it (heartbeats every second), not installed."""
    from argus.producers.agent import AgentConfig, RankAgent, RankInfo

    info = RankInfo("gpu-check", 0, rank, world, 0, socket.gethostname())
    return RankAgent(sink, info, AgentConfig(heartbeat_s=1.0, **cfg))


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _steps_of(sink: ListSink) -> dict[int, Any]:
    """The step rows the agent published, by step (decoded from their wire bytes)."""
    from argus.schemas import STEPS, decode

    out = {}
    for topic, rec in sink.items:
        if topic == STEPS:
            b = decode(rec)
            out[int(b.step)] = b
    return out


# -- the parts ----------------------------------------------------------------------------
def part_cupti(size: Size, device: str) -> dict[str, Any]:
    """Kernel activity through the agent's collector, sketches against the same records: the
    agent's default (one step traced in ``kernel_every``) first, its figures the part's, then
    every step traced."""
    if device != "cuda":
        return {"cuda": False, **sketch_accuracy(*_pure_sketches(size.steps))}
    model, opt, data = build(size, device)
    for i in range(3):
        train_step(model, opt, data[i % len(data)])
    _sync(device)
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
    _sync(device)
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


def part_events(size: Size, device: str) -> dict[str, Any]:
    """The agent's CUDA-event phase times against torch.profiler's on the same steps."""
    import torch

    model, opt, data = build(size, device)
    for i in range(3):
        train_step(model, opt, data[i % len(data)], marks=True)
    _sync(device)
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
            _sync(device)
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    time.sleep(1.5)
    agent.close()
    phases = ("argus.forward", "argus.backward", "argus.optimizer")
    prof_ms = profiler_phase_ms(trace, phases)
    rows = _steps_of(sink)
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


def part_nvml(size: Size, device: str) -> dict[str, Any]:
    """Every field the node agent emits, sampled each second under a matmul load."""
    from argus.producers.collectors.nvml import FIELDS, NvmlSampler, field_value, read_device

    sampler = NvmlSampler(socket.gethostname())
    ok, reason = sampler.open()
    if not ok:
        return {"nvml": False, "reason": reason, "nvml_fields_ok": 0, "nvml_fields_refused": len(DCGM)}
    stop = threading.Event()
    load = threading.Thread(target=_matmul_load, args=(stop, device), daemon=True)
    load.start()
    seen: dict[str, list[float]] = defaultdict(list)
    refused: set[str] = set()
    samples = 0
    t_end = time.monotonic() + size.nvml_s
    try:
        while time.monotonic() < t_end:
            samples += len(sampler.sample())  # the node agent's own path, records as published
            nvml = sampler._nvml
            for i, h, uuid in sampler._devices:
                r = read_device(nvml, h, i, uuid)
                values = {
                    "utilization": None if r.utilization is None else r.utilization.gpu,
                    "sm_clock_mhz": r.sm_clock_mhz,
                    "power_mw": None if r.power_mw is None else r.power_mw / 1000,
                    "temp_c": r.temp_c,
                    "clock_event_reasons": r.clock_event_reasons,
                    "ecc_dbe": r.ecc_dbe,
                    "remapped_rows": None if r.remapped_rows is None else r.remapped_rows[1],
                }
                got = {int(fv.fieldId): field_value(fv) for fv in r.field_values}
                for f in FIELDS:
                    values[f"field_{f}"] = got.get(f)
                for k, v in values.items():
                    (seen[k].append(float(v)) if v is not None else refused.add(k))
            time.sleep(1.0)
    finally:
        stop.set()
        load.join(5)
        xid = "xid_events"
        if sampler._events is None:
            refused.add(xid)
        else:
            seen[xid].append(0.0)
        sampler.close()
    fields = {
        k: {
            "dcgm": DCGM[k][0],
            "unit": DCGM[k][1],
            "ok": k in seen and k not in refused,
            "min": min(seen[k]) if seen.get(k) else None,
            "max": max(seen[k]) if seen.get(k) else None,
        }
        for k in DCGM
    }
    return {
        "nvml": True,
        "reason": reason,
        "seconds": size.nvml_s,
        "records": samples,
        "nvml_fields_ok": sum(f["ok"] for f in fields.values()),
        "nvml_fields_refused": sorted(k for k, f in fields.items() if not f["ok"]),
        "fields": fields,
    }


def _matmul_load(stop: threading.Event, device: str) -> None:
    import torch

    if device != "cuda":
        return
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def part_overhead(
    size: Size,
    device: str,
    side: str = "agent",
    rounds: int | None = None,
    budget_s: float = math.inf,
    **agent_cfg: Any,
) -> dict[str, Any]:
    """Paired blocks with and without ``side`` (the agent, or torch.profiler); rounds stop
    early once ``budget_s`` is spent (the line says how many ran), each round said on stderr."""
    import torch

    began = time.perf_counter()
    model, opt, data = build(size, device)
    for i in range(5):
        train_step(model, opt, data[i % len(data)])
    _sync(device)
    it = iter(range(10**9))

    def block(on: bool) -> float:
        ctx: Any = contextlib.nullcontext()
        agent = None
        if on and side == "agent":
            agent = new_agent(ListSink(), **agent_cfg)
            agent.install(model, opt)
        elif on:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if device == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            ctx = torch.profiler.profile(activities=acts)
        with ctx:
            # untimed: the side settles, and the agent's first traced step (CUPTI on from its
            # begin to the begin of the step after the next) is behind it: a block of a
            # multiple of kernel_every steps then holds as many traced steps as the run does
            for _ in range(3):
                train_step(model, opt, data[next(it) % len(data)])
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(size.block):
                train_step(model, opt, data[next(it) % len(data)])
            _sync(device)
            ms = (time.perf_counter() - t0) * 1e3 / size.block
        if agent is not None:
            time.sleep(0.05)
            th = agent._thread
            cpu = _thread_cpu_ms(th.native_id) if th is not None and th.native_id else math.nan
            agent.close()
            agent_cpu.append(round(cpu / (size.block + 1), 3))
            if agent.cupti is not None:
                toggles.append(agent.cupti.toggle_ns / 1e6)
        return ms

    agent_cpu: list[float] = []  # the agent's thread, CPU ms per step of a block
    toggles: list[float] = []  # ms a block spent turning CUPTI's device kinds on and off
    block(True)  # untimed: CUPTI's or the profiler's first start in this process costs seconds
    ratios, off, on = [], [], []
    absent: dict[str, str] = {}
    warm_s = time.perf_counter() - began
    for r in range(rounds or size.rounds):
        if r >= 2 and time.perf_counter() - began > budget_s:
            break
        t: dict[bool, list[float]] = {False: [], True: []}
        for o in ((False, True, True, False), (True, False, False, True))[r % 2]:
            t[o].append(block(o))
        ratios.append(statistics.mean(t[True]) / statistics.mean(t[False]) - 1)
        off += t[False]
        on += t[True]
        print(
            f"overhead {side} {agent_cfg}: round {r} off {t[False]} on {t[True]} ms/step"
            f" at {time.perf_counter() - began:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    if side == "agent":
        probe = new_agent(ListSink(), **agent_cfg)
        probe.install(model, opt)
        absent = dict(probe.absent)
        probe.close()
    med = statistics.median(ratios)
    # the median's standard error from the rounds' MAD (one stalled round must not swamp it)
    mad = statistics.median(abs(r - med) for r in ratios)
    se = 1.2533 * 1.4826 * mad / math.sqrt(len(ratios)) if len(ratios) > 1 else math.nan
    return {
        "side": side,
        **agent_cfg,
        "rounds": len(ratios),
        "block_steps": size.block,
        "setup_s": round(warm_s, 1),
        "step_ms_off": statistics.median(off),
        "step_ms_on": statistics.median(on),
        "overhead_pct": med * 100,
        "overhead_se_pct": se * 100,
        "absent_layers": absent,
        # every round's figures, so a wide error can be told from a real cost afterwards
        "round_pct": [round(x * 100, 3) for x in ratios],
        "block_ms_off": [round(x, 3) for x in off],
        "block_ms_on": [round(x, 3) for x in on],
        "agent_thread_cpu_ms_per_step": agent_cpu,
        "toggle_ms_per_block": [round(x, 3) for x in toggles],
    }


def _thread_cpu_ms(tid: int) -> float:
    """CPU milliseconds a thread of this process has used (Linux; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _mps(device: str) -> Iterator[dict[str, str] | None]:
    """CUDA MPS for the straggler's two processes where the machine has it (its environment),
    else None. Without MPS the GPU time-slices the two processes' contexts, so one rank's
    busy-wait kernel stalls its peer's kernels too and the two ranks slow together (seen on
    an H100: the slowed rank was not named); under MPS the one-block spin kernel holds one SM
    and the peer runs beside it, as on a machine with a GPU per rank."""

    ctl = shutil.which("nvidia-cuda-mps-control")
    if device != "cuda" or ctl is None:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="argus-mps-")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=folder, CUDA_MPS_LOG_DIRECTORY=folder)
    if subprocess.run([ctl, "-d"], env=env, capture_output=True, timeout=20).returncode != 0:
        yield None
        return
    try:
        yield {"CUDA_MPS_PIPE_DIRECTORY": folder, "CUDA_MPS_LOG_DIRECTORY": folder}
    finally:
        subprocess.run([ctl], input=b"quit\n", env=env, capture_output=True, timeout=20)


def part_straggler(size: Size, device: str, out: Path) -> dict[str, Any]:
    """Two processes on the one GPU (under MPS where it runs), rank 1 slowed by a busy-wait
    kernel; the engine with the kernel level must name rank 1 with kernel evidence."""
    with _mps(device) as mps:
        res = _straggler(size, device, mps, out)
    if mps is not None and "error" in res:  # the MPS server refused the clients: time-sliced
        return {"mps": False, "mps_error": res["error"], **_straggler(size, device, None, out)}
    return {"mps": mps is not None, **res}


def _straggler(size: Size, device: str, mps: dict[str, str] | None, out: Path) -> dict[str, Any]:
    steps = size.straggler_steps
    slow = (steps // 3, steps // 3 + steps // 3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the ranks' records stay beside gpu.jsonl: an anomaly's window can be checked afterwards
    files = [out / f"straggler-rank{r}.pkl" for r in range(2)]
    env = dict(
        os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1", **(mps or {})
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--rank-of-straggler",
                str(r),
                "--steps",
                str(steps),
                "--to",
                str(f),
                *(["--cpu"] * (device != "cuda")),
            ],
            env=env,
        )
        for r, f in enumerate(files)
    ]
    try:
        codes = [p.wait(timeout=150) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return {"error": "rank processes did not finish in 150 s"}
    if codes != [0, 0]:
        return {"error": f"rank processes exited {codes}"}
    recs = [pickle.loads(f.read_bytes()) for f in files]
    anomalies = replay(recs, "gpu-straggler")
    named = [
        a
        for a in anomalies
        if 1 in a.ranks
        and 0 not in a.ranks
        and a.start_step < slow[1]
        and a.end_step >= slow[0]  # the slowed stretch, not a blip before it
        and any(k.startswith(("kernel:", "kernel_family:")) for k in a.evidence)  # a slow kernel named
    ]
    return {
        "steps": steps,
        "slowed_steps": list(slow),
        "gpu_straggler_named": bool(named),
        "anomalies": [
            {
                "cause": a.cause,
                "level": a.level,
                "suspect": a.suspect,
                "ranks": list(a.ranks),
                "window": [a.start_step, a.end_step],
                "evidence": list(a.evidence)[:12],
                "summary": a.summary[:200],
            }
            for a in anomalies
        ],
    }


def straggler_rank(rank: int, steps: int, to: Path, device: str) -> None:
    """One rank of the straggler part (run in its own process)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    small = Size(2048, 256, 4, 4, 256, 8, 0, 0, 0, steps, 0)
    if device != "cuda":
        small = Size(512, 32, 1, 2, 16, 2, 0, 0, 0, steps, 0)
    model, opt, data = build(small, device)
    # Data parallel by hand: the gradients' mean over gloo each step (DDP's bucketed gloo
    # all-reduce of CUDA tensors stalled on a first run; the peer's wait is the same).
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))

    def mean_grads() -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat[: sum(g.numel() for g in grads)] = torch.cat([g.flatten().float().cpu() for g in grads])
        dist.all_reduce(flat)
        flat.div_(2)

    lo, hi = steps // 3, 2 * (steps // 3)
    sink = ListSink()
    agent = new_agent(sink, rank=rank, world=2, cupti_tagging=os.environ.get("ARGUS_GPU_TAGGING", "marker"))
    agent.install(model, opt)
    for s in range(steps):
        # ~250 ms vs ~10 us at ~2 GHz: about the step (a 60 ms spin on a 250 ms step came out as
        # a 35 ms longer collective wait on the peer, under the step's own noise)
        cycles = int(500e6) if rank == 1 and lo <= s < hi else 20_000
        train_step(model, opt, data[s % len(data)], slow=cycles, before_step=mean_grads)
        if s % 10 == 0:
            print(f"straggler rank {rank}: step {s}", file=sys.stderr, flush=True)
    _sync(device)
    time.sleep(1.5)
    agent.close()
    dist.destroy_process_group()
    to.write_bytes(pickle.dumps(sink.items))


def replay(ranks: Sequence[list[tuple[str, Any]]], job: str) -> list[Any]:
    """The agents' records through the one engine with the kernel level, step by step as the
    stream worker sees them: each step's kernel evidence kept before the step is diagnosed."""
    from argus.detectors import DiagnoserConfig, JobDiagnoser, JobState, apply_findings, step_findings
    from argus.schemas import STEPS, StackSample, StepBatch, decode

    EvidenceHistory = _evidence_history()

    rows: dict[int, list[Any]] = defaultdict(list)
    evidence: dict[int, list[Any]] = defaultdict(list)
    names: list[Any] = []
    for items in ranks:
        for topic, rec in items:
            if topic == STEPS:
                b = decode(rec)
                rows[int(b.step)].extend(r for r in b.records())
            elif isinstance(rec, KernelNames):
                names.append(rec)
            elif isinstance(rec, KernelSketch | StackSample):
                evidence[rec.step].append(rec)
    cfg = DiagnoserConfig()
    hist = EvidenceHistory()
    for n in names:
        hist.add(_renamed(n, job))
    state = JobState.new(job, 0, cfg)
    final: dict[str, Any] = {}
    for s in sorted(rows):
        if len(rows[s]) < len(ranks):
            continue
        for rec in evidence.get(s, []):
            hist.add(_renamed(rec, job))
        batch = StepBatch.from_records(sorted((_renamed(r, job) for r in rows[s]), key=lambda r: r.rank))
        res = apply_findings(state, step_findings(batch, cfg), cfg, deepen=hist.deepener(job, 0, cfg))
        final.update((a.id, a) for a in res.anomalies)
    final.update((a.id, a) for a in JobDiagnoser(job, 0, cfg, state).flush(hist.deepener(job, 0, cfg)))
    return sorted(final.values(), key=lambda a: (a.start_step, a.cause))


def _evidence_history() -> Any:
    """The stream worker's kernel-evidence store. Its module needs no Faust, but its package
    imports the Faust app, and the GPU machine has no Faust: load the module alone there."""
    try:
        from argus.streams.deepening import EvidenceHistory
    except ImportError:
        import types

        pkg = types.ModuleType("argus.streams")
        pkg.__path__ = [str(Path(__file__).resolve().parents[1] / "argus" / "streams")]
        sys.modules["argus.streams"] = pkg
        from argus.streams.deepening import EvidenceHistory
    return EvidenceHistory


def _renamed(rec: Any, job: str) -> Any:
    from dataclasses import replace

    return replace(rec, job=job)


# -- driver ---------------------------------------------------------------------------------
def _cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, f"no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda})"
    return True, f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"


def run_part(name: str, size: Size, out: Path, device: str) -> dict[str, Any]:
    """One part in this process (the driver runs each in a child)."""
    t0 = time.perf_counter()
    try:
        if name == "cupti":
            res = part_cupti(size, device)
        elif name == "events":
            res = part_events(size, device)
        elif name == "nvml":
            res = part_nvml(size, device)
        elif name == "overhead":
            # within the part's 400 s: the agent as it ships first, then with every step's
            # kernels traced and with CUPTI off (what each layer costs), then torch.profiler
            res = part_overhead(size, device, "agent", budget_s=110)
            alt = {
                name: part_overhead(size, device, "agent", size.rounds // 2, budget_s=40, **cfg)
                for name, cfg in (("every_step", {"kernel_every": 1}), ("no_cupti", {"cupti": False}))
            }
            prof = part_overhead(size, device, "profiler", max(2, size.rounds // 4), budget_s=40)
            res = {
                "overhead_gpu_pct": res["overhead_pct"],
                "overhead_gpu_se_pct": res["overhead_se_pct"],
                **{f"overhead_{t}_gpu_pct": a["overhead_pct"] for t, a in alt.items()},
                **{f"overhead_{t}_gpu_se_pct": a["overhead_se_pct"] for t, a in alt.items()},
                "profiler_overhead_gpu_pct": prof["overhead_pct"],
                "profiler_overhead_gpu_se_pct": prof["overhead_se_pct"],
                "agent": res,
                **{f"agent_{t}": a for t, a in alt.items()},
                "profiler": prof,
            }
        elif name == "straggler":
            res = part_straggler(size, device, out)
        else:
            raise ValueError(f"unknown part {name!r}")
    except Exception as exc:  # one part's failure is its line, not the run's end
        import traceback

        res = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    return {"part": name, "device": device, "seconds": round(time.perf_counter() - t0, 1), **res}


@contextlib.contextmanager
def _child(
    name: str, size_name: str, out: Path, timeout: float, cpu: bool
) -> Iterator[subprocess.Popen[str]]:
    p = subprocess.Popen(
        [sys.executable, __file__, "--one", name, "--size", size_name, "--out", str(out), *(["--cpu"] * cpu)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield p
    finally:
        if p.poll() is None:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _line(p: subprocess.Popen[str], name: str) -> dict[str, Any]:
    out = p.stdout.read() if p.stdout else ""
    p.wait()
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"part": name, "error": f"the part's process exited {p.returncode} without a result"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true")
    g.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="folder for gpu.jsonl")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument(
        "--cpu", action="store_true", help="run every part on the CPU (the code paths, not the figures)"
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--size", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank-of-straggler", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--to", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.out is None and not (args.one or args.rank_of_straggler is not None):
        with tempfile.TemporaryDirectory(prefix="argus-gpu-") as tmp:  # gpu.jsonl goes with it
            args.out = Path(tmp)
            _main(args)
        return
    _main(args)


def _main(args: argparse.Namespace) -> None:
    size_name = args.size or ("smoke" if args.smoke else "quick" if args.quick else "full")
    size = SIZES[size_name]
    out = args.out or Path(tempfile.gettempdir())
    out.mkdir(parents=True, exist_ok=True)
    if args.rank_of_straggler is not None:
        straggler_rank(args.rank_of_straggler, args.steps, args.to, "cpu" if args.cpu else "cuda")
        return
    if args.one:
        device = "cuda" if _cuda()[0] and not args.cpu else "cpu"
        print(json.dumps(run_part(args.one, size, out, device), default=str), flush=True)
        return
    ok, why = _cuda()
    wanted = [p for p in args.parts.split(",") if p]
    if not ok and not args.cpu:
        wanted = [p for p in wanted if p == "cupti"]  # its pure half needs no GPU
    results: list[dict[str, Any]] = []

    def run(name: str) -> None:
        with _child(name, size_name, out, 400, args.cpu) as p:
            results.append(_line(p, name))
        print(json.dumps(results[-1], default=str), flush=True)

    # nvml beside cupti and events (they compare records with records, not times)
    beside = [p for p in wanted if p in ("cupti", "events")] if "nvml" in wanted else []
    if "nvml" in wanted:
        with _child("nvml", size_name, out, 120, args.cpu) as nv:
            for name in beside:
                run(name)
            results.append(_line(nv, "nvml"))
            print(json.dumps(results[-1], default=str), flush=True)
    for name in [p for p in wanted if p != "nvml" and p not in beside]:
        run(name)
    summary = _summary(results, ok, why)
    _table(results)
    (out / "gpu.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in [*results, summary]))
    if not ok:
        print(f"gpu-check: stopped where CUDA is needed: {why}")
    print(json.dumps(summary, default=str))


def _summary(results: list[dict[str, Any]], cuda: bool, why: str) -> dict[str, Any]:
    by = {r["part"]: r for r in results}
    keys = {
        "cupti": (
            "sketch_ratio",
            "sketch_p99_err_max",
            "kernels_per_step",
            "cupti_dropped",
            "cupti_untagged",
        ),
        "events": ("event_vs_profiler_pct",),
        "nvml": ("nvml_fields_ok", "nvml_fields_refused"),
        "overhead": (
            "overhead_gpu_pct",
            "overhead_gpu_se_pct",
            "profiler_overhead_gpu_pct",
            "profiler_overhead_gpu_se_pct",
        ),
        "straggler": ("gpu_straggler_named",),
    }
    out: dict[str, Any] = {"cuda": cuda, "device": why}
    for part, ks in keys.items():
        for k in ks:
            out[k] = by.get(part, {}).get(k)
    # every step traced and CUPTI off, beside the default's figures
    over = by.get("overhead", {})
    out.update({k: v for k, v in over.items() if k.startswith("overhead_") and k not in out})
    cupti = by.get("cupti", {})
    out.update({k: cupti.get(k) for k in ("counts_totals_exact", "step_ms", "toggle_us_mean")})
    for name, sub in cupti.items():
        if isinstance(sub, dict) and "tagging" in sub:
            for k in (
                "cupti_untagged",
                "cupti_dropped",
                "sketch_p99_err_max",
                "counts_totals_exact",
                "step_ms",
            ):
                out[f"{name}_{k}"] = sub.get(k)
    out["errors"] = {r["part"]: r["error"] for r in results if "error" in r}
    return out


def _table(results: list[dict[str, Any]]) -> None:
    print(f"{'part':<10} {'s':>6}  figures")
    for r in results:
        figs = {
            k: v
            for k, v in r.items()
            if k not in ("part", "seconds", "fields", "anomalies", "trace", "agent", "profiler")
            and not isinstance(v, dict)
        }
        text = ", ".join(f"{k}={_fmt(v)}" for k, v in figs.items())
        print(f"{r['part']:<10} {r.get('seconds', 0):>6}  {text[:400]}")


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
