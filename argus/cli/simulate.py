"""``argus simulate``: a simulated job into Kafka, with faults."""

from __future__ import annotations

import time

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ._app import app, console, exit_on_error, settings


@app.command()
def simulate(
    ranks: int = typer.Option(1024, min=8, max=200_000, help="ranks of the job (a multiple of 8)"),
    steps: int = typer.Option(100, min=1, max=1_000_000, help="steps to publish"),
    fault: list[str] = typer.Option([], "--fault", help="CLASS@STEP[+STEPS][:TARGET], repeatable"),
    rate: float = typer.Option(2.0, min=0.0, help="steps per second (0: as fast as possible)"),
    job: str = typer.Option("", help="job id (default sim-<time>)"),
    seed: int = typer.Option(0, help="random seed"),
    ranks_per_message: int = typer.Option(64, min=1, help="ranks per Kafka message (a node agent's batch)"),
) -> None:
    """Publish a simulated job with injected faults into Kafka at a chosen step rate."""
    from argus.producers.publisher import Publisher
    from argus.schemas import ALL_TOPICS

    from ..kafka_admin import ensure_topics, probe_kafka
    from ..simulate import layout_for, parse_fault, publish_simulation

    s = settings()
    with exit_on_error():
        layout = layout_for(ranks)
        faults = [parse_fault(f, layout) for f in fault]
        conf = s.kafka_client_config()
        probe_kafka(conf)
        ensure_topics(conf, ALL_TOPICS, partitions=s.kafka_partitions)
        publisher = Publisher(conf, block_when_full=True)
    job = job or f"sim-{time.strftime('%Y%m%d-%H%M%S')}"
    with Progress(
        TextColumn(f"[bold]{job}[/] {layout.dp}×{layout.tp}×{layout.pp}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("steps", total=steps)
        result = publish_simulation(
            publisher.publish,
            job=job,
            layout=layout,
            steps=steps,
            faults=faults,
            seed=seed,
            rate=rate,
            ranks_per_message=ranks_per_message,
            progress=lambda n: bar.advance(task, n),
        )
    with exit_on_error():
        publisher.drain(60)
    console.print(
        f"published {result.records:,} rank-steps in {result.messages:,} messages "
        f"({result.records / max(result.seconds, 1e-9):,.0f}/s)"
    )
    if result.labels:
        table = Table("fault", "steps", "suspect", title="injected (ground truth)")
        for label in result.labels:
            table.add_row(label.kind, f"{label.first_step}..{label.last_step}", label.suspect)
        console.print(table)
