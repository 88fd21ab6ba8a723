"""``argus doctor``: is everything Argus needs here, and if not, why not."""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..config import redact_url
from ..wiring import open_configured_store
from ._app import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, app, console, settings

__all__ = ["Check", "install_kind", "run_checks"]

_OPTIONAL = (
    ("confluent_kafka", "agent", "Kafka publisher and consumers"),
    ("faust", "streams", "stream workers"),
    ("chdb", "sinks", "embedded ClickHouse"),
    ("clickhouse_connect", "sinks", "ClickHouse server client"),
    ("grafana_client", "sinks", "Grafana push"),
    ("scipy", "detect", "distribution distances"),
    ("torch", "torch", "PyTorch framework layer"),
)


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report (its detail one line, credentials redacted)."""

    name: str
    status: str  # ok | warn | fail | invalid (a setting Argus cannot use) | absent
    detail: str
    required: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", _one_line(self.detail))


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")


def _secrets() -> list[str]:
    """Every form a configured password may take in a message: as set, and as a URL carries
    it (percent-encoded, spaces as ``+``), from ``ARGUS_CLICKHOUSE_PASSWORD`` and from the
    user info of ``ARGUS_CLICKHOUSE_URL`` however it is written (``user:pw@host`` without a
    scheme, a space in the password), which the URL redaction does not all recognize."""
    from urllib.parse import quote, quote_plus, unquote

    s = settings()  # read before any check runs: a bad value has ended the command already
    found = [s.clickhouse_password]
    m = _USERINFO.match(s.clickhouse_url or "")
    if m:
        found.append(m.group("pw"))
    out = set()
    for pw in filter(None, found):
        for form in (pw, unquote(pw), quote(pw, safe=""), quote_plus(pw), quote(unquote(pw), safe="")):
            if len(form) >= 3:  # a one- or two-character password cannot be told from text
                out.add(form)
    return sorted(out, key=len, reverse=True)


_USERINFO = re.compile(r"^\s*(?:[A-Za-z][A-Za-z0-9+.-]*://)?[^:/@]*:(?P<pw>.*)@[^@]*$", re.S)


def _one_line(text: str, limit: int = 240) -> str:
    """A cause in one short line: a socket error's own words when there is one, no password."""
    for secret in _secrets():
        text = text.replace(secret, "***")
    text = redact_url(text)
    m = _ERRNO.search(text)
    if m and "HTTPConnectionPool" in text:  # urllib3's retry wrapper around a socket error
        text = text[: text.index("Error HTTPConnectionPool")].rstrip(": ") + f": {m.group(1).strip()}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def install_kind() -> str:
    """How this Argus was installed: "source" (a checkout with the Makefile), "container"
    (the image, in Docker or Kubernetes) or "pip" (a wheel in someone's environment)."""
    root = Path(__file__).resolve().parents[2]
    if (root / "Makefile").is_file() and (root / "scripts" / "kafka.sh").is_file():
        return "source"
    if os.environ.get("KUBERNETES_SERVICE_HOST") or Path("/.dockerenv").exists():
        return "container"
    return "pip"


def _kafka_hint(bootstrap: object) -> str:
    return {
        "source": "start the local broker with `make kafka-up`",
        "container": f"check the Kafka bootstrap the deployment sets (ARGUS_KAFKA_BOOTSTRAP={bootstrap})",
        "pip": f"set ARGUS_KAFKA_BOOTSTRAP to your brokers (now {bootstrap})",
    }[install_kind()]


def _extra_hint(extra: str) -> str:
    if install_kind() == "source":
        return f"`.venv/bin/pip install -e '.[{extra}]'`"
    return f"`pip install 'argus-gpu[{extra}]'`"


def _kafka(conf: dict[str, object]) -> Check:
    try:
        from ..kafka_admin import KafkaUnavailable, probe_kafka
    except ImportError:  # pragma: no cover - confluent-kafka missing
        return Check("Kafka", "fail", f"confluent-kafka not installed: {_extra_hint('agent')}", True)
    try:
        return Check("Kafka", "ok", probe_kafka(conf), True)
    except KafkaUnavailable as exc:
        return Check("Kafka", "fail", f"{exc}; {_kafka_hint(conf.get('bootstrap.servers'))}", True)


