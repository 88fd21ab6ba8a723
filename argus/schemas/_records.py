"""Record types of the contracts in docs/architecture.md#contracts.

Every record is a frozen dataclass whose fields are named as in its Avro schema
(``schemas/avro/*.avsc``). Step records travel as :class:`StepBatch`, a columnar batch
of one step of one job (one entry per rank), because per-record overhead is what limits
a stream worker: detectors read its numpy columns directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any, ClassVar, Self

import numpy as np

__all__ = [
    "COLLECTIVE_COLUMNS",
    "PHASE_COLUMNS",
    "STEP_COLUMNS",
    "Anomaly",
    "DeadLetter",
    "GpuSample",
    "Heartbeat",
    "KernelNames",
    "KernelSketch",
    "Record",
    "StackSample",
    "StepBatch",
    "StepRecord",
    "StepSummary",
]


class Record:
    """Mixin: conversion between a dataclass and the dict fastavro reads and writes."""

    def to_avro(self) -> dict[str, Any]:
        """The record as the dict fastavro writes."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_avro(cls, data: Mapping[str, Any]) -> Record:
        """Build the record from a dict fastavro read (unknown keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in names}
        return cls(**kwargs)


class EvidenceRecord(Record):
    """Mixin: a record with ``ranks`` and ``evidence`` (an Anomaly, a Finding); the evidence
    mapping travels as two arrays, ``evidence_keys`` and ``evidence_values``."""

    def to_avro(self) -> dict[str, Any]:
        out = super().to_avro()
        evidence = out.pop("evidence")
        out["evidence_keys"], out["evidence_values"] = list(evidence), [float(v) for v in evidence.values()]
        return out

    @classmethod
    def from_avro(cls, data: Mapping[str, Any]) -> Self:
        fields_ = {k: v for k, v in data.items() if not k.startswith("evidence_")}
        fields_["ranks"] = tuple(fields_["ranks"])
        fields_["evidence"] = dict(zip(data["evidence_keys"], data["evidence_values"], strict=True))
        return cls(**fields_)


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    return value


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One rank's view of one training step: times in ms, wall clock in ns since the epoch."""

    job: str
    run: int
    step: int
    rank: int
    host: str = ""
    gpu_uuid: str = ""
    dp: int = 0
    tp: int = 0
    pp: int = 0
    ep: int = 0
    cp: int = 0
    start_ns: int = 0
    end_ns: int = 0
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    optimizer_ms: float = 0.0
    dataloader_ms: float = 0.0
    h2d_ms: float = 0.0
    gc_ms: float = 0.0
    compile_ms: float = 0.0
    checkpoint_ms: float = 0.0
    all_reduce_ms: float = 0.0
    all_gather_ms: float = 0.0
    reduce_scatter_ms: float = 0.0
    all_to_all_ms: float = 0.0
    broadcast_ms: float = 0.0
    p2p_ms: float = 0.0
    samples: int = 0
    tokens: int = 0

    @property
    def step_ms(self) -> float:
        """Wall time of the step."""
        return (self.end_ns - self.start_ns) / 1e6


_HEADER = ("job", "run", "step")
STEP_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StepRecord) if f.name not in _HEADER)
"""Per-rank columns of a StepBatch, in schema order."""
PHASE_COLUMNS = (
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "dataloader_ms",
    "h2d_ms",
    "gc_ms",
    "compile_ms",
    "checkpoint_ms",
)
COLLECTIVE_COLUMNS = (
    "all_reduce_ms",
    "all_gather_ms",
    "reduce_scatter_ms",
    "all_to_all_ms",
    "broadcast_ms",
    "p2p_ms",
)
_STRING_COLUMNS = frozenset({"host", "gpu_uuid"})
_DTYPES: dict[str, Any] = {
    f.name: (object if f.name in _STRING_COLUMNS else np.float64 if f.type == "float" else np.int64)
    for f in dataclasses.fields(StepRecord)
    if f.name not in _HEADER
}
_COLUMN_SET = frozenset(STEP_COLUMNS)
_WIRE = {name: ("<f8" if dt is np.float64 else "<i8") for name, dt in _DTYPES.items() if dt is not object}


class ColumnarRecord(Record):
    """Mixin: a record of numpy columns, one entry per rank (StepBatch, HeartbeatBatch)."""

    columns: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.columns["rank"])

    def __getitem__(self, name: str) -> np.ndarray:
        column: np.ndarray = self.columns[name]
        return column


