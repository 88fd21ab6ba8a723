"""Round trips, schema evolution and hostile bytes for the wire codec."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from fastavro import parse_schema, schemaless_writer

from argus import schemas
from argus.schemas import (
    SCHEMAS,
    DecodeError,
    KernelNames,
    SchemaError,
    StepBatch,
    UnknownSchemaError,
    ValidationError,
    decode,
    decode_many,
    encode,
    peek_schema_id,
)
from tests.records import RECORDS, T0, step_batch


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_round_trip(record: object) -> None:
    data = encode(record)  # type: ignore[arg-type]
    assert data[0] == 0
    assert decode(data) == record


def test_step_batch_round_trip_keeps_every_column() -> None:
    batch = step_batch()
    back = decode(encode(batch))
    assert back.records() == batch.records()
    np.testing.assert_allclose(back.step_ms, batch.step_ms)


def test_schema_ids_are_stable() -> None:
    registry = json.loads((Path(schemas.__file__).parent / "avro" / "registry.json").read_text())
    assert registry["1"] == "step_batch.v1"
    assert registry["2"] == "step_batch.v2"
    assert registry["11"] == "step_batch.v3"
    assert peek_schema_id(encode(step_batch())) == 11  # newest version of the step batch
    assert registry["9"] == "anomaly.v1"
    assert peek_schema_id(encode(RECORDS[6])) == 13  # anomaly.v2 (severity)


def test_anomaly_v1_reads_as_page_severity() -> None:
    """An anomaly a v1 writer sent (no severity) decodes with severity 'page'."""
    a = RECORDS[6]
    body = a.to_avro()
    body.pop("severity")
    back = decode(_written_with(9, body))
    assert back.severity == "page" and back.id == a.id


def _written_with(version_id: int, body: dict) -> bytes:
    buf = io.BytesIO()
    buf.write(struct.pack(">bI", 0, version_id))
    schemaless_writer(buf, SCHEMAS[version_id].schema, body)
    return buf.getvalue()


def _array_body(batch: StepBatch) -> dict:
    body = {"job": batch.job, "run": batch.run, "step": batch.step}
    body.update({k: v.tolist() for k, v in batch.columns.items()})
    return body


def test_current_reader_reads_v1_and_v2_writers() -> None:
    batch = step_batch(4)
    v2 = decode(_written_with(2, _array_body(batch)))
    assert v2.records() == batch.records()
    body = _array_body(batch)
    del body["ep"], body["cp"]  # a v1 writer does not know them
    v1 = decode(_written_with(1, body))
    assert isinstance(v1, StepBatch)
    assert v1["ep"].tolist() == [0, 0, 0, 0] and v1["cp"].tolist() == [0, 0, 0, 0]
    np.testing.assert_array_equal(v1["forward_ms"], batch["forward_ms"])


def test_v3_packed_and_v2_arrays_decode_alike() -> None:
    batch = step_batch(1024)
    packed = encode(batch)
    assert decode(packed).records() == batch.records()
    assert decode(_written_with(2, _array_body(batch))).records() == batch.records()


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", DecodeError),
        (b"\x00\x00", DecodeError),
        (b"\x01\x00\x00\x00\x01rest", DecodeError),  # wrong magic
        (b"\x00\x00\x00\x03\xe7" + b"\x00" * 20, UnknownSchemaError),  # id 999
        (b"\x00\x00\x00\x00\x02" + b"\xff" * 40, DecodeError),  # garbage body
    ],
)
def test_garbage_raises_a_schema_error(data: bytes, error: type) -> None:
    with pytest.raises(error):
        decode(data)


def test_truncated_and_padded_messages_are_rejected() -> None:
    data = encode(step_batch())
    for cut in (5, 6, len(data) // 2, len(data) - 1):
        with pytest.raises(DecodeError):
            decode(data[:cut])
    with pytest.raises(DecodeError, match="trailing"):
        decode(data + b"\x00")


def test_random_bytes_never_escape_the_error_tree() -> None:
    rng = np.random.default_rng(7)
    for _ in range(2000):
        n = int(rng.integers(0, 200))
        data = bytes([0, 0, 0, 0, int(rng.integers(1, 11))]) + rng.bytes(n)
        with contextlib.suppress(SchemaError):
            decode(data)


def _with(batch: StepBatch, **cols: np.ndarray) -> StepBatch:
    columns = dict(batch.columns)
    columns.update(cols)
    return StepBatch(batch.job, batch.run, batch.step, columns)


MUTATIONS = [
    (lambda b: _with(b, forward_ms=np.full(len(b), np.nan)), "forward_ms"),
    (lambda b: _with(b, all_reduce_ms=-np.ones(len(b))), "all_reduce_ms"),
    (lambda b: _with(b, rank=np.arange(len(b)) + 10_000_000), "rank"),
    (lambda b: _with(b, rank=np.zeros(len(b), dtype=np.int64)), "twice"),
    (lambda b: _with(b, end_ns=b["start_ns"] - 1), "negative"),
    (lambda b: _with(b, start_ns=np.full(len(b), 10), end_ns=np.full(len(b), 20)), "2000"),
    (lambda b: _with(b, host=np.array(["x" * (1 << 20)] * len(b), dtype=object)), "host"),
    (lambda b: _with(b, host=np.array(["a\nb"] * len(b), dtype=object)), "newline"),
]


@pytest.mark.parametrize(("mutate", "message"), MUTATIONS)
def test_out_of_range_values_are_invalid(mutate, message: str) -> None:
    bad = mutate(step_batch())
    with pytest.raises(ValidationError, match=message):
        encode(bad)
    data = encode(bad, check=False)  # a hostile producer skips the check ...
    with pytest.raises(ValidationError, match=f"{message}|differ in length"):
        decode(data)  # ... the reader does not (a newline splits a text column: lengths differ)


@pytest.mark.parametrize(("mutate", "message"), MUTATIONS)
def test_decode_many_names_the_one_bad_batch_among_good_ones(mutate, message: str) -> None:
    good = [step_batch(8, step=s) for s in range(6)]
    payloads = [encode(b) for b in good]
    payloads.insert(3, encode(mutate(step_batch(8, step=9)), check=False))
    out = decode_many(payloads, expect=StepBatch)
    assert isinstance(out[3], ValidationError)
    assert re.search(f"{message}|differ in length", str(out[3]))
    decoded = out[:3] + out[4:]
    assert [b.records() for b in decoded] == [b.records() for b in good]


def test_decode_many_equals_decode_one_by_one() -> None:
    batches = [step_batch(n, step=s) for s, n in enumerate((1, 8, 64, 3, 1024))]
    payloads = [encode(b) for b in batches]
    payloads += [_written_with(2, _array_body(batches[1])), b"\x00\x00", encode(RECORDS[0])]
    out = decode_many(payloads)
    for data, got in zip(payloads, out, strict=True):
        try:
            want = decode(data)
        except SchemaError as exc:
            assert type(got) is type(exc) and str(got) == str(exc)
            continue
        if isinstance(want, StepBatch):
            assert got.records() == want.records()
        else:
            assert got == want
    assert isinstance(decode_many(payloads, expect=StepBatch)[-1], DecodeError)


def test_decode_many_catches_columns_that_shift_between_messages() -> None:
    # Two messages whose packed columns are each 8 bytes off in opposite directions: the
    # total length matches, so only a per-message check keeps rows from sliding across.
    a, b = step_batch(4, step=1), step_batch(4, step=2)
    body_a, body_b = a.to_avro(), b.to_avro()
    body_a["forward_ms"] = body_a["forward_ms"][:-8]
    body_b["forward_ms"] = body_b["forward_ms"] + body_b["forward_ms"][:8]
    out = decode_many([_written_with(11, body_a), _written_with(11, body_b)])  # v3
    assert all(isinstance(o, ValidationError) for o in out)


def test_megabyte_kernel_name_is_invalid() -> None:
    rec = KernelNames("j", 0, 0, (1,), ("k" * (1 << 20),))
    with pytest.raises(ValidationError, match="names"):
        decode(encode(rec, check=False))


def test_expect_rejects_other_types() -> None:
    with pytest.raises(DecodeError, match="expected StepBatch"):
        decode(encode(RECORDS[0]), expect=StepBatch)


def test_every_schema_parses_and_matches_its_record() -> None:
    for info in SCHEMAS.values():
        parse_schema(info.raw, named_schemas={})
        names = {f["name"] for f in info.raw["fields"]}
        assert names, info.name


def _fastavro_bytes(record: object) -> bytes:
    """The record as fastavro's generic writer writes it (the reference for the direct one)."""
    info = next(i for i in SCHEMAS.values() if i.id == peek_schema_id(encode(record)))  # type: ignore[arg-type]
    buf = io.BytesIO()
    buf.write(struct.pack(">bI", 0, info.id))
    schemaless_writer(buf, info.schema, record.to_avro())  # type: ignore[attr-defined]
    return buf.getvalue()


