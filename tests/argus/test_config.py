"""Settings: precedence, secret files, redaction, forgiving environment, strict arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from argus.config import ConfigError, load_settings


def test_defaults_fit_one_machine() -> None:
    s = load_settings(env={})
    assert s.kafka_bootstrap == "127.0.0.1:9092"
    assert s.clickhouse_url == ""
    assert s.data_dir == s.home / "clickhouse"


def test_precedence_arguments_then_env_then_file(tmp_path: Path) -> None:
    cfg = tmp_path / "argus.toml"
    cfg.write_text('[argus]\nkafka_bootstrap = "file:1"\nttl_days = 7\njob = "from-file"\n')
    env = {"ARGUS_CONFIG": str(cfg), "ARGUS_KAFKA_BOOTSTRAP": "env:2"}
    s = load_settings(env=env, job="from-arg")
    assert (s.kafka_bootstrap, s.ttl_days, s.job) == ("env:2", 7, "from-arg")


def test_secret_from_file_is_used_and_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cr3t-value\n")
    env = {
        "ARGUS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "ARGUS_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "ARGUS_KAFKA_SASL_USERNAME": "argus",
        "ARGUS_KAFKA_SASL_PASSWORD_FILE": str(secret),
        "ARGUS_GRAFANA_TOKEN": "glsa_token_value",
    }
    s = load_settings(env=env)
    conf = s.kafka_client_config()
    assert conf["sasl.password"] == "s3cr3t-value"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512" and conf["security.protocol"] == "SASL_PLAINTEXT"
    shown = repr(s) + str(s.describe())
    assert "s3cr3t-value" not in shown and "glsa_token_value" not in shown
    assert s.describe()["kafka_sasl_password"] == "***"


def test_bad_env_value_falls_back_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    s = load_settings(env={"ARGUS_TTL_DAYS": "forever"})
    assert s.ttl_days == 30
    assert "ARGUS_TTL_DAYS" in caplog.text


def test_bad_argument_raises() -> None:
    with pytest.raises(ConfigError, match="ttl_days"):
        load_settings(env={}, ttl_days="forever")
    with pytest.raises(ConfigError, match="unknown settings"):
        load_settings(env={}, no_such_setting=1)


def test_broken_config_file_is_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[argus\n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_settings(env={"ARGUS_CONFIG": str(cfg)})


def test_a_ttl_that_does_not_parse_stops_a_command_with_a_clear_message(tmp_path: Path) -> None:
    """ARGUS_TTL_DAYS=thirty: every `argus` command (servers included) stops, exit 2, naming
    the variable (before: a warning and 30 days)."""
    import os
    import subprocess
    import sys

    with pytest.raises(ConfigError, match="ARGUS_TTL_DAYS='thirty'"):
        load_settings(env={"ARGUS_TTL_DAYS": "thirty"}, strict_env=True)
    env = {**os.environ, "ARGUS_HOME": str(tmp_path), "ARGUS_TTL_DAYS": "thirty"}
    done = subprocess.run(
        [sys.executable, "-m", "argus.cli", "sink", "--idle-exit", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "ARGUS_TTL_DAYS='thirty' is not a valid value" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr


def test_a_ttl_past_datetimes_end_is_refused() -> None:
    """30,000 days from now wraps past 2106: 0 rows right after insert. Bounded."""
    from argus.config import MAX_TTL_DAYS
    from argus.sinks.migrate import MAX_TTL_DAYS as SINK_MAX

    assert MAX_TTL_DAYS == SINK_MAX
    with pytest.raises(ConfigError, match="between 1 and 10,000"):
        load_settings(env={"ARGUS_TTL_DAYS": "30000"}, strict_env=True)
    with pytest.raises(ConfigError, match="ttl_days"):
        load_settings(env={}, ttl_days=0)
    assert load_settings(env={"ARGUS_TTL_DAYS": "30000"}).ttl_days == 30  # in a training job: default
    assert load_settings(env={"ARGUS_TTL_DAYS": " 90 "}, strict_env=True).ttl_days == 90


def test_a_step_timeout_must_be_positive() -> None:
    """The step assembler's max_wait_s (0: every step would complete at once, short of its ranks)."""
    with pytest.raises(ConfigError, match="must be positive"):
        load_settings(env={"ARGUS_STREAMS_STEP_TIMEOUT_S": "0"}, strict_env=True)
    assert load_settings(env={"ARGUS_STREAMS_STEP_TIMEOUT_S": "0"}).streams_step_timeout_s == 30.0


def test_relay_peers_and_metrics_address() -> None:
    s = load_settings(env={"ARGUS_RELAY_ALLOWED_UIDS": "1000, 1001", "ARGUS_RELAY_ALLOWED_GIDS": "2000"})
    assert s.relay_uids == (1000, 1001) and s.relay_gids == (2000,)
    assert load_settings(env={}).relay_uids is None  # the relay's own uid
    with pytest.raises(ConfigError, match="ARGUS_RELAY_ALLOWED_UIDS"):
        load_settings(env={"ARGUS_RELAY_ALLOWED_UIDS": "root"}, strict_env=True)
    assert load_settings(env={}).metrics_addr == "127.0.0.1"
    assert load_settings(env={"ARGUS_METRICS_ADDR": "10.1.2.3"}).metrics_addr == "10.1.2.3"


def test_oauthbearer_uses_a_token_callback_never_a_config_string(tmp_path: Path) -> None:
    """The token goes through librdkafka's oauth_cb (before: `token=` in
    sasl.oauthbearer.config, which librdkafka rejects while echoing the secret)."""
    import base64
    import json

    def jwt(sub: str, exp: int) -> str:
        part = base64.urlsafe_b64encode(json.dumps({"sub": sub, "exp": exp}).encode()).rstrip(b"=")
        return f"eyJhbGciOiJub25lIn0.{part.decode()}."

    token_file = tmp_path / "token"
    token_file.write_text(jwt("svc-a", 2_000_000_000))
    env = {
        "ARGUS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "ARGUS_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
        "ARGUS_KAFKA_OAUTH_TOKEN_FILE": str(token_file),
    }
    conf = load_settings(env=env, strict_env=True).kafka_client_config()
    assert "sasl.oauthbearer.config" not in conf and "sasl.password" not in conf
    assert conf["oauth_cb"]("") == (jwt("svc-a", 2_000_000_000), 2_000_000_000.0, "svc-a")
    token_file.write_text(jwt("svc-b", 2_000_000_100))  # rotated: read again at refresh
    assert conf["oauth_cb"]("")[1:] == (2_000_000_100.0, "svc-b")
    assert "eyJ" not in repr(conf) + str(load_settings(env=env).describe())
    with pytest.raises(ConfigError, match="OAUTHBEARER needs"):
        load_settings(env={"ARGUS_KAFKA_SASL_MECHANISM": "OAUTHBEARER"}, strict_env=True)
