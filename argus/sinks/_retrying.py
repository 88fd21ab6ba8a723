"""The sink's store connection: opened on first use, a call retried only while the store
is unavailable (OpenTelemetry's exporter retries: jittered, capped backoff within one
deadline, cut short by a stop), its outage recorded for the health probes."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from ._errors import QueryError, SinkError, StoreLockedError, StoreUnavailableError
from .store import Store

__all__ = ["RetryingStore", "Stopped"]

log = logging.getLogger("argus.sink")

_T = TypeVar("_T")


class Stopped(SinkError):
    """The sink was stopped while a write waited for the store (the batch is replayed later)."""


class _Outage(Protocol):
    """The counters the retries keep (:class:`argus.sinks.kafka_sink.SinkStats`)."""

    insert_retries: int
    store_down_since: float | None


class RetryingStore:
    """A store opened by ``open_store`` when first needed and again after it failed;
    :meth:`call` retries only what an unavailable store refused."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        stats: _Outage,
        *,
        max_backoff_s: float,
        retry_deadline_s: float,
        stopping: threading.Event,
        stopped: Callable[[], bool],
    ) -> None:
        self._open_store = open_store
        self._stats = stats
        self._max_backoff = max_backoff_s
        self.retry_deadline_s = retry_deadline_s
        self._stopping = stopping
        self._stopped = stopped
        self.store: Store | None = None
        self.answered: float | None = None
        """When the store last answered (monotonic), a rejection included; None: never yet."""

    def call(self, what: str, call: Callable[[Store], _T]) -> _T:
        """``call(store)``, retried only while the store is unavailable: jittered backoff
        within ``retry_deadline_s``, cut short by a stop. Raises :class:`QueryError` when the
        store rejects it, :class:`SinkError` when the deadline passed or the sink stopped."""
        backoff = 0.2
        attempt = 0
        deadline = time.monotonic() + self.retry_deadline_s
        while True:
            try:
                if self.store is None:
                    self.store = self._open_store()
                result = call(self.store)
                self.answered = time.monotonic()
                if self._stats.store_down_since is not None:
                    log.warning(
                        "ClickHouse is back after %.1f s", time.monotonic() - self._stats.store_down_since
                    )
                    self._stats.store_down_since = None
                return result
            except (StoreUnavailableError, StoreLockedError) as exc:
                attempt += 1
                self._stats.insert_retries += 1
                if self._stats.store_down_since is None:
                    self._stats.store_down_since = time.monotonic()
                self.drop()
                delay = random.uniform(backoff / 2, backoff)  # jitter: sinks do not retry in step
                if self._stopped():
                    raise Stopped(f"stopped while trying to {what}: {exc}") from exc
                if time.monotonic() + delay > deadline:
                    raise SinkError(
                        f"ClickHouse unavailable for {self.retry_deadline_s:.0f} s ({what}, "
                        f"{attempt} attempts): {exc}"
                    ) from exc
                log.warning(
                    "%s failed (attempt %d): %s; retrying in %.1f s",
                    what,
                    attempt,
                    str(exc)[:200],
                    delay,
                )
                end = time.monotonic() + delay  # the consumer thread keeps the group alive meanwhile
                while not self._stopped() and time.monotonic() < end:
                    self._stopping.wait(min(0.1, max(end - time.monotonic(), 0.0)))
                backoff = min(backoff * 2, self._max_backoff)
            except QueryError:
                self.answered = time.monotonic()
                if self._stats.store_down_since is not None:
                    self._stats.store_down_since = None  # it answered: it is up
                raise

    def drop(self) -> None:
        """Close the store (it is opened again on the next call)."""
        if self.store is not None:
            try:
                self.store.close()
            finally:
                self.store = None
