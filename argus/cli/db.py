"""``argus db``: schema migrations."""

from __future__ import annotations

import typer

from ._app import app, console, settings
from ._store import command_store

db_app = typer.Typer(help="ClickHouse schema: versioned migrations.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("migrate")
def migrate_cmd() -> None:
    """Apply the DDL migrations the store lacks and the retention ARGUS_TTL_DAYS sets (safe to run again)."""
    from argus.sinks import migrate, migrations
    from argus.sinks.migrate import retention_report

    ttl_days = settings().ttl_days
    with command_store(migrate=False) as store:
        applied = migrate(store, ttl_days=ttl_days)
        for m in applied:
            console.print(f"applied {m.version:03d}_{m.name}")
        console.print(f"schema at version {max(m.version for m in migrations())}; {len(applied)} applied now")
        console.print(retention_report(store, ttl_days), markup=False, highlight=False)
