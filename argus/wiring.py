"""Concrete objects built from settings: the one place that knows how parts connect."""

from __future__ import annotations

from typing import Any

from .config import Settings

__all__ = ["open_configured_store"]


def open_configured_store(settings: Settings) -> Any:
    """The ClickHouse store the settings name: a server if ARGUS_CLICKHOUSE_URL, else chDB."""
    from sinks import open_store

    if settings.clickhouse_url:
        return open_store(
            url=settings.clickhouse_url,
            username=settings.clickhouse_user or None,
            password=settings.clickhouse_password or None,
            database=settings.clickhouse_database or None,
            ca_cert=settings.clickhouse_ca or None,
        )
    return open_store(data_dir=settings.data_dir)