def _clickhouse() -> Check:
    s = settings()
    try:
        from argus.sinks import SinkError, StoreLockedError
    except ImportError as exc:
        return Check("ClickHouse", "fail", f"sinks extra not installed ({exc.name})", True)
    where = redact_url(s.clickhouse_url) or str(s.data_dir)
    kind = "server" if s.clickhouse_url else "embedded chDB"
    try:
        store = open_configured_store(s)
    except ValueError as exc:  # a malformed URL: the setting is wrong, not the server
        return Check("ClickHouse", "invalid", f"ARGUS_CLICKHOUSE_URL={where}: {exc}", True)
    except StoreLockedError as exc:
        return Check("ClickHouse", "warn", f"{kind}: {exc}", True)
    except SinkError as exc:
        return Check("ClickHouse", "fail", f"{kind} at {where}: {exc}", True)
    try:
        version = store.query_rows("SELECT version()")[0][0]
        tables = store.query_rows("SELECT count() FROM system.tables WHERE database = currentDatabase()")[0][
            0
        ]
    except SinkError as exc:
        return Check("ClickHouse", "fail", f"{kind} at {where}: {exc}", True)
    finally:
        store.close()
    return Check("ClickHouse", "ok", f"{kind} {version} at {where}, {tables} tables", True)


def _optional() -> list[Check]:
    out = []
    for module, extra, what in _OPTIONAL:
        try:
            mod = importlib.import_module(module)
            version = getattr(mod, "__version__", "") or "installed"
            out.append(Check(f"{module}", "ok", f"{version} ({what})"))
        except ImportError:
            out.append(Check(f"{module}", "absent", f"not installed: {_extra_hint(extra)} ({what})"))
    return out


def _gpu() -> list[Check]:
    from argus.producers.collectors import cupti_probe, nvml_probe

    checks = []
    for name, probe in (("NVML (GPU health)", nvml_probe), ("CUPTI (GPU kernels)", cupti_probe)):
        ok, reason = probe()
        checks.append(Check(name, "ok" if ok else "absent", reason))
    return checks


def run_checks() -> list[Check]:
    """Every check, in report order."""
    s = settings()
    return [_kafka(s.kafka_client_config()), _clickhouse(), *_optional(), *_gpu()]


_CLIENT_LOGGERS = ("urllib3", "clickhouse_connect", "argus.kafka")


def _quiet_clients(record: logging.LogRecord) -> bool:
    """Drop the clients' own retry and connection logs: each check reports its cause once."""
    return not record.name.startswith(_CLIENT_LOGGERS)


_STYLE = {
    "ok": "[green]ok[/]",
    "warn": "[yellow]in use[/]",
    "fail": "[bold red]FAIL[/]",
    "invalid": "[bold red]INVALID[/]",
    "absent": "[dim]absent[/]",
}


@app.command()
def doctor() -> None:
    """Check Kafka, ClickHouse, optional parts and GPU libraries; exit 3 if a required part fails."""
    if logging.getLogger().level > logging.DEBUG:  # one line per part; --verbose shows the clients' logs
        for handler in logging.getLogger().handlers:
            handler.addFilter(_quiet_clients)
    checks = run_checks()
    table = Table(title="argus doctor", show_lines=False)
    table.add_column("part", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", no_wrap=not sys.stdout.isatty(), overflow="fold")
    for c in checks:
        table.add_row(c.name, _STYLE[c.status], Text(c.detail))  # text: no markup, no :emoji: codes
    if sys.stdout.isatty():
        console.print(table)
    else:  # piped or logged: one line per part, however long (never folded at 80 columns)
        from rich.console import Console

        width = max(len(c.name) for c in checks) + max(len(c.detail) for c in checks) + 20
        Console(width=max(width, console.width), soft_wrap=False, highlight=False).print(table)
    invalid = [c.name for c in checks if c.required and c.status == "invalid"]
    failed = [c.name for c in checks if c.required and c.status == "fail"]
    if invalid or failed:
        console.print(f"[bold red]not ready:[/] {escape(', '.join(invalid + failed))}")
        raise typer.Exit(EXIT_BAD_INPUT if invalid else EXIT_UNAVAILABLE)
