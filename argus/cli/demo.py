"""``argus demo``: the whole path on this machine."""

from __future__ import annotations

import typer
from rich.table import Table

from ._app import EXIT_UNAVAILABLE, app, console, fail, settings


@app.command()
def demo(
    ranks: int = typer.Option(64, min=8, max=4096, help="ranks of the synthetic job"),
    steps: int = typer.Option(50, min=1, max=10_000, help="steps of the synthetic job"),
) -> None:
    """Send a synthetic job through the real Kafka broker into ClickHouse and print what comes back."""
    from sinks import SinkError, StoreLockedError

    from ..demo import run_foundation_demo
    from ..kafka_admin import KafkaUnavailable

    s = settings()
    try:
        with console.status(f"publishing {ranks} ranks × {steps} steps and sinking them into ClickHouse"):
            result = run_foundation_demo(s, ranks=ranks, steps=steps)
    except KafkaUnavailable as exc:
        fail(f"{exc}. Start the broker with `make kafka-up`.", EXIT_UNAVAILABLE)
    except StoreLockedError as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    except SinkError as exc:
        fail(f"ClickHouse: {exc}", EXIT_UNAVAILABLE)
    console.print(
        f"job [bold]{result.job}[/]: sent {result.sent_rows} step records, "
        f"read back {result.stored_rows} from ClickHouse in {result.seconds:.1f} s"
    )
    table = Table(
        "rank",
        "host",
        "steps",
        "median step ms",
        "median forward ms",
        "median all-reduce ms",
        title="slowest ranks by forward time (read back from ClickHouse)",
    )
    for row in result.slowest:
        table.add_row(*(str(v) for v in row))
    console.print(table)
    if result.stored_rows != result.sent_rows:
        fail(f"only {result.stored_rows} of {result.sent_rows} rows arrived", EXIT_UNAVAILABLE)
