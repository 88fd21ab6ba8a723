"""sinks/migrate.py: versioned DDL applied in order, each once, with the retention written in
(a fresh chDB store per test runs in its own process: chDB serves one data directory per process)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from argus.sinks import migrate, migrations
from argus.sinks.migrate import MAX_TTL_DAYS, applied_versions
from argus.sinks.store import split_statements

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


def test_the_ddl_names_busy_time_and_the_collective_sum_once() -> None:
    """Busy time is step time minus the collective sum of schemas.COLLECTIVE_COLUMNS, written once
    in sinks/_sql.py: the DDL files name it, they do not spell the sum again."""
    from argus.schemas import COLLECTIVE_COLUMNS
    from argus.sinks._sql import COLLECTIVE_MS

    folder = resources.files("argus.sinks") / "ddl"
    raw = [f.read_text() for f in folder.iterdir() if f.name.endswith(".sql")]
    assert not any(re.search(r"all_reduce_ms\s*\+", sql) for sql in raw)
    assert "(" + " + ".join(COLLECTIVE_COLUMNS) + ")" == COLLECTIVE_MS
    rendered = [s for m in migrations() for s in re.findall(r"all_reduce_ms\s*\+[^()]*p2p_ms", m.sql)]
    assert len(rendered) >= 9 and set(rendered) == {" + ".join(COLLECTIVE_COLUMNS)}
    assert not any(re.search(r"\{(?!ttl_days\})[a-z_]+\}", m.sql) for m in migrations())  # every name filled


# sha256 of each migration's statements (comments dropped, white space folded), as shipped.
_APPLIED = {
    1: "ae1ec1903ab41045",
    2: "a2f2fe7a8b244100",
    3: "a4d27dbc59a705b7",
    4: "5b2a94c229c614b1",
    5: "5403ce8f3c219b0e",
    6: "8b1c11d103fc6527",
    7: "65b2423045eaf09e",
    8: "9ae0456974290965",
    9: "917f2d1ba0553c05",
    10: "671942ba28d218f3",
    11: "4fb768f2ac508ed4",
}


def test_a_shipped_migration_renders_as_it_always_did() -> None:
    """A store runs a migration once, by version: a migration that changes afterwards gives fresh
    stores another schema than the live ones. That includes a change to what sinks/_sql.py fills
    into it. Change the schema with a new migration; a new one is added to _APPLIED."""
    got = {
        m.version: hashlib.sha256(
            re.sub(r"\s+", " ", "\n".join(split_statements(m.sql))).encode()
        ).hexdigest()[:16]
        for m in migrations()
    }
    assert got == _APPLIED
