"""Checks shared by the deployment tests: what a container runs must be what `argus` accepts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import pytest
import typer.main

from argus.cli import app
from argus.config import Settings

SETTINGS_ENV = {"ARGUS_" + f.name.upper() for f in dataclasses.fields(Settings)}


def _check_command(args: list[str]) -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    command = commands.get(args[0])
    assert command is not None, f"argus has no command {args[0]!r}"
    if hasattr(command, "commands"):  # a group (`argus grafana push`)
        sub = command.commands.get(args[1])
        assert sub is not None, f"argus {args[0]} has no command {args[1]!r}"
        sub.make_context(args[1], args[2:])
    else:
        command.make_context(args[0], args[1:])  # raises on an unknown option or a bad value


def _check_env(names: Iterable[str]) -> None:
    for name in names:
        if name.startswith("ARGUS_"):
            assert name.removesuffix("_FILE") in SETTINGS_ENV, f"{name} is not an Argus setting"


@pytest.fixture
def argus_accepts() -> Callable[[list[str]], None]:
    """Asserts that ``argus ARGS...`` parses (command and every option exist, values valid)."""
    return _check_command


@pytest.fixture
def argus_settings() -> Callable[[Iterable[str]], None]:
    """Asserts that every ``ARGUS_*`` name (or ``ARGUS_*_FILE``) is a setting Argus reads."""
    return _check_env
