"""The demo's child processes (each the leader of its own session) and its own broker."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ._config import REPO, DemoError

__all__ = ["_Broker", "_Child", "_Children", "_own_broker_env", "_tail", "_wait"]


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]


class _Children:
    """Child processes, each the leader of its own session so its whole tree can be stopped."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[_Child] = []

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> _Child:
        log_path = self.logs / f"{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        proc = subprocess.Popen(
            list(argv), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO
        )
        child = _Child(name, proc, log_path, log)
        self.started.append(child)
        return child

    def check_alive(self, *names: str) -> None:
        """Raise DemoError when one of ``names`` exited early."""
        for c in self.started:
            if c.name in names and c.proc.poll() is not None:
                raise DemoError(f"{c.name} exited early (code {c.proc.returncode}); {_tail(c.log_path)}")

    def stop(self, child: _Child, timeout: float = 30.0) -> int:
        """SIGTERM the child's process group, SIGKILL it after ``timeout``; its exit code."""
        if child.proc.poll() is None:
            _signal_group(child.proc.pid, signal.SIGTERM)
            try:
                child.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(child.proc.pid, signal.SIGKILL)
                child.proc.wait(10)
        _signal_group(child.proc.pid, signal.SIGKILL)  # stragglers of its tree, if any
        child.log.close()
        return int(child.proc.returncode)

    def stop_all(self) -> None:
        """Stop every child still running, newest first."""
        for c in reversed(self.started):
            self.stop(c, timeout=15.0)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"log {path} unreadable"
    return f"last lines of {path}:\n  " + "\n  ".join(text[-lines:]) if text else f"log {path} is empty"


def _wait(
    what: str,
    done: Callable[[], bool],
    deadline: float,
    *,
    tick: Callable[[], None] = lambda: time.sleep(0.3),
) -> None:
    while not done():
        if time.monotonic() > deadline:
            raise DemoError(f"timed out waiting for {what}")
        tick()


class _Broker:
    """The demo's own single-node broker (``scripts/kafka.sh``) on ``port``, data under ``data``."""

    def __init__(self, port: int, data: Path) -> None:
        self.script = REPO / "scripts" / "kafka.sh"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_KAFKA_SCRAM")}
        self.env.update(ARGUS_KAFKA_PORT=str(port), ARGUS_KAFKA_DATA=str(data))
        self.port, self.data = port, data
        self.bootstrap = f"127.0.0.1:{port}"
        self.started = False

    def taken(self) -> bool:
        """Something other than this demo's broker answers on the port (kafka.sh would use
        it, and that broker's workers would diagnose the demo's jobs too)."""
        with socket.socket() as sock:
            sock.settimeout(1.0)
            if sock.connect_ex(("127.0.0.1", self.port)) != 0:
                return False
        try:
            os.kill(int((self.data / "broker.pid").read_text().strip()), 0)
        except (OSError, ValueError):
            return True  # no live broker of ours behind it
        return False

    def start(self, log: Path) -> None:
        """Start it (fetching the jars the first time) and wait until it answers."""
        if not self.script.is_file():
            raise DemoError(
                f"{self.script} is missing: run the demo from a checkout, or use --broker configured"
            )
        if self.taken():
            raise DemoError(
                f"127.0.0.1:{self.port} already answers, and it is not this demo's broker: "
                "pass --port with a free port (or --broker configured to use that one on purpose)"
            )
        self.started = True
        with open(log, "ab") as out:
            r = subprocess.run(
                [str(self.script), "up"],
                env=self.env,
                stdout=out,
                stderr=out,
                timeout=600,
                start_new_session=True,
            )
        if r.returncode != 0:
            raise DemoError(f"the demo's Kafka broker did not start; {_tail(log)}")

    def stop(self) -> None:
        """Stop it (by the PID file kafka.sh keeps) if this demo started it."""
        if self.started:
            subprocess.run(
                [str(self.script), "down"], env=self.env, capture_output=True, timeout=120, check=False
            )


def _own_broker_env(env: dict[str, str], bootstrap: str) -> dict[str, str]:
    """``env`` for children of a demo on its own broker: a user's Kafka address and SASL/TLS
    variables replaced by the plain local broker's."""
    out = {k: v for k, v in env.items() if not k.startswith(("ARGUS_KAFKA_", "ARGUS_CONFIG"))}
    out.update(ARGUS_KAFKA_BOOTSTRAP=bootstrap, ARGUS_KAFKA_SECURITY_PROTOCOL="PLAINTEXT")
    if "ARGUS_KAFKA_PARTITIONS" in env:
        out["ARGUS_KAFKA_PARTITIONS"] = env["ARGUS_KAFKA_PARTITIONS"]
    return out
