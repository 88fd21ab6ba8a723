"""``argus db``: schema migrations."""

from __future__ import annotations

import typer

from ._app import app, console
from ._store import command_store

db_app = typer.Typer(help="ClickHouse schema: versioned migrations.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("migrate")
def migrate_cmd() -> None:
    """Apply the DDL migrations the store lacks (safe to run again)."""
    from argus.sinks import migrate, migrations

    with command_store(migrate=False) as store:
        applied = migrate(store)
        for m in applied:
            console.print(f"applied {m.version:03d}_{m.name}")
        console.print(f"schema at version {max(m.version for m in migrations())}; {len(applied)} applied now")
