"""Retention counts from arrival (migration 006) and is bounded (issue 17 item 13, issue 15
item 5): an imported 2023 trace is stored and read back; a TTL past 2106 is refused."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from argus.sinks import migrate

REPO = Path(__file__).resolve().parents[2]
OLD_DAY = "2023-03-01"
TABLES_WITH_TTL = (
    "steps",
    "kernel_sketches",
    "stacks",
    "gpu_samples",
    "step_summaries",
    "anomalies",
    "dead_letters",
    "kernels",
    "steps_minutely",
    "steps_by_rank",
    "steps_rank_minutely",
)


def test_steps_of_2023_are_stored_and_read_back(store, unique: str) -> None:
    """Rows whose own time is years old survive the TTL merge (before: deleted at once)."""
    job = f"old-trace-{unique}"
    for rank in range(4):
        store.execute(
            "INSERT INTO steps (job, run, step, rank, time, start_ns, end_ns, step_ms) VALUES "
            "({job:String}, 0, 7, {rank:UInt32}, toDateTime64({day:String}, 3), 0, 1, 100)",
            {"job": job, "rank": rank, "day": f"{OLD_DAY} 10:00:00"},
        )
    partition = OLD_DAY.replace("-", "")
    for table in ("steps", "steps_minutely", "steps_rank_minutely"):
        # merges the old day's parts only (other tests' rows are left alone): TTL applies now
        store.execute(f"OPTIMIZE TABLE {table} PARTITION ID '{partition}' FINAL")
    rows = store.query_rows("SELECT count(), min(time) FROM steps WHERE job = {job:String}", {"job": job})
    assert rows[0][0] == 4 and str(rows[0][1]).startswith(OLD_DAY)
    minutely = store.query_rows("SELECT sum(rows) FROM steps_minutely WHERE job = {job:String}", {"job": job})
    assert minutely == [(4,)]


def test_every_ttl_counts_from_arrival(store) -> None:
    for table in TABLES_WITH_TTL:
        ddl = store.query_rows(f"SHOW CREATE TABLE {table}")[0][0]
        assert "TTL inserted + toIntervalDay(" in ddl, table


def test_a_retention_past_2106_is_refused(store) -> None:
    with pytest.raises(ValueError, match="between 1 and 10,000"):
        migrate(store, ttl_days=30_000)


_OLD_STORE = r"""
import sys
from pathlib import Path
from argus.sinks import ChdbStore, migrate, migrations
from argus.sinks.migrate import applied_versions

s = ChdbStore(Path(sys.argv[1]))
# a store of the previous release: every migration before 006, a row in it
for m in migrations():
    if m.version < 6:
        from argus.sinks.store import split_statements
        for st in split_statements(m.sql.replace("{ttl_days}", "30")):
            s.execute(st)
        s.execute("INSERT INTO schema_migrations (version) VALUES ({v:UInt32})", {"v": m.version})
s.execute("INSERT INTO steps (job, run, step, rank, time, start_ns, end_ns, step_ms) "
          "VALUES ('before', 0, 1, 0, now64(3), 0, 1, 100)")
applied = [m.version for m in migrate(s, ttl_days=30)]
s.execute("INSERT INTO steps (job, run, step, rank, time, start_ns, end_ns, step_ms) "
          "VALUES ('after', 0, 1, 0, toDateTime64('2023-03-01 10:00:00', 3), 0, 1, 100)")
s.execute("OPTIMIZE TABLE steps FINAL")
print(6 in applied, sorted(r[0] for r in s.query_rows("SELECT job FROM steps")))
s.close()
"""


def test_migration_006_upgrades_a_store_with_data(tmp_path: Path) -> None:
    """On a store of the previous release: the migration applies and keeps its rows (own
    process: chDB serves one data directory per process)."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_OLD_STORE), str(tmp_path / "ch")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "True ['after', 'before']"


def _argus(home: Path, ttl: int, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    full = {**os.environ, "ARGUS_HOME": str(home), "ARGUS_TTL_DAYS": str(ttl), "COLUMNS": "200", **env}
    return subprocess.run(
        [sys.executable, "-m", "argus.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=full,
        timeout=300,
    )


_TTLS = r"""
import json, sys
from argus.sinks import ChdbStore
from argus.sinks.migrate import retention
s = ChdbStore(sys.argv[1])
print(json.dumps(retention(s)))
s.close()
"""


def _stored_ttls(home: Path) -> dict[str, int]:
    import json

    out = subprocess.run(
        [sys.executable, "-c", _TTLS, str(home / "clickhouse")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=True,
    )
    ttls: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return ttls


def test_the_configured_ttl_is_applied_and_reported_on_a_fresh_store_and_when_it_changes(
    tmp_path: Path,
) -> None:
    """Issue 34, item 7: ``ARGUS_TTL_DAYS=365 argus db migrate`` on a fresh store created
    30-day TTLs (migrate never got the setting), and once the schema existed a new value
    was ignored silently. Now both apply it to every table and say so."""
    home = tmp_path / "home"
    first = _argus(home, 365, "db", "migrate")
    assert first.returncode == 0, first.stderr
    ttls = _stored_ttls(home)
    assert set(TABLES_WITH_TTL) <= set(ttls) and set(ttls.values()) == {365}, ttls
    assert f"retention: 365 days from arrival on {len(ttls)} tables" in first.stdout
    again = _argus(home, 90, "db", "migrate")
    assert again.returncode == 0, again.stderr
    assert set(_stored_ttls(home).values()) == {90}
    assert (
        f"retention: 90 days from arrival on {len(ttls)} tables (changed now on {len(ttls)}, from 365 days)"
        in (again.stdout)
    )
    same = _argus(home, 90, "db", "migrate")
    assert "retention: 90 days" in same.stdout and "changed now" not in same.stdout


@pytest.mark.kafka
def test_every_sink_start_applies_and_reports_the_ttl(tmp_path: Path, kafka_conf) -> None:
    """Issue 34, item 7: the sink applies ARGUS_TTL_DAYS on every start, the schema there or not."""
    from argus.kafka_admin import ensure_topics, skip_to_end
    from argus.sinks.kafka_sink import SINK_TOPICS

    home = tmp_path / "home"
    assert _argus(home, 30, "db", "migrate").returncode == 0
    group = f"ttl-{tmp_path.name}"
    ensure_topics(kafka_conf, list(SINK_TOPICS), partitions=16)
    skip_to_end(kafka_conf, group, SINK_TOPICS)  # the sink starts and idles: other tests' records are not its
    out = _argus(
        home,
        120,
        "sink",
        "--idle-exit",
        "1",
        "--group",
        group,
        ARGUS_KAFKA_BOOTSTRAP=kafka_conf["bootstrap.servers"],
    )
    assert out.returncode == 0, out.stderr
    assert "retention: 120 days from arrival" in out.stdout and "from 30 days" in out.stdout
    assert set(_stored_ttls(home).values()) == {120}
