"""Kafka SASL/OAUTHBEARER end to end (issue 17 item 12): a broker whose SASL listener takes
OAUTHBEARER (Kafka's unsecured JWS validator), the token from a file through librdkafka's
``oauth_cb`` and Faust's token provider; a bad token refused without the token shown."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from argus.config import load_settings
from argus.kafka_admin import KafkaUnavailable, ensure_topics, probe_kafka
from argus.wiring import faust_credentials
from tests.helpers.kafka import faust_send, first_value, own_broker

PORT = 19392  # PLAINTEXT; SASL_PLAINTEXT (OAUTHBEARER) on PORT + 2
pytestmark = pytest.mark.kafka


def unsecured_jwt(sub: str, lifetime_s: float = 3600) -> str:
    """A JWS with alg "none", as Kafka's unsecured validator takes it."""

    def b64(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    now = time.time()
    return f"{b64({'alg': 'none'})}.{b64({'sub': sub, 'iat': now, 'exp': now + lifetime_s})}."


@pytest.fixture(scope="module")
def oauth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with own_broker(tmp_path_factory.mktemp("kafka-oauth"), PORT, ARGUS_KAFKA_OAUTHBEARER="unsecured"):
        yield f"127.0.0.1:{PORT + 2}"


def env_for(bootstrap: str, token_file: Path) -> dict[str, str]:
    return {
        "ARGUS_KAFKA_BOOTSTRAP": bootstrap,
        "ARGUS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "ARGUS_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
        "ARGUS_KAFKA_OAUTH_TOKEN_FILE": str(token_file),
    }


def test_admin_producer_and_consumer_authenticate_with_a_token_file(oauth_broker, tmp_path: Path) -> None:
    from argus.producers.publisher import Publisher

    token = tmp_path / "token"
    token.write_text(unsecured_jwt("argus-test"))
    conf = load_settings(env=env_for(oauth_broker, token), strict_env=True).kafka_client_config()
    assert "broker(s)" in probe_kafka(conf, timeout=20)
    ensure_topics(conf, ["oauth-check"], partitions=1)
    pub = Publisher(conf, linger_ms=1)
    pub.publish_raw("oauth-check", b"k", b"authenticated")
    pub.drain(30)
    assert pub.shutdown(5)
    assert first_value(conf, "oauth-check", "oauth") == b"authenticated"


def test_faust_clients_authenticate_with_the_same_token(oauth_broker, tmp_path: Path) -> None:
    import faust

    token = tmp_path / "token"
    token.write_text(unsecured_jwt("argus-faust"))
    settings = load_settings(env=env_for(oauth_broker, token), strict_env=True)
    creds = faust_credentials(settings)
    assert isinstance(creds, faust.OAuthCredentials)
    assert "eyJ" not in repr(creds) + repr(creds.oauth_cb)
    ensure_topics(settings.kafka_client_config(), ["oauth-check"], partitions=1)
    assert faust_send(oauth_broker, creds, "oauth-check", "oauth").topic == "oauth-check"


def test_an_expired_token_is_refused_and_never_shown(oauth_broker, tmp_path: Path) -> None:
    token = tmp_path / "token"
    expired = unsecured_jwt("argus-test", lifetime_s=-60)
    token.write_text(expired)
    env = {**os.environ, "ARGUS_HOME": str(tmp_path), "COLUMNS": "200", **env_for(oauth_broker, token)}
    out = subprocess.run(
        [sys.executable, "-m", "argus.cli", "doctor"], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 3
    payload = expired.split(".")[1]
    assert payload not in out.stdout + out.stderr
    conf = load_settings(env=env_for(oauth_broker, token), strict_env=True).kafka_client_config()
    with pytest.raises(KafkaUnavailable) as err:
        probe_kafka(conf, timeout=10)
    assert payload not in str(err.value)
