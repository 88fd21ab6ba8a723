"""Claimed-size bombs: messages of a few hundred bytes whose sizes claim terabytes.

Each is a record of a real schema, valid Avro up to its bomb: a row count, a string or
bytes length, an array's or a map's block count of ``CLAIM`` (2**40) with nothing behind
it. A decoder that sizes anything from such a claim instead of from the bytes present
allocates terabytes (``MemoryError``) or gigabytes (at 10**8). One definition for the
codec's tests, the sink's and the reliability bench.
"""

from __future__ import annotations

import io
from typing import Any

from fastavro import parse_schema, schemaless_writer

from argus.schemas import (
    ANOMALIES,
    DEAD_LETTER,
    GPU_SAMPLES,
    HEARTBEATS,
    KERNELS,
    SCHEMAS,
    STACKS,
    STEP_FINDINGS,
    STEP_SUMMARIES,
    STEPS,
    HeartbeatBatch,
    StepBatch,
)
from argus.schemas._codec import _HEADER, _varint

__all__ = ["CLAIM", "bombs", "row_claim"]

CLAIM = 1 << 40

_BOMB_FIELD = {
    "kernel_sketch": "payload",
    "kernel_names": "ids",
    "stack_sample": "stacks",
    "gpu_sample": "gpu_uuid",
    "heartbeat": "groups",
    "step_summary": "missing",
    "anomaly": "ranks",
    "dead_letter": "payload",
    "step_findings": "job_median",
    "job_order": "action",
    "step_batch": "rank",
}
"""Per schema, the field whose length or count claims ``CLAIM``."""

_TOPIC = {
    "step_batch": STEPS,
    "kernel_sketch": KERNELS,
    "kernel_names": KERNELS,
    "stack_sample": STACKS,
    "gpu_sample": GPU_SAMPLES,
    "heartbeat": HEARTBEATS,
    "heartbeat_batch": HEARTBEATS,
    "step_summary": STEP_SUMMARIES,
    "anomaly": ANOMALIES,
    "dead_letter": DEAD_LETTER,
    "step_findings": STEP_FINDINGS,
    "job_order": STEP_FINDINGS,
}


def _sample(kind: str) -> Any:
    """Plain values for every field of a schema: zeros, empty strings and lists."""
    return {
        "int": 0,
        "long": 0,
        "double": 0.0,
        "float": 0.0,
        "string": "j",
        "bytes": b"",
        "boolean": False,
    }.get(kind, [])


def _claimed_field(sid: int) -> bytes:
    """A message of schema ``sid`` whose bomb field claims ``CLAIM`` entries or bytes."""
    info = SCHEMAS[sid]
    target = _BOMB_FIELD[info.name]
    buf = io.BytesIO()
    buf.write(_HEADER.pack(0, sid))
    for f in info.raw["fields"]:
        if f["name"] == target:
            buf.write(_varint(CLAIM))
            buf.write(b"\x02" * 16)  # a few bytes behind the claim, then the message ends
            return buf.getvalue()
        kind = f["type"] if isinstance(f["type"], str) else f["type"].get("type", "")
        schemaless_writer(buf, parse_schema(f["type"]), _sample(kind))
    raise AssertionError(f"{info.name} v{info.version} has no field {target}")


def row_claim(rows: int, *, keep_rows: int = 0) -> bytes:
    """A v3 StepBatch claiming ``rows`` rows whose columns hold ``keep_rows`` (0: every column
    empty; else a valid batch of that many ranks under a false ``rows``)."""
    from tests.records import step_batch

    data = step_batch(max(keep_rows, 1)).to_avro()
    if not keep_rows:
        data = {
            k: (b"" if isinstance(v, bytes) else "" if k in ("host", "gpu_uuid") else v)
            for k, v in data.items()
        }
    return _raw(StepBatch, {**data, "rows": rows})


def _raw(kind: type, data: dict[str, Any]) -> bytes:
    """The wire bytes of ``data`` in the newest schema of ``kind``, its ints written as
    varints whatever their range (an Avro ``int`` claim beyond 32 bits reads back as is)."""
    sid = max(
        i.id
        for i in SCHEMAS.values()
        if i.record_type is kind
        and i.version == max(j.version for j in SCHEMAS.values() if j.record_type is kind)
    )
    out = [_HEADER.pack(0, sid)]
    for f in SCHEMAS[sid].raw["fields"]:
        value = data[f["name"]]
        if f["type"] in ("int", "long"):
            out.append(_varint(value))
        elif f["type"] == "string":
            raw = value.encode()
            out += [_varint(len(raw)), raw]
        else:
            out += [_varint(len(value)), value]
    return b"".join(out)


def _heartbeat_claim() -> bytes:
    from argus.schemas import Heartbeat
    from tests.records import T0

    data = HeartbeatBatch.from_beats([Heartbeat("j", 1, 0, "h", T0, 1)]).to_avro()
    data = {
        k: (b"" if isinstance(v, bytes) else "" if isinstance(v, str) and k != "job" else v)
        for k, v in data.items()
    }
    return _raw(HeartbeatBatch, {**data, "rows": CLAIM, "width": CLAIM})


def bombs() -> list[tuple[str, str, bytes]]:
    """(topic, what, message) for every topic and every schema that may travel on it."""
    out = [
        (STEPS, "step_batch rows=2**40, columns empty", row_claim(CLAIM)),
        (STEPS, "step_batch rows=10**8, columns empty", row_claim(10**8)),
        (STEPS, "step_batch rows=-3, one row of columns", row_claim(-3, keep_rows=1)),
        (STEPS, "step_batch rows=2**40, one row of columns", row_claim(CLAIM, keep_rows=1)),
        (HEARTBEATS, "heartbeat_batch rows=width=2**40, columns empty", _heartbeat_claim()),
    ]
    for sid, info in sorted(SCHEMAS.items()):
        if info.name in _BOMB_FIELD:
            out.append(
                (
                    _TOPIC[info.name],
                    f"{info.name} v{info.version} {_BOMB_FIELD[info.name]}=2**40",
                    _claimed_field(sid),
                )
            )
    return out