@dataclass(frozen=True, eq=False)
class StepBatch(ColumnarRecord):
    """Step records of one step of one job, as numpy columns (one entry per rank).

    ``columns`` maps every name of :data:`STEP_COLUMNS` to an array of the same length.
    """

    job: str
    run: int
    step: int
    columns: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        lengths = set(map(len, self.columns.values()))
        if len(lengths) > 1:
            raise ValueError(f"StepBatch columns differ in length: {sorted(lengths)}")
        missing = _COLUMN_SET.difference(self.columns)
        if missing:
            raise ValueError(f"StepBatch lacks columns: {sorted(missing)}")

    @property
    def step_ms(self) -> np.ndarray:
        """Wall time of the step per rank, ms."""
        wall: np.ndarray = (self.columns["end_ns"] - self.columns["start_ns"]) / 1e6
        return wall

    @classmethod
    def from_records(cls, records: Sequence[StepRecord]) -> StepBatch:
        """Columnize records of one step of one job."""
        if not records:
            raise ValueError("StepBatch.from_records needs at least one record")
        head = records[0]
        for r in records:
            if (r.job, r.run, r.step) != (head.job, head.run, head.step):
                raise ValueError("a StepBatch holds one step of one job and run")
        columns = {
            name: np.array([getattr(r, name) for r in records], dtype=_DTYPES[name]) for name in STEP_COLUMNS
        }
        return cls(head.job, head.run, head.step, columns)

    @classmethod
    def empty_columns(cls, n: int) -> dict[str, np.ndarray]:
        """Zero-filled columns for ``n`` ranks, for builders that fill them in place."""
        return {
            name: (np.full(n, "", dtype=object) if dt is object else np.zeros(n, dtype=dt))
            for name, dt in _DTYPES.items()
        }

    def records(self) -> list[StepRecord]:
        """The batch as one StepRecord per rank."""
        cols = {name: self.columns[name].tolist() for name in STEP_COLUMNS}
        return [
            StepRecord(self.job, self.run, self.step, **{k: cols[k][i] for k in STEP_COLUMNS})
            for i in range(len(self))
        ]

    @classmethod
    def concat(cls, parts: Sequence[StepBatch]) -> StepBatch:
        """One batch of the parts of one step; a rank sent twice (a retry) keeps its first row.

        The parts must be of one (job, run, step): the callers (the stream assembler, the
        node relay) group them by that key already, so it is not checked again per part.
        """
        head = parts[0]
        if len(parts) == 1:
            return head
        columns = {k: np.concatenate([p.columns[k] for p in parts]) for k in head.columns}
        _, first = np.unique(columns["rank"], return_index=True)
        if len(first) != len(columns["rank"]):
            columns = {k: v[np.sort(first)] for k, v in columns.items()}
        return cls(head.job, head.run, head.step, columns)

    def take(self, index: np.ndarray | Sequence[int]) -> StepBatch:
        """A batch of the selected rows."""
        idx = np.asarray(index)
        return StepBatch(self.job, self.run, self.step, {k: v[idx] for k, v in self.columns.items()})

    def to_avro(self) -> dict[str, Any]:
        """The v3 wire form: numeric columns packed little-endian, text newline-joined."""
        out: dict[str, Any] = {"job": self.job, "run": self.run, "step": self.step, "rows": len(self)}
        for name in STEP_COLUMNS:
            col = self.columns[name]
            if name in _STRING_COLUMNS:
                out[name] = "\n".join(col.tolist())
            else:
                out[name] = np.ascontiguousarray(col, dtype=_WIRE[name]).tobytes()
        return out

    @classmethod
    def from_avro(cls, data: Mapping[str, Any]) -> StepBatch:
        """Build the batch from any schema version's dict (v1/v2: arrays, v3: packed).

        The row count comes from the bytes present, never from a claim: the ``rank``
        column's length (v3's ``rows`` must agree with it, or ValueError), so a message of a
        few bytes claiming 2**40 rows allocates nothing.
        """
        n = len(data["rank"])
        if "rows" in data:
            rank = data["rank"]
            if not isinstance(rank, bytes) or len(rank) % 8:
                raise ValueError(f"rank column of {len(rank)} bytes is not packed 8-byte entries")
            n //= 8
            if data["rows"] != n:
                raise ValueError(f"rows={data['rows']} but the columns hold {n} rows")
        columns: dict[str, np.ndarray] = {}
        for name in STEP_COLUMNS:
            value = data.get(name)
            if value is None or (len(value) == 0 and n):  # a column a later version added
                columns[name] = StepBatch.empty_columns(n)[name]
            elif isinstance(value, bytes):
                # No copy where the wire type is the native one: the column is a read-only
                # view of the message.
                columns[name] = np.frombuffer(value, dtype=_WIRE[name]).astype(_DTYPES[name], copy=False)
            elif isinstance(value, str):
                columns[name] = np.array(value.split("\n") if n else [], dtype=object)
            else:
                columns[name] = np.array(value, dtype=_DTYPES[name])
        return cls(data["job"], data["run"], data["step"], columns)


