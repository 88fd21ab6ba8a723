"""The embedded store: migrations, Arrow inserts, bound parameters, one process per directory."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from argus.sinks import TABLE_OF, QueryError, migrate, migrations, to_arrow
from argus.sinks.store import dedup_settings, split_statements, with_datetimes
from tests.records import RECORDS, step_batch


def test_migrations_are_applied_once(store) -> None:
    assert migrate(store) == []  # the fixture already migrated
    tables = {
        r[0] for r in store.query_rows("SELECT name FROM system.tables WHERE database = currentDatabase()")
    }
    assert {
        "steps",
        "kernel_sketches",
        "kernel_names",
        "stacks",
        "gpu_samples",
        "step_summaries",
        "anomalies",
        "dead_letters",
        "schema_migrations",
    } <= tables
    versions = store.query_rows("SELECT count(), max(version) FROM schema_migrations")
    assert versions == [(len(migrations()), migrations()[-1].version)]


def test_every_record_type_lands_in_its_table(store, unique: str) -> None:
    for record in RECORDS:
        if type(record) not in TABLE_OF:  # heartbeats are state for the hang detector, not rows
            continue
        table, data = to_arrow([record])
        store.insert_arrow(table, data)
    batch = step_batch(16)
    batch = type(batch)(f"job-{unique}", batch.run, batch.step, batch.columns)
    table, data = to_arrow([batch])
    store.insert_arrow(table, data)
    rows = store.query_rows(
        "SELECT count(), sum(forward_ms), max(rank) FROM steps WHERE job = {job:String}",
        {"job": f"job-{unique}"},
    )
    assert rows == [(16, pytest.approx(16 * 30.5), 15)]
    ev = store.query_rows("SELECT evidence['forward_ms_z'], ranks FROM anomalies WHERE id = 'a1'")
    assert ev[0][0] == pytest.approx(9.1) and list(ev[0][1]) == [5]


def test_insert_deduplication_token_makes_retries_idempotent(store, unique: str) -> None:
    batch = step_batch(8)
    batch = type(batch)(f"dedup-{unique}", batch.run, batch.step, batch.columns)
    table, data = to_arrow([batch])
    for _ in range(3):
        store.insert_arrow(table, data, settings=dedup_settings(f"t-{unique}"))
    count = store.query_rows("SELECT count() FROM steps WHERE job = {j:String}", {"j": f"dedup-{unique}"})
    assert count == [(8,)]
    rollup = store.query_rows(
        "SELECT sum(rows) FROM steps_minutely WHERE job = {j:String}", {"j": f"dedup-{unique}"}
    )
    assert rollup == [(8,)]  # the retried inserts did not reach the materialized views either


def test_bound_parameters_keep_hostile_strings_inert(store) -> None:
    hostile = "x'; DROP TABLE steps; --"
    assert store.query_rows("SELECT {j:String}", {"j": hostile}) == [(hostile,)]
    assert store.query_rows("SELECT count() FROM steps WHERE job = {j:String}", {"j": hostile}) == [(0,)]
    assert store.query_rows("EXISTS TABLE steps") == [(1,)]


def test_bad_sql_is_a_query_error(store) -> None:
    with pytest.raises(QueryError, match=r"UNKNOWN_TABLE|Unknown table"):
        store.query_rows("SELECT * FROM no_such_table")


def test_unsafe_identifiers_are_refused(store) -> None:
    with pytest.raises(ValueError):
        store.insert_arrow("steps; DROP TABLE steps", pa.table({"a": [1]}))


def test_split_statements_drops_comments() -> None:
    assert split_statements("-- c\nSELECT 1;\n\nSELECT 2;\n") == ["SELECT 1", "SELECT 2"]


def test_a_second_process_gets_a_clear_lock_error(tmp_path: Path) -> None:
    holder = textwrap.dedent(
        f"""
        import sys, time
        from argus.sinks import ChdbStore
        s = ChdbStore({str(tmp_path)!r})
        print("ready", flush=True)
        sys.stdin.readline()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        probe = subprocess.run(
            [sys.executable, "-c", f"from argus.sinks import ChdbStore\nChdbStore({str(tmp_path)!r})"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.returncode != 0
        assert "StoreLockedError" in probe.stderr and f"in use by process {proc.pid}" in probe.stderr
    finally:
        proc.communicate("\n", timeout=30)


def test_query_raw_writes_clickhouses_own_bytes(store) -> None:
    out = b"".join(store.query_raw("SELECT 1 AS a, 'x' AS s FORMAT JSONEachRow"))
    assert out == b'{"a":1,"s":"x"}\n'
    # without a FORMAT clause: the format asked for (TSV with names by default)
    assert b"".join(store.query_raw("SELECT {n:UInt8} AS n", {"n": 7})) == b"n\n7\n"
    assert b"".join(store.query_raw("SELECT 2 AS b", fmt="CSV")) == b"2\n"
    with pytest.raises(QueryError):
        b"".join(store.query_raw("SELEC 1 FORMAT JSONEachRow"))


def test_datetime_columns_come_back_as_timestamps_not_epoch_integers(store, unique: str) -> None:
    table = store.query_arrow(
        "SELECT toDateTime('2026-01-02 03:04:05', 'UTC') AS utc, "
        "toDateTime('2026-01-02 03:04:05', 'Asia/Tokyo') AS tokyo, "
        "CAST(NULL, 'Nullable(DateTime(\\'UTC\\'))') AS missing, "
        "[toDateTime('2026-01-02 03:04:05', 'UTC')] AS listed, "
        "toUInt32(1767323045) AS plain_uint32, toDateTime64('2026-01-02 03:04:05.250', 3, 'UTC') AS ms"
    )
    types = {f.name: f.type for f in table.schema}
    assert types["utc"] == pa.timestamp("s", tz="UTC")
    assert types["tokyo"] == pa.timestamp("s", tz="Asia/Tokyo")
    assert types["missing"] == pa.timestamp("s", tz="UTC")
    assert types["listed"] == pa.list_(pa.timestamp("s", tz="UTC"))
    assert types["plain_uint32"] == pa.uint32()  # a real UInt32 stays a number
    row = table.to_pylist()[0]
    assert row["utc"].isoformat() == "2026-01-02T03:04:05+00:00"
    assert (
        row["tokyo"].isoformat() == "2026-01-02T03:04:05+09:00"
    )  # the column's zone, like clickhouse-client
    assert row["missing"] is None and row["plain_uint32"] == 1767323045
    assert row["ms"].isoformat() == "2026-01-02T03:04:05.250000+00:00"
    # a stored DateTime behind SimpleAggregateFunction (the rollups' `inserted`), through query_rows too
    store.execute(
        f"CREATE TABLE t_{unique} (k UInt32, at SimpleAggregateFunction(max, DateTime('UTC'))) "
        "ENGINE = AggregatingMergeTree ORDER BY k"
    )
    store.execute(f"INSERT INTO t_{unique} VALUES (1, '2026-01-02 03:04:05')")
    [(k, at)] = store.query_rows(f"SELECT k, at FROM t_{unique};")
    assert k == 1 and at.isoformat() == "2026-01-02T03:04:05+00:00"
    # statements DESCRIBE cannot take keep their result as it is
    assert "steps" in store.query_arrow("SHOW TABLES").column("name").to_pylist()


def test_with_datetimes_uses_the_servers_zone_for_a_bare_datetime() -> None:
    table = pa.table({"t": pa.array([0, None], pa.uint32()), "n": pa.array([5, 6], pa.uint32())})
    out = with_datetimes(table, {"t": "Nullable(DateTime)", "n": "UInt32"}, "Europe/Berlin")
    assert out.schema.field("t").type == pa.timestamp("s", tz="Europe/Berlin")
    assert out.column("t").to_pylist()[0].isoformat() == "1970-01-01T01:00:00+01:00"
    assert out.column("t").null_count == 1 and out.column("n").to_pylist() == [5, 6]


WEIRD_NAMES = [
    "C:\\runs\\new\\tjob",
    "run\\t1",
    "tab\there",
    "line\nbreak",
    "nul\0name",
    "\\",
    "esc\x1b[2Jname",
]


@pytest.mark.parametrize("name", WEIRD_NAMES)
def test_a_bound_string_reads_back_as_given_and_finds_its_rows(store, name: str, unique: str) -> None:
    """Issue 34, item 8: chDB parses a bound value as escaped text: a job named
    ``C:\\runs\\new\\tjob`` (stored) could not be found, ``run\\t1`` became a tab, a
    newline or a lone backslash failed to parse."""
    from argus.schemas import StepBatch
    from argus.sinks import to_arrow
    from tests.records import step_batch

    job = f"{name}-{unique}"
    b = step_batch(2)
    table, data = to_arrow([StepBatch(job, b.run, b.step, b.columns)])
    store.insert_arrow(table, data)
    assert store.query_rows("SELECT {j:String}", {"j": job}) == [(job,)]
    assert store.query_rows("SELECT count() FROM steps WHERE job = {j:String}", {"j": job}) == [(2,)]
