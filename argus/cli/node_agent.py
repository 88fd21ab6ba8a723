"""``argus node-agent``: GPU health of this node from NVML, published every interval."""

from __future__ import annotations

import signal
import socket
import threading

import typer

from ._app import EXIT_UNAVAILABLE, app, console, err_console, fail, settings


@app.command("node-agent")
def node_agent(
    interval: float = typer.Option(1.0, "--interval", min=0.05, help="Seconds between samples."),
    rounds: int = typer.Option(
        0, "--rounds", min=0, help="Stop after this many rounds (0: run until stopped)."
    ),
    host: str = typer.Option("", "--host", help="Host name in the records (default: this machine's)."),
) -> None:
    """Sample every GPU of this node (utilization, clocks, power, throttling, XID, ECC, NVLink)."""
    from producers.collectors.nvml import NvmlSampler, run_node_agent
    from producers.publisher import Publisher, PublishError

    conf = settings()
    try:
        publisher = Publisher(conf.kafka_client_config(), spool_dir=conf.spool_dir / "node-agent")
    except PublishError as exc:
        fail(str(exc))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    absent: list[str] = []

    def on_absent(reason: str) -> None:
        absent.append(reason)
        err_console.print(f"GPU health absent: {reason}")

    try:
        done = run_node_agent(
            publisher,
            NvmlSampler(host or socket.gethostname()),
            interval_s=interval,
            stop=stop,
            max_rounds=rounds or None,
            on_absent=on_absent,
        )
    except KeyboardInterrupt:
        done = -1
    finally:
        publisher.shutdown(10)
    if absent:
        raise typer.Exit(EXIT_UNAVAILABLE)
    console.print(f"node agent: {done} rounds, publisher {publisher.stats()}")
