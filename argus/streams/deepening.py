"""The worker's short memory of kernel sketches and stack samples, for the kernel level.

Ranks publish a kernel sketch (``argus.kernels``) and a stack sample (``argus.stacks``)
every step, keyed by job and rank so that a rank's delta chain stays in order. The stage
that diagnoses a job is keyed by job, so the worker re-keys them (:func:`evidence_key`,
from the record's key without decoding it) into :data:`EVIDENCE_TOPIC`, co-partitioned
with the step findings: a job's sketches and its diagnosis meet in one worker. There an
:class:`EvidenceHistory` keeps, per (job, run, rank), the last few steps, and
:meth:`EvidenceHistory.deepener` hands :func:`detectors.apply_findings` what a confirmed
suspect and its peers did (:func:`detectors.deepen_ranks` decides; one engine).

Bounded (docs/architecture.md#contracts: nothing grows with what an input claims): per rank at most
``steps`` steps of at most ``max_kernels`` kernels (the most GPU time) and ``max_stacks``
folded stacks (the most samples) of at most ``max_stack_chars`` characters each, at most
``max_names`` kernel names of ``max_name_chars``; a delta chain's base at most
``max_base_bytes``; sketches held undecoded until a suspect or peer is read (decoding is
most of the intake's cost) at most ``max_pending`` frames and ``max_pending_bytes``; all jobs together at most ``max_bytes`` (the least recently fed job
is dropped first, then a job too large alone loses its least recently fed ranks).
:meth:`HistoryConfig.bytes_per_rank` states the bound per rank. This state is
in memory on purpose, like the hang state: a few steps, refilled a few steps after a
restart (an anomaly confirmed meanwhile is deepened on the following steps).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from argus.detectors import Deepen, Deepening, DiagnoserConfig, common_ids, deepen_ranks
from argus.schemas import (
    DEEPEN_EVIDENCE,
    DecodeError,
    KernelNames,
    KernelSketch,
    KernelStats,
    SchemaError,
    StackSample,
    decode_many,
    job_key,
)
from argus.schemas.kernel_codec import CODEC_ID, decode_payload

__all__ = ["EVIDENCE_TOPIC", "EvidenceHistory", "HistoryConfig", "evidence_key", "pack", "rekey", "unpack"]

EVIDENCE_TOPIC = DEEPEN_EVIDENCE
"""The topic (``schemas.DEEPEN_EVIDENCE``) of the evidence this module re-keys and :func:`pack` packs."""

log = logging.getLogger("argus.streams.deepening")

_KERNEL_ROW_BYTES = 4 + 8 * 4  # id, count, total, min, max
_ENTRY_OVERHEAD = 200  # a deque slot, a tuple and the arrays' headers, roughly


@dataclass(frozen=True)
class HistoryConfig:
    """Bounds of the worker's kernel/stack history (see the module docstring)."""

    steps: int = 3
    max_kernels: int = 256
    max_probs: int = 16
    max_stacks: int = 32
    max_stack_chars: int = 512
    max_names: int = 2048
    max_name_chars: int = 200
    max_base_bytes: int = 256 << 10
    max_pending: int = 40
    max_pending_bytes: int = 128 << 10
    max_bytes: int = 512 << 20
    max_age_s: float = 600.0
    """Kernel and stack messages older than this (Kafka timestamp) are skipped, not kept: a
    worker whose group starts at the topics' beginning does not re-key their backlog."""

    def bytes_per_rank(self) -> int:
        """The most one rank can hold: its kept steps (kernels and stacks), the base of
        its delta chain and its kernel names."""
        step_k = self.max_kernels * (_KERNEL_ROW_BYTES + 8 * self.max_probs) + _ENTRY_OVERHEAD
        step_s = self.max_stacks * (self.max_stack_chars + 8) + _ENTRY_OVERHEAD
        names = self.max_names * (self.max_name_chars + 16)
        pending = self.max_pending_bytes + _ENTRY_OVERHEAD
        return self.steps * (step_k + step_s) + self.max_base_bytes + pending + names


def _stats_bytes(s: KernelStats) -> int:
    arrays = (
        s.ids,
        s.count,
        s.total_ns,
        s.min_ns,
        s.max_ns,
        s.probs,
        s.quantiles_ns,
        s.stream_ids,
        s.idle_ns,
    )
    return sum(int(np.asarray(a).nbytes) for a in arrays) + _ENTRY_OVERHEAD


def _stack_bytes(s: StackSample) -> int:
    return sum(len(x) + 8 for x in s.stacks) + _ENTRY_OVERHEAD


@dataclass
class _Job:
    ranks: OrderedDict[int, _Rank] = field(default_factory=OrderedDict)
    nbytes: int = 0