FLOAT_COLUMNS: tuple[str, ...] = tuple(name for name in STEP_COLUMNS if _DTYPES[name] is np.float64)
"""The float columns of a StepBatch (every one a duration in ms), in schema order."""
INT_COLUMNS: tuple[str, ...] = tuple(name for name in STEP_COLUMNS if _DTYPES[name] is np.int64)
"""The integer columns of a StepBatch, in schema order."""


@dataclass(frozen=True, eq=False)
class PackedSteps:
    """Many v3 StepBatch dicts (a consumer batch) read together: the float and the integer
    columns of all of them as one array each (column × row, rows in message order).

    Workers and sinks decode thousands of small batches per second; per-call overhead, not
    rows, is what that costs, so the columns are read and checked once per consumer batch,
    and each StepBatch's columns are views of these arrays.
    """

    heads: tuple[tuple[str, int, int], ...]  # job, run, step of each batch
    lengths: np.ndarray
    floats: np.ndarray
    ints: np.ndarray
    strings: Mapping[str, list[str]]  # host, gpu_uuid of every row

    @classmethod
    def read(cls, raws: Sequence[Mapping[str, Any]]) -> PackedSteps | None:
        """The dicts read together, or None unless every one is v3 with consistent columns
        (then decode them one by one, which names what is wrong)."""
        try:
            lengths = [int(raw["rows"]) for raw in raws]
            if not raws or min(lengths) < 1:
                return None
            arrays = []
            for names, wire in ((FLOAT_COLUMNS, "<f8"), (INT_COLUMNS, "<i8")):
                expected = [8 * n for n in lengths]
                columns = [list(map(itemgetter(name), raws)) for name in names]
                if any(list(map(len, column)) != expected for column in columns):
                    return None
                packed = b"".join(chain.from_iterable(columns))
                arrays.append(np.frombuffer(packed, dtype=wire).reshape(len(names), sum(lengths)))
            strings = {}
            for name in _STRING_COLUMNS:
                if [raw[name].count("\n") + 1 for raw in raws] != lengths:
                    return None
                strings[name] = "\n".join([raw[name] for raw in raws]).split("\n")
            heads = tuple((raw["job"], raw["run"], raw["step"]) for raw in raws)
        except (KeyError, TypeError, AttributeError):
            return None
        return cls(heads, np.asarray(lengths), arrays[0], arrays[1], strings)

    @classmethod
    def of(cls, batches: Sequence[StepBatch]) -> PackedSteps:
        """The same layout built from StepBatches (to check them like a consumer batch)."""
        return cls(
            tuple((b.job, b.run, b.step) for b in batches),
            np.array([len(b) for b in batches]),
            np.concatenate([b[name] for name in FLOAT_COLUMNS for b in batches]).reshape(
                len(FLOAT_COLUMNS), -1
            ),
            np.concatenate([b[name] for name in INT_COLUMNS for b in batches]).reshape(len(INT_COLUMNS), -1),
            {name: [v for b in batches for v in b[name].tolist()] for name in _STRING_COLUMNS},
        )

    def batches(self) -> list[StepBatch]:
        """One StepBatch per dict; numeric columns are read-only views of the shared arrays."""
        out = []
        lo = 0
        for (job, run, step), n in zip(self.heads, self.lengths.tolist(), strict=True):
            hi = lo + n
            columns = dict(zip(FLOAT_COLUMNS, self.floats[:, lo:hi], strict=True))
            columns.update(zip(INT_COLUMNS, self.ints[:, lo:hi], strict=True))
            for name, values in self.strings.items():
                columns[name] = np.array(values[lo:hi], dtype=object)
            out.append(StepBatch(job, run, step, columns))
            lo = hi
        return out


