"""sinks/rows.py: records to Arrow tables shaped like the ClickHouse tables (checked against real chDB)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from argus.schemas import COLLECTIVE_COLUMNS, PHASE_COLUMNS, DeadLetter, StepBatch
from argus.sinks import TABLE_OF, to_arrow
from tests.records import RECORDS, T0, step_batch


def test_a_step_batch_is_one_row_per_rank_with_its_step_repeated() -> None:
    batch = step_batch(8, step=11)
    table, data = to_arrow([batch, StepBatch("job-b", 2, 12, step_batch(4, step=12).columns)])
    assert table == "steps" and data.num_rows == 12
    assert data.column("job").to_pylist() == ["job-a"] * 8 + ["job-b"] * 4
    assert data.column("step").to_pylist() == [11] * 8 + [12] * 4
    assert data.column("run").to_pylist() == [1] * 8 + [2] * 4
    assert data.column("rank").to_pylist() == list(range(8)) + list(range(4))
    assert data.schema.field("step").type == pa.uint64() and data.schema.field("rank").type == pa.uint32()
    # the step's end, nanoseconds in the record, milliseconds in the table's DateTime64(3)
    assert data.column("time").type == pa.timestamp("ms")
    assert data.column("time").cast(pa.int64()).to_pylist()[0] == (T0 + 120_000_000) // 1_000_000
    assert data.column("all_reduce_ms").to_pylist()[:2] == [12.25, 12.25]
    assert {*PHASE_COLUMNS, *COLLECTIVE_COLUMNS} <= set(data.column_names)


def test_a_dead_letter_keeps_its_payload_bytes_and_origin() -> None:
    letter = DeadLetter.of("argus.steps", 3, 42, "bad_magic", "no magic byte", T0, b"\x00\xffjunk")
    table, data = to_arrow([letter])
    assert table == "dead_letters"
    row = data.to_pylist()[0]
    assert (row["topic"], row["partition"], row["offset"], row["reason"]) == (
        "argus.steps",
        3,
        42,
        "bad_magic",
    )
    assert row["payload"] == b"\x00\xffjunk" and data.schema.field("payload").type == pa.binary()


def test_one_type_per_call_and_at_least_one_record() -> None:
    with pytest.raises(ValueError, match="at least one"):
        to_arrow([])
    with pytest.raises(ValueError, match="one type"):
        to_arrow([step_batch(2), RECORDS[0]])


def test_every_table_takes_its_rows_column_for_column(store, unique: str) -> None:
    """Each converter's columns exist in its table with a type ClickHouse accepts: the rows
    go in and come back with the same values."""
    columns = {
        t: dict(
            store.query_rows(
                f"SELECT name, type FROM system.columns WHERE table = '{t}' AND database = currentDatabase()"
            )
        )
        for t in set(TABLE_OF.values())
    }
    for record in [step_batch(3), *(r for r in RECORDS if type(r) in TABLE_OF)]:
        table, data = to_arrow([record])
        assert set(data.column_names) <= set(columns[table]), (
            table,
            set(data.column_names) - set(columns[table]),
        )
    batch = StepBatch(f"rows-{unique}", 1, 7, step_batch(3).columns)
    table, data = to_arrow([batch])
    store.insert_arrow(table, data)
    got = store.query_rows(
        "SELECT rank, all_reduce_ms, toUnixTimestamp64Milli(time) FROM steps WHERE job = {j:String} ORDER BY rank",
        {"j": batch.job},
    )
    assert got == [(r, 12.25, (T0 + 120_000_000) // 1_000_000) for r in range(3)]
