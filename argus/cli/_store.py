"""Open the configured store for a command; its errors exit by the table (:mod:`._errors`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..wiring import open_configured_store
from ._app import exit_on_error, settings

__all__ = ["command_store"]


@contextmanager
def command_store(*, migrate: bool = True) -> Iterator[Any]:
    """The store, migrated; a locked or unreachable store is a one-line error, exit 3, a
    rejected query exit 2 (as every store error inside the ``with``)."""
    from argus.sinks import migrate as run_migrations

    s = settings()
    with exit_on_error():
        store = open_configured_store(s)
        try:
            if migrate:
                run_migrations(store, ttl_days=s.ttl_days)
            yield store
        finally:
            store.close()
