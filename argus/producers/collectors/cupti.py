"""GPU kernels through CUPTI's activity API (cupti-python), into kernel sketches.

Pure part (tested with cupti-python's own record classes): :func:`activity_arrays` turns
the records of completed buffers (concurrent kernels, memcpy, memset, synchronization,
external correlation) into numpy columns, and :func:`step_events` splits them by training
step through the external-correlation id the agent pushes at each step begin
(``ExternalCorrelationKind.CUSTOM0`` = step number, the way Kineto tags its ranges).
Memcpy and memset become pseudo-kernels named ``[memcpy HtoD]``, ``[memset]``, so the
sketches see everything that occupies a stream; synchronization records are CPU waits and
are returned apart (``sync_ns`` per step), never mixed into GPU idle time.

:class:`CuptiCollector` is the live side: it registers the buffer callbacks (buffers are
completed by CUPTI's own thread, off the training thread), flushes from the agent's thread
and emits ``KernelNames`` + ``KernelSketch`` per step. Without a GPU or cupti-python,
:func:`cupti_available` says why and the agent steps aside.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from argus.schemas import KernelNames, KernelSketch

from ..sketch import NameInterner, RankSketchEncoder, kernel_stats
from .gpu_probe import cupti_probe

__all__ = [
    "KIND_CONCURRENT_KERNEL",
    "KIND_EXTERNAL_CORRELATION",
    "KIND_KERNEL",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "KIND_SYNCHRONIZATION",
    "Activity",
    "ActivityArrays",
    "CuptiCollector",
    "activity_arrays",
    "cupti_available",
    "cupti_version_mismatch",
    "join_arrays",
    "step_events",
    "sync_ns_per_step",
]

# CUpti_ActivityKind values (cupti.cupti.ActivityKind is an IntEnum with these values)
KIND_MEMCPY = 1
KIND_MEMSET = 2
KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10
KIND_SYNCHRONIZATION = 38
KIND_EXTERNAL_CORRELATION = 39
EXTERNAL_KIND_CUSTOM0 = 3

_MEMCPY_NAMES = {
    0: "[memcpy]",
    1: "[memcpy HtoD]",
    2: "[memcpy DtoH]",
    3: "[memcpy HtoA]",
    4: "[memcpy AtoH]",
    5: "[memcpy AtoA]",
    6: "[memcpy AtoD]",
    7: "[memcpy DtoA]",
    8: "[memcpy DtoD]",
    9: "[memcpy HtoH]",
    10: "[memcpy PtoP]",
}


@dataclass(frozen=True)
class ActivityArrays:
    """Device activity (kernels, memcpy, memset) and synchronization waits, as columns."""

    names: list[str]
    start_ns: np.ndarray
    end_ns: np.ndarray
    stream_ids: np.ndarray
    correlation_ids: np.ndarray
    nbytes: np.ndarray  # memcpy/memset bytes, 0 for kernels
    sync_start_ns: np.ndarray
    sync_end_ns: np.ndarray
    sync_correlation_ids: np.ndarray
    external: dict[int, int]  # correlation id -> external id (the step)

    def __len__(self) -> int:
        return len(self.names)


def activity_arrays(records: Iterable[Any], *, external_kind: int = EXTERNAL_KIND_CUSTOM0) -> ActivityArrays:
    """Columns of cupti-python activity records (objects with CUPTI's field names).

    Records of other kinds are ignored; a record with ``end < start`` (CUPTI reports 0 for
    a timestamp it could not take) is dropped.
    """
    names: list[str] = []
    dev: list[tuple[int, int, int, int, int]] = []
    sync: list[tuple[int, int, int]] = []
    external: dict[int, int] = {}
    for r in records:
        kind = int(r.kind)
        if kind in (KIND_CONCURRENT_KERNEL, KIND_KERNEL):
            name, nb = str(r.name), 0
        elif kind == KIND_MEMCPY:
            name, nb = _MEMCPY_NAMES.get(int(r.copy_kind), "[memcpy]"), int(r.bytes)
        elif kind == KIND_MEMSET:
            name, nb = "[memset]", int(r.bytes)
        elif kind == KIND_SYNCHRONIZATION:
            if r.end >= r.start > 0:
                sync.append((int(r.start), int(r.end), int(r.correlation_id)))
            continue
        elif kind == KIND_EXTERNAL_CORRELATION:
            if int(r.external_kind) == external_kind:
                external[int(r.correlation_id)] = int(r.external_id)
            continue
        else:
            continue
        if not r.end >= r.start > 0:
            continue
        names.append(name)
        dev.append((int(r.start), int(r.end), int(r.stream_id), int(r.correlation_id), nb))
    d = np.array(dev, dtype=np.int64).reshape(-1, 5)
    s = np.array(sync, dtype=np.int64).reshape(-1, 3)
    return ActivityArrays(
        names, d[:, 0], d[:, 1], d[:, 2], d[:, 3], d[:, 4], s[:, 0], s[:, 1], s[:, 2], external
    )


def _steps_between(correlation_ids: np.ndarray, external: dict[int, int]) -> np.ndarray:
    """The external id (step) of each correlation id: its own tag's, and for an untagged id
    between two tagged ones the step of the one below (-1 where there is none).

    Correlation ids count every CUDA API call of the process in call order, while a step's
    tag is pushed on the training thread only (or on one marker call per step): the kernels
    that autograd's device thread (or a communication thread) launches inside a step lie
    between that step's tagged ones. An untagged id above every tagged one is -1 until a
    later tag comes."""
    if not external or len(correlation_ids) == 0:
        return np.full(len(correlation_ids), -1, np.int64)
    corr = np.fromiter(external.keys(), np.int64, len(external))
    ext = np.fromiter(external.values(), np.int64, len(external))
    order = np.argsort(corr)
    corr, ext = corr[order], ext[order]
    below = np.searchsorted(corr, correlation_ids, side="right") - 1
    exact = (below >= 0) & (corr[np.maximum(below, 0)] == correlation_ids)
    inside = (below >= 0) & (below < len(corr) - 1)
    return np.where(exact | inside, ext[np.maximum(below, 0)], -1)


def step_events(a: ActivityArrays) -> dict[int, np.ndarray]:
    """Row indices of the device activity of each step (by external correlation id; see
    :func:`_steps_between` for activity launched from other threads inside a step).

    Activity launched before the first tag or after the last one is left out.
    """
    steps = _steps_between(a.correlation_ids, a.external)
    return {int(s): np.flatnonzero(steps == s) for s in np.unique(steps[steps >= 0])}


def sync_ns_per_step(a: ActivityArrays) -> dict[int, int]:
    """Nanoseconds the CPU waited in CUDA synchronization, per step."""
    steps = _steps_between(a.sync_correlation_ids, a.external)
    dur = a.sync_end_ns - a.sync_start_ns
    return {int(s): int(dur[steps == s].sum()) for s in np.unique(steps[steps >= 0])}


def cupti_available() -> tuple[bool, str]:
    """Whether kernel tracing can run here (a GPU, libcuda, cupti-python), and why not."""
    ok, reason = cupti_probe()
    if not ok:
        return ok, reason
    try:
        import torch

        if not torch.cuda.is_available():
            return False, "no CUDA device visible to torch"
    except ImportError:
        pass
    return True, reason


def cupti_version_mismatch(torch_cuda: str | None = None, cupti_version: str | None = None) -> str:
    """A one-line reason when cupti-python's CUDA major differs from torch's, else "".

    cupti-python 12.x drives CUDA 12's CUPTI, 13.x CUDA 13's; beside a torch built for the
    other major it loads a second, mismatched CUPTI. Both versions are read from the
    installation unless given.
    """
    if torch_cuda is None:
        try:
            import torch

            torch_cuda = torch.version.cuda
        except ImportError:
            return ""
    if cupti_version is None:
        try:
            from importlib.metadata import version

            cupti_version = version("cupti-python")
        except Exception:
            return ""
    if not torch_cuda or not cupti_version:
        return ""
    want, have = torch_cuda.split(".")[0], cupti_version.split(".")[0]
    if want == have:
        return ""
    return (
        f"cupti-python {cupti_version} is for CUDA {have} but torch was built with CUDA {torch_cuda}: "
        f'GPU kernel tracing off (pip install "argus-gpu[gpu-cu{want}]")'
    )


class CuptiCollector:
    """Live CUPTI activity collection for one rank, drained into kernel sketches per step."""

    KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION", "EXTERNAL_CORRELATION")
    DEVICE_KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION")
    TAGGINGS = ("runtime", "marker")

    def __init__(
        self,
        job: str,
        run: int,
        rank: int,
        *,
        buffer_bytes: int = 8 << 20,
        key_every: int = 32,
        tagging: str = "runtime",
        marker: Any = None,
        every: int = 1,
    ) -> None:
        """``tagging``: how a step's device activity is found. CUPTI writes an
        external-correlation record only beside a runtime-API record (seen on an H100 with
        CUPTI 13.0: with the kernel kinds alone no kernel was tagged). ``"runtime"`` keeps
        API records on for the whole run (one per CUDA call, skipped once read) and tags every
        call of the training thread; ``"marker"`` turns them on only around one call of
        ``marker`` (a cheap runtime-API call, e.g. a stream query) at each step's begin, so a
        step is the correlation ids between its marker and the next (see
        :func:`_steps_between`) and CUPTI writes one API record per step.

        ``every``: trace the device activity of one step in ``every`` (the steps whose number
        is a multiple of it, the same steps on every rank). CUPTI's records are read in
        Python, a few microseconds each: on a step that launches a kernel every few tens of
        microseconds that is a tenth of the step, and it holds the interpreter lock the
        training loop launches from. Between traced steps the device kinds are off, so CUPTI
        costs nothing; a traced step ``s`` keeps them on until step ``s + 2`` begins (its
        kernels still in flight when ``s + 1`` begins are kept) and is emitted once the
        activity of ``s + 1`` is in."""
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every must be a whole number of steps >= 1, not {every!r}")
        if tagging not in self.TAGGINGS:
            raise ValueError(f"tagging must be one of {self.TAGGINGS}, not {tagging!r}")
        if tagging == "marker" and marker is None:
            raise ValueError("marker tagging needs a marker: a callable making one runtime-API call")
        self.tagging = tagging
        self._marker = marker
        self.names = NameInterner(job, run, rank)
        self.encoder = RankSketchEncoder(job, run, rank, key_every=key_every)
        self.buffer_bytes = buffer_bytes
        self.every = every
        self._chunks: list[ActivityArrays] = []  # completed buffers' columns, not yet fed
        self._lock = threading.Lock()
        self._feed_lock = threading.Lock()
        self._pending: dict[int, list[ActivityArrays]] = {}
        self._cupti: Any = None
        self._external: dict[int, int] = {}
        self.dropped_records = 0
        self.sync_ns: dict[int, int] = {}
        self._carry: ActivityArrays | None = None
        self._last_tag = 0  # the highest tagged correlation id seen
        self._device_step = -1  # the latest step device activity has come for
        self.carry_limit = 200_000
        self._on = every == 1  # the device kinds are enabled
        self._pushed = False  # a runtime tag is pushed (popped at the step's end)
        self.untraced_records = 0  # device records of the steps after traced ones, not emitted
        self.toggles = 0  # enables and disables of the device kinds, and their cost
        self.toggle_ns = 0

    def _requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0

    def _completed(self, activities: list[Any]) -> None:
        # CUPTI's thread. cupti-python's records are views into the activity buffer, which
        # CUPTI reuses once this returns: the one pass that reads them copies their fields.
        a = activity_arrays(activities)
        with self._lock:
            self._chunks.append(a)

    def start(self) -> None:
        """Register the buffer callbacks and enable the activity kinds (the device kinds
        now only when every step is traced; else at each traced step's begin)."""
        from cupti import cupti

        self._cupti = cupti
        cupti.activity_register_callbacks(self._requested, self._completed)
        for k in self._kinds():
            if self._on or k not in self.DEVICE_KINDS:
                cupti.activity_enable(getattr(cupti.ActivityKind, k))

    def _kinds(self) -> tuple[str, ...]:
        return (*self.KINDS, "RUNTIME") if self.tagging == "runtime" else self.KINDS

    def _toggle(self, on: bool) -> None:
        c, t0 = self._cupti, time.perf_counter_ns()
        for k in self.DEVICE_KINDS:
            (c.activity_enable if on else c.activity_disable)(getattr(c.ActivityKind, k))
        self._on = on
        self.toggles += 1
        self.toggle_ns += time.perf_counter_ns() - t0

    def begin_step(self, step: int) -> None:
        """Tag CUDA work launched from now on with ``step`` (external correlation), on a
        traced step, the one after it and the one after that (whose tag closes the span)."""
        c = self._cupti
        if c is None:
            return
        phase = step % self.every
        if self.every > 1:
            if phase == 0 and not self._on:
                self._toggle(True)
            elif phase > 2:
                return
        if self.tagging == "runtime":
            c.activity_push_external_correlation_id(c.ExternalCorrelationKind.CUSTOM0, step)
            self._pushed = True
        else:
            c.activity_enable(c.ActivityKind.RUNTIME)
            c.activity_push_external_correlation_id(c.ExternalCorrelationKind.CUSTOM0, step)
            try:
                self._marker()
            finally:
                c.activity_pop_external_correlation_id(c.ExternalCorrelationKind.CUSTOM0)
                c.activity_disable(c.ActivityKind.RUNTIME)
        if phase == 2 and self._on:
            self._toggle(False)

    def end_step(self, _step: int) -> None:
        """Stop tagging (a marker's tag ended with its call)."""
        if self._cupti is not None and self._pushed:
            self._pushed = False
            with contextlib.suppress(Exception):
                self._cupti.activity_pop_external_correlation_id(self._cupti.ExternalCorrelationKind.CUSTOM0)

    def drain(
        self, current_step: int, *, lag: int = 2, final: bool = False
    ) -> list[KernelNames | KernelSketch]:
        """Flush CUPTI, convert, and emit the steps whose device activity is in (see
        :meth:`feed`); ``final`` (after :meth:`stop`): every step before ``current_step``."""
        if self._cupti is not None:
            self._cupti.activity_flush_all(0)
        with self._lock:
            chunks, self._chunks = self._chunks, []
        with self._feed_lock:
            return self._feed(join_arrays(chunks), current_step, lag, final)

    def feed(
        self, records: Iterable[Any], current_step: int, *, lag: int = 2, final: bool = False
    ) -> list[KernelNames | KernelSketch]:
        """Pure core of :meth:`drain`: records in, finished steps' names and sketches out.

        A step is finished once it is older than ``current_step - lag`` *and* device activity
        of the step after the next has come: CUPTI hands records over a buffer at a time, so
        the GPU's records trail the training loop by several steps (an 8 MiB buffer holds ~10
        steps of a 1,000-kernel step with API records on), and a step emitted on the CPU's
        clock alone lost its late kernels. One feed at a time: the agent's thread drains while
        ``close`` drains the rest."""
        a = activity_arrays(records)
        with self._feed_lock:
            return self._feed(a, current_step, lag, final)

    def _feed(
        self, a: ActivityArrays, current_step: int, lag: int, final: bool
    ) -> list[KernelNames | KernelSketch]:
        if len(self._external) > 4_000_000:  # bound the map on very long runs
            self._external.clear()
        self._external.update(a.external)
        self._last_tag = max(self._last_tag, max(a.external, default=0))
        if self._carry is not None:  # untagged activity of the last feed, above every tag then
            a = _concat(self._carry, a)
            self._carry = None
        a = replace(a, external=self._external)  # a kernel may come in a later buffer than its tag
        steps = _steps_between(a.correlation_ids, self._external)
        wait = np.flatnonzero((steps < 0) & (a.correlation_ids > self._last_tag))
        if 0 < len(wait) <= self.carry_limit:
            self._carry = _take(a, wait)
        by_step = {int(st): np.flatnonzero(steps == st) for st in np.unique(steps[steps >= 0])}
        self.dropped_records += (
            len(a)
            - sum(len(r) for r in by_step.values())
            - (len(self._carry) if self._carry is not None else 0)
        )
        self._device_step = max(self._device_step, max(by_step, default=-1))
        for step, rows in by_step.items():
            if step % self.every:  # the span after a traced step: it only tells that one is in
                self.untraced_records += len(rows)
            else:
                self._pending.setdefault(step, []).append(_take(a, rows))
        for step, ns in sync_ns_per_step(a).items():
            if step % self.every == 0:
                self.sync_ns[step] = self.sync_ns.get(step, 0) + ns
        # tags of steps two behind the device's: their kernels are in
        keep_from = min(current_step - lag, self._device_step) - 2
        if len(self._external) > 4 * 4096:
            self._external = {c: st for c, st in self._external.items() if st >= keep_from}
        # every step traced: a step waits for device activity of the step after the next; a
        # traced step of a sampled run waits for that of the next (traced until the one after)
        settled = self._device_step - (1 if self.every == 1 else 0)
        upto = current_step if final else min(current_step - lag + 1, settled)
        out: list[KernelNames | KernelSketch] = []
        for step in sorted(s for s in self._pending if s < upto):
            parts = self._pending.pop(step)
            names = [n for p in parts for n in p.names]
            ids = self.names.intern_many(names)
            start = np.concatenate([p.start_ns for p in parts])
            end = np.concatenate([p.end_ns for p in parts])
            streams = np.concatenate([p.stream_ids for p in parts])
            stats = kernel_stats(ids, start, end, streams)
            pending = self.names.pending()
            if pending is not None:
                out.append(pending)
            out.append(self.encoder.encode(step, stats))
        return out

    def buffer_dropped(self) -> int | None:
        """Records CUPTI dropped because no activity buffer was free (None: it cannot say)."""
        if self._cupti is None:
            return None
        import ctypes

        n = ctypes.c_size_t(0)
        try:
            self._cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(n))
        except Exception:
            return None
        return int(n.value)

    def stop(self) -> None:
        """Flush everything and disable the activity kinds."""
        if self._cupti is None:
            return
        self._cupti.activity_flush_all(1)
        for k in self._kinds():
            if self._on or k not in self.DEVICE_KINDS:
                self._cupti.activity_disable(getattr(self._cupti.ActivityKind, k))
        self._on = False


@dataclass(frozen=True, slots=True)
class Activity:
    """The fields of one CUPTI activity record that :func:`activity_arrays` reads (absent
    fields are 0 / empty): records shaped like cupti-python's, for :meth:`CuptiCollector.feed`
    without a GPU."""

    kind: int
    name: str = ""
    start: int = 0
    end: int = 0
    stream_id: int = 0
    correlation_id: int = 0
    copy_kind: int = 0
    bytes: int = 0
    external_kind: int = 0
    external_id: int = 0


def join_arrays(chunks: list[ActivityArrays]) -> ActivityArrays:
    """Completed buffers' columns as one, in order."""
    if len(chunks) == 1:
        return chunks[0]
    if not chunks:
        return activity_arrays(())

    def cat(c: str) -> np.ndarray:
        return np.concatenate([getattr(x, c) for x in chunks])

    external: dict[int, int] = {}
    for x in chunks:
        external.update(x.external)
    return ActivityArrays(
        [n for x in chunks for n in x.names],
        cat("start_ns"),
        cat("end_ns"),
        cat("stream_ids"),
        cat("correlation_ids"),
        cat("nbytes"),
        cat("sync_start_ns"),
        cat("sync_end_ns"),
        cat("sync_correlation_ids"),
        external,
    )


def _concat(x: ActivityArrays, y: ActivityArrays) -> ActivityArrays:
    """Device activity of ``x`` then ``y`` (synchronization and tags: ``y``'s)."""

    def cat(c: str) -> np.ndarray:
        return np.concatenate([getattr(x, c), getattr(y, c)])

    return ActivityArrays(
        x.names + y.names,
        cat("start_ns"),
        cat("end_ns"),
        cat("stream_ids"),
        cat("correlation_ids"),
        cat("nbytes"),
        y.sync_start_ns,
        y.sync_end_ns,
        y.sync_correlation_ids,
        y.external,
    )


def _take(a: ActivityArrays, rows: np.ndarray) -> ActivityArrays:
    return ActivityArrays(
        [a.names[i] for i in rows],
        a.start_ns[rows],
        a.end_ns[rows],
        a.stream_ids[rows],
        a.correlation_ids[rows],
        a.nbytes[rows],
        a.sync_start_ns[:0],
        a.sync_end_ns[:0],
        a.sync_correlation_ids[:0],
        {},
    )
