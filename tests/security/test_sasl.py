"""Kafka SASL/SCRAM end to end: a broker with a SCRAM listener, every client kind, and a
wrong password refused with a clear message that never shows the password."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from argus.config import load_settings
from argus.kafka_admin import KafkaUnavailable, ensure_topics, probe_kafka
from argus.wiring import faust_credentials
from tests.helpers.kafka import faust_send, first_value, own_broker

PORT = 19292  # PLAINTEXT; SASL_PLAINTEXT on PORT + 2
pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def scram_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    password = secrets.token_urlsafe(18)
    data = tmp_path_factory.mktemp("kafka-scram")
    with own_broker(data, PORT, ARGUS_KAFKA_SCRAM_USER="argus-test", ARGUS_KAFKA_SCRAM_PASSWORD=password):
        yield {"user": "argus-test", "password": password, "bootstrap": f"127.0.0.1:{PORT + 2}"}


def env_for(broker: dict[str, str], password: str) -> dict[str, str]:
    return {
        "ARGUS_KAFKA_BOOTSTRAP": broker["bootstrap"],
        "ARGUS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "ARGUS_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "ARGUS_KAFKA_SASL_USERNAME": broker["user"],
        "ARGUS_KAFKA_SASL_PASSWORD": password,
    }


def test_producer_consumer_and_admin_authenticate(scram_broker, tmp_path: Path) -> None:
    secret_file = tmp_path / "pw"
    secret_file.write_text(scram_broker["password"])
    env = env_for(scram_broker, "")
    del env["ARGUS_KAFKA_SASL_PASSWORD"]
    env["ARGUS_KAFKA_SASL_PASSWORD_FILE"] = str(secret_file)  # secrets from files work too
    conf = load_settings(env=env).kafka_client_config()
    assert "broker(s)" in probe_kafka(conf)
    ensure_topics(conf, ["sasl-check"], partitions=1)
    p = Producer({**conf, "enable.idempotence": True})
    p.produce("sasl-check", b"authenticated")
    assert p.flush(20) == 0
    assert first_value(conf, "sasl-check", "sasl") == b"authenticated"


def test_faust_clients_authenticate_with_the_same_settings(scram_broker) -> None:
    import faust

    settings = load_settings(env=env_for(scram_broker, scram_broker["password"]))
    creds = faust_credentials(settings)
    assert isinstance(creds, faust.SASLCredentials) and creds.mechanism.value == "SCRAM-SHA-512"
    assert faust_send(scram_broker["bootstrap"], creds, "sasl-check", "sasl").topic == "sasl-check"


def test_a_wrong_password_is_refused_clearly(scram_broker) -> None:
    conf = load_settings(env=env_for(scram_broker, "not-the-password")).kafka_client_config()
    with pytest.raises(KafkaUnavailable, match="authentication failed") as err:
        probe_kafka(conf, timeout=10)
    assert "not-the-password" not in str(err.value)


def test_doctor_reports_the_refusal_without_the_secret(scram_broker, tmp_path: Path) -> None:
    wrong = "wrong-" + secrets.token_hex(8)
    env = {**os.environ, "ARGUS_HOME": str(tmp_path), "COLUMNS": "200", **env_for(scram_broker, wrong)}
    out = subprocess.run(
        [sys.executable, "-m", "argus.cli", "doctor"], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 3
    assert "authentication failed" in out.stdout
    assert wrong not in out.stdout + out.stderr and scram_broker["password"] not in out.stdout + out.stderr
