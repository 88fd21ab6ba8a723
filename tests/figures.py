"""Scenario tests print one machine-readable line of figures; bench/reliability.py runs
them at full size and tabulates those lines."""

from __future__ import annotations

import json
from typing import Any

PREFIX = "ARGUS-FIGURES "


def report(scenario: str, **figures: Any) -> None:
    """Print the scenario's figures (sent, received, lost, duplicated, ...) on one line."""
    print(PREFIX + json.dumps({"scenario": scenario, **figures}), flush=True)
