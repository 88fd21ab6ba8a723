"""Versioned DDL migrations: ``ddl/NNN_name.sql`` applied in order, each once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from ._sql import DDL_FRAGMENTS
from .store import Store, _ident, split_statements

__all__ = [
    "MAX_TTL_DAYS",
    "Migration",
    "applied_versions",
    "apply_ttl",
    "migrate",
    "migrations",
    "retention",
    "retention_report",
]

MAX_TTL_DAYS = 10_000
"""The longest retention (about 27 years): arrival time + TTL must stay below DateTime's end
(2106-02-07), or the TTL date wraps into the past and every row is deleted at once."""

_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
_TTL = re.compile(r"\bTTL inserted \+ toIntervalDay\((\d+)\)")


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
    _check_ttl(ttl_days)
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


def _check_ttl(ttl_days: int) -> None:
    if not 1 <= ttl_days <= MAX_TTL_DAYS:
        raise ValueError(f"ttl_days must be between 1 and {MAX_TTL_DAYS:,} (got {ttl_days})")


def retention(store: Store) -> dict[str, int]:
    """Days each table with a TTL keeps a row, as the store's own DDL says (the TTL counts
    from a row's arrival, ``inserted``, since migration 006)."""
    rows = store.query_rows(
        "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase() "
        "AND engine_full LIKE '%TTL inserted%' ORDER BY name"
    )
    out = {}
    for name, engine in rows:
        m = _TTL.search(str(engine))
        if m:
            out[str(name)] = int(m.group(1))
    return out


def apply_ttl(store: Store, ttl_days: int) -> dict[str, int]:
    """Make every table's TTL ``ttl_days`` (the migrations write it only when they create a
    table); return the tables changed, each with the days it kept before.

    Run by ``argus db migrate`` and on every ``argus sink`` start, the processes that own the
    store's configuration (never by a reader such as ``argus sql``, whose environment may
    lack ``ARGUS_TTL_DAYS``). ClickHouse rewrites each changed table's parts once (the TTL
    is materialized), then deletes what is older than the new retention.
    """
    _check_ttl(ttl_days)
    changed = {table: days for table, days in retention(store).items() if days != ttl_days}
    for table in changed:
        store.execute(f"ALTER TABLE {_ident(table)} MODIFY TTL inserted + INTERVAL {int(ttl_days)} DAY")
    return changed


def retention_report(store: Store, ttl_days: int) -> str:
    """Apply ``ttl_days`` (:func:`apply_ttl`) and say in one line what the store keeps now."""
    changed = apply_ttl(store, ttl_days)
    now = retention(store)
    kept = sorted(set(now.values()))
    line = f"retention: {', '.join(map(str, kept)) or '-'} days from arrival on {len(now)} tables"
    if changed:
        before = sorted(set(changed.values()))
        line += f" (changed now on {len(changed)}, from {', '.join(map(str, before))} days)"
    return line
