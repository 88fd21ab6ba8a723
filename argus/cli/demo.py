"""``argus demo``: the whole system on this machine (see :mod:`argus.demo`)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from argus.producers.simulator.scoring import named_kernels

from ._app import app, console, exit_on_error, fail, n_anomalies, settings
from ._errors import EXIT_MISSED

if TYPE_CHECKING:
    from ..demo import DemoResult


_TASKS = {
    "broker": "Kafka broker",
    "train": "training (gloo)",
    "simulate": "simulated steps",
    "diagnose": "steps diagnosed",
    "sink": "sink → ClickHouse",
    "report": "HTML reports",
}


class _RichProgress:
    """:class:`argus.demo.DemoProgress` drawn as rich progress bars, one per task."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.ids: dict[str, TaskID] = {}

    def update(self, task: str, done: float, total: float | None = None, note: str = "") -> None:
        if task not in self.ids:
            self.ids[task] = self.bar.add_task(_TASKS.get(task, task), total=total, note=note)
        self.bar.update(self.ids[task], completed=done, total=total, note=note)


def _kind(job: str) -> str:
    """A demo job by its kind (``demo-train-20261124-001200`` → ``train``), any other as is."""
    parts = job.split("-")
    return parts[1] if len(parts) > 2 and parts[0] == "demo" else job


def _diagnosis_table(result: DemoResult, width: int = 200) -> Table:
    """The findings read back; under 130 columns without the evidence and kernel columns, and
    each job by its kind (folded into 80 columns, every cell would be a few letters wide)."""
    wide = width >= 130
    table = Table(title="diagnosis (read back from ClickHouse)", show_lines=False)
    cols = ["job", "window" if wide else "steps", "suspect", "root cause"]
    cols += ["kernel / frame", "severity", "evidence", "cost"] if wide else ["severity", "+ms/step"]
    # the long free-text columns wrap; the short ones keep their width (folded, a suspect
    # column was squeezed to nothing between 130 and 240 columns)
    free = ("job", "kernel / frame", "evidence") if wide else ("suspect",)
    short = {"suspect": 12, "window": 13, "root cause": 14} if wide else {}
    for col in cols:
        table.add_column(col, overflow="fold", min_width=short.get(col, len(col)), no_wrap=col not in free)
    for f in result.findings:
        top = sorted(f.evidence.items(), key=lambda kv: -abs(kv[1]))[:3]
        cost = (
            f"+{f.step_ms_added:.1f} ms/step, {f.gpu_hours_lost:.3g} GPU·h"
            if wide
            else f"{f.step_ms_added:.1f}"
        )
        job = f.job if wide else _kind(f.job)
        window = f"{f.start_step}–{f.end_step}"
        row = [job, f"steps {window}" if wide else window, f.suspect, f.cause]
        if wide:
            kernels = ", ".join(named_kernels(f)[:2])  # what the kernel level named (slowest first)
            row += [kernels, f.severity, ", ".join(f"{k} {v:.3g}" for k, v in top), cost]
        else:
            row += [f.severity, cost]
        table.add_row(*row)
    return table


_OK, _BAD = "[green]✓[/]", "[red]✘[/]"


def _check_table(result: DemoResult, width: int = 200) -> Table:
    """One row per injected fault (found with its class and window IoU, or not), then one
    ✘ row per anomaly that matches no injected fault (extra) or only with another class.
    What was found names only what differs from the injected fault; under 130 columns each
    job goes by its kind (``train``)."""
    table = Table(title="injected on purpose vs found")
    for col in ("", "job", "injected", "suspect", "steps", "found", "IoU"):
        table.add_column(col, overflow="fold", no_wrap=col in ("injected", "steps", "IoU"))
    for check in result.checks:
        job = check.job if width >= 130 else _kind(check.job)
        for j, lab in enumerate(check.labels):
            best = check.scoring.of_label(j)
            hit = best[0] if best and best[0].right else None
            if hit is None:
                table.add_row(
                    _BAD,
                    job,
                    lab.kind,
                    lab.suspect,
                    f"{lab.first_step}–{lab.last_step}",
                    "not found",
                    "",
                )
                continue
            f = check.findings[hit.anomaly]
            mark = _OK if hit.iou >= result.min_iou else _BAD
            same = f.cause == lab.kind and f.suspect == lab.suspect
            steps = f"{f.start_step}–{f.end_step}"
            found = f"same, steps {steps}" if same else f"{f.cause} {f.suspect} (steps {steps})"
            table.add_row(
                mark,
                job,
                lab.kind,
                lab.suspect,
                f"{lab.first_step}–{lab.last_step}",
                found,
                f"{hit.iou:.2f}",
            )
        for i, why in [
            *((i, "extra") for i in check.scoring.extras),
            *((i, "wrong class") for i in check.scoring.wrong),
        ]:
            f = check.findings[i]
            table.add_row(
                f"{_BAD} {why}",
                job,
                "—",
                "—",
                "—",
                f"{f.cause} {f.suspect} (steps {f.start_step}–{f.end_step})",
                "",
            )
    return table


