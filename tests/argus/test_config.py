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
