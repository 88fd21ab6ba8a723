"""Concrete objects built from settings: the one place that knows how parts connect."""

from __future__ import annotations

import os
from typing import Any

from argus.producers.spool import private_dir

from .config import Settings

__all__ = ["faust_credentials", "open_configured_store", "private_dir", "stream_config"]


def open_configured_store(settings: Settings) -> Any:
    """The ClickHouse store the settings name: a server if ARGUS_CLICKHOUSE_URL, else chDB."""
    from argus.sinks import open_store

    if settings.clickhouse_url:
        return open_store(
            url=settings.clickhouse_url,
            username=settings.clickhouse_user or None,
            password=settings.clickhouse_password or None,
            database=settings.clickhouse_database or None,
            ca_cert=settings.clickhouse_ca or None,
        )
    private_dir(settings.home)
    private_dir(settings.data_dir)
    # chDB writes its parts from its own threads with the process umask: files 0600, dirs 0700
    os.umask(os.umask(0o077) | 0o077)
    return open_store(data_dir=settings.data_dir)


def faust_credentials(settings: Settings) -> Any:
    """Faust (aiokafka) credentials equivalent to the librdkafka settings, or None."""
    import ssl

    import faust

    proto = settings.kafka_security_protocol.upper()
    context = None
    if proto in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=settings.kafka_ssl_ca or None)
        if settings.kafka_ssl_cert:
            context.load_cert_chain(
                settings.kafka_ssl_cert,
                settings.kafka_ssl_key or None,
                settings.kafka_ssl_key_password or None,
            )
    if proto.startswith("SASL") and settings.kafka_sasl_mechanism == "OAUTHBEARER":
        return faust.OAuthCredentials(oauth_cb=_aiokafka_token_provider(settings), ssl_context=context)
    if proto.startswith("SASL"):
        return faust.SASLCredentials(
            username=settings.kafka_sasl_username,
            password=settings.kafka_sasl_password,
            mechanism=settings.kafka_sasl_mechanism or "PLAIN",
            ssl_context=context,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def _aiokafka_token_provider(settings: Settings) -> Any:
    """The OAUTHBEARER token for aiokafka (Faust): the same source as librdkafka's ``oauth_cb``."""
    from aiokafka.abc import AbstractTokenProvider

    source = settings.oauth_token()

    class _Provider(AbstractTokenProvider):  # type: ignore[misc]
        async def token(self) -> str:
            return source.current()

        def __repr__(self) -> str:
            return f"<OAUTHBEARER {source!r}>"

    return _Provider()


def stream_config(settings: Settings, **overrides: Any) -> Any:
    """The stream workers' configuration from settings."""
    from argus.detectors import HangConfig
    from argus.streams import AssemblyConfig, StreamConfig

    brokers = ";".join(f"kafka://{b.strip()}" for b in settings.kafka_bootstrap.split(",") if b.strip())
    values: dict[str, Any] = {
        "broker": brokers,
        "credentials": faust_credentials(settings),
        "kafka_config": settings.kafka_client_config(),
        "partitions": settings.kafka_partitions,
        "store": settings.streams_store,
        "datadir": str(private_dir(settings.home / "streams")),  # job names, stacks: 0700, not Faust's 0755
        "assembly": AssemblyConfig(max_wait_s=settings.streams_step_timeout_s),
        "session_timeout_s": settings.streams_session_timeout_s,
        "replication_factor": settings.streams_replication_factor,
        "job_ttl_s": settings.streams_job_ttl_s,
        "hang": HangConfig(
            floor_s=settings.hang_floor_s,
            step_factor=settings.hang_step_factor,
            lost_floor_s=settings.hang_lost_floor_s,
        ),
    }
    values.update(overrides)
    return StreamConfig(**values)
