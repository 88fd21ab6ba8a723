"""The ``argus`` command: each subcommand lives in its own module and registers on ``app``.

The command's libraries (typer, rich, msgspec) are the ``cli`` extra; a training image
with only ``argus-gpu[agent]`` has none of them, and ``argus`` then says so in one line
and exits 2 instead of showing a traceback.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys

from ._errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED

EXTRA_OF = {
    **dict.fromkeys(("typer", "click", "rich", "msgspec", "shellingham", "pygments", "markdown_it"), "cli"),
    **dict.fromkeys(("faust", "mode", "aiokafka", "cramjam", "scipy", "prometheus_client"), "streams"),
    **dict.fromkeys(
        ("chdb", "clickhouse_connect", "grafana_client", "grafana_foundation_sdk", "pyarrow", "yaml"), "sinks"
    ),
}
"""Top-level modules of the extras (and of their dependencies) the command may need, and
their extra: ``cli`` for the command itself, the others for some subcommands."""
CLI_EXTRA_MODULES = frozenset(m for m, extra in EXTRA_OF.items() if extra == "cli")
MISSING_EXTRA = "the argus command needs the cli extra: pip install 'argus-gpu[cli]'"

_missing: ModuleNotFoundError | None = None
try:
    from . import (  # noqa: F401 - registration by import
        db,
        demo,
        diagnose,
        doctor,
        fleet,
        grafana,
        import_trace,
        node_agent,
        report,
        simulate,
        sink,
        sql,
        worker,
    )
    from ._app import app, err_console
except ModuleNotFoundError as exc:  # an [agent]-only install: main() explains, anything else raises
    if (exc.name or "").partition(".")[0] not in CLI_EXTRA_MODULES:
        raise
    _missing = exc

__all__ = ["CLI_EXTRA_MODULES", "MISSING_EXTRA", "app", "main"]


def main() -> None:
    """Entry point of the ``argus`` console script."""
    if _missing is not None:
        print(MISSING_EXTRA, file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    # A crash in native code (librdkafka, chDB, torch) prints every thread's Python stack to
    # stderr (the pod's log) instead of dying silently with SIGSEGV.
    faulthandler.enable()
    code: int | str | None = 0
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        code = EXIT_INTERRUPTED
    except ModuleNotFoundError as exc:  # a subcommand of an extra that is not installed
        extra = EXTRA_OF.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        err_console.print(
            f"this command needs the {extra} extra: pip install 'argus-gpu[{extra}]' (no {exc.name})",
            markup=False,
        )
        code = EXIT_BAD_INPUT
    except SystemExit as exc:
        code = exc.code
    if "chdb" in sys.modules:
        _leave(code)
    sys.exit(code)


def _leave(code: int | str | None) -> None:
    """Exit without the interpreter's teardown. The command is done and closed its store;
    chDB's own teardown at exit races its background threads and crashed ``argus sink`` with
    SIGSEGV on about half of its SIGTERM stops (a failed stop for the kubelet)."""
    if isinstance(code, str):  # as sys.exit would: the message to stderr, status 1
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code or 0)
