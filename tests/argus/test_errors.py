"""One error root per package; ``argus.attach`` raises only what its docstring promises."""

from __future__ import annotations

import ast
import importlib
import pickle
from pathlib import Path

import pytest

import argus

REPO = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("schemas", "producers", "detectors", "streams", "sinks")
ROOTS = {
    "argus": "argus._errors:ArgusError",
    "schemas": "argus.schemas._errors:SchemaError",
    "producers": "argus.producers._errors:ProducerError",
    "sinks": "argus.sinks._errors:SinkError",
}
"""The root of each package that defines errors; detectors/ and streams/ define none (they
raise ValueError for misuse; the workers dead-letter bad input)."""


def _error_classes(package: str) -> list[tuple[str, str]]:
    """(module, class) of every class in ``package``'s sources that subclasses something
    named ``*Error``, ``*Exception`` or ``*Unavailable`` (an exception by its base's name)."""
    folder = REPO / "argus" if package == "argus" else REPO / "argus" / package
    found = []
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        if package == "argus" and rel.parts[1] in SUBPACKAGES:
            continue  # the other packages' own
        parts = [p for p in rel.parts if p != "__init__"]
        module = ".".join(parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(_exceptional(b) for b in node.bases):
                found.append((module, node.name))
    return found


def _exceptional(base: ast.expr) -> bool:
    name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
    return name.endswith(("Error", "Exception", "Unavailable"))


def _load(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


@pytest.mark.parametrize("package", sorted(ROOTS))
def test_one_error_root_per_package(package: str) -> None:
    root = _load(ROOTS[package])
    classes = _error_classes(package)
    assert len(classes) >= 2, classes  # the root and at least one error
    for module, name in classes:
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, root), f"{module}.{name} is not a {root.__name__}"


def test_the_packages_without_a_root_define_no_errors() -> None:
    assert _error_classes("detectors") == []
    assert _error_classes("streams") == []


def test_old_error_names_still_import_from_where_they_were() -> None:
    from argus.producers._errors import ProducerError
    from argus.producers.kineto import TraceError
    from argus.producers.publisher import KafkaSettingsError, PublishError
    from argus.producers.relay import RelayError

    assert all(
        issubclass(c, ProducerError) for c in (PublishError, KafkaSettingsError, RelayError, TraceError)
    )
    assert issubclass(KafkaSettingsError, PublishError)
    assert issubclass(argus.ConfigError, argus.ArgusError) and issubclass(argus.ConfigError, ValueError)


def test_a_trace_error_survives_the_import_workers_pickling() -> None:
    from argus.producers.kineto import TraceError

    back = pickle.loads(pickle.dumps(TraceError("rank3.json", "no ProfilerStep#N markers")))
    assert isinstance(back, TraceError) and (back.path, back.problem) == (
        "rank3.json",
        "no ProfilerStep#N markers",
    )
    assert str(back) == "rank3.json: no ProfilerStep#N markers"


def test_attach_with_invalid_kafka_settings_raises_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid Kafka settings") as caught:
        argus.attach(
            home=str(tmp_path),
            quiet=True,
            kafka_security_protocol="SSL",
            kafka_ssl_ca=str(tmp_path / "no-ca.pem"),
        )
    assert isinstance(caught.value, argus.ConfigError)
    assert argus.api.attached() is None


def test_attach_with_an_unwritable_home_raises_a_value_error(tmp_path: Path) -> None:
    home = tmp_path / "file"
    home.write_text("not a folder")
    with pytest.raises(argus.ConfigError, match="cannot create the spool"):
        argus.attach(home=str(home), quiet=True)
    assert argus.api.attached() is None
