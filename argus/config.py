"""Settings from ``ARGUS_*`` environment variables or a TOML config file.

This module is the only reader of ``ARGUS_*``. Precedence: explicit arguments, then the
environment, then the config file (``ARGUS_CONFIG`` or ``./argus.toml``), then defaults.
Secrets (``*_PASSWORD``, ``*_TOKEN``) may also come from a file named by the variable with
``_FILE`` appended (``ARGUS_KAFKA_SASL_PASSWORD_FILE``), and are never printed: the
settings' ``repr`` and :meth:`Settings.describe` redact them.

A bad value in the environment is logged and the default used when Argus runs inside a
training job (``argus.attach``: telemetry must not stop training); every ``argus`` command
(servers included) loads with ``strict_env=True``, where a bad value stops the process with
a :class:`ConfigError` naming the variable. A bad explicit argument always raises.

URLs are shown through :func:`redact_url` (``http://user:***@host``) wherever they are
printed or logged.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import re
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._errors import ArgusError

__all__ = ["MAX_TTL_DAYS", "ConfigError", "OAuthToken", "Settings", "load_settings", "redact_url"]

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


MAX_TTL_DAYS = 10_000
"""The longest retention (about 27 years): insert time + TTL must stay below ClickHouse
DateTime's end (2106-02-07); beyond it the TTL date wraps into the past and every row is
deleted at once. Equal to ``argus.sinks.migrate.MAX_TTL_DAYS``."""

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/?#@\s]*):[^@/?#\s]*@")
_URL_TOKEN = re.compile(r"(?i)([?&](?:password|passwd|pwd|token|access_token|secret|key)=)[^&#\s'\"]+")


def redact_url(text: str) -> str:
    """``text`` with the password of every URL in it (``scheme://user:pass@``) and secret
    query parameters (``?password=``, ``?token=``) replaced by ``***``."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _URL_TOKEN.sub(r"\1***", text)


class ConfigError(ArgusError, ValueError):
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
    """OAUTHBEARER: the bearer token (a JWT; its ``exp`` and ``sub`` claims are used)."""
    kafka_oauth_token_file: str = ""
    """OAUTHBEARER: a file holding the token, read again at every refresh (rotated tokens)."""
    kafka_ssl_ca: str = ""
    kafka_ssl_cert: str = ""
    kafka_ssl_key: str = ""
    kafka_ssl_key_password: str = field(default="", repr=False)
    kafka_partitions: int = 16
    streams_store: str = "memory://"
    streams_step_timeout_s: float = 30.0
    """A step completes at the latest this long after its first part (missing ranks named)."""
    streams_replication_factor: int = 0
    """Replicas of the topics a worker creates (its tables' changelogs, its internal topic, the
    pipeline's topics when missing); 0: the brokers' ``default.replication.factor``."""
    streams_session_timeout_s: float = 15.0
    """A killed worker's partitions move to the others after this long."""
    streams_job_ttl_s: float = 6 * 3600.0
    """A job run silent this long is forgotten by the worker (its diagnosis state dropped)."""
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
    """Days a stored row is kept, counted from when it arrived (1..MAX_TTL_DAYS)."""
    grafana_url: str = ""
    grafana_token: str = field(default="", repr=False)
    job: str = ""
    quiet: bool = False
    """The rank agent prints nothing at attach (rank 0 prints one line by default)."""
    relay_socket: str = ""
    """The node relay's Unix socket: served by ``argus node-agent``, used by rank agents
    (step records merged per node; empty: ranks publish to Kafka directly)."""
    relay_allowed_uids: str = ""
    """Comma-separated uids whose processes may send through the relay (empty: the relay's own)."""
    relay_allowed_gids: str = ""
    """Comma-separated primary gids whose processes may send through the relay."""
    metrics_addr: str = "127.0.0.1"
    """The address ``/metrics`` binds (Helm sets the pod's IP; ``0.0.0.0`` for every interface)."""

    @property
    def relay_uids(self) -> tuple[int, ...] | None:
        """The uids allowed to send through the relay; None: the relay's own uid."""
        return _ids(self.relay_allowed_uids) or None

    @property
    def relay_gids(self) -> tuple[int, ...]:
        """The primary gids allowed to send through the relay."""
        return _ids(self.relay_allowed_gids)

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
                conf["oauth_cb"] = self.oauth_token()
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

    def oauth_token(self) -> OAuthToken:
        """The OAUTHBEARER token source (librdkafka's ``oauth_cb``; Faust's provider wraps it)."""
        if not (self.kafka_oauth_token or self.kafka_oauth_token_file):
            raise ConfigError(
                "ARGUS_KAFKA_SASL_MECHANISM=OAUTHBEARER needs ARGUS_KAFKA_OAUTH_TOKEN or "
                "ARGUS_KAFKA_OAUTH_TOKEN_FILE"
            )
        return OAuthToken(self.kafka_oauth_token, self.kafka_oauth_token_file)

    def describe(self) -> dict[str, str]:
        """Every setting as text, secrets redacted (for `argus doctor` and logs)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = _redacted(value) if f.name in _SECRET_FIELDS else redact_url(str(value))
        return out


class OAuthToken:
    """An OAUTHBEARER token for Kafka clients, read again from its file at every refresh.

    Called by librdkafka as ``oauth_cb(sasl.oauthbearer.config)``: returns (token, expiry
    in epoch seconds, principal). The expiry and principal come from the token's JWT
    ``exp`` and ``sub`` claims when it has them (not verified: the broker does that), else
    5 minutes from now and ``argus``. The token is never part of a printed config or repr.
    """

    def __init__(self, token: str = "", path: str = "") -> None:
        self._token = token
        self._path = path

    def __repr__(self) -> str:
        return f"OAuthToken(file={self._path!r})" if self._path else "OAuthToken(***)"

    def current(self) -> str:
        """The token now: the file's content if it is readable, else the last one known."""
        if self._path:
            try:
                text = Path(self._path).read_text().strip()
            except OSError as exc:
                log.warning("cannot read the OAuth token file %s: %s", self._path, exc.strerror)
            else:
                if text:
                    self._token = text
        if not self._token:
            raise ConfigError(f"no OAuth token (file {self._path or 'unset'})")
        return self._token

    def __call__(self, _config: str | None = None) -> tuple[str, float, str]:
        token = self.current()
        claims = _jwt_claims(token)
        exp = claims.get("exp")
        expiry = float(exp) if isinstance(exp, int | float) and exp > 0 else time.time() + 300.0
        if expiry <= time.time():
            log.warning(
                "the Kafka OAuth token%s expired at %s",
                f" in {self._path}" if self._path else "",
                time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expiry)),
            )
        sub = claims.get("sub")
        return token, expiry, sub if isinstance(sub, str) and sub else "argus"