@dataclass
class _Rank:
    job: _Job
    kernels: deque[tuple[int, KernelStats]]
    stacks: deque[tuple[int, StackSample]]
    frames: deque[KernelSketch] = field(default_factory=deque)
    names: dict[int, str] = field(default_factory=dict)
    base: tuple[int, KernelStats] | None = None
    nbytes: int = 0
    frame_bytes: int = 0
    newest: int = -1  # the newest kernel step held
    newest_stack: int = -1


def evidence_key(key: bytes | None, value: bytes) -> bytes | SchemaError:
    """The job key a kernel/stack message is re-keyed to: from its record key
    (``<job>/r<rank>``, :func:`schemas.rank_key`) when it has that form, else from the
    decoded record (a SchemaError for bytes that do not decode)."""
    if key:
        job, sep, rank = bytes(key).rpartition(b"/r")
        if sep and job and rank.isdigit():
            return job
    (rec,) = decode_many([value])
    if isinstance(rec, SchemaError):
        return rec
    return job_key(str(rec.job))


def pack(values: Sequence[bytes], max_bytes: int) -> list[bytes]:
    """Messages of an evidence batch: each a run of 4-byte big-endian lengths and values,
    at most ``max_bytes`` long (a value longer than that alone goes alone)."""
    out: list[bytes] = []
    cur: list[bytes] = []
    size = 0
    for v in values:
        if cur and size + 4 + len(v) > max_bytes:
            out.append(b"".join(cur))
            cur, size = [], 0
        cur += [len(v).to_bytes(4, "big"), v]
        size += 4 + len(v)
    if cur:
        out.append(b"".join(cur))
    return out


def unpack(blob: bytes) -> list[bytes]:
    """Inverse of :func:`pack`; a truncated tail is dropped."""
    out: list[bytes] = []
    view = memoryview(blob)
    at = 0
    while at + 4 <= len(view):
        n = int.from_bytes(view[at : at + 4], "big")
        if at + 4 + n > len(view):
            break
        out.append(bytes(view[at + 4 : at + 4 + n]))
        at += 4 + n
    return out


def rekey(
    items: Sequence[tuple[bytes | None, bytes]], max_bytes: int
) -> tuple[list[tuple[bytes, bytes]], list[tuple[int, SchemaError]]]:
    """One batch of kernel/stack messages (key, value), in partition order, as the evidence
    topic's messages (job key, packed values: a rank's order kept) and the rejected ones
    (index, why): bytes that neither have a rank key nor decode."""
    by_job: dict[bytes, list[bytes]] = {}
    bad: list[tuple[int, SchemaError]] = []
    for i, (key, value) in enumerate(items):
        job = evidence_key(key, value)
        if isinstance(job, SchemaError):
            bad.append((i, job))
        else:
            by_job.setdefault(job, []).append(value)
    return [(job, blob) for job, values in by_job.items() for blob in pack(values, max_bytes)], bad


