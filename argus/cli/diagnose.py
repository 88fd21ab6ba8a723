"""``argus diagnose --steps-csv``: anomalous windows and suspect ranks from a log CSV."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import typer
from rich.table import Table

from detectors import diagnose_series

from ._app import app, console, fail


def _read(path: Path, rank_col: str, t_col: str, value_col: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three columns of a CSV as numbers (other columns ignored, blank values skipped)."""
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in (rank_col, t_col, value_col) if c not in header]
            if missing:
                fail(
                    f"{path}: missing column(s) {', '.join(missing)}; the header has {', '.join(header) or 'nothing'}"
                )
            ranks, ts, vs = [], [], []
            for line, row in enumerate(reader, start=2):
                raw = (row.get(rank_col), row.get(t_col), row.get(value_col))
                if any(v is None or v.strip() == "" for v in raw):
                    continue
                try:
                    ranks.append(int(float(raw[0] or "")))
                    ts.append(float(raw[1] or ""))
                    vs.append(float(raw[2] or ""))
                except ValueError:
                    fail(f"{path}:{line}: not a number in {rank_col}/{t_col}/{value_col}: {raw!r}")
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")
    except (csv.Error, UnicodeDecodeError) as exc:
        fail(f"{path} is not a readable CSV: {exc}")
    if not vs:
        fail(f"{path}: no data rows")
    return np.array(ranks, np.int64), np.array(ts), np.array(vs)


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
    rank, t, value = _read(steps_csv, rank_col, t_col, value_col)
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