def _jwt_claims(token: str) -> dict[str, Any]:
    """The payload of a JWT (``header.payload.signature``), unverified; {} if it is not one."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        raw = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {}
    return claims if isinstance(claims, dict) else {}


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def _check_ids(text: str) -> str:
    for x in text.replace(" ", "").split(","):
        if x and not (x.isdigit() and int(x) < 2**32 - 1):
            raise ValueError(f"{x!r} is not a uid/gid")
    return text


def _check_range(lo: int, hi: int) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not lo <= value <= hi:
            raise ValueError(f"must be between {lo:,} and {hi:,}")
        return value

    return check


def _check_positive(value: float) -> float:
    if not value > 0:
        raise ValueError("must be positive")
    return value


def _check_mechanism(text: str) -> str:
    known = ("", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
    if text not in known:
        raise ValueError(f"not one of {', '.join(k for k in known if k)}")
    return text


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "ttl_days": _check_range(1, MAX_TTL_DAYS),
    "kafka_partitions": _check_range(1, 100_000),
    "streams_replication_factor": _check_range(0, 32_767),
    "streams_step_timeout_s": _check_positive,  # the step assembler's max_wait_s
    "relay_allowed_uids": _check_ids,
    "relay_allowed_gids": _check_ids,
    "kafka_sasl_mechanism": _check_mechanism,
}


def _env_name(field_name: str) -> str:
    return "ARGUS_" + field_name.upper()


def _read_secret_file(path: str, name: str, *, strict: bool) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        if strict:
            raise ConfigError(f"cannot read {name}_FILE ({path}): {exc.strerror}") from None
        log.warning("cannot read %s_FILE (%s): %s; the setting stays unset", name, path, exc.strerror)
        return None


def _coerce(name: str, field_name: str, raw: Any, default: Any, *, strict: bool) -> Any:
    try:
        if isinstance(default, Path):
            value: Any = Path(str(raw)).expanduser()
        elif isinstance(default, bool):
            value = str(raw).lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int | float):
            if isinstance(raw, str):
                raw = raw.strip()
            value = type(default)(raw)
            if not value >= 0:  # negative or NaN
                raise ValueError("negative")
        else:
            value = str(raw)
        check = _CHECKS.get(field_name)
        return check(value) if check is not None else value
    except (TypeError, ValueError) as exc:
        shown = "***" if field_name in _SECRET_FIELDS else repr(raw)
        if strict:
            raise ConfigError(f"{name}={shown} is not a valid value ({exc})") from None
        log.warning("ignoring %s=%s (%s); using the default %r", name, shown, exc, default)
        return default


def load_settings(
    env: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
    *,
    strict_env: bool = False,
    **overrides: Any,
) -> Settings:
    """Build settings from overrides, the environment and the config file, in that order.

    With ``strict_env`` a bad value in the environment or the config file raises
    :class:`ConfigError` (every ``argus`` command); without it, it is logged and the default
    used (inside a training job).
    """
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
            values[f.name] = _coerce(f.name, f.name, overrides[f.name], default, strict=True)
            continue
        name = _env_name(f.name)
        raw: Any = env.get(name)
        if raw is None and name + "_FILE" in env:
            raw = _read_secret_file(env[name + "_FILE"], name, strict=strict_env)
        if raw is None:
            raw = file_values.get(f.name)
        if raw is not None and raw != "":
            values[f.name] = _coerce(name, f.name, raw, default, strict=strict_env)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(Settings)}
    if unknown:
        raise ConfigError(f"unknown settings: {sorted(unknown)}")
    settings = Settings(**values)
    if settings.kafka_sasl_mechanism == "OAUTHBEARER" and not (
        settings.kafka_oauth_token or settings.kafka_oauth_token_file
    ):
        message = "ARGUS_KAFKA_SASL_MECHANISM=OAUTHBEARER needs ARGUS_KAFKA_OAUTH_TOKEN or ARGUS_KAFKA_OAUTH_TOKEN_FILE"
        if strict_env:
            raise ConfigError(message)
        log.warning("%s; Kafka clients will fail to authenticate", message)
    return settings
