"""Kineto trace → the records a live rank would publish: StepBatch, KernelNames, KernelSketch.

Steps are the ``ProfilerStep#N`` annotations. A kernel belongs to the step in which it was
*launched* (its ``cuda_runtime`` event, matched by correlation id; its GPU start when the
launch is missing), as HTA assigns kernels to iterations.

Memory: the JSON is streamed a megabyte at a time and never held; each kernel is kept as a
row of compact columns (about 36 bytes, a twentieth of its JSON) until the end of the file,
because Kineto does not write GPU events in time order (in rank0.json.gz the kernels of the
first step come after those of the third), so no step is known complete before the end.

Phases: data-loader, checkpoint and compile time are the CPU spans of their annotations.
Forward, backward and optimizer time is what the GPU computed for them when the trace has
GPU kernels launched inside those annotations: the busy time (union of intervals) of the
non-collective kernels launched in the phase, as HTA splits GPU time into computation and
communication. The CPU span of ``## forward ##`` also holds the waits for collectives
(on ``trace_filter_2rank`` rank 0's CPU forward is longer than rank 1's while its GPU
computes 10 ms less), so it would hide a compute straggler behind its peers' waiting. A
phase without kernels in the whole trace (a CPU optimizer) keeps its CPU span.

Step records need wall-clock times: ``ts`` (µs) plus ``baseTimeNanoseconds`` when the trace
has it (newer PyTorch writes it at the *end* of the file, so step records are emitted at
the end; they are a few hundred bytes each). Traces without it whose ``ts`` are already
epoch µs are used as they are; otherwise the last event is anchored at the file's
modification time (documented fallback, see :attr:`KinetoImport.time_base`).
"""

from __future__ import annotations

import os
import re
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from argus.schemas import COLLECTIVE_COLUMNS, LIMITS, StepBatch, StepRecord, ValidationError, validate
from argus.schemas import Record as _Record

from ..sketch import NameInterner, RankSketchEncoder, kernel_stats
from ._errors import TraceError
from ._reader import Event, TraceReader

__all__ = ["ImportSummary", "KinetoImport", "collective_kind", "phase_of"]

_STEP = re.compile(r"ProfilerStep#(\d+)$")
_NCCL = ("ncclKernel_", "ncclDevKernel_")
_GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})
_ANNOTATION_CATS = frozenset({"user_annotation", "cpu_op"})
_GPU_PHASES = ("forward_ms", "backward_ms", "optimizer_ms")  # measured on the GPU when it ran them
_KINDS = ("", *COLLECTIVE_COLUMNS)  # a kernel's collective kind ("": not a collective)
_KIND_WORDS = (
    ("allreduce", "all_reduce_ms"),
    ("allgather", "all_gather_ms"),
    ("reducescatter", "reduce_scatter_ms"),
    ("alltoall", "all_to_all_ms"),
    ("broadcast", "broadcast_ms"),
    ("sendrecv", "p2p_ms"),
    ("send", "p2p_ms"),
    ("recv", "p2p_ms"),
    ("reduce", "all_reduce_ms"),
)


def collective_kind(kernel_name: str, collective: str | None = None) -> str:
    """The StepRecord column of an NCCL kernel ('' when the name is not NCCL's).

    ``collective`` is the trace's "Collective name" metadata when present (it tells an
    all-to-all apart from the SendRecv kernels that implement it).
    """
    if not kernel_name.startswith(_NCCL):
        return ""
    for text in (collective or "", kernel_name.split("_", 2)[1] if "_" in kernel_name else ""):
        word = text.lower().replace("_", "").replace("base", "")
        for key, col in _KIND_WORDS:
            if word.startswith(key):
                return col
    return "p2p_ms"


