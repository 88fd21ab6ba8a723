"""The exit-code table of the `argus` command: every error of every package has a row, no
row hides another, and real commands exit by it."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from argus.cli._app import exit_on_error
from argus.cli._errors import (
    ERROR_EXITS,
    EXIT_BAD_INPUT,
    EXIT_UNAVAILABLE,
    ErrorExit,
    exit_for,
)
from tests.helpers.net import free_port

ARGUS = [sys.executable, "-m", "argus.cli"]


def _cls(row: ErrorExit) -> type[BaseException]:
    module, _, name = row.error.partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type) and issubclass(cls, Exception), row.error
    return cls


def _instance(cls: type[BaseException], message: str = "it broke") -> BaseException:
    exc = cls.__new__(cls)  # TraceError, UnknownJobError take other arguments than a message
    exc.args = (message,)
    return exc


def test_every_row_names_an_exception_class_where_it_is_defined() -> None:
    for row in ERROR_EXITS:
        cls = _cls(row)
        assert row.error == f"{cls.__module__}:{cls.__qualname__}", "name the class where it is defined"
        assert row.error_class() is cls


def test_no_row_is_hidden_by_an_earlier_one() -> None:
    classes = [_cls(row) for row in ERROR_EXITS]
    for i, later in enumerate(classes):
        for earlier in classes[:i]:
            assert not issubclass(later, earlier), f"{later.__name__} is caught by {earlier.__name__} first"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ("argus.config:ConfigError", EXIT_BAD_INPUT),
        ("argus.kafka_admin:KafkaUnavailable", EXIT_UNAVAILABLE),
        ("argus.demo._config:DemoError", EXIT_UNAVAILABLE),
        ("argus.producers.kineto._errors:TraceError", EXIT_BAD_INPUT),
        ("argus.producers.csvlogs:CsvError", EXIT_BAD_INPUT),
        ("argus.producers._errors:RelayError", EXIT_BAD_INPUT),
        ("argus.producers._errors:KafkaSettingsError", EXIT_BAD_INPUT),
        ("argus.producers._errors:PublishError", EXIT_UNAVAILABLE),
        ("argus.sinks._errors:QueryError", EXIT_BAD_INPUT),
        ("argus.sinks._errors:MacroError", EXIT_BAD_INPUT),
        ("argus.sinks.report._data:UnknownJobError", EXIT_BAD_INPUT),
        ("argus.sinks._errors:StoreLockedError", EXIT_UNAVAILABLE),
        ("argus.sinks._errors:StoreUnavailableError", EXIT_UNAVAILABLE),
        ("argus.sinks._errors:GrafanaPushError", EXIT_UNAVAILABLE),
        ("argus.sinks._errors:SinkError", EXIT_UNAVAILABLE),
    ],
)
def test_each_error_exits_with_the_code_the_commands_always_gave(error: str, code: int) -> None:
    cls = _cls(ErrorExit(error, 0))
    found = exit_for(_instance(cls))
    assert found is not None and found[0] == code


def test_every_error_class_of_every_package_has_a_row() -> None:
    """A new error class under a package root gets its exit code by its root's row at least."""
    roots = [
        "argus._errors:ArgusError",
        "argus.producers._errors:ProducerError",
        "argus.sinks._errors:SinkError",
    ]
    for module in (
        "argus.config",
        "argus.producers.csvlogs",
        "argus.demo",
        "argus.kafka_admin",
        "argus.sinks.report",
        "argus.producers.publisher",
        "argus.producers.relay",
        "argus.producers.kineto",
        "argus.sinks",
        "argus.sinks.kafka_sink",
    ):
        importlib.import_module(module)
    for root in roots:
        base = _cls(ErrorExit(root, 0))
        todo, seen = [base], []
        while todo:
            cls = todo.pop()
            seen.append(cls)
            todo.extend(cls.__subclasses__())
        named = [c for c in seen if c is not base and not c.__name__.startswith("_")]
        assert named, root
        for cls in named:
            assert exit_for(_instance(cls)) is not None, f"{cls.__module__}.{cls.__name__} has no exit code"


