"""The sinks package's error tree.

SinkError                  the store could not do what was asked
├── StoreLockedError       the embedded data directory is open in another process
├── StoreUnavailableError  the store cannot be reached now (retryable)
└── QueryError             the store rejected a statement (bad SQL, unknown table)
"""

from __future__ import annotations

__all__ = ["QueryError", "SinkError", "StoreLockedError", "StoreUnavailableError"]


class SinkError(Exception):
    """Base class for store and sink failures."""


class StoreLockedError(SinkError):
    """The chDB data directory is held by another process (one writer per directory)."""


class StoreUnavailableError(SinkError):
    """The store cannot be reached now; retrying later may succeed."""


class QueryError(SinkError):
    """The store rejected a statement."""