def _verdict(result: DemoResult) -> str:
    """Why the check failed, in one line."""
    extras = sum(len(c.scoring.extras) + len(c.scoring.wrong) for c in result.checks)
    misses = sum(len(c.scoring.misses) for c in result.checks)
    narrow = sum(1 for c in result.checks for m in c.scoring.matches if m.right and m.iou < result.min_iou)
    parts = [
        f"{misses} injected fault(s) not found" if misses else "",
        f"{n_anomalies(extras)} matching no injected fault" if extras else "",
        f"{narrow} window(s) with IoU < {result.min_iou}" if narrow else "",
    ]
    return "; ".join(p for p in parts if p) + " (see the table above)"


@app.command()
def demo(
    train_steps: int = typer.Option(40, min=10, max=1000, help="steps of the real 4-rank training"),
    sim_ranks: int = typer.Option(4096, min=4096, max=65_536, help="ranks of the simulated job"),
    sim_steps: int = typer.Option(64, min=60, max=10_000, help="steps of the simulated job"),
    timeout: float = typer.Option(240.0, min=30.0, help="seconds before the demo gives up"),
    app_id: str = typer.Option(
        "argus-demo", help="consumer group of the demo's worker (its sink's is APP_ID-sink)"
    ),
    broker: str = typer.Option(
        "own",
        help="own: start a broker for the demo (127.0.0.1:--port); configured: use ARGUS_KAFKA_BOOTSTRAP",
    ),
    port: int = typer.Option(19092, min=1024, max=65_000, help="port of the demo's own broker"),
) -> None:
    """The whole system on this machine: broker, stream worker and sink as child processes,
    a real 4-rank gloo training with one rank slowed and a simulated 4,096-rank job with
    three faults; prints the diagnosis, writes the HTML reports, stops what it started."""
    from ..demo import DemoConfig, run_demo

    s = settings()
    if broker not in ("own", "configured"):
        fail(f"--broker must be own or configured, not {broker!r}")
    with exit_on_error():
        cfg = DemoConfig(
            own_broker=broker == "own",
            broker_port=port,
            train_steps=train_steps,
            sim_ranks=sim_ranks,
            sim_steps=sim_steps,
            timeout_s=timeout,
            app_id=app_id,
        )
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[dim]{task.fields[note]}"),
            TimeElapsedColumn(),
            console=console,
        ) as bar:
            result = run_demo(s, _RichProgress(bar), cfg)
    console.print(_diagnosis_table(result, console.width))
    console.print(_check_table(result, console.width))
    for job, path in result.reports.items():
        console.print(f"report for [bold]{job}[/]: {path}")
    if result.report_error:
        console.print(f"[yellow]{result.report_error}[/]")
    t = result.timings
    console.print(
        f"done in {t['total_s']:.0f} s (after the start: training over at {t['train_s']:.0f} s, all diagnosed at "
        f"{t['diagnose_s']:.0f} s, stored at {t['stored_s']:.0f} s). Query it: ARGUS_HOME={result.home} {_argus_command()} sql "
        f"\"SELECT cause, suspect, start_step, end_step FROM anomalies FINAL WHERE job = '{result.sim_job}'\""
    )
    if not result.ok:
        fail(_verdict(result), EXIT_MISSED)


def _argus_command() -> str:
    """How to run ``argus`` from the user's shell: the bare name when it is on PATH and is this
    installation's, else its path beside this interpreter (a venv not activated, as under
    ``make demo``), else ``python -m argus.cli``."""
    beside = Path(sys.executable).with_name("argus")
    found = shutil.which("argus")
    if found and (not beside.exists() or Path(found).resolve() == beside.resolve()):
        return "argus"
    if beside.exists():
        return str(beside)
    return f"{sys.executable} -m argus.cli"
