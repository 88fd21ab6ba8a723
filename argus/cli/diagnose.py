"""``argus diagnose --steps-csv``: anomalous windows and suspect ranks from a log CSV."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Column, Table

from argus.producers.csvlogs import LogRows, as_written, phase_of, read_series

from ..csvlogs import LogDiagnosis, diagnose_log
from ..detectors import DiagnoserConfig
from ..schemas import Anomaly
from ._app import app, console, err_console, exit_on_error, fail, n_anomalies
from ._errors import EXIT_FOUND


@app.command()
def diagnose(
    steps_csv: Path = typer.Option(..., "--steps-csv", help="CSV with one row per rank per sample"),
    rank_col: str = typer.Option("rank", "--rank-col", help="column holding the rank"),
    time_col: str | None = typer.Option(None, "--time-col", help="column holding a time (irregular samples)"),
    step_col: str | None = typer.Option(
        None, "--step-col", help="column holding the step (instead of --time-col)"
    ),
    time_format: str | None = typer.Option(
        None,
        "--time-format",
        help="how --time-col writes times, as for strptime ('%d/%m/%Y %H:%M:%S'); "
        "default: numbers or ISO 8601",
    ),
    value_col: str = typer.Option(..., "--value-col", help="column holding the value (e.g. step_ms)"),
    host_col: str | None = typer.Option(
        None, "--host-col", help="column naming each rank's host (default: a column called host, node, ...)"
    ),
    higher_is_better: bool = typer.Option(False, "--higher-is-better", help="the value is a throughput"),
    as_json: bool = typer.Option(
        False, "--json", help="print the anomalies and transients as JSON ({anomalies, transients})"
    ),
    change_points: bool = typer.Option(
        True,
        "--change-points/--no-change-points",
        help="also test each rank against its own past (jobs of up to 1,024 ranks: "
        "docs/architecture.md#change-points)",
    ),
    fail_on: str | None = typer.Option(
        None,
        "--fail-on",
        help="exit 4 when an anomaly of this severity or above is found (page, warn or info), "
        "after printing as usual: for scripts and CI",
    ),
) -> None:
    """Anomalous windows and suspect ranks from a CSV of per-rank values, by the same engine as
    the live workers (the CSV becomes one step batch per window)."""
    if (time_col is None) == (step_col is None):
        fail("give exactly one of --time-col or --step-col")
    if fail_on is not None and fail_on not in Anomaly.SEVERITIES:
        fail(f"--fail-on {fail_on}: give one of {', '.join(reversed(Anomaly.SEVERITIES))}")
    t_col = time_col or step_col or ""
    with exit_on_error(ValueError):  # diagnose_log's ValueError: the CSV's values
        rows = read_series(steps_csv, rank_col, t_col, value_col, host_col, time_format)
        if step_col is not None and rows.iso:
            fail(f"--step-col {step_col} holds times, not step numbers: pass it as --time-col {step_col}")
        split = rows.t[rows.t % 1 != 0] if step_col is not None else rows.t[:0]
        if len(split):
            fail(
                f"--step-col {step_col} holds numbers that are not whole steps (e.g. {float(split[0])}):"
                f" if they are times, pass it as --time-col {step_col}"
            )
        result = diagnose_log(
            rows.rank, rows.t, rows.value, by_time=time_col is not None, metric=value_col,
            higher_is_better=higher_is_better, job=steps_csv.stem or "log", hosts=rows.hosts,
            config=DiagnoserConfig(change_points=change_points),
        )  # fmt: skip
    clock = rows.iso or (time_col is not None and _epoch_seconds(rows.t))
    notes = (*rows.notes, *result.notes)
    if clock and not rows.iso and not as_json:
        notes += (
            f"{time_col} read as seconds since the epoch: shown as UTC times (--json keeps the numbers)",
        )
    for note in notes:
        err_console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    unit = "time" if time_col else "step"
    if as_json:
        out = {
            "anomalies": [_as_json(a, result, rows, value_col, unit) for a in result.anomalies],
            "transients": _transients_json(result, rows),
        }
        sys.stdout.write(json.dumps(out, allow_nan=False) + "\n")
    else:
        _print_table(result, rows, value_col, unit, clock)
        for line in _transient_lines(result, rows, unit, clock):
            console.print(line, highlight=False, soft_wrap=True, markup=False)
    rank = Anomaly.SEVERITIES.index
    if fail_on is not None and any(rank(a.severity) >= rank(fail_on) for a in result.anomalies):
        raise typer.Exit(EXIT_FOUND)


def _as_json(a: Anomaly, result: LogDiagnosis, rows: LogRows, value_col: str, unit: str) -> dict[str, Any]:
    """One anomaly of ``--json``: its window in the log's own steps or times (ISO 8601
    strings when the log wrote its times so); the log's rank labels beside the numbers
    (and the suspect's, ``suspect_label``) when it has labels."""
    iso = rows.iso
    labels = (
        {"labels": [rows.label(r) for r in a.ranks], "suspect_label": _named(a.suspect, rows)}
        if rows.labels
        else {}
    )
    return {
        "rank": a.ranks[0] if a.suspect_kind == "rank" and a.ranks else None,
        **labels,
        "suspect": a.suspect,
        "suspect_kind": a.suspect_kind,
        "ranks": list(a.ranks),
        "start": _label(result, a.start_step, iso),
        "end": _label(result, a.end_step, iso),
        "class": a.cause,
        "severity": a.severity,
        "score": _finite(round(a.score, 2)),
        "windows": int(a.evidence.get("steps_seen", 0)),
        "period_steps": int(k) if (k := a.evidence.get("period_steps")) else None,
        "added": _finite(result.added(a)),
        "slowdown": _finite(round(result.slowdown(a), 4)),
        "summary": _summary(a, result, rows, value_col, unit),
    }


def _summary(a: Anomaly, result: LogDiagnosis, rows: LogRows, value_col: str, unit: str) -> str:
    """The anomaly in the log's own words: its suspect as the log names it and what it
    adds to the value, in place of the engine's statistic (the engine's pattern and
    detail kept: "slow every 8 steps")."""
    since = " since the job's start" if a.evidence.get("persistent") else ""
    seen = int(a.evidence.get("steps_seen", 0))
    rest = a.summary.partition(" step(s)")[2]
    against = "its usual level" if a.suspect_kind == "job" else "its peers"
    if a.evidence.get("period_steps"):  # what a slow step adds, seen in its slow steps
        against += " on each slow step"
    f = result.slowdown(a)
    if result.higher_is_better:
        what = f"{value_col} {result.added(a):+.4g} (-{100 * f / (1 + f):.1f} %) against {against}"
    else:
        what = f"{value_col} +{100 * f:.1f} % against {against}"
    return f"{a.cause} at {_named(a.suspect, rows)}{since}: {what}, seen in {_counted(seen, unit)}{rest}"


def _counted(n: int, unit: str) -> str:
    """How many of the log's windows: its logged steps (``--step-col``), else its time windows."""
    word = "step" if unit == "step" else "window"
    return f"{n} {word}{'' if n == 1 else 's'}"


def _print_table(result: LogDiagnosis, rows: LogRows, value_col: str, unit: str, iso: bool) -> None:
    """The anomalies as a table (ranks by the log's own labels when it has them), the
    transients counted in its caption (listed below it: :func:`_transient_lines`); times
    as UTC clock times with ``iso``."""
    found, n_ranks = result.anomalies, len(np.unique(rows.rank))
    n_tr = sum(result.transients.values())
    caption = (
        f"{n_anomalies(len(found))} in {n_ranks} ranks; "
        f"{n_tr} transient blip(s) on {len(result.transients)} suspect(s), never an anomaly"
    )
    if not found:  # no empty frame: the caption says it all
        console.print(caption, highlight=False)
        return
    # ISO times all of one day: the day in the caption, the cells the time of day (two whole
    # ISO times truncated at 80 columns to "2026-11-23T…")
    at = {as_written(x, iso) for a in found for x in (result.start(a), result.end(a))}
    day = next(iter(at))[:11] if iso and len({t[:11] for t in at}) == 1 else ""
    when = "UTC" if iso else unit  # (ISO times over several days: whole, still UTC)
    caption = f"{day[:10]} (UTC): {caption}" if day else caption
    fit = max(len(t) for t in at) - (len(day) + 1 if day else 0)
    table = Table(
        *(Column(h, overflow="fold") for h in ("suspect", "ranks")),
        *(Column(f"{h} ({when})", min_width=fit, no_wrap=True) for h in ("start", "end")),
        *(Column(h, overflow="fold") for h in ("class", "severity", "score", "seen in")),
        Column("slowdown" if phase_of(value_col) is None else f"added to {value_col}", overflow="fold"),
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        show_edge=False,
    )
    cells = [
        (
            _named(a.suspect, rows),
            _listed(a.ranks, rows),
            *(
                as_written(x, iso).removeprefix(day).removesuffix("Z" if day else "")
                for x in (result.start(a), result.end(a))
            ),
            a.cause + (f", every {k:.0f} steps" if (k := a.evidence.get("period_steps")) else ""),
            a.severity,
            f"{_finite(a.score) or 0:.1f}",
            _counted(int(a.evidence.get("steps_seen", 0)), unit),
            f"+{100 * result.slowdown(a):.1f} %",
        )
        for a in found
    ]
    for row in cells:
        table.add_row(*row)
    # piped: the whole table, however wide, unless COLUMNS says how wide (a terminal keeps
    # its own width)
    wide = console.is_terminal or "COLUMNS" in os.environ
    out = console if wide else Console(width=max(console.width, 250))
    if Measurement.get(out, out.options.update_width(10_000), table).maximum <= out.width:
        out.print(table)
        out.print(caption, highlight=False, markup=False)  # (no table caption: padded to its width)
        return
    # narrower than the table: an anomaly in three lines (cells wrapped letter by letter at
    # 80 columns read "suspec/t", "unkno/wn")
    last = table.columns[-1].header
    for name, ranks, start, end, cause, severity, score, seen, figure in cells:
        out.print(
            f"{name}: {cause}, {severity}, score {score}", highlight=False, markup=False, soft_wrap=True
        )
        out.print(f"  ranks {ranks}", highlight=False, markup=False, soft_wrap=True)
        span = f"{start} – {end} UTC" if day else f"{unit} {start} – {end}"
        out.print(f"  {span}, seen in {seen}, {last} {figure}", highlight=False, markup=False)
    out.print(caption, highlight=False, markup=False)


_LISTED = 10
"""Transients' suspects listed under the table, the most frequent first."""


def _transients_by_count(result: LogDiagnosis) -> list[tuple[str, int]]:
    """The transients' suspects, the most frequent first, then by when (their last)."""
    at = result.transient_at
    return sorted(
        result.transients.items(),
        key=lambda kv: (-kv[1], at[kv[0]][-1] if at.get(kv[0]) else (-1, -1), kv[0]),
    )


def _transient_lines(result: LogDiagnosis, rows: LogRows, unit: str, iso: bool) -> list[str]:
    """The transients' suspects, the most frequent first, each with the windows of its last
    few blips in the log's own steps or times (one line each, so a narrow terminal does not
    break them)."""
    if not result.transients:
        return []
    top = _transients_by_count(result)
    names = [_named(k, rows) for k, _ in top[:_LISTED]]
    width = max(len(n) for n in names)
    out = [
        f"transients (not confirmed as an anomaly: too brief, too few sightings or too faint), the {unit}s of the last few:"
    ]
    for name, (k, n) in zip(names, top, strict=False):
        at = [_window(result, w, iso) for w in result.transient_at.get(k, [])]
        more = "…, " if n > len(at) else ""
        out.append(f"  {name:<{width}}  ×{n:<3} {more}{', '.join(at)}")
    if len(top) > _LISTED:
        out.append(f"  … and {len(top) - _LISTED} more suspect(s) (--json lists all)")
    return out


def _transients_json(result: LogDiagnosis, rows: LogRows) -> list[dict[str, Any]]:
    """The transients of ``--json``: per suspect, how many, and the windows (first, last)
    of the last eight at most, as :func:`_as_json` writes a window."""
    out = []
    for k, n in _transients_by_count(result):
        at = [[_label(result, w, rows.iso) for w in ab] for ab in result.transient_at.get(k, [])]
        label = {"suspect_label": _named(k, rows)} if rows.labels else {}
        kind = result.transient_kinds.get(k, k.partition(":")[0])
        out.append({"suspect": k, "suspect_kind": kind, **label, "count": n, "at": at})
    return out


def _label(result: LogDiagnosis, window: int, iso: bool) -> str | float | int:
    return as_written(result.label(window), iso) if iso else _number(result.label(window))


def _window(result: LogDiagnosis, w: tuple[int, int], iso: bool) -> str:
    """A transient's window, its end's time of day alone when it ends the day it began
    (``2026-11-23T01:50:00Z–01:50:20Z``)."""
    a, b = (as_written(result.label(x), iso) for x in w)
    if a == b:
        return a
    return f"{a}–{b[11:]}" if iso and a[:11] == b[:11] else f"{a}–{b}"


_EPOCH_S = (1e9, 4.2e9)
"""Times in this range read as seconds since the epoch (2001-09-09 to 2103)."""


def _epoch_seconds(t: np.ndarray) -> bool:
    """Whether a log's times are seconds since the epoch (every one of them in :data:`_EPOCH_S`)."""
    return bool(len(t)) and bool(((t >= _EPOCH_S[0]) & (t <= _EPOCH_S[1])).all())


def _named(suspect: str, rows: LogRows) -> str:
    """A rank suspect (``rank:7``) or several (``ranks:2,4-6``) as the log names them
    (``gpu-7``; ``node2,node4,node5,node6``, eight at most) when it has labels."""
    kind, _, named = suspect.partition(":")
    if not rows.labels or kind not in ("rank", "ranks"):
        return suspect
    ranks: list[int] = []
    for part in named.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) - int(lo) > 1024:
            return suspect
        ranks += range(int(lo), int(hi or lo) + 1)
    return _listed(ranks, rows)


def _listed(ranks: Sequence[int], rows: LogRows) -> str:
    """Ranks by the log's labels, eight at most (then how many in all)."""
    shown = ",".join(rows.label(r) for r in ranks[:8])
    return shown + (f",… ({len(ranks)})" if len(ranks) > 8 else "")


def _number(x: float) -> float | int:
    """A step as a whole number, a time as it is."""
    return int(x) if float(x).is_integer() else x


def _finite(x: float) -> float | None:
    """JSON has no infinity: a figure out of range is null."""
    return float(x) if math.isfinite(x) else None
