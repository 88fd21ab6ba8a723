"""A sink that keeps what a rank agent publishes (instead of a Kafka publisher)."""

from __future__ import annotations

from typing import Any, TypeVar

from argus.schemas import Record, decode

R = TypeVar("R")


class ListSink:
    """Keeps every record as ``(topic, key, record)``; step messages, which the agent sends
    as wire bytes, are decoded (so a test sees what a worker would read)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, Any]] = []

    def publish(self, topic: str, key: bytes, record: Record | bytes) -> None:
        """Keep one record."""
        self.records.append((topic, key, decode(record) if isinstance(record, bytes) else record))

    def of(self, kind: type[R]) -> list[R]:
        """The records of one type, in the order they came."""
        return [r for _, _, r in self.records if isinstance(r, kind)]
