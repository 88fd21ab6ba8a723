"""ClickHouse (embedded chDB or a server), the exactly-once Kafka sink, Grafana."""

from __future__ import annotations

from ._errors import (
    GrafanaPushError,
    MacroError,
    QueryError,
    SinkError,
    StoreLockedError,
    StoreUnavailableError,
)
from .migrate import Migration, migrate, migrations
from .rows import TABLE_OF, to_arrow
from .store import ChdbStore, ServerStore, Store, open_store

__all__ = [
    "TABLE_OF",
    "ChdbStore",
    "GrafanaPushError",
    "MacroError",
    "Migration",
    "QueryError",
    "ServerStore",
    "SinkError",
    "Store",
    "StoreLockedError",
    "StoreUnavailableError",
    "migrate",
    "migrations",
    "open_store",
    "to_arrow",
]
