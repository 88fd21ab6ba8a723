"""The sinks package's error tree (one root: ``except SinkError`` catches every one).

SinkError                  the store, the sink or Grafana could not do what was asked
├── StoreLockedError       the embedded data directory is open in another process
├── StoreUnavailableError  the store cannot be reached now (retryable)
├── QueryError             the store rejected a statement (bad SQL, unknown table)
├── MacroError             a Grafana macro or variable the expander does not know (also a ValueError)
├── GrafanaPushError       Grafana refused or could not be reached during ``push``
├── EvaluationError        an alert rule's query or expressions failed (``grafana.evaluation``)
└── UnknownJobError        ``argus report``: the store has no steps of the job (also a LookupError;
                           defined beside the report, ``sinks.report``)
"""

from __future__ import annotations

__all__ = [
    "GrafanaPushError",
    "MacroError",
    "QueryError",
    "SinkError",
    "StoreLockedError",
    "StoreUnavailableError",
]


class SinkError(Exception):
    """Base class for store, sink and Grafana failures."""


class StoreLockedError(SinkError):
    """The chDB data directory is held by another process (one writer per directory)."""


class StoreUnavailableError(SinkError):
    """The store cannot be reached now; retrying later may succeed."""


class QueryError(SinkError):
    """The store rejected a statement."""


class MacroError(SinkError, ValueError):
    """A macro or variable the expander does not know, or bad arguments (a ValueError too:
    the caller passed a query the expander cannot take)."""


class GrafanaPushError(SinkError):
    """Grafana refused or could not be reached; the message says which step failed."""