@dataclass(frozen=True, slots=True)
class KernelSketch(Record):
    """Kernel activity of one rank in one step, as the kernel codec's payload."""

    job: str
    run: int
    rank: int
    step: int
    codec: int
    base_step: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class KernelNames(Record):
    """Kernel-name dictionary entries of one rank (only names not sent before)."""

    job: str
    run: int
    rank: int
    ids: tuple[int, ...]
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StackSample(Record):
    """Folded call stacks of one rank over one window, with sample counts."""

    job: str
    run: int
    rank: int
    step: int
    start_ns: int
    end_ns: int
    stacks: tuple[str, ...]
    counts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GpuSample(Record):
    """One NVML reading of one GPU (fields named after DCGM's)."""

    host: str
    gpu_uuid: str
    gpu_index: int
    time_ns: int
    gpu_util: float = 0.0
    sm_clock_mhz: float = 0.0
    power_w: float = 0.0
    temp_c: float = 0.0
    clock_event_reasons: int = 0
    xid: int = 0
    ecc_dbe: int = 0
    remapped_rows: int = 0
    nvlink_tx_bytes: int = 0
    nvlink_rx_bytes: int = 0
    nvlink_errors: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat(Record):
    """Where a rank is, sent every few seconds even when no step completes.

    ``pause`` / ``pause_until_ns`` (schema v2): what the job declared it is doing instead of
    steps (e.g. ``"checkpoint"``) and until when; a declared pause is not a hang.
    """

    job: str
    run: int
    rank: int
    host: str
    time_ns: int
    last_step: int
    groups: tuple[str, ...] = ()
    seq_entered: tuple[int, ...] = ()
    seq_finished: tuple[int, ...] = ()
    kinds: tuple[str, ...] = ()
    nbytes: tuple[int, ...] = ()
    stack: str = ""
    pause: str = ""
    pause_until_ns: int = 0


@dataclass(frozen=True, slots=True)
class StepSummary(Record):
    """Cross-rank statistics of one step of one job."""

    job: str
    run: int
    step: int
    end_ns: int
    ranks: int
    missing: tuple[int, ...]
    step_ms_median: float
    step_ms_p99: float
    step_ms_max: float
    compute_ms_median: float
    collective_ms_median: float
    dataloader_ms_median: float
    checkpoint_ms_max: float
    tokens: int
    suspects: tuple[int, ...] = ()

    FIGURES: ClassVar[tuple[str, ...]] = (
        "step_ms_median",
        "step_ms_p99",
        "step_ms_max",
        "compute_ms_median",
        "collective_ms_median",
        "dataloader_ms_median",
        "checkpoint_ms_max",
    )
    """The step's figures in ms (non-negative floats; Float32 columns in the store)."""


@dataclass(frozen=True, slots=True)
class Anomaly(EvidenceRecord):
    """A diagnosis with its evidence (the figures that decided) and its cost."""

    id: str
    job: str
    run: int
    start_step: int
    end_step: int
    level: str
    suspect_kind: str
    suspect: str
    ranks: tuple[int, ...]
    cause: str
    score: float
    evidence: Mapping[str, float] = field(default_factory=dict)
    summary: str = ""
    step_ms_added: float = 0.0
    gpu_hours_lost: float = 0.0
    detected_ns: int = 0
    severity: str = "page"

    LEVELS: ClassVar[frozenset[str]] = frozenset({"iteration", "cross_rank", "kernel", "hang"})
    SEVERITIES: ClassVar[tuple[str, ...]] = ("info", "warn", "page")
    """From the least severe to the most."""


@dataclass(frozen=True, slots=True)
class DeadLetter(Record):
    """Input that failed to decode or validate, with the reason.

    Built with :meth:`of` (by the worker and the sink alike), which bounds it: the payload
    keeps at most :data:`DEAD_PAYLOAD_BYTES` of the input (the error then says how large
    the input was), the error and the reason are cut to what validation allows.
    """

    topic: str
    partition: int
    offset: int
    reason: str
    error: str
    time_ns: int
    payload: bytes

    @classmethod
    def of(
        cls, topic: str, partition: int, offset: int, reason: str, error: str, time_ns: int, payload: bytes
    ) -> DeadLetter:
        """A bounded dead letter of one input message (never larger than ~70 KB encoded)."""
        data = bytes(payload or b"")
        if len(data) > DEAD_PAYLOAD_BYTES:
            error = f"[input of {len(data)} bytes, first {DEAD_PAYLOAD_BYTES} kept] {error}"
            data = data[:DEAD_PAYLOAD_BYTES]
        return cls(
            str(topic)[:256],
            min(max(int(partition), 0), (1 << 31) - 1),
            max(int(offset), 0),
            str(reason)[:256],
            str(error)[:4096],
            min(max(int(time_ns), 0), 4_102_444_800 * 10**9 - 1),
            data,
        )


DEAD_PAYLOAD_BYTES = 64 << 10
"""Bytes of the bad input a dead letter keeps (the limit ``validate`` checks)."""
