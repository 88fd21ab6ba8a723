"""``argus fleet``: the nodes that keep slowing jobs down, and what slowness costs the fleet.

- On a terminal: the suspect nodes ranked, each with its evidence, then the fleet's GPU-hours
  lost by day and cause.
- Piped or redirected: TSV with a header, one suspect per line (``--lost``: one day and
  cause per line instead); ``-f json``: everything as one JSON object.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import typer

from ._app import app, console, exit_on_error
from ._store import command_store
from .sql import tsv_escape

if TYPE_CHECKING:
    from argus.fleet import FleetView

__all__ = ["FleetFormat", "view_json"]

_COLUMNS = (
    "host", "confidence", "rate_x_fleet_min", "jobs", "jobs_expected", "decided_by", "slower_than_peers",
    "anomalies", "gpu_hours_hosted",
    "gpu_hours_lost", "causes", "gpus", "xid_samples", "ecc_errors", "throttled_samples", "link_errors",
    "xids", "jobs_list", "anomaly_ids",
)  # fmt: skip


class FleetFormat(StrEnum):
    """How ``argus fleet`` writes its result."""

    auto = "auto"
    table = "table"
    tsv = "tsv"
    json = "json"


def view_json(view: FleetView) -> dict[str, Any]:
    """The whole view as plain JSON-able data."""
    return {
        "since": view.since.isoformat(),
        "until": view.until.isoformat(),
        "cause": view.cause,
        "fleet_rate_per_gpu_hour": view.rate,
        "nodes": view.nodes,
        "gpu_hours_hosted": view.gpu_hours,
        "suspects": [n.row() for n in view.suspects],
        "lost_by_day": [
            {"day": x.day, "cause": x.cause, "anomalies": x.anomalies, "gpu_hours_lost": x.gpu_hours_lost}
            for x in view.lost
        ],
    }


def _short(counts: dict[str, int], limit: int = 3) -> str:
    return ", ".join(f"{k} {v}" for k, v in list(counts.items())[:limit])


def _print_table(view: FleetView) -> None:
    from rich.table import Table

    from argus.fleet import slow_summary

    window = f"{view.since:%Y-%m-%d %H:%M} to {view.until:%Y-%m-%d %H:%M} UTC"
    console.print(
        f"{window}: {view.nodes} nodes, {view.gpu_hours:,.1f} GPU-hours hosted, fleet rate "
        f"{view.rate * 1000:.3g} implicating jobs per 1,000 GPU-hours"
        + (f", cause {view.cause}" if view.cause else ""),
        highlight=False,
        markup=False,
    )
    if not view.suspects:
        console.print(
            "no suspect node: no node was implicated by jobs well above the fleet's rate, "
            "and no GPU was slower than its job peers in improbably many jobs"
        )
    else:
        t = Table(
            "host", "confidence", "rate ≥", "jobs (expected)", "GPU-h hosted / lost", "causes", "GPUs",
            "health", "slower than job peers", "anomalies", title="suspect nodes", title_justify="left",
        )  # fmt: skip
        for n in view.suspects:
            ev = n.evidence
            health = f"XID {ev.xid_samples}, ECC {ev.ecc_errors}, throttled {ev.throttled_samples}, link {ev.link_errors}"
            ids = ", ".join(ev.ids[:3]) + (f" (+{len(ev.ids) - 3})" if len(ev.ids) > 3 else "")
            t.add_row(
                n.host,
                f"{n.confidence:.4f}",
                f"{n.ratio_low:.1f}x fleet",
                f"{n.jobs} ({n.expected:.2f}) {n.decided_by}",
                f"{n.gpu_hours:.1f} / {ev.gpu_hours_lost:.2f}",
                _short(ev.causes),
                _short(ev.gpus, 2),
                health,
                slow_summary(ev) or "-",
                ids,
            )
        console.print(t)
    if view.lost:
        t = Table("day", "cause", "anomalies", "GPU-hours lost", title="GPU-hours lost", title_justify="left")
        for x in view.lost:
            t.add_row(x.day, x.cause, str(x.anomalies), f"{x.gpu_hours_lost:.2f}")
        console.print(t)


def _print_tsv(view: FleetView, lost: bool) -> None:
    out = sys.stdout
    if lost:
        out.write("day\tcause\tanomalies\tgpu_hours_lost\n")
        for x in view.lost:
            out.write(f"{x.day}\t{tsv_escape(x.cause)}\t{x.anomalies}\t{x.gpu_hours_lost!r}\n")
        return
    out.write("\t".join(_COLUMNS) + "\n")
    for n in view.suspects:
        row = n.row()
        out.write("\t".join(tsv_escape(row[c]) for c in _COLUMNS) + "\n")


@app.command()
def fleet(
    since: str = typer.Option(
        "7d", "--since", help="the window: a span before --until (7d, 36h, 2w) or an ISO time"
    ),
    until: str = typer.Option("", "--until", help="the window's end, an ISO time (default: now)"),
    cause: str = typer.Option("", "--cause", help="only anomalies of this cause (e.g. compute_straggler)"),
    fmt: FleetFormat = typer.Option(
        FleetFormat.auto,
        "--format",
        "-f",
        help="auto (table on a terminal, TSV when piped), table, tsv, json",
    ),
    save: bool = typer.Option(
        False, "--record", help="also store the suspects (node_suspects: the dashboard and alert read them)"
    ),
    lost: bool = typer.Option(
        False, "--lost", help="TSV: the GPU-hours lost by day and cause, not the suspects"
    ),
) -> None:
    """Suspect nodes ranked (nodes that slow jobs more often than the fleet, given the GPU-hours
    they hosted, or whose GPU is slower than its job peers job after job), with their evidence,
    and the fleet's GPU-hours lost by day and cause."""
    import json

    from argus.fleet import fleet_view, parse_since, record

    with exit_on_error(ValueError):  # a ValueError here: --since or --until
        end = datetime.now(UTC) if not until else parse_since(until, datetime.now(UTC))
        start = parse_since(since, end)
        if start >= end:
            raise ValueError(
                f"--since ({start:%Y-%m-%d %H:%M}) must be before --until ({end:%Y-%m-%d %H:%M})"
            )
    if fmt is FleetFormat.auto:
        fmt = FleetFormat.table if sys.stdout.isatty() else FleetFormat.tsv
    with command_store() as store, exit_on_error(ValueError):  # fleet_view's: the --cause given
        if save and cause:
            raise ValueError("--record stores the view over every node cause: drop --cause")
        view = fleet_view(store, since=start, until=end, cause=cause or None)
        if save:
            record(store, view)
    if fmt is FleetFormat.json:
        sys.stdout.write(json.dumps(view_json(view)) + "\n")
    elif fmt is FleetFormat.tsv:
        _print_tsv(view, lost)
    else:
        _print_table(view)