def phase_of(annotation: str) -> str:
    """The StepRecord phase column of a user annotation ('' for none)."""
    n = annotation.lower()
    if "dataloader" in n or "data_load" in n or n.startswith("enumerate(dataloader"):
        return "dataloader_ms"
    if "backward" in n:
        return "backward_ms"
    if n.startswith("optimizer.") or "## optimizer" in n or "optimizer.step" in n:
        return "optimizer_ms"
    if "## forward" in n or n.endswith(".forward") or n == "forward":
        return "forward_ms"
    if "checkpoint" in n:
        return "checkpoint_ms"
    if "compile" in n or ("triton" in n and "autotun" in n):
        return "compile_ms"
    return ""


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) µs intervals, in ms."""
    if not intervals:
        return 0.0
    a = np.array(sorted(intervals))
    run_end = np.maximum.accumulate(a[:, 1])
    gaps = np.maximum(a[1:, 0] - run_end[:-1], 0.0).sum() if len(a) > 1 else 0.0
    return float((run_end[-1] - a[0, 0] - gaps) / 1e3)


_MAX_DUR_US = 86_400e6  # no event lasts a day
_MAX_TS_US = 4_102_444_800e6  # no event starts after 2100, whatever the time base


@dataclass
class _Step:
    number: int
    start_us: float
    end_us: float
    phases: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    gpu_ms: dict[str, float] = field(default_factory=dict)
    compute_ms: dict[str, float] = field(default_factory=dict)  # GPU busy time per phase


@dataclass
class ImportSummary:
    """What an import read and wrote."""

    path: str
    rank: int = -1
    steps: int = 0
    kernels: int = 0
    kernels_outside_steps: int = 0
    events: int = 0
    events_absurd: int = 0
    events_skipped: int = 0
    sketch_bytes: int = 0
    time_base: str = ""
    gpu_phases: tuple[str, ...] = ()
    """The phases measured as GPU compute time (kernels launched in them), not CPU spans."""


class KinetoImport:
    """Import one Kineto trace file (one rank): iterate :meth:`records`.

    Args:
        path: ``.json`` or ``.json.gz`` Chrome-trace file written by the PyTorch profiler.
        job, run: job id and run incarnation of the records.
        rank: the rank; None takes ``distributedInfo.rank`` from the trace.
        key_every: a key frame every this many kernel sketches.
        progress: called with the on-disk bytes read so far.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        job: str,
        run: int = 0,
        rank: int | None = None,
        key_every: int = 32,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.job, self.run, self.rank = job, run, rank
        self.key_every = key_every
        self._reader = TraceReader(self.path, progress)
        self.summary = ImportSummary(self.path)
        self._steps: list[_Step] = []
        self._flushed = 0  # steps are sketched at the end of the file
        self._runtime: dict[int, float] = {}
        # kernel columns, compact (about 36 bytes a kernel, a twentieth of its JSON)
        self._k: dict[str, array[Any]] = {
            "id": array("i"),
            "ts": array("d"),
            "dur": array("d"),
            "stream": array("q"),
            "corr": array("q"),
            "kind": array("b"),
        }
        self._mem: list[tuple[float, float, bool]] = []  # (ts, dur, is_h2d) of copies
        self._max_ts = -np.inf
        self._names: NameInterner | None = None
        self._encoder: RankSketchEncoder | None = None
        self._local = NameInterner(
            job, run, 0
        )  # ids in this file (never sent): mapped to the rank's at the end
        self._pending: list[tuple[int, Any]] = []
        self._annotations: list[tuple[str, float, float]] = []

    # -- event intake ----------------------------------------------------------------------

    def _on_event(self, e: Event) -> None:
        """One complete ("X") event; one with an impossible time or duration is skipped."""
        if not (0.0 <= e.dur <= _MAX_DUR_US and abs(e.ts) <= _MAX_TS_US):  # also False for NaN
            self.summary.events_absurd += 1
            return
        cat = e.cat
        if cat in _GPU_CATS:
            self._on_gpu(e)
        elif cat in _RUNTIME_CATS:
            if e.args is not None and e.args.correlation is not None:
                self._runtime[e.args.correlation] = e.ts
        elif cat in _ANNOTATION_CATS:
            m = _STEP.match(e.name) if e.name.startswith("ProfilerStep#") else None
            if m is not None:
                self._add_step(int(m.group(1)), e.ts, e.ts + e.dur)
            elif cat == "user_annotation":
                phase = phase_of(e.name)
                if phase:
                    self._annotations.append((phase, e.ts, e.ts + e.dur))
        if e.ts > self._max_ts:
            self._max_ts = e.ts

    def _add_step(self, number: int, start: float, end: float) -> None:
        if self._steps and start < self._steps[-1].start_us:
            if self._flushed:
                raise TraceError(self.path, f"ProfilerStep#{number} is out of order in the file")
            self._steps.append(_Step(number, start, end))
            self._steps.sort(key=lambda s: s.start_us)
            return
        self._steps.append(_Step(number, start, end))

    def _on_gpu(self, e: Event) -> None:
        if e.cat != "kernel":
            is_h2d = "HtoD" in e.name or "H2D" in e.name
            self._mem.append((e.ts, e.dur, is_h2d))
            return
        a = e.args
        name = e.name
        kind = ""
        if name.startswith(_NCCL):
            kind = collective_kind(name, a.collective if a else None)
            if a is not None and a.collective:
                name = (
                    f"{name} [{a.collective} in={a.in_nelems} out={a.out_nelems} {a.dtype or ''} "
                    f"group={a.group_size} pg={a.pg_name or ''}]"
                )
        k = self._k
        k["id"].append(self._local.intern(name))
        k["ts"].append(e.ts)
        k["dur"].append(e.dur)
        k["stream"].append(a.stream if a is not None and a.stream is not None else 0)
        k["corr"].append(a.correlation if a is not None and a.correlation is not None else -1)
        k["kind"].append(_KINDS.index(kind))
        self.summary.kernels += 1

    # -- step assembly ---------------------------------------------------------------------

    def _assign(self) -> tuple[np.ndarray, np.ndarray]:
        """Step index of every buffered kernel by its launch time (-1: outside every step),
        and the launch times (µs; the GPU start where the launch is missing)."""
        k = self._k
        gpu_ts = np.frombuffer(k["ts"], np.float64) if len(k["ts"]) else np.zeros(0)
        corr = np.frombuffer(k["corr"], np.int64) if len(k["corr"]) else np.zeros(0, np.int64)
        get = self._runtime.get
        launch = np.array(
            [get(c, t) for c, t in zip(corr.tolist(), gpu_ts.tolist(), strict=True)], np.float64
        )
        starts = np.array([s.start_us for s in self._steps])
        idx = np.searchsorted(starts, launch, side="right") - 1
        idx[(idx == len(self._steps) - 1) & (launch > self._steps[-1].end_us)] = -1
        return idx, launch

    def _phase_of_launch(self, launch: np.ndarray) -> np.ndarray:
        """Per kernel, the index in ``_GPU_PHASES`` of the annotation it was launched in (-1: none)."""
        out = np.full(len(launch), -1, np.int8)
        for p, phase in enumerate(_GPU_PHASES):
            spans = sorted((a, b) for ph, a, b in self._annotations if ph == phase)
            if not spans:
                continue
            iv = np.array(spans)
            ends = np.maximum.accumulate(iv[:, 1])  # nested annotations: cover to the furthest end
            j = np.searchsorted(iv[:, 0], launch, side="right") - 1
            inside = (j >= 0) & (launch < ends[np.maximum(j, 0)]) & (out < 0)
            out[inside] = p
        return out

    def _flush_all(self) -> None:
        """Sketch every step from the kernel columns (GPU events are not in time order in
        Kineto files: on rank0.json.gz the kernels of the first step come after the third's,
        so no step is complete before the end of the file)."""
        idx, launch = self._assign()
        self.summary.kernels_outside_steps = int(np.sum(idx < 0))
        k = self._k
        cols: dict[str, np.ndarray] = {
            "id": np.frombuffer(k["id"], np.int32) if len(k["id"]) else np.zeros(0, np.int32),
            "ts": np.frombuffer(k["ts"], np.float64) if len(k["ts"]) else np.zeros(0),
            "dur": np.frombuffer(k["dur"], np.float64) if len(k["dur"]) else np.zeros(0),
            "stream": np.frombuffer(k["stream"], np.int64) if len(k["stream"]) else np.zeros(0, np.int64),
            "kind": np.frombuffer(k["kind"], np.int8) if len(k["kind"]) else np.zeros(0, np.int8),
        }
        cols["phase"] = np.where(cols["kind"] == 0, self._phase_of_launch(launch), -1).astype(np.int8)
        self.summary.gpu_phases = tuple(p for i, p in enumerate(_GPU_PHASES) if np.any(cols["phase"] == i))
        order = np.argsort(idx, kind="stable")
        bounds = np.searchsorted(idx[order], np.arange(len(self._steps) + 1))
        for i in range(len(self._steps)):
            self._emit_step(i, {n: c[order[bounds[i] : bounds[i + 1]]] for n, c in cols.items()})
        self._flushed = len(self._steps)

    def _emit_step(self, i: int, kernels: dict[str, np.ndarray]) -> None:
        step = self._steps[i]
        stats = None
        gpu: dict[str, float] = {}
        if len(kernels["id"]):
            dur_ns = np.rint(kernels["dur"] * 1e3).astype(np.int64)
            start_ns = np.rint((kernels["ts"] - step.start_us) * 1e3).astype(np.int64)
            stats = (kernels["id"].astype(np.int64), start_ns, dur_ns, kernels["stream"])
            per_kind = np.bincount(kernels["kind"], weights=dur_ns, minlength=len(_KINDS))
            gpu = {
                kind: float(v) / 1e6 for kind, v in zip(_KINDS, per_kind.tolist(), strict=True) if kind and v
            }
        for p, phase in enumerate(_GPU_PHASES):
            sel = kernels["phase"] == p
            if np.any(sel):
                ts = kernels["ts"][sel]
                step.compute_ms[phase] = _union_ms(
                    list(zip(ts.tolist(), (ts + kernels["dur"][sel]).tolist(), strict=True))
                )
        h2d = sum(d for t, d, is_h2d in self._mem if is_h2d and step.start_us <= t < self._next_start(i))
        gpu["h2d_ms"] = h2d / 1e3
        step.gpu_ms = gpu
        self._pending.append((i, stats))
        self.summary.steps += 1

    def _next_start(self, i: int) -> float:
        return self._steps[i + 1].start_us if i + 1 < len(self._steps) else self._steps[i].end_us

    # -- output ----------------------------------------------------------------------------

    def _sketches(self) -> Iterator[_Record]:
        """KernelNames/KernelSketch records of the steps sketched so far (rank known)."""
        assert self.rank is not None
        if self._names is None:
            self._names = NameInterner(self.job, self.run, self.rank)
            self._encoder = RankSketchEncoder(self.job, self.run, self.rank, key_every=self.key_every)
        assert self._encoder is not None
        for i, raw in self._pending:
            step = self._steps[i]
            if raw is None:
                ids = np.zeros(0, np.int64)
                start = dur = streams = np.zeros(0, np.int64)
            else:
                local, start, dur, streams = raw
                used = np.unique(local)
                mapping = self._names.intern_many(self._local.name(j) for j in used.tolist())
                ids = mapping[np.searchsorted(used, local)]
            names = self._names.pending()
            if names is not None:
                yield names
            stats = kernel_stats(ids, start, start + dur, streams)
            sketch = self._encoder.encode(step.number, stats)
            self.summary.sketch_bytes += len(sketch.payload)
            yield sketch
        self._pending.clear()

    def _resolve_rank(self) -> None:
        if self.rank is None:
            info = self._reader.meta.get("distributedInfo")
            if isinstance(info, dict) and isinstance(info.get("rank"), int):
                self.rank = int(info["rank"])

    def records(self) -> Iterator[_Record]:
        """Every record of the trace: names and sketches as steps complete, step records last."""
        on_event = self._on_event
        for batch in self._reader.batches():
            self.summary.events += len(batch)
            for e in batch:
                if e.ph == "X":
                    on_event(e)
        self.summary.events_skipped = self._reader.skipped
        if not self._steps:
            raise TraceError(self.path, "no ProfilerStep#N markers: cannot split the trace into steps")
        self._flush_all()
        self._resolve_rank()
        if self.rank is None:
            raise TraceError(self.path, "no distributedInfo.rank in the trace: give the rank (--rank)")
        if not 0 <= self.rank < LIMITS["max_rank"]:
            raise TraceError(self.path, f"rank {self.rank} out of range")
        self.summary.rank = self.rank
        for record in chain(self._sketches(), self._step_batches()):
            try:
                validate(record)  # what a live rank would refuse to send, the importer refuses too
            except ValidationError as exc:
                raise TraceError(self.path, f"step {getattr(record, 'step', '?')}: {exc}") from None
            yield record

    def _time_base(self) -> int:
        base = self._reader.meta.get("baseTimeNanoseconds")
        first = self._steps[0].start_us
        if isinstance(base, int) and LIMITS["min_time_ns"] <= base + first * 1e3 < LIMITS["max_time_ns"]:
            self.summary.time_base = "baseTimeNanoseconds"
            return base
        if LIMITS["min_time_ns"] <= first * 1e3 < LIMITS["max_time_ns"]:
            self.summary.time_base = "epoch ts"
            return 0
        self.summary.time_base = "file mtime"
        return os.stat(self.path).st_mtime_ns - int(self._max_ts * 1e3)

    def _step_batches(self) -> Iterator[StepBatch]:
        assert self.rank is not None
        base = self._time_base()
        for a_phase, a_start, a_end in self._annotations:
            i = int(np.searchsorted([s.start_us for s in self._steps], a_start, side="right")) - 1
            if 0 <= i < len(self._steps) and a_start <= self._steps[i].end_us:
                self._steps[i].phases.setdefault(a_phase, []).append(
                    (a_start, min(a_end, self._steps[i].end_us))
                )
        for s in self._steps:
            if s.number >= LIMITS["max_step"]:
                raise TraceError(self.path, f"ProfilerStep#{s.number} out of range")
            values: dict[str, Any] = {p: _union_ms(iv) for p, iv in s.phases.items()}
            for phase in self.summary.gpu_phases:  # the GPU ran this phase: its compute time
                values[phase] = s.compute_ms.get(phase, 0.0)
            values.update(s.gpu_ms)
            rec = StepRecord(
                self.job,
                self.run,
                s.number,
                self.rank,
                start_ns=base + round(s.start_us * 1e3),
                end_ns=base + round(s.end_us * 1e3),
                **values,
            )
            yield StepBatch.from_records([rec])
