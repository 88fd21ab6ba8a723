"""Settings from ``ARGUS_*`` environment variables or a TOML config file.

This module is the only reader of ``ARGUS_*``. Precedence: explicit arguments, then the
environment, then the config file (``ARGUS_CONFIG`` or ``./argus.toml``), then defaults.
Secrets (``*_PASSWORD``, ``*_TOKEN``) may also come from a file named by the variable with
``_FILE`` appended (``ARGUS_KAFKA_SASL_PASSWORD_FILE``), and are never printed: the
settings' ``repr`` and :meth:`Settings.describe` redact them.

A bad value in the environment is logged and the default used (telemetry must not stop a
training job); a bad explicit argument raises :class:`ConfigError`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "Settings", "load_settings"]

log = logging.getLogger("argus.config")

_SECRET_FIELDS = frozenset(
    {
        "kafka_sasl_password",
        "kafka_oauth_token",
        "clickhouse_password",
        "grafana_token",
        "kafka_ssl_key_password",
    }
)


class ConfigError(ValueError):
    """A setting has a value Argus cannot use."""


def _redacted(value: Any) -> str:
    return "***" if value else "(unset)"


@dataclass(frozen=True)
class Settings:
    """Everything configurable, with sane defaults for one machine."""

    home: Path = field(default_factory=lambda: Path.home() / ".argus")
    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str = ""
    kafka_sasl_username: str = ""
    kafka_sasl_password: str = field(default="", repr=False)
    kafka_oauth_token: str = field(default="", repr=False)
    kafka_ssl_ca: str = ""
    kafka_ssl_cert: str = ""
    kafka_ssl_key: str = ""
    kafka_ssl_key_password: str = field(default="", repr=False)
    kafka_partitions: int = 16
    streams_store: str = "memory://"
    streams_step_timeout_s: float = 30.0
    """A step completes at the latest this long after its first part (missing ranks named)."""
    streams_session_timeout_s: float = 15.0
    """A killed worker's partitions move to the others after this long."""
    hang_floor_s: float = 10.0
    """No step for max(this, hang_step_factor x the job's step time) is a hang."""
    hang_step_factor: float = 10.0
    hang_lost_floor_s: float = 10.0
    """A rank with no heartbeat for at least this long is lost."""
    clickhouse_url: str = ""
    clickhouse_user: str = ""
    clickhouse_password: str = field(default="", repr=False)
    clickhouse_database: str = ""
    clickhouse_ca: str = ""
    ttl_days: int = 30
    grafana_url: str = ""
    grafana_token: str = field(default="", repr=False)
    job: str = ""
    relay_socket: str = ""
    """The node relay's Unix socket: served by ``argus node-agent``, used by rank agents
    (step records merged per node; empty: ranks publish to Kafka directly)."""

    @property
    def data_dir(self) -> Path:
        """The embedded ClickHouse (chDB) data directory."""
        return self.home / "clickhouse"

    @property
    def spool_dir(self) -> Path:
        """Where the rank agent spools records while the broker is unreachable."""
        return self.home / "spool"

    def kafka_client_config(self) -> dict[str, Any]:
        """librdkafka settings (confluent-kafka) shared by every producer, consumer and admin."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.kafka_bootstrap,
            "security.protocol": self.kafka_security_protocol,
        }
        if self.kafka_sasl_mechanism:
            conf["sasl.mechanism"] = self.kafka_sasl_mechanism
            if self.kafka_sasl_mechanism == "OAUTHBEARER":
                if self.kafka_oauth_token:
                    conf["sasl.oauthbearer.config"] = f"principal=argus token={self.kafka_oauth_token}"
            else:
                conf["sasl.username"] = self.kafka_sasl_username
                conf["sasl.password"] = self.kafka_sasl_password
        for key, value in (
            ("ssl.ca.location", self.kafka_ssl_ca),
            ("ssl.certificate.location", self.kafka_ssl_cert),
            ("ssl.key.location", self.kafka_ssl_key),
            ("ssl.key.password", self.kafka_ssl_key_password),
        ):
            if value:
                conf[key] = value
        return conf

    def describe(self) -> dict[str, str]:
        """Every setting as text, secrets redacted (for `argus doctor` and logs)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = _redacted(value) if f.name in _SECRET_FIELDS else str(value)
        return out


def _env_name(field_name: str) -> str:
    return "ARGUS_" + field_name.upper()


def _read_secret_file(path: str, name: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        log.warning("cannot read %s_FILE (%s): %s; the setting stays unset", name, path, exc.strerror)
        return None


def _coerce(name: str, raw: Any, default: Any, *, strict: bool) -> Any:
    try:
        if isinstance(default, Path):
            return Path(str(raw)).expanduser()
        if isinstance(default, bool):
            return str(raw).lower() in ("1", "true", "yes", "on")
        if isinstance(default, int | float):
            value = type(default)(raw)
            if not value >= 0:  # negative or NaN
                raise ValueError("negative")
            return value
        return str(raw)
    except (TypeError, ValueError) as exc:
        if strict:
            raise ConfigError(f"{name}: {raw!r} is not a valid value ({exc})") from exc
        log.warning("ignoring %s=%r (%s); using the default %r", name, raw, exc, default)
        return default


def load_settings(
    env: Mapping[str, str] | None = None, config_file: str | os.PathLike[str] | None = None, **overrides: Any
) -> Settings:
    """Build settings from overrides, the environment and the config file, in that order."""
    env = os.environ if env is None else env
    path = config_file or env.get("ARGUS_CONFIG")
    file_values: dict[str, Any] = {}
    if path or Path("argus.toml").is_file():
        p = Path(path or "argus.toml")
        try:
            file_values = tomllib.loads(p.read_text()).get("argus", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {p}: {exc}") from exc
    values: dict[str, Any] = {}
    defaults = Settings()
    for f in dataclasses.fields(Settings):
        default = getattr(defaults, f.name)
        if f.name in overrides and overrides[f.name] is not None:
            values[f.name] = _coerce(f.name, overrides[f.name], default, strict=True)
            continue
        name = _env_name(f.name)
        raw: Any = env.get(name)
        if raw is None and name + "_FILE" in env:
            raw = _read_secret_file(env[name + "_FILE"], name)
        if raw is None:
            raw = file_values.get(f.name)
        if raw is not None and raw != "":
            values[f.name] = _coerce(name, raw, default, strict=False)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(Settings)}
    if unknown:
        raise ConfigError(f"unknown settings: {sorted(unknown)}")
    return Settings(**values)
