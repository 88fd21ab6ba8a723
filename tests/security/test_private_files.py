"""ARGUS_HOME, the spool and the embedded store are private to their user (issue 17 item
15): directories 0700, files 0600 (before: 0755/0644, readable by every local user)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_OPEN_STORE = r"""
import os, stat, sys
from pathlib import Path
from argus.config import load_settings
from argus.wiring import open_configured_store
from argus.sinks import migrate
from argus.producers.spool import Spool

home = Path(sys.argv[1]) / "home"
s = load_settings(env={"ARGUS_HOME": str(home)})
Spool(s.spool_dir / "agent").append([("argus.steps", b"k", b"v")])
store = open_configured_store(s)
migrate(store)
store.execute("INSERT INTO steps (job, run, step, rank, time, start_ns, end_ns, step_ms) "
              "VALUES ('j', 0, 1, 0, now64(3), 0, 1, 1)")
store.close()
loose = []
for root, dirs, files in os.walk(home):
    for name in dirs + files:
        p = os.path.join(root, name)
        if not os.path.islink(p) and stat.S_IMODE(os.stat(p).st_mode) & 0o077:
            loose.append(f"{p} {oct(stat.S_IMODE(os.stat(p).st_mode))}")
print(oct(stat.S_IMODE(home.stat().st_mode)), len(loose), loose[:5])
"""


def test_home_spool_and_embedded_store_are_0700_and_0600(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_OPEN_STORE), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "0o700 0 []"


def test_an_existing_loose_home_is_tightened(tmp_path: Path) -> None:
    from argus.wiring import private_dir

    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    private_dir(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_the_stream_workers_data_directory_is_0700(tmp_path: Path) -> None:
    """Issue 34, item 11: ``$ARGUS_HOME/streams`` (Faust's data: job names, stacks) was 0755."""
    from argus.config import Settings
    from argus.wiring import stream_config

    home = tmp_path / "home"
    config = stream_config(Settings(home=home))
    streams = home / "streams"
    assert Path(config.datadir) == streams
    assert stat.S_IMODE(streams.stat().st_mode) == 0o700
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