class EvidenceHistory:
    """The last few steps of kernel statistics and stack samples of every rank, bounded."""

    def __init__(self, config: HistoryConfig | None = None) -> None:
        self.config = config or HistoryConfig()
        self._jobs: OrderedDict[tuple[str, int], _Job] = OrderedDict()
        self.nbytes = 0
        self.undecodable = 0
        self.invalid = 0
        self.dropped_jobs = 0
        self.dropped_ranks = 0
        self.replayed = 0

    # -- intake -------------------------------------------------------------------------

    def add_packed(self, blobs: Iterable[bytes]) -> int:
        """:meth:`add_many` of the evidence topic's messages (:func:`pack`)."""
        return self.add_many([v for blob in blobs for v in unpack(bytes(blob or b""))])

    def add_many(self, values: Iterable[bytes]) -> int:
        """Decode and keep a batch of messages (KernelSketch, KernelNames, StackSample, in
        their partition's order); returns how many were kept. Bad bytes are counted
        (``invalid``), not raised: they were dead-lettered where they entered."""
        kept = 0
        for rec in decode_many([bytes(v or b"") for v in values]):
            if isinstance(rec, SchemaError) or not isinstance(rec, KernelSketch | KernelNames | StackSample):
                self.invalid += 1
                continue
            kept += self.add(rec)
        self._evict()
        return kept

    def add(self, rec: KernelSketch | KernelNames | StackSample) -> bool:
        """Keep one record; False when it cannot be used (a delta frame without its base)."""
        job = self._job(rec.job, rec.run)
        r = job.ranks.get(rec.rank)
        if r is None:
            steps = self.config.steps
            r = job.ranks[rec.rank] = _Rank(job, deque(maxlen=steps), deque(maxlen=steps))
        else:
            job.ranks.move_to_end(rec.rank)
        before = r.nbytes
        ok = True
        if isinstance(rec, KernelNames):
            self._names(r, rec)
        elif isinstance(rec, KernelSketch):
            ok = self._sketch(r, rec)
        else:
            self._stack(r, rec)
        self._account(r, r.nbytes - before)
        return ok

    def _account(self, r: _Rank, delta: int) -> None:
        r.job.nbytes += delta
        self.nbytes += delta

    def _job(self, job: str, run: int) -> _Job:
        key = (job, run)
        j = self._jobs.get(key)
        if j is None:
            j = self._jobs[key] = _Job()
        else:
            self._jobs.move_to_end(key)
        return j

    def _names(self, r: _Rank, rec: KernelNames) -> None:
        cfg = self.config
        for i, name in zip(rec.ids, rec.names, strict=True):
            if len(r.names) >= cfg.max_names and i not in r.names:
                break
            if i not in r.names:
                r.nbytes += min(len(name), cfg.max_name_chars) + 16
            r.names[int(i)] = name[: cfg.max_name_chars]

    def _sketch(self, r: _Rank, rec: KernelSketch) -> bool:
        """Hold a frame undecoded (decoding is most of the cost, and only suspects and their
        peers are ever read): :meth:`_catch_up` decodes a rank's frames when asked. Too many
        held frames: those before the latest key frame go, or (no key frame) they are
        decoded now."""
        if rec.step <= r.newest:  # a replay (redelivered after a restart): what it says is held
            self.replayed += 1
            return False
        if rec.codec != CODEC_ID or len(rec.payload) > self.config.max_pending_bytes:
            self.undecodable += 1
            return False
        r.newest = rec.step
        size = len(rec.payload) + _ENTRY_OVERHEAD
        r.frames.append(rec)
        r.nbytes += size
        r.frame_bytes += size
        cfg = self.config
        if len(r.frames) > cfg.max_pending or r.frame_bytes > cfg.max_pending_bytes:
            keys = [i for i, f in enumerate(r.frames) if f.base_step < 0]
            if keys and keys[-1] > 0:
                for _ in range(keys[-1]):
                    self._drop_frame(r)
            if len(r.frames) > cfg.max_pending or r.frame_bytes > cfg.max_pending_bytes:
                self._catch_up(r)
        return True

    def _drop_frame(self, r: _Rank) -> KernelSketch:
        f = r.frames.popleft()
        size = len(f.payload) + _ENTRY_OVERHEAD
        r.nbytes -= size
        r.frame_bytes -= size
        return f

    def _catch_up(self, r: _Rank) -> None:
        """Decode a rank's held frames in order into its kept steps."""
        cfg = self.config
        before = r.nbytes
        while r.frames:
            rec = self._drop_frame(r)
            base = None
            if rec.base_step >= 0:
                if r.base is None or r.base[0] != rec.base_step:
                    self.undecodable += 1
                    continue
                base = r.base[1]
            try:
                stats = decode_payload(rec.payload, base)
            except DecodeError as exc:
                self.undecodable += 1
                log.debug("kernel sketch of %.100s rank %d step %d: %s", rec.job, rec.rank, rec.step, exc)
                continue
            if r.base is not None:
                r.nbytes -= _stats_bytes(r.base[1])
            full = _stats_bytes(stats)
            r.base = (rec.step, stats) if full <= cfg.max_base_bytes else None  # else: wait for a key frame
            if r.base is not None:
                r.nbytes += full
            kept = _top_kernels(stats, cfg.max_kernels, cfg.max_probs)
            if len(r.kernels) == r.kernels.maxlen:
                r.nbytes -= _stats_bytes(r.kernels[0][1])
            r.kernels.append((rec.step, kept))
            r.nbytes += _stats_bytes(kept)
        self._account(r, r.nbytes - before)

    def _stack(self, r: _Rank, rec: StackSample) -> None:
        cfg = self.config
        if rec.step <= r.newest_stack:
            self.replayed += 1
            return
        r.newest_stack = rec.step
        order = np.argsort(-np.asarray(rec.counts, np.int64), kind="stable")[: cfg.max_stacks]
        kept = replace(
            rec,
            stacks=tuple(rec.stacks[i][-cfg.max_stack_chars :] for i in order.tolist()),
            counts=tuple(int(rec.counts[i]) for i in order.tolist()),
        )
        if len(r.stacks) == r.stacks.maxlen:
            r.nbytes -= _stack_bytes(r.stacks[0][1])
        r.stacks.append((rec.step, kept))
        r.nbytes += _stack_bytes(kept)

    def _evict(self) -> None:
        """Within ``max_bytes``: the least recently fed jobs go first, then (one job alone
        too large: as many ranks as it claims) its least recently fed ranks."""
        while self.nbytes > self.config.max_bytes and len(self._jobs) > 1:
            _, job = self._jobs.popitem(last=False)
            self.nbytes -= job.nbytes
            self.dropped_jobs += 1
        if self.nbytes > self.config.max_bytes and self._jobs:
            job = next(iter(self._jobs.values()))
            while self.nbytes > self.config.max_bytes and job.ranks:
                _, r = job.ranks.popitem(last=False)
                job.nbytes -= r.nbytes
                self.nbytes -= r.nbytes
                self.dropped_ranks += 1

    # -- read side ----------------------------------------------------------------------

    def ranks(self, job: str, run: int) -> int:
        """How many ranks of a job run the history holds."""
        j = self._jobs.get((job, run))
        return len(j.ranks) if j else 0

    def forget(self, job: str, run: int) -> None:
        """Drop a job run (it expired)."""
        j = self._jobs.pop((job, run), None)
        if j is not None:
            self.nbytes -= j.nbytes

    def evidence(
        self, job: str, run: int, ranks: Sequence[int], since: int = 0
    ) -> tuple[dict[int, KernelStats], dict[int, StackSample], list[str]]:
        """What ``ranks`` (the first one the suspect) did in the same recent steps from step
        ``since`` on (an anomaly's onset: the steps before it say nothing of it): kernel
        statistics of the kept step of the suspect's that most of the others also have (the
        latest of those), ids mapped to one dictionary whose names are returned, for the
        ranks that have that step; stack samples summed over the suspect's kept steps, for
        the ranks that have any of them. Steps are never mixed: a peer's other step may be
        an evaluation step, whose collectives wait far longer."""
        j = self._jobs.get((job, run))
        if j is None or not ranks:
            return {}, {}, []
        held = {r: j.ranks[r] for r in dict.fromkeys(ranks) if r in j.ranks}
        for h in held.values():
            self._catch_up(h)
        lead = held.get(ranks[0])
        if lead is None:
            return {}, {}, []
        stats: dict[int, KernelStats] = {}
        mine = [st for st, _ in lead.kernels if st >= since]
        if mine:
            have = {r: {st: x for st, x in h.kernels} for r, h in held.items()}
            step = max((sum(st in h for h in have.values()), st) for st in mine)[1]
            stats = {r: h[step] for r, h in have.items() if step in h}
        common, table = common_ids(stats, {r: held[r].names for r in stats})
        stacks: dict[int, StackSample] = {}
        steps = {st for st, _ in lead.stacks if st >= since}
        if steps:
            for r, h in held.items():
                kept = [(st, x) for st, x in h.stacks if st in steps]
                if kept:
                    stacks[r] = _summed(kept)
        return common, stacks, table

    def deepener(self, job: str, run: int, config: DiagnoserConfig | None = None) -> Deepen:
        """The ``deepen`` argument of :func:`detectors.apply_findings` for this job run."""

        def deepen(suspects: Sequence[int], peers: Sequence[int], since: int) -> Deepening | None:
            if not suspects:
                return None
            kernels, stacks, names = self.evidence(job, run, [*suspects, *peers], since)
            return deepen_ranks(suspects, peers, kernels, stacks, names, config)

        return deepen


