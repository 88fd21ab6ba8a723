"""Every public package says what it exports, and exports what it says."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("package", ["argus.schemas", "argus.sinks", "argus.detectors", "argus"])
def test_all_names_exist(package: str) -> None:
    mod = importlib.import_module(package)
    for name in mod.__all__:
        assert hasattr(mod, name), f"{package}.{name} is in __all__ but missing"
    public = {n for n in vars(mod) if not n.startswith("_") and not isinstance(getattr(mod, n), type(mod))}
    public -= {"annotations"}
    assert public <= set(mod.__all__) | {"version", "PackageNotFoundError"}, public - set(mod.__all__)
