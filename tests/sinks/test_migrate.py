"""sinks/migrate.py: versioned DDL applied in order, each once, with the retention written in
(a fresh chDB store per test runs in its own process: chDB serves one data directory per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from argus.sinks import migrate, migrations
from argus.sinks.migrate import MAX_TTL_DAYS, applied_versions

_FRESH = r"""
import json, sys
from argus.sinks import ChdbStore, migrate
from argus.sinks.migrate import applied_versions

s = ChdbStore(sys.argv[1])
before = sorted(applied_versions(s))
first = [m.version for m in migrate(s, ttl_days=7)]
second = [m.version for m in migrate(s, ttl_days=7)]
counts = s.query_rows("SELECT version, count() FROM schema_migrations GROUP BY version ORDER BY version")
ddl = s.query_rows("SHOW CREATE TABLE steps")[0][0]
print(json.dumps({"before": before, "first": first, "second": second,
                  "counts": [list(c) for c in counts], "ddl": ddl}))
s.close()
"""


def test_migrations_are_numbered_once_in_order() -> None:
    versions = [m.version for m in migrations()]
    assert versions == sorted(set(versions)) and versions[0] == 1
    assert versions == list(range(1, len(versions) + 1))  # no gap: a gap is a lost file
    assert all(m.sql.strip() and m.name for m in migrations())


def test_a_fresh_store_gets_every_migration_once_with_its_retention(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FRESH, str(tmp_path / "ch")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    every = [m.version for m in migrations()]
    assert got["before"] == [] and got["first"] == every and got["second"] == []
    assert got["counts"] == [[v, 1] for v in every]  # recorded once each, not again on the rerun
    assert "TTL inserted + toIntervalDay(7)" in got["ddl"] and "{ttl_days}" not in got["ddl"]


def test_retention_out_of_bounds_is_refused_before_any_statement(store) -> None:
    done = applied_versions(store)
    for bad in (0, MAX_TTL_DAYS + 1):
        with pytest.raises(ValueError, match="ttl_days"):
            migrate(store, ttl_days=bad)
    assert applied_versions(store) == done


def test_the_ddls_collective_sums_are_the_one_definition() -> None:
    """Busy time is step time minus the collective sum of schemas.COLLECTIVE_COLUMNS: the Grafana
    queries build it from that list; applied migrations cannot be regenerated, so every sum
    written in them must spell exactly that list (a new collective needs a new migration)."""
    import re

    from argus.schemas import COLLECTIVE_COLUMNS

    sums = [
        re.sub(r"\s+", " ", s)
        for m in migrations()
        for s in re.findall(r"all_reduce_ms\s*\+[^()]*p2p_ms", m.sql)
    ]
    assert len(sums) >= 9
    assert set(sums) == {" + ".join(COLLECTIVE_COLUMNS)}
