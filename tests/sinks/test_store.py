"""The embedded store: migrations, Arrow inserts, bound parameters, one process per directory."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from argus.sinks import TABLE_OF, QueryError, migrate, migrations, to_arrow
from argus.sinks.store import dedup_settings, split_statements

from ..schemas.test_codec import RECORDS, step_batch


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
            [sys.executable, "-c", f"from sinks import ChdbStore\nChdbStore({str(tmp_path)!r})"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.returncode != 0
        assert "StoreLockedError" in probe.stderr and f"in use by process {proc.pid}" in probe.stderr
    finally:
        proc.communicate("\n", timeout=30)
