"""An ``[agent]``-only install has no typer, rich or msgspec: the ``argus`` command says
which extra it needs in one line and exits 2. The missing modules are simulated in a
subprocess by a meta-path finder (installed through ``sitecustomize``) that refuses them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BLOCKER = '''
import sys

class _Refuse:
    """Pretend the cli extra is not installed."""

    BLOCKED = {"typer", "rich", "msgspec", "click"}

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Refuse())
'''

MESSAGE = "the argus command needs the cli extra: pip install 'argus-gpu[cli]'"


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_the_blocker_really_hides_typer(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", "import typer"], env=_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1 and "No module named 'typer'" in out.stderr


def test_argus_without_the_cli_extra_says_so_in_one_line_and_exits_2(tmp_path):
    code = "from argus.cli import main; main()"
    out = subprocess.run(
        [sys.executable, "-c", code, "--help"], env=_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out
    assert out.stderr.strip() == MESSAGE
    assert out.stdout == ""
    # the agent itself still imports and attaches without the cli extra
    attach = "import argus; a = argus.attach(sink=type('S', (), {'publish': lambda *a: None})(), cupti=False); argus.detach(); print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", attach], env=_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out


def test_the_console_script_without_the_cli_extra(tmp_path):
    script = shutil.which("argus", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the argus console script is not installed in this environment")
    out = subprocess.run([script, "report"], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr.strip()) == (2, MESSAGE), out


def test_with_the_cli_extra_the_command_and_its_imports_work():
    from argus.cli import app, main

    assert callable(main) and app is not None
    out = subprocess.run(
        [sys.executable, "-c", "from argus.cli import main; main()", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "Usage" in out.stdout


@pytest.mark.parametrize(
    "argv",
    [["grafana", "export", "--out", "{tmp}/dash"], ["sql", "SELECT 1"]],
    ids=["grafana-export", "sql"],
)
def test_a_command_of_a_missing_extra_names_it_in_one_line(tmp_path, argv):
    """With the cli extra but not the sinks extra (no pyarrow), a command that needs the
    store says which extra to install, in one line, exit 2; no traceback."""
    code = (
        "import sys; sys.modules['pyarrow'] = None; "  # import of pyarrow fails as if absent
        f"sys.argv = ['argus', *{[a.format(tmp=tmp_path) for a in argv]!r}]; "
        "from argus.cli import main; main()"
    )
    env = {**os.environ, "ARGUS_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out
    assert (
        out.stderr.strip()
        == "this command needs the sinks extra: pip install 'argus-gpu[sinks]' (no pyarrow)"
    )
    assert "Traceback" not in out.stderr
