"""Avro encode/decode in the Confluent wire format.

A message is ``0x00`` (magic), the schema id as a 4-byte big-endian integer, then the
record in Avro binary encoding. Schema ids are fixed in ``avro/registry.json`` so that
they are stable without a schema registry; a record is always written with the newest
version of its schema, and a reader decodes with the writer's version and builds the
current record type from it (fields a version lacks take their defaults), so a reader
with v3 reads what a v1 or v2 writer sent.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import numpy as np
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from ._errors import DecodeError, SchemaError, UnknownSchemaError, ValidationError
from ._findings import JobOrder, StepFindings
from ._heartbeats import HeartbeatBatch, PackedHeartbeats
from ._records import (
    FLOAT_COLUMNS,
    Anomaly,
    DeadLetter,
    GpuSample,
    Heartbeat,
    KernelNames,
    KernelSketch,
    PackedSteps,
    Record,
    StackSample,
    StepBatch,
    StepRecord,
    StepSummary,
)
from ._validate import LIMITS, validate, validate_packed, validate_packed_heartbeats

__all__ = ["SCHEMAS", "SchemaInfo", "StepRowWriter", "decode", "decode_many", "encode", "peek_schema_id"]

MAGIC = 0
_HEADER = struct.Struct(">bI")

_TYPES: dict[str, type[Record]] = {
    "step_batch": StepBatch,
    "kernel_sketch": KernelSketch,
    "kernel_names": KernelNames,
    "stack_sample": StackSample,
    "gpu_sample": GpuSample,
    "heartbeat": Heartbeat,
    "heartbeat_batch": HeartbeatBatch,
    "step_summary": StepSummary,
    "anomaly": Anomaly,
    "dead_letter": DeadLetter,
    "step_findings": StepFindings,
    "job_order": JobOrder,
}


@dataclass(frozen=True)
class SchemaInfo:
    """One registered schema version."""

    id: int
    name: str
    version: int
    record_type: type[Record]
    schema: Any  # the parsed Avro schema
    raw: dict[str, Any]


def _load() -> dict[int, SchemaInfo]:
    folder = resources.files(__package__ or "argus.schemas") / "avro"
    registry = json.loads((folder / "registry.json").read_text())
    out: dict[int, SchemaInfo] = {}
    for sid, ref in registry.items():
        name, version = ref.rsplit(".v", 1)
        raw = json.loads((folder / f"{ref}.avsc").read_text())
        out[int(sid)] = SchemaInfo(
            int(sid), name, int(version), _TYPES[name], parse_schema(raw, named_schemas={}), raw
        )
    return out


SCHEMAS: dict[int, SchemaInfo] = _load()
"""Every known schema version by its stable id."""

_LATEST: dict[type[Record], SchemaInfo] = {}
for _info in sorted(SCHEMAS.values(), key=lambda i: i.version):
    _LATEST[_info.record_type] = _info


def _varint(n: int) -> bytes:
    """Avro's ``long``: zigzag, then base-128 little-endian."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL = [_varint(n) for n in range(1 << 12)]
"""Varints of the lengths and counts a record mostly holds (one 8-byte column entry: 16)."""

_PRIMITIVE = frozenset({"string", "bytes", "int", "long"})
_FLAT: dict[int, tuple[tuple[str, str], ...]] = {
    info.id: tuple((f["name"], f["type"]) for f in info.raw["fields"])
    for info in SCHEMAS.values()
    if all(isinstance(f["type"], str) and f["type"] in _PRIMITIVE for f in info.raw["fields"])
}
"""Schemas whose fields are all strings, bytes and integers (step and heartbeat batches,
kernel sketches): written by :func:`_write_flat`, not by fastavro's generic writer, which
costs ~10 µs per record of ~30 fields (a training process writes one per step)."""


def _write_flat(fields: tuple[tuple[str, str], ...], data: dict[str, Any], out: list[bytes]) -> None:
    """Append the Avro binary of a flat record to ``out`` (the same bytes fastavro writes)."""
    small = _SMALL
    for name, kind in fields:
        value = data[name]
        if kind == "string":
            if not isinstance(value, str):
                raise TypeError(f"{name}: expected a string, got {type(value).__name__}")
            value = value.encode()
        elif kind != "bytes":
            # a float or anything else but an integer raises TypeError (list index, shift)
            out.append(small[value] if 0 <= value < 4096 else _varint(value))
            continue
        n = len(value)
        out.append(small[n] if n < 4096 else _varint(n))
        out.append(value)


