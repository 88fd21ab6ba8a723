"""The exit codes of the ``argus`` command and the one table that maps errors to them.

code  name              meaning
----  ----------------  -------------------------------------------------------------------
0     EXIT_OK           done
1     EXIT_MISSED       ``argus demo`` ran but its diagnosis missed or misnamed a fault (and
                        any exception the table does not know: a bug, with its traceback)
2     EXIT_BAD_INPUT    bad input: an argument, a setting, a file, a query, a job the store
                        does not have; an extra the command needs is not installed
3     EXIT_UNAVAILABLE  a service could not be reached or refused: Kafka, ClickHouse,
                        Grafana; a part ``doctor`` or ``node-agent`` needs is absent
4     EXIT_FOUND        ``argus diagnose --fail-on SEVERITY`` found an anomaly of that
                        severity or above (its output is printed all the same)
130   EXIT_INTERRUPTED  interrupted (Ctrl-C)

:data:`ERROR_EXITS` says which error is which, most specific first (the first row whose
class the error is an instance of wins). A command runs its work inside
:func:`~argus.cli._app.exit_on_error`, which prints the row's one-line message and exits
with its code; an error in no row propagates (a bug shows its traceback).

Rows name their class by module path instead of importing it: the sinks' and producers'
errors live in extras the command may not have, and importing them (chDB, pyarrow,
confluent-kafka) would slow every command. An error's class is in ``sys.modules`` once
it can have been raised, so a module not imported yet cannot match.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ERROR_EXITS",
    "EXIT_BAD_INPUT",
    "EXIT_FOUND",
    "EXIT_INTERRUPTED",
    "EXIT_MISSED",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "ErrorExit",
    "exit_for",
]

EXIT_OK = 0
EXIT_MISSED = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3
EXIT_FOUND = 4
EXIT_INTERRUPTED = 130


def _first_line(exc: BaseException) -> str:
    """ClickHouse's message without its stack trace (its first line, at most 500 characters)."""
    lines = str(exc).splitlines()
    return lines[0][:500] if lines else ""


@dataclass(frozen=True)
class ErrorExit:
    """One row: errors of class ``error`` (``"module:Class"``) exit with ``code``, after
    the one-line message ``say(exc)``."""

    error: str
    code: int
    say: Callable[[BaseException], str] = str

    def error_class(self) -> type[BaseException] | None:
        """The row's class if its module is imported (else no error of it can exist)."""
        module, _, name = self.error.partition(":")
        cls = getattr(sys.modules.get(module), name, None)
        return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None


ERROR_EXITS: tuple[ErrorExit, ...] = (
    # argus/ (root ArgusError)
    ErrorExit("argus.config:ConfigError", EXIT_BAD_INPUT),
    ErrorExit("argus.kafka_admin:KafkaUnavailable", EXIT_UNAVAILABLE),
    ErrorExit("argus.demo._config:DemoError", EXIT_UNAVAILABLE),
    # producers/ (root ProducerError): bad settings or files are input; a lost record is Kafka's
    ErrorExit("argus.producers.kineto._errors:TraceError", EXIT_BAD_INPUT),
    ErrorExit("argus.producers.csvlogs:CsvError", EXIT_BAD_INPUT),
    ErrorExit("argus.producers._errors:RelayError", EXIT_BAD_INPUT),
    ErrorExit("argus.producers._errors:KafkaSettingsError", EXIT_BAD_INPUT),
    ErrorExit("argus.producers._errors:PublishError", EXIT_UNAVAILABLE),
    # sinks/ (root SinkError): a rejected query or an unknown macro is input; the rest, the service
    ErrorExit("argus.sinks._errors:QueryError", EXIT_BAD_INPUT, lambda e: f"ClickHouse rejected the query: {_first_line(e)}"),
    ErrorExit("argus.sinks._errors:MacroError", EXIT_BAD_INPUT),
    ErrorExit("argus.sinks.report._data:UnknownJobError", EXIT_BAD_INPUT),
    ErrorExit("argus.sinks._errors:StoreLockedError", EXIT_UNAVAILABLE),
    ErrorExit("argus.sinks._errors:GrafanaPushError", EXIT_UNAVAILABLE),
    ErrorExit("argus.sinks._errors:SinkError", EXIT_UNAVAILABLE, lambda e: f"ClickHouse: {e}"),
)  # fmt: skip
"""Which error exits how, most specific first. schemas/ errors never reach a command (the
workers dead-letter them); detectors/ and streams/ raise only ``ValueError`` for misuse."""


def exit_for(
    exc: BaseException, *, bad_input: tuple[type[BaseException], ...] = ()
) -> tuple[int, str] | None:
    """``(code, message)`` for ``exc`` by :data:`ERROR_EXITS`, or None when no row takes it.

    ``bad_input``: classes that, in this command, can only come from the user's input
    (``ValueError`` from a CSV's values); checked after the table, exit 2 with ``str(exc)``.
    """
    for row in ERROR_EXITS:
        cls = row.error_class()
        if cls is not None and isinstance(exc, cls):
            return row.code, row.say(exc)
    if isinstance(exc, bad_input):
        return EXIT_BAD_INPUT, str(exc)
    return None
