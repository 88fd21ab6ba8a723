"""``argus node-agent``: GPU health of this node from NVML, and the node relay of step records."""

from __future__ import annotations

import signal
import socket
import threading
from typing import Any

import typer

from ..config import Settings
from ._app import app, console, err_console, exit_on_error, settings
from ._errors import EXIT_UNAVAILABLE


def node_metrics(relay: Any, publisher: Any) -> dict[str, Any]:
    """The node agent's Prometheus families (``argus.metrics`` snapshot format)."""
    out: dict[str, Any] = {}
    pub = publisher.stats()
    out["argus_node_publisher_delivered_total"] = (
        "counter",
        "records Kafka acknowledged",
        {(): pub["delivered"]},
    )
    out["argus_node_publisher_dropped_total"] = (
        "counter",
        "records dropped by the publisher, by reason",
        {(("reason", k),): v for k, v in pub["dropped"].items()},
    )
    out["argus_node_publisher_spool_bytes"] = ("gauge", "bytes spooled to disk", {(): pub["spool_bytes"]})
    out["argus_node_publisher_stalled"] = (
        "gauge",
        "1 while Kafka is unreachable",
        {(): float(pub["stalled"])},
    )
    if relay is not None:
        out["argus_relay_received_total"] = ("counter", "step datagrams received", {(): relay.received})
        out["argus_relay_published_total"] = (
            "counter",
            "merged step messages published",
            {(): relay.published},
        )
        out["argus_relay_refused_total"] = (
            "counter",
            "datagrams refused, by reason",
            {(("reason", k.replace(" ", "_")),): v for k, v in relay.refused.items()},
        )
        out["argus_relay_open_steps"] = (
            "gauge",
            "steps waiting for the node's ranks",
            {(): relay.merger.open_steps},
        )
    return out


@app.command("node-agent")
def node_agent(
    interval: float = typer.Option(1.0, "--interval", min=0.05, help="Seconds between samples."),
    rounds: int = typer.Option(
        0, "--rounds", min=0, help="Stop after this many rounds (0: run until stopped)."
    ),
    host: str = typer.Option("", "--host", help="Host name in the records (default: this machine's)."),
    relay: str = typer.Option(
        "",
        "--relay",
        help="Serve the node relay on this Unix socket: the node's ranks send their step records "
        "here and each step goes to Kafka as one message (default: ARGUS_RELAY_SOCKET; empty: none).",
    ),
    metrics_port: int = typer.Option(
        0, "--metrics-port", help="serve Prometheus /metrics and /healthz on this port (0: off)"
    ),
) -> None:
    """Sample every GPU of this node (utilization, clocks, power, throttling, XID, ECC, NVLink).

    With a relay socket it also merges the step records of the node's ranks, one Kafka
    message per step instead of one per rank; without a GPU the relay keeps serving.
    """
    from argus.producers.collectors.nvml import NvmlSampler, run_node_agent

    conf = settings()
    publisher = _publisher(conf)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    absent: list[str] = []
    node_relay, relay_thread = _start_relay(relay or conf.relay_socket, publisher, conf, stop)
    if metrics_port:
        _serve_metrics(metrics_port, conf, node_relay, relay_thread, publisher, stop)

    def on_absent(reason: str) -> None:
        absent.append(reason)
        relay_only = "; serving the relay only" if node_relay is not None else ""
        err_console.print(f"[bold red]GPU health absent[/]: {reason}{relay_only}")

    try:
        done = run_node_agent(
            publisher,
            NvmlSampler(host or socket.gethostname()),
            interval_s=interval,
            stop=stop,
            max_rounds=rounds or None,
            on_absent=on_absent,
        )
        while node_relay is not None and (absent or not rounds) and not stop.wait(1.0):
            pass  # the relay serves until SIGTERM or Ctrl-C
    except KeyboardInterrupt:
        done = -1
    finally:
        stop.set()
        if node_relay is not None and relay_thread is not None:
            relay_thread.join(10)  # it publishes what it holds before returning
            console.print(f"node relay: {node_relay.stats()}")
        publisher.shutdown(10)
    if absent and node_relay is None:
        raise typer.Exit(EXIT_UNAVAILABLE)
    console.print(f"node agent: {done} rounds, publisher {publisher.stats()}")


def _publisher(conf: Settings) -> Any:
    """The node's Kafka publisher (spooling to disk under the node agent's home)."""
    from argus.producers.publisher import Publisher

    with exit_on_error():
        return Publisher(conf.kafka_client_config(), spool_dir=conf.spool_dir / "node-agent", background=True)


def _start_relay(
    path: str, publisher: Any, conf: Settings, stop: threading.Event
) -> tuple[Any, threading.Thread | None]:
    """The node relay serving ``path`` on its own thread until ``stop`` (None, None without a
    path); a relay that cannot serve is a clean error."""
    from argus.producers.relay import NodeRelay

    if not path:
        return None, None
    with exit_on_error():
        try:
            node_relay = NodeRelay(
                path, publisher, allowed_uids=conf.relay_uids, allowed_gids=conf.relay_gids
            )
        except Exception:
            publisher.shutdown(1)  # its thread would keep the process alive after the error
            raise
    relay_thread = threading.Thread(target=node_relay.serve, args=(stop,), name="argus-relay")
    relay_thread.start()
    console.print(
        f"node relay: serving {path} for uids {sorted(node_relay.allowed_uids)}"
        + (f", gids {sorted(node_relay.allowed_gids)}" if node_relay.allowed_gids else "")
    )
    return node_relay, relay_thread


def _serve_metrics(
    port: int,
    conf: Settings,
    node_relay: Any,
    relay_thread: threading.Thread | None,
    publisher: Any,
    stop: threading.Event,
) -> None:
    """Prometheus ``/metrics`` (:func:`node_metrics`) and ``/healthz`` (the relay thread alive,
    not stopping) on ``port``."""
    from argus.metrics import serve_metrics

    from ._health import add_probes

    def healthy() -> tuple[bool, str]:
        if relay_thread is not None and not relay_thread.is_alive():
            return False, "relay thread stopped"
        if stop.is_set():
            return False, "stopping"
        return True, "ok"

    server = serve_metrics(port, lambda: node_metrics(node_relay, publisher), addr=conf.metrics_addr)
    add_probes(server, {"/healthz": healthy})
