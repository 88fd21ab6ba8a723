"""``argus diagnose --steps-csv``: anomalous windows and suspect ranks from a log CSV."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import typer
from rich.table import Table

from argus.detectors import diagnose_series

from ..csvlogs import CsvError, read_series
from ._app import app, console, fail


@app.command()
def diagnose(
    steps_csv: Path = typer.Option(..., "--steps-csv", help="CSV with one row per rank per sample"),
    rank_col: str = typer.Option("rank", "--rank-col", help="column holding the rank"),
    time_col: str | None = typer.Option(None, "--time-col", help="column holding a time (irregular samples)"),
    step_col: str | None = typer.Option(
        None, "--step-col", help="column holding the step (instead of --time-col)"
    ),
    value_col: str = typer.Option(..., "--value-col", help="column holding the value (e.g. step_ms)"),
    higher_is_better: bool = typer.Option(False, "--higher-is-better", help="the value is a throughput"),
    z: float = typer.Option(6.0, "--z", help="robust z-score a rank must reach in a window"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON list of anomalies"),
) -> None:
    """Anomalous windows and suspect ranks from a CSV of per-rank values (logs only)."""
    if (time_col is None) == (step_col is None):
        fail("give exactly one of --time-col or --step-col")
    t_col = time_col or step_col or ""
    try:
        rank, t, value = read_series(steps_csv, rank_col, t_col, value_col)
    except CsvError as exc:
        fail(str(exc))
    try:
        found = diagnose_series(
            rank,
            t,
            value,
            by_time=time_col is not None,
            metric=value_col,
            higher_is_better=higher_is_better,
            z=z,
        )
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        rows = [
            {
                "rank": a.rank,
                "start": a.start,
                "end": a.end,
                "class": a.cause,
                "score": a.score,
                "windows": a.windows,
            }
            for a in found
        ]
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    unit = "time" if time_col else "step"
    table = Table(
        "rank", f"start ({unit})", f"end ({unit})", "class", "score", "windows", value_col, "median",
        caption=f"{len(found)} anomal{'y' if len(found) == 1 else 'ies'} in {len(np.unique(rank))} ranks",
    )  # fmt: skip
    for a in found:
        table.add_row(
            "job" if a.rank is None else str(a.rank),
            f"{a.start:g}",
            f"{a.end:g}",
            a.cause,
            f"{a.score:.1f}",
            str(a.windows),
            f"{a.value:.4g}",
            f"{a.reference:.4g}",
        )
    console.print(table)
