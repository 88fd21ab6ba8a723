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
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from ._errors import DecodeError, SchemaError, UnknownSchemaError, ValidationError
from ._findings import JobOrder, StepFindings
from ._heartbeats import HeartbeatBatch, PackedHeartbeats
from ._records import (
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
    StepSummary,
)
from ._validate import validate, validate_packed, validate_packed_heartbeats

__all__ = ["SCHEMAS", "SchemaInfo", "decode", "decode_many", "encode", "peek_schema_id"]

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


def encode(record: Record, *, check: bool = True) -> bytes:
    """Encode a record with the newest version of its schema.

    Raises :class:`ValidationError` when ``check`` is set and the record is out of range.
    """
    info = _LATEST.get(type(record))
    if info is None:
        raise TypeError(f"not a record type: {type(record).__name__}")
    if check:
        validate(record)
    buf = io.BytesIO()
    buf.write(_HEADER.pack(MAGIC, info.id))
    schemaless_writer(buf, info.schema, record.to_avro())
    return buf.getvalue()


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
    except (TypeError, ValueError, KeyError) as exc:
        return ValidationError(f"{writer.name}: {exc}")
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
