"""Validation matches every column of the store: what passes converts to Arrow and inserts
into chDB unchanged; one past any bound is rejected (issue 17, item 4)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from argus.schemas import (
    LIMITS,
    Anomaly,
    DeadLetter,
    GpuSample,
    KernelNames,
    KernelSketch,
    StackSample,
    StepSummary,
    ValidationError,
    decode,
    encode,
    validate,
)
from argus.sinks import to_arrow
from tests.records import RECORDS, T0

U32, I31, I63 = (1 << 32) - 1, (1 << 31) - 1, (1 << 63) - 1
MAX_RANK = LIMITS["max_rank"] - 1
LAST_NS = LIMITS["max_time_ns"] - 1


def _of(kind: type) -> object:
    return next(r for r in RECORDS if type(r) is kind)


# Each of these passed validation before issue 17 and then overflowed `to_arrow` or was
# stored as a wrapped-around value (the sink crashed on the batch and on every restart).
OVERFLOWING = {
    "KernelSketch codec 70000": dataclasses.replace(_of(KernelSketch), codec=70_000),
    "StepSummary run -1": dataclasses.replace(_of(StepSummary), run=-1),
    "StepSummary missing -1": dataclasses.replace(_of(StepSummary), missing=(-1,)),
    "StepSummary tokens -1": dataclasses.replace(_of(StepSummary), tokens=-1),
    "StepSummary end_ns 0": dataclasses.replace(_of(StepSummary), end_ns=0),
    "StepSummary collective NaN": dataclasses.replace(_of(StepSummary), collective_ms_median=float("nan")),
    "Anomaly run -1": dataclasses.replace(_of(Anomaly), run=-1),
    "Anomaly ranks -1": dataclasses.replace(_of(Anomaly), ranks=(-1,)),
    "Anomaly step_ms_added inf": dataclasses.replace(_of(Anomaly), step_ms_added=float("inf")),
    "Anomaly detected_ns -1": dataclasses.replace(_of(Anomaly), detected_ns=-1),
    "Anomaly long suspect": dataclasses.replace(_of(Anomaly), suspect="x" * 5000),
    "DeadLetter offset -1": dataclasses.replace(_of(DeadLetter), offset=-1),
    "DeadLetter partition -1": dataclasses.replace(_of(DeadLetter), partition=-1),
    "DeadLetter 1 MB payload": dataclasses.replace(_of(DeadLetter), payload=b"x" * (1 << 20)),
    "GpuSample xid -1": dataclasses.replace(_of(GpuSample), xid=-1),
    "GpuSample ecc_dbe -7": dataclasses.replace(_of(GpuSample), ecc_dbe=-7),
    "GpuSample nvlink_errors -1": dataclasses.replace(_of(GpuSample), nvlink_errors=-1),
    "GpuSample power 1e39 (Float32 inf)": dataclasses.replace(_of(GpuSample), power_w=1e39),
    "KernelNames id -1": dataclasses.replace(_of(KernelNames), ids=(-1, 1)),
    "StackSample count -1": dataclasses.replace(_of(StackSample), counts=(-1, 10)),
}


@pytest.mark.parametrize("record", OVERFLOWING.values(), ids=list(OVERFLOWING))
def test_values_a_column_cannot_hold_are_rejected(record: object) -> None:
    data = encode(record, check=False)  # what a hostile producer sends
    with pytest.raises(ValidationError):
        decode(data)


# Every record at the edges of its ranges: the largest (and smallest) value each column takes.
AT_BOUNDS = [
    KernelSketch("bounds", I31 - 1, MAX_RANK, LIMITS["max_step"] - 1, (1 << 16) - 1, -1, b"\x00"),
    KernelNames("bounds", 0, MAX_RANK, (0, I31), ("a" * LIMITS["max_name_len"], "")),
    StackSample("bounds", 0, MAX_RANK, 0, LIMITS["min_time_ns"], LAST_NS, ("s",), (I31,)),
    GpuSample(
        "h" * 256,
        "g",
        1023,
        LAST_NS,
        gpu_util=1e30,
        sm_clock_mhz=0.0,
        power_w=1e30,
        temp_c=0.0,
        clock_event_reasons=I63,
        xid=I31,
        ecc_dbe=I63,
        remapped_rows=I63,
        nvlink_tx_bytes=I63,
        nvlink_rx_bytes=I63,
        nvlink_errors=I63,
    ),
    StepSummary(
        "bounds",
        I31 - 1,
        LIMITS["max_step"] - 1,
        LAST_NS,
        MAX_RANK,
        (MAX_RANK, 0),
        1e30,
        0.0,
        1e30,
        0.0,
        0.0,
        0.0,
        1e30,
        I63,
        (MAX_RANK,),
    ),
    Anomaly(
        "bounds-" + "x" * 249,
        "bounds",
        I31 - 1,
        0,
        LIMITS["max_step"] - 1,
        "hang",
        "rank",
        "s" * 256,
        (MAX_RANK, 0),
        "hang",
        1e30,
        {"e" * 256: -1e30},
        "y" * LIMITS["max_name_len"],
        -1e30,
        1e30,
        LAST_NS,
    ),
    DeadLetter("t" * 256, I31 - 1, I63, "r", "e" * 4096, LAST_NS, b"\xff" * LIMITS["max_dead_payload"]),
]


@pytest.mark.parametrize("record", AT_BOUNDS, ids=lambda r: type(r).__name__)
def test_records_at_every_bound_insert_and_read_back_unchanged(store, record: object) -> None:
    validate(record)
    table, data = to_arrow([record])
    marker = f"bounds-{type(record).__name__}-{np.random.default_rng().integers(1 << 40)}"
    column = {"gpu_samples": "gpu_uuid", "dead_letters": "reason", "anomalies": "id"}.get(table, "job")
    data = data.set_column(data.column_names.index(column), column, pa.array([marker] * data.num_rows))
    store.insert_arrow(table, data)
    binary = "payload" in data.column_names
    back = store.query_arrow(
        f"SELECT * {'EXCEPT payload, hex(payload) AS payload' if binary else ''} FROM {table} "
        f"WHERE {column} = {{m:String}}",
        {"m": marker},
    )
    assert back.num_rows == data.num_rows
    for name in data.column_names:
        sent, got = data.column(name).to_pylist(), back.column(name).to_pylist()
        if name == "time":
            continue  # DateTime64 comes back zoned; the partitioning is what matters
        if name == "payload":
            sent = [v.hex().upper() for v in sent]
        if name == "evidence":
            got = [list(m) if not isinstance(m, dict) else list(m.items()) for m in got]
        if isinstance(sent[0], float):
            assert np.allclose(sent, got, rtol=1e-6), name
        else:
            assert [str(v) for v in sent] == [str(v) for v in got], name


def test_one_past_every_bound_is_rejected() -> None:
    past = [
        dataclasses.replace(AT_BOUNDS[0], codec=1 << 16),
        dataclasses.replace(AT_BOUNDS[1], ids=(0, 1 << 32)),
        dataclasses.replace(AT_BOUNDS[2], counts=(1 << 32,)),
        dataclasses.replace(AT_BOUNDS[3], xid=1 << 32),
        dataclasses.replace(AT_BOUNDS[3], power_w=1.1e30),
        dataclasses.replace(AT_BOUNDS[4], missing=(MAX_RANK + 1,)),
        dataclasses.replace(AT_BOUNDS[4], run=1 << 31),
        dataclasses.replace(AT_BOUNDS[5], ranks=(MAX_RANK + 1,)),
        dataclasses.replace(AT_BOUNDS[5], detected_ns=LAST_NS + 1),
        dataclasses.replace(AT_BOUNDS[6], offset=1 << 63),
        dataclasses.replace(AT_BOUNDS[6], payload=b"x" * (LIMITS["max_dead_payload"] + 1)),
    ]
    for record in past:
        with pytest.raises(ValidationError):
            validate(record)


def test_dead_letter_of_oversized_input_keeps_a_prefix_and_the_size() -> None:
    letter = DeadLetter.of("argus.steps", 3, 7, "decode", "bad magic", T0, b"\x01" * 1_000_000)
    validate(letter)
    assert len(letter.payload) == LIMITS["max_dead_payload"] and "1000000 bytes" in letter.error
    assert len(encode(letter)) < 70_000
    small = DeadLetter.of("argus.steps", -1, -5, "decode", "e" * 10_000, -1, b"\x02")
    assert (small.partition, small.offset, small.time_ns, len(small.error), small.payload) == (
        0,
        0,
        0,
        4096,
        b"\x02",
    )