def encode(record: Record, *, check: bool = True) -> bytes:
    """Encode a record with the newest version of its schema.

    Raises :class:`ValidationError` when ``check`` is set and the record is out of range.
    """
    info = _LATEST.get(type(record))
    if info is None:
        raise TypeError(f"not a record type: {type(record).__name__}")
    if check:
        validate(record)
    flat = _FLAT.get(info.id)
    if flat is not None:
        out = [_HEADER.pack(MAGIC, info.id)]
        _write_flat(flat, record.to_avro(), out)
        return b"".join(out)
    buf = io.BytesIO()
    buf.write(_HEADER.pack(MAGIC, info.id))
    schemaless_writer(buf, info.schema, record.to_avro())
    return buf.getvalue()


_ROW_FIELDS = ("start_ns", "end_ns", *FLOAT_COLUMNS, "samples", "tokens")
"""The fields of a step batch a rank's rows differ in besides ``step``: contiguous in the
schema, each one packed entry of 8 bytes."""


class StepRowWriter:
    """Wire bytes of one rank's steps, each a 1-row StepBatch, written from the step's numbers.

    The same bytes as :func:`encode` of that 1-row batch for a tenth of the cost (a
    training process writes one per step): the rank's own columns (job, run, rank, host,
    GPU, parallel coordinates) are checked and encoded once, here; :meth:`write` checks a
    step's numbers against the contract's limits and packs them.

    Raises :class:`ValidationError` if the rank's columns are out of range.
    """

    def __init__(self, rank: StepRecord) -> None:
        first = StepBatch.from_records(
            [replace(rank, step=0, start_ns=LIMITS["min_time_ns"], end_ns=LIMITS["min_time_ns"])]
        )
        validate(first)
        info = _LATEST[StepBatch]
        fields = _FLAT[info.id]
        names = [name for name, _ in fields]
        at, row = names.index("step"), names.index(_ROW_FIELDS[0])
        if names[at + 1] != "rows" or tuple(names[row : row + len(_ROW_FIELDS)]) != _ROW_FIELDS:
            raise SchemaError("step_batch schema changed: StepRowWriter no longer matches it")
        data = first.to_avro()
        head: list[bytes] = [_HEADER.pack(MAGIC, info.id)]
        _write_flat(fields[:at], data, head)
        mid: list[bytes] = [_SMALL[1]]  # rows
        _write_flat(fields[at + 2 : row], data, mid)
        tail: list[bytes] = []
        _write_flat(fields[row + len(_ROW_FIELDS) :], data, tail)
        self._head, self._mid, self._tail = b"".join(head), b"".join(mid), b"".join(tail)
        self._row = struct.Struct("<" + "".join("Bd" if f in FLOAT_COLUMNS else "Bq" for f in _ROW_FIELDS))
        self._lengths = [_SMALL[8][0]] * (2 * len(_ROW_FIELDS))  # each entry's length prefix

    def write(
        self, step: int, start_ns: int, end_ns: int, figures: Any, samples: int = 0, tokens: int = 0
    ) -> bytes:
        """The message of one step; ``figures`` holds the ms of ``FLOAT_COLUMNS`` in order.

        Raises :class:`ValidationError` for values out of the contract's range (and for
        NaN), as :func:`encode` would.
        """
        times = np.asarray(figures, dtype=np.float64)
        if times.shape != (len(FLOAT_COLUMNS),):
            raise ValidationError(f"StepRowWriter: {times.shape} figures, expected {len(FLOAT_COLUMNS)}")
        limit = LIMITS["max_duration_ms"]
        if not (times.min() >= 0.0 and times.max() <= limit):  # NaN fails both
            raise ValidationError("StepRowWriter: a figure holds NaN, inf, negative or absurd values")
        if not 0 <= step < LIMITS["max_step"]:
            raise ValidationError(f"StepRowWriter: step {step} out of range")
        if not (LIMITS["min_time_ns"] <= start_ns <= end_ns < LIMITS["max_time_ns"]):
            raise ValidationError("StepRowWriter: start_ns/end_ns out of order or outside years 2000..2100")
        if end_ns - start_ns > limit * 1_000_000:
            raise ValidationError("StepRowWriter: step wall time longer than a day")
        if not (0 <= samples < 1 << 63 and 0 <= tokens < 1 << 63):
            raise ValidationError("StepRowWriter: samples/tokens negative or too large")
        values = self._lengths.copy()
        values[1::2] = [start_ns, end_ns, *times.tolist(), samples, tokens]
        return b"".join(
            (
                self._head,
                _SMALL[step] if step < 4096 else _varint(step),
                self._mid,
                self._row.pack(*values),
                self._tail,
            )
        )


def peek_schema_id(data: bytes) -> int:
    """The schema id in the wire header, without decoding the body."""
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) < _HEADER.size:
        raise DecodeError(f"message of {len(data) if data is not None else 0} bytes has no wire header")
    magic, sid = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise DecodeError(f"magic byte {magic} is not the Confluent wire format (0)")
    return int(sid)


