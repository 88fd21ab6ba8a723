"""Versioned DDL migrations: ``ddl/NNN_name.sql`` applied in order, each once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from ._sql import DDL_FRAGMENTS
from .store import Store, split_statements

__all__ = ["MAX_TTL_DAYS", "Migration", "applied_versions", "migrate", "migrations"]

MAX_TTL_DAYS = 10_000
"""The longest retention (about 27 years): arrival time + TTL must stay below DateTime's end
(2106-02-07), or the TTL date wraps into the past and every row is deleted at once."""

_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One DDL file, its shared expressions (``{busy_ms}`` ...) filled in; ``{ttl_days}`` is
    left for :func:`migrate`."""

    version: int
    name: str
    sql: str


def _fill(sql: str, names: dict[str, str]) -> str:
    for name, text in names.items():
        sql = sql.replace("{" + name + "}", text)
    return sql


def migrations() -> list[Migration]:
    """All migrations shipped with this build, in version order."""
    folder = resources.files(__package__ or "argus.sinks") / "ddl"
    out = []
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if m:
            out.append(Migration(int(m.group(1)), m.group(2), _fill(entry.read_text(), DDL_FRAGMENTS)))
    return sorted(out, key=lambda m: m.version)


def applied_versions(store: Store) -> set[int]:
    """Versions already recorded in ``schema_migrations`` (empty on a new store)."""
    exists = store.query_rows(
        "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = 'schema_migrations'"
    )
    if not exists[0][0]:
        return set()
    return {int(r[0]) for r in store.query_rows("SELECT DISTINCT version FROM schema_migrations")}


def migrate(store: Store, *, ttl_days: int = 30) -> list[Migration]:
    """Apply the migrations the store lacks; return those applied. Safe to run again.

    ``ttl_days`` (1..MAX_TTL_DAYS) is the retention the migrations write into the tables'
    TTL, counted from each row's arrival (migration 006).
    """
    if not 1 <= ttl_days <= MAX_TTL_DAYS:
        raise ValueError(f"ttl_days must be between 1 and {MAX_TTL_DAYS:,} (got {ttl_days})")
    done = applied_versions(store)
    applied = []
    for m in migrations():
        if m.version in done:
            continue
        for statement in split_statements(_fill(m.sql, {"ttl_days": str(int(ttl_days))})):
            store.execute(statement)
        store.execute("INSERT INTO schema_migrations (version) VALUES ({v:UInt32})", {"v": m.version})
        applied.append(m)
    return applied