def test_flat_records_are_written_byte_for_byte_as_fastavro_writes_them() -> None:
    from tests.schemas.test_heartbeat_batch import beat

    rng = np.random.default_rng(7)
    records: list[object] = [step_batch(n, step=s) for n, s in ((1, 0), (1, 5_000), (8, 3), (300, 10**11))]
    one = step_batch(1)
    records.append(
        StepBatch(one.job, 1 << 30, one.step, {**one.columns, "host": np.array(["nœud-ü 7"], object)})
    )
    wide = step_batch(64)
    records.append(
        StepBatch(wide.job, wide.run, wide.step, {**wide.columns, "forward_ms": rng.random(64) * 1e5})
    )
    records.append(schemas.HeartbeatBatch.from_beats([beat(r) for r in range(5)]))
    records.append(next(r for r in RECORDS if type(r).__name__ == "KernelSketch"))
    for record in records:
        assert encode(record, check=False) == _fastavro_bytes(record)  # type: ignore[arg-type]
    assert decode(encode(records[4])).columns["host"][0] == "nœud-ü 7"


@pytest.mark.parametrize("field, value", [("job", 7), ("run", 1.5), ("step", "3")])
def test_a_wrong_type_in_a_flat_record_is_a_type_error(field: str, value: object) -> None:
    batch = step_batch(2)
    bad = StepBatch(
        **{"job": batch.job, "run": batch.run, "step": batch.step, "columns": batch.columns, field: value}
    )
    with pytest.raises(TypeError):
        encode(bad, check=False)


