"""Load a bench script (bench/NAME.py, not a package) as a module, for tests of its parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/``name``.py as the module ``argus_bench_<name>`` (registered: its dataclasses
    look their module up)."""
    spec = importlib.util.spec_from_file_location(f"argus_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
