"""The ``argus`` command: each subcommand lives in its own module and registers on ``app``."""

from __future__ import annotations

import sys

from . import (  # noqa: F401 - registration by import
    db,
    demo,
    diagnose,
    doctor,
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

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the ``argus`` console script."""
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
