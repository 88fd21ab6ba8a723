"""Open the configured store for a command, mapping store errors to clean exits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..wiring import open_configured_store
from ._app import EXIT_UNAVAILABLE, fail, settings

__all__ = ["command_store"]


@contextmanager
def command_store(*, migrate: bool = True) -> Iterator[Any]:
    """The store, migrated; a locked or unreachable store is a one-line error, exit 3."""
    from argus.sinks import QueryError, SinkError, StoreLockedError
    from argus.sinks import migrate as run_migrations

    s = settings()
    try:
        store = open_configured_store(s)
    except StoreLockedError as exc:
        fail(f"{exc}", EXIT_UNAVAILABLE)
    except SinkError as exc:
        fail(f"cannot open the ClickHouse store: {exc}", EXIT_UNAVAILABLE)
    try:
        if migrate:
            run_migrations(store, ttl_days=s.ttl_days)
        yield store
    except QueryError as exc:
        fail(f"ClickHouse rejected the query: {str(exc).splitlines()[0][:500]}")
    finally:
        store.close()
