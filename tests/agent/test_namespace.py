"""One import namespace: a training repository with its own ``schemas`` and ``detectors``
packages imports argus, attaches, and still gets its own packages; the callbacks are where
the README writes them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import schemas, detectors  # the repository's own packages
import torch

import argus

assert schemas.OWN == "training-repo schemas", schemas.__file__
assert detectors.OWN == "training-repo detectors", detectors.__file__
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sink = []


class Sink:
    def publish(self, topic, key, record):
        # step records come as wire bytes
        sink.append(argus.schemas.decode(record) if isinstance(record, bytes) else record)


agent = argus.attach(model, opt, sink=Sink(), job="throwaway", home=sys.argv[1])
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
argus.detach()
import schemas as again  # argus did not replace them
assert again.OWN == "training-repo schemas"
assert sys.modules["schemas"].__file__.startswith(sys.argv[2]), sys.modules["schemas"].__file__
ours = [m for m in sys.modules if m.split(".")[0] in ("producers", "streams", "sinks")]
assert not ours, ours
steps = [r for r in sink if type(r).__name__ == "StepBatch"]
assert len(steps) == 3, sink
print("ok", type(steps[0]).__module__)
"""


def test_a_repository_with_its_own_schemas_and_detectors_imports_argus_and_attaches(tmp_path):
    repo = tmp_path / "training-repo"
    for pkg in ("schemas", "detectors"):
        (repo / pkg).mkdir(parents=True)
        (repo / pkg / "__init__.py").write_text(f'OWN = "training-repo {pkg}"\n')
    (repo / "train.py").write_text(textwrap.dedent(SCRIPT))
    venv_python = REPO / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.exists() else sys.executable
    out = subprocess.run(
        [python, "train.py", str(tmp_path / "home"), str(repo)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},  # no PYTHONPATH: the installed argus
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok argus.schemas"), out.stdout


def test_the_callbacks_are_exported_from_argus_as_the_readme_writes_them():
    import argus

    pl = pytest.importorskip("lightning.pytorch")
    transformers = pytest.importorskip("transformers")
    cb = argus.ArgusLightningCallback(job="readme")
    assert isinstance(cb, pl.Callback)
    hf = argus.ArgusHFCallback()
    assert isinstance(hf, transformers.TrainerCallback)
    with pytest.raises(AttributeError):
        argus.NoSuchThing  # noqa: B018