def _top_kernels(s: KernelStats, k: int, q: int) -> KernelStats:
    """The ``k`` kernels that took the most time, quantiles at most ``q`` probabilities."""
    keep = np.sort(np.argsort(-s.total_ns, kind="stable")[:k]) if len(s.ids) > k else slice(None)
    probs = np.asarray(s.probs)
    cols: np.ndarray | slice = slice(None)
    if len(probs) > q:
        cols = np.unique(np.linspace(0, len(probs) - 1, q).round().astype(int))
    return KernelStats(
        ids=s.ids[keep],
        count=s.count[keep],
        total_ns=s.total_ns[keep],
        min_ns=s.min_ns[keep],
        max_ns=s.max_ns[keep],
        probs=probs[cols],
        quantiles_ns=np.asarray(s.quantiles_ns)[keep][:, cols],
        stream_ids=s.stream_ids[:64],
        idle_ns=s.idle_ns[:64],
    )


def _summed(samples: Iterable[tuple[int, StackSample]]) -> StackSample:
    """One stack sample of a rank's kept steps: counts of the same stack added."""
    counts: dict[str, int] = {}
    kept = list(samples)
    for _, s in kept:
        for stack, n in zip(s.stacks, s.counts, strict=True):
            counts[stack] = counts.get(stack, 0) + int(n)
    return replace(kept[-1][1], stacks=tuple(counts), counts=tuple(counts.values()))
