"""Issue 34, item 8: a name from the stream (a job, a host) cannot forge a log line of the
worker or drive the reader's terminal; a traceback keeps its lines."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import logging, sys
from argus.cli._app import one_line_records
one_line_records()
one_line_records()  # idempotent
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(message)s")
log = logging.getLogger("argus.streams.progress")
log.info("job %s diagnosed through step %d", "evil\nERROR forged line\x1b[2J", 7)
try:
    raise RuntimeError("boom")
except RuntimeError:
    log.exception("job %s failed", "ok")
"""


def test_a_name_with_a_newline_or_an_escape_stays_on_its_log_line() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    lines = out.stdout.splitlines()
    assert lines[0] == r"INFO job evil\x0aERROR forged line\x1b[2J diagnosed through step 7"
    assert "\x1b" not in out.stdout
    assert lines[1] == "ERROR job ok failed" and lines[2].startswith("Traceback")  # kept as lines
    assert not any(line.startswith("ERROR forged") for line in lines)