def decode(data: bytes, *, check: bool = True, expect: type[Record] | None = None) -> Any:
    """Decode one message into its record type (the newest version of its schema).

    Raises :class:`UnknownSchemaError` for an unknown schema id, :class:`DecodeError` for
    bytes that are not valid Avro, and :class:`ValidationError` when ``check`` is set and the
    values are out of range; ``expect`` rejects records of another type.
    """
    record = _build(*_read(data, expect), check=check)
    if isinstance(record, SchemaError):
        raise record
    return record


def _read(data: bytes, expect: type[Record] | None) -> tuple[SchemaInfo, Any]:
    """The writer's schema and the Avro body as fastavro reads it."""
    sid = peek_schema_id(data)
    writer = SCHEMAS.get(sid)
    if writer is None:
        raise UnknownSchemaError(f"unknown schema id {sid}")
    if expect is not None and writer.record_type is not expect:
        raise DecodeError(f"expected {expect.__name__}, got {writer.record_type.__name__}")
    buf = io.BytesIO(data)
    buf.seek(_HEADER.size)
    try:
        # Read with the writer's schema; from_avro knows every version's shape (v1/v2
        # StepBatch columns are Avro arrays, v3 packed bytes), which Avro resolution cannot map.
        raw = schemaless_reader(buf, writer.schema, None)
    except Exception as exc:  # fastavro raises many types on garbage: EOF, UnicodeDecode, ...
        raise DecodeError(f"{writer.name} v{writer.version}: body is not valid Avro ({exc!r})") from exc
    if buf.tell() != len(data):
        raise DecodeError(f"{writer.name}: {len(data) - buf.tell()} trailing bytes after the record")
    return writer, raw


def _build(writer: SchemaInfo, raw: Any, *, check: bool) -> Any:
    """The record from fastavro's dict, checked; a :class:`SchemaError` is returned, not raised."""
    try:
        record = writer.record_type.from_avro(raw)
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        return ValidationError(f"{writer.name}: {exc}")
    except MemoryError:  # sizes come from the bytes present; this is the last guard
        return DecodeError(f"{writer.name}: its sizes claim more memory than this process has")
    if check:
        try:
            validate(record)
        except ValidationError as exc:
            return exc
    return record


def decode_many(payloads: Sequence[bytes], *, expect: type[Record] | None = None) -> list[Any]:
    """Decode messages like :func:`decode`; each entry is the record or the
    :class:`SchemaError` that rejects it.

    The v3 StepBatches among them (what a worker or a sink consumes) are read and checked
    together, in one vectorized pass (:class:`PackedSteps`), and so are the
    HeartbeatBatches; only if that pass fails is each checked alone, to name the bad ones.
    """
    out: list[Any] = []
    steps: list[tuple[int, SchemaInfo]] = []  # v3 StepBatches, still raw dicts in ``out``
    beats: list[tuple[int, SchemaInfo]] = []  # HeartbeatBatches, still raw dicts in ``out``
    for data in payloads:
        try:
            writer, raw = _read(data, expect)
        except SchemaError as exc:
            out.append(exc)
            continue
        if writer.record_type is StepBatch and "rows" in raw:
            steps.append((len(out), writer))
            out.append(raw)
        elif writer.record_type is HeartbeatBatch:
            beats.append((len(out), writer))
            out.append(raw)
        else:
            out.append(_build(writer, raw, check=True))
    packed = PackedSteps.read([out[i] for i, _ in steps]) if len(steps) > 1 else None
    if packed is not None and _passes(packed):
        for (i, _), batch in zip(steps, packed.batches(), strict=True):
            out[i] = batch
    else:
        for i, writer in steps:
            out[i] = _build(writer, out[i], check=True)
    if beats:
        _heartbeat_batches(out, beats)
    return out


def _heartbeat_batches(out: list[Any], where: list[tuple[int, SchemaInfo]]) -> None:
    """Build the HeartbeatBatches at ``where`` (raw dicts in ``out``) and check them in one
    pass; if that fails, one by one (the bad ones are replaced by their error)."""
    packed = PackedHeartbeats.read([out[i] for i, _ in where]) if len(where) > 1 else None
    if packed is not None:
        try:
            validate_packed_heartbeats(packed)
        except ValidationError:
            pass  # named below
        else:
            for (i, _), batch in zip(where, packed.batches(), strict=True):
                out[i] = batch
            return
    for i, writer in where:
        out[i] = _build(writer, out[i], check=True)


def _passes(packed: PackedSteps) -> bool:
    try:
        validate_packed(packed)
    except (ValidationError, TypeError, ValueError):
        return False
    return True