def test_query_error_says_only_the_first_line() -> None:
    from argus.sinks import QueryError

    code, message = exit_for(QueryError("Code: 62. Syntax error at 'SELEC'\n  stack trace line\n")) or (0, "")
    assert (
        code == EXIT_BAD_INPUT
        and message == "ClickHouse rejected the query: Code: 62. Syntax error at 'SELEC'"
    )


def test_an_error_of_no_row_is_a_bug_and_keeps_its_traceback() -> None:
    assert exit_for(RuntimeError("bug")) is None
    assert exit_for(ValueError("bug")) is None  # only where a command declares it input
    assert exit_for(ValueError("3 columns"), bad_input=(ValueError,)) == (EXIT_BAD_INPUT, "3 columns")


def _app_raising(exc: Exception, *bad_input: type[Exception]) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def go() -> None:
        with exit_on_error(*bad_input):
            raise exc

    return app


def test_exit_on_error_prints_one_line_and_exits_with_the_code() -> None:
    from argus.kafka_admin import KafkaUnavailable

    out = CliRunner().invoke(_app_raising(KafkaUnavailable("no broker at 127.0.0.1:1")), [])
    assert out.exit_code == EXIT_UNAVAILABLE
    assert "error: no broker at 127.0.0.1:1" in out.output and "Traceback" not in out.output


def test_exit_on_error_lets_a_bug_through() -> None:
    out = CliRunner().invoke(_app_raising(KeyError("x")), [])
    assert isinstance(out.exception, KeyError)
    out = CliRunner().invoke(_app_raising(ValueError("bad value"), ValueError), [])
    assert out.exit_code == EXIT_BAD_INPUT and "error: bad value" in out.output


def _argus(args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "ARGUS_HOME": str(home), "COLUMNS": "200", **env}
    return subprocess.run([*ARGUS, *args], capture_output=True, text=True, env=full, timeout=120)


def test_commands_exit_by_the_table(tmp_path: Path) -> None:
    """One real command per kind of error: a bad CSV, a bad trace, invalid Kafka settings, an
    unreachable broker, a bad setting."""
    csv = tmp_path / "log.csv"
    csv.write_text("rank,step\n0,1\n")
    out = _argus(
        ["diagnose", "--steps-csv", str(csv), "--step-col", "step", "--value-col", "step_ms"], tmp_path
    )
    assert out.returncode == EXIT_BAD_INPUT and "step_ms" in out.stderr, out.stderr  # CsvError

    trace = tmp_path / "rank0.json"
    trace.write_text("{ not json")
    out = _argus(["import-trace", "--local", "--rank", "0", str(trace)], tmp_path)
    assert out.returncode == EXIT_BAD_INPUT and str(trace) in out.stderr, out.stderr  # TraceError

    bad_ssl = {"ARGUS_KAFKA_SECURITY_PROTOCOL": "SSL", "ARGUS_KAFKA_SSL_CA": str(tmp_path / "no-ca.pem")}
    out = _argus(["import-trace", "--rank", "0", str(trace)], tmp_path, **bad_ssl)
    assert out.returncode == EXIT_BAD_INPUT and "invalid Kafka settings" in out.stderr, out.stderr

    nobody = {"ARGUS_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}"}
    out = _argus(["simulate", "--ranks", "8", "--steps", "1"], tmp_path, **nobody)
    assert out.returncode == EXIT_UNAVAILABLE and "Traceback" not in out.stderr, (
        out.stderr
    )  # KafkaUnavailable

    out = _argus(["simulate", "--ranks", "8", "--fault", "no_such_class@3"], tmp_path)
    assert out.returncode == EXIT_BAD_INPUT and "no_such_class" in out.stderr, out.stderr  # ConfigError
