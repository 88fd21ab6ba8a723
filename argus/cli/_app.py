"""The ``argus`` Typer app and the mapping of errors to messages and exit codes."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from ..config import Settings, load_settings, redact_url
from ._errors import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, exit_for

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_UNAVAILABLE",
    "app",
    "console",
    "err_console",
    "exit_on_error",
    "fail",
    "n_anomalies",
    "settings",
]

app = typer.Typer(
    name="argus",
    help="Always-on tracing and performance diagnosis for large GPU training jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Written to a file or a pipe (``make demo | tee``), rich would wrap tables at 80 columns:
# there, without COLUMNS, lines may be as long as their content needs, up to 160.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)
err_console = Console(stderr=True, soft_wrap=True)  # an error stays one line in a log


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        console.print(f"argus {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log everything to stderr."),
) -> None:
    setup_logging(verbose)


def n_anomalies(n: int) -> str:
    """``"1 anomaly"``, ``"3 anomalies"``."""
    return f"{n} anomal{'y' if n == 1 else 'ies'}"


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print a one-line error (no stack trace) and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {escape(redact_url(message))}", highlight=False)
    raise typer.Exit(code)


@contextmanager
def exit_on_error(*bad_input: type[Exception]) -> Iterator[None]:
    """Run a command's work: an error of the exit-code table (:mod:`argus.cli._errors`)
    becomes its one-line message and exit code; others propagate (a bug keeps its
    traceback). ``bad_input``: classes that here come only from the user's input."""
    try:
        yield
    except Exception as exc:
        found = exit_for(exc, bad_input=bad_input)
        if found is None:
            raise
        fail(found[1], found[0])


def settings(**overrides: Any) -> Settings:
    """Settings for a command; a bad value (in arguments, environment or file) is a clean error."""
    with exit_on_error():
        return load_settings(strict_env=True, **overrides)


def setup_logging(verbose: bool) -> None:
    """Log to stderr: warnings by default, everything with --verbose."""
    one_line_records()
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(_redact_record)


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def one_line(text: str) -> str:
    """``text`` with its control characters (newlines, ESC, NUL, ...) as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line_records() -> None:
    """Every log record of this process is one line: a job or host name that holds a newline
    or an escape sequence cannot forge a log line or drive the reader's terminal (set once;
    a traceback, added by the formatter after the message, keeps its lines)."""
    make = logging.getLogRecordFactory()
    if getattr(make, "argus_one_line", False):
        return

    def record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        r = make(*args, **kwargs)
        message = r.getMessage()
        clean = one_line(message)
        if clean != message:
            r.msg, r.args = clean, None
        return r

    record.argus_one_line = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(record)


def _redact_record(record: logging.LogRecord) -> bool:
    """Log lines never show a URL's password (ARGUS_CLICKHOUSE_URL, Grafana, ...)."""
    message = record.getMessage()
    clean = redact_url(message)
    if clean != message:
        record.msg, record.args = clean, None
    return True
