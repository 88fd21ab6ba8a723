"""``argus report``: a self-contained HTML report of one job."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import app, console, fail, n_anomalies
from ._store import command_store
from .sql import terminal_text


@app.command()
def report(
    job: str = typer.Option(..., "--job", "-j", help="the job id"),
    output: Path = typer.Option(Path("report.html"), "--output", "-o", help="where to write the HTML"),
) -> None:
    """Write an HTML report of a job: heatmap, phases, anomalies with cost, kernels and stacks of suspects."""
    from argus.sinks.report import UnknownJobError, collect, render

    with command_store() as store:
        try:
            data = collect(store, job)
        except UnknownJobError as exc:
            fail(str(exc))
    html = render(data)
    try:
        output.write_text(html, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    found = ", ".join(f"rank {s.rank} ({s.reason})" for s in data.suspects) or "no suspects"
    console.print(
        terminal_text(
            f"wrote {output} ({len(html.encode()) // 1024} KiB): {n_anomalies(len(data.anomalies))}; {found}"
        ),
        highlight=False,
        markup=False,
    )