def _row(step: int, **figures: float) -> tuple[schemas.StepRecord, np.ndarray]:
    from argus.schemas._records import FLOAT_COLUMNS

    values = {name: figures.get(name, 0.25 * k) for k, name in enumerate(FLOAT_COLUMNS)}
    rec = schemas.StepRecord(
        "job-ü", 7, step, 1_000, "node-ä", "GPU-1", 3, 2, 1, 4, 5, T0, T0 + 45_000_000, **values
    )
    return rec, np.array(list(values.values()))


def test_a_step_row_is_the_encoding_of_its_one_row_batch() -> None:
    rec, _ = _row(0)
    writer = schemas.StepRowWriter(rec)
    for step in (0, 1, 4095, 4096, 10**12 - 1):
        row, figures = _row(step, forward_ms=12.5, p2p_ms=86_400_000.0)
        row = dataclasses.replace(row, samples=step % 7, tokens=1 << 40)
        message = writer.write(step, row.start_ns, row.end_ns, figures, row.samples, row.tokens)
        assert message == encode(StepBatch.from_records([row]))
        assert decode(message).records() == [row]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"figures": [float("nan")] + [0.0] * 13}, "NaN"),
        ({"figures": [-1.0] + [0.0] * 13}, "negative"),
        ({"figures": [0.0] * 13}, "figures"),
        ({"step": -1}, "step"),
        ({"end_ns": T0 - 1}, "out of order"),
        ({"start_ns": 5, "end_ns": 6}, "2000..2100"),
        ({"end_ns": T0 + 2 * 86_400 * 10**9}, "longer than a day"),
        ({"samples": -3}, "samples"),
    ],
)
def test_a_step_row_out_of_range_is_refused(change: dict[str, object], message: str) -> None:
    rec, figures = _row(3)
    args: dict[str, object] = {"step": 3, "start_ns": T0, "end_ns": T0 + 1, "figures": figures}
    args.update(change)
    with pytest.raises(ValidationError, match=message):
        schemas.StepRowWriter(rec).write(**args)  # type: ignore[arg-type]


def test_a_rank_out_of_range_has_no_step_row_writer() -> None:
    rec, _ = _row(0)
    with pytest.raises(ValidationError):
        schemas.StepRowWriter(dataclasses.replace(rec, host="h" * 300))


def test_a_claimed_row_count_allocates_nothing_and_is_rejected() -> None:
    """Issue 34, item 2: an 816-byte StepBatch claiming 2**40 rows over empty columns made
    the decoder allocate columns of the claimed size (MemoryError, the sink crash-looped;
    at 10**8 rows 1.6 GB). Sizes come from the bytes present."""
    import tracemalloc

    from tests.security.bombs import CLAIM, row_claim

    for rows in (CLAIM, 10**8):
        message = row_claim(rows)
        tracemalloc.start()
        try:
            with pytest.raises(SchemaError, match=f"rows={rows}"):
                decode(message)
            (bad,) = decode_many([message])
            assert isinstance(bad, SchemaError)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20


@pytest.mark.parametrize("rows", [-3, 0, 2, 1 << 40])
def test_a_row_count_the_columns_do_not_hold_is_rejected(rows: int) -> None:
    """Issue 34, item 2: ``rows`` of -3 or 2**40 over one row of consistent columns was
    accepted as a 1-row batch."""
    from tests.security.bombs import row_claim

    message = row_claim(rows, keep_rows=1)
    with pytest.raises(SchemaError, match="rows="):
        decode(message)
    assert isinstance(decode_many([message, encode(step_batch(1))])[0], SchemaError)
    assert decode(row_claim(1, keep_rows=1)).step == 3


def test_no_claimed_size_bomb_escapes_the_error_tree() -> None:
    """Issue 34, item 2: a size claim of 2**40 in every schema (a row count, a string, bytes,
    an array) is a SchemaError, read without allocating from the claim."""
    import tracemalloc

    from tests.security.bombs import bombs

    for _topic, what, message in bombs():
        tracemalloc.start()
        try:
            (got,) = decode_many([message])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert isinstance(got, SchemaError), what
        assert peak < 1 << 20, what
