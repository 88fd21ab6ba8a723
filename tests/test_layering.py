"""The packages import only downward (docs/architecture.md, "Packages and import directions"):
every import of the sources, relative ones resolved, against the allowed edges."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "producers", "detectors", "streams", "sinks")
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),
    "producers": {"schemas"},
    "detectors": {"schemas"},
    "streams": {"schemas", "detectors"},
    "sinks": {"schemas"},
    "argus": set(PACKAGES),
}


def _sources(top: str) -> list[Path]:
    files = sorted((REPO / "argus" / ("" if top == "argus" else top)).rglob("*.py"))
    if top == "argus":  # argus/schemas etc. are the other packages: not argus/'s own
        files = [f for f in files if f.relative_to(REPO).parts[1] not in PACKAGES]
    return files


def _imported(path: Path) -> set[str]:
    """The top packages of ours (``schemas``, ..., ``argus`` for the composition root) that
    ``path`` imports, by ``argus.X`` name or relative import, or by a bare top-level name."""
    module = list(path.relative_to(REPO).with_suffix("").parts)
    package = module[:-1]  # an __init__'s package is its folder: the same slice
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            names = [base + (node.module.split(".") if node.module else [])]
        else:
            continue
        for name in names:
            if name[0] in PACKAGES:
                out.add(f"{name[0]} (bare, outside the argus namespace)")
            elif name[0] == "argus":
                out.add(name[1] if len(name) > 1 and name[1] in PACKAGES else "argus")
    return out


def test_packages_import_only_downward() -> None:
    wrong: dict[str, list[str]] = defaultdict(list)
    for top in (*PACKAGES, "argus"):
        for path in _sources(top):
            for target in _imported(path) - ALLOWED[top] - {top}:
                wrong[f"{top} -> {target}"].append(str(path.relative_to(REPO)))
    assert not wrong, dict(wrong)


def test_the_check_sees_imports() -> None:
    """The resolution finds the edges that exist (a check that finds nothing passes anything)."""
    assert _imported(REPO / "argus" / "streams" / "app.py") >= {"schemas", "detectors"}
    assert "producers" in _imported(REPO / "argus" / "api.py")
    assert "argus" in _imported(REPO / "argus" / "cli" / "_app.py")  # from ..config import ...
