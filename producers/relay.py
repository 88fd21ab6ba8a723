"""The node relay: one Kafka message per step per node instead of one per rank.

A rank agent publishes a one-row ``StepBatch`` per step. At 10,000 GPUs that is 10,000
Kafka messages per step, and a stream worker's cost is per message (about 8,000 messages/s
each, whatever their size). The relay runs in ``argus node-agent`` on every GPU node: the
rank agents of the node send their step records to it over a Unix datagram socket, and it
publishes one ``StepBatch`` per step with all of the node's ranks (8 per message on an
8-GPU node, 8× fewer messages for the workers).

The relay never sits on the training path:

* the rank side (:class:`RelayClient`, used by the rank's publisher thread) sends without
  blocking; if the relay is absent, gone or its queue is full, the record goes straight
  to Kafka as before, and the relay is tried again a few seconds later;
* the relay side (:class:`StepMerger`, pure) publishes a step's parts as soon as every
  rank the node has for that job arrived, or ``linger_s`` after the first part: a slow
  rank's record follows in its own message (the worker assembles steps from any number
  of parts).

Records that do not decode as a ``StepBatch`` are forwarded unchanged, so the worker
dead-letters them exactly as it would have.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from argus.schemas import STEPS, Record, SchemaError, StepBatch, decode_many, step_key

__all__ = ["NodeRelay", "RelayClient", "RelayError", "StepMerger"]

log = logging.getLogger("argus.relay")

_MAX_DATAGRAM = 1 << 20
_MAX_BATCH = 512
_THIS_RECORD_ONLY = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.EMSGSIZE})


class RelayError(Exception):
    """The relay cannot serve its socket (served by a live relay, not a socket, not creatable)."""


@dataclass
class _Group:
    first: float
    parts: list[StepBatch] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)


class StepMerger:
    """Merge the parts of each (job, run, step) that reach this node.

    A job's rank count on the node is learned from what arrives: the most ranks seen in
    one step. A step is released when it has that many, or ``linger_s`` after its first
    part, whichever comes first. A job silent for ``forget_s`` is forgotten.
    """

    def __init__(self, linger_s: float = 0.2, max_open: int = 4096, forget_s: float = 3600.0) -> None:
        if linger_s <= 0 or max_open < 1 or forget_s <= 0:
            raise ValueError("linger_s, max_open and forget_s must be positive")
        self.linger_s = linger_s
        self.max_open = max_open
        self.forget_s = forget_s
        self._open: dict[tuple[str, int, int], _Group] = {}
        self._local_ranks: dict[tuple[str, int], int] = {}
        self._last_seen: dict[tuple[str, int], float] = {}
        self._next_prune = 0.0

    @property
    def open_steps(self) -> int:
        """Steps holding parts now."""
        return len(self._open)

    def add(self, part: StepBatch, now: float) -> list[StepBatch]:
        """Take one part; return the steps it completes (at most one) or the oldest when full."""
        key = (part.job, part.run, part.step)
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = _Group(now)
        group.parts.append(part)
        group.ranks.update(part["rank"].tolist())  # a retried rank counts once
        job = (part.job, part.run)
        self._last_seen[job] = now
        if len(group.ranks) >= self._local_ranks.get(job, 1 << 62):
            return [self._release(key)]
        if len(self._open) > self.max_open:
            return [self._release(next(iter(self._open)))]
        return []

    def due(self, now: float) -> list[StepBatch]:
        """Steps whose first part is ``linger_s`` old."""
        if now >= self._next_prune:
            self._next_prune = now + 60.0
            for job in [j for j, t in self._last_seen.items() if now - t > self.forget_s]:
                del self._last_seen[job]
                self._local_ranks.pop(job, None)
        late = [k for k, g in self._open.items() if now - g.first >= self.linger_s]
        return [self._release(k) for k in late]

    def drain(self) -> list[StepBatch]:
        """Everything held (at shutdown)."""
        return [self._release(k) for k in list(self._open)]

    def _release(self, key: tuple[str, int, int]) -> StepBatch:
        group = self._open.pop(key)
        job = (key[0], key[1])
        self._local_ranks[job] = max(self._local_ranks.get(job, 0), len(group.ranks))
        return StepBatch.concat(group.parts)


class Sink(Protocol):
    """Where the relay publishes (a :class:`~producers.publisher.Publisher`)."""

    def publish(self, topic: str, key: bytes, record: Record) -> None: ...

    def publish_raw(self, topic: str, key: bytes, value: bytes) -> None: ...


class NodeRelay:
    """Serve the relay socket: receive rank records, merge per step, publish.

    Args:
        path: the Unix socket path (``ARGUS_RELAY_SOCKET``); its directory is created.
        sink: where merged batches go (the node agent's publisher, with its spool).
        linger_s: how long a step waits for the node's other ranks.
    """

    def __init__(
        self,
        path: str | Path,
        sink: Sink,
        *,
        linger_s: float = 0.2,
    ) -> None:
        self.path = Path(path)
        self.sink = sink
        self.merger = StepMerger(linger_s)
        self.received = 0
        self.published = 0
        self.forwarded_undecodable = 0
        self._inode = 0
        self._buf = bytearray(_MAX_DATAGRAM)
        self._sock = self._bind()

    def _bind(self) -> socket.socket:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RelayError(f"cannot create {self.path.parent}: {exc.strerror}") from None
        try:
            mode = self.path.lstat().st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise RelayError(f"cannot serve {self.path}: {exc.strerror}") from None
        if mode is not None:
            if not stat.S_ISSOCK(mode):
                raise RelayError(f"cannot serve {self.path}: it exists and is not a socket")
            self._remove_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(str(self.path))
            # Training pods may run as any user; access is governed by who mounts the directory.
            os.chmod(self.path, 0o666)
            self._inode = self.path.stat().st_ino
        except OSError as exc:
            sock.close()
            raise RelayError(f"cannot serve {self.path}: {exc.strerror}") from None
        sock.setblocking(False)
        return sock

    def _remove_stale(self) -> None:
        """Remove a dead relay's socket; refuse one that a live relay serves."""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(str(self.path))
        except ConnectionRefusedError:
            pass  # nobody bound to it: a dead relay's socket
        except OSError as exc:
            raise RelayError(f"cannot serve {self.path}: {exc.strerror}") from None
        else:
            raise RelayError(f"another relay is serving {self.path}")
        finally:
            probe.close()
        try:
            self.path.unlink()
        except OSError as exc:
            raise RelayError(f"cannot replace the dead relay socket {self.path}: {exc.strerror}") from None

    def serve(self, stop: threading.Event) -> None:
        """Receive and publish until ``stop``; then publish everything taken, and stop taking.

        At the end the socket stops receiving first (ranks sending after that get an error
        and go to Kafka directly), then what is still queued in it is read and published:
        a record a rank handed to the relay is never dropped by a clean stop.
        """
        try:
            while not stop.is_set():
                try:
                    self._round(min(0.05, self.merger.linger_s / 2))
                except Exception:  # a relay that stops would only send the ranks to Kafka
                    log.exception("node relay error (continuing)")
                    time.sleep(0.1)
        finally:
            try:
                self._unlink_own()
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RD)
                while self._round(0.0):
                    pass
            finally:
                for batch in self.merger.drain():
                    self._send(batch)
                self._sock.close()

    def _unlink_own(self) -> None:
        """Remove the socket file, unless another relay has replaced it since."""
        with contextlib.suppress(OSError):
            if self.path.stat().st_ino == self._inode:
                self.path.unlink()

    def _round(self, timeout: float) -> int:
        """Take what arrives within ``timeout``, publish steps that are due; datagrams taken."""
        raws = self._receive(timeout)
        now = time.monotonic()
        if raws:
            self.received += len(raws)
            self._take(raws, now)
        for batch in self.merger.due(now):
            self._send(batch)
        return len(raws)

    def _receive(self, timeout: float) -> list[bytes]:
        """Wait up to ``timeout`` for datagrams; take all that are queued (at most _MAX_BATCH)."""
        raws: list[bytes] = []
        if not select.select([self._sock], [], [], timeout)[0]:
            return raws
        while len(raws) < _MAX_BATCH:
            try:
                n = self._sock.recv_into(self._buf)
            except BlockingIOError:
                break
            raws.append(bytes(self._buf[:n]))
        return raws

    def _take(self, raws: list[bytes], now: float) -> None:
        # One decode for all: the parts' columns are range-checked in one vectorized pass.
        for raw, part in zip(raws, decode_many(raws, expect=StepBatch), strict=True):
            if isinstance(part, SchemaError):
                self.forwarded_undecodable += 1
                self.sink.publish_raw(STEPS, b"", raw)
                continue
            try:
                released = self.merger.add(part, now)
            except Exception:  # never lose a part: it goes on as the rank sent it
                log.exception("node relay: cannot merge a part of step %d (forwarded as is)", part.step)
                self.sink.publish_raw(STEPS, step_key(part.job, part.step), raw)
                continue
            for batch in released:
                self._send(batch)

    def _send(self, batch: StepBatch) -> None:
        self.sink.publish(STEPS, step_key(batch.job, batch.step), batch)
        self.published += 1

    def stats(self) -> dict[str, int]:
        """Counters for logs."""
        return {
            "received": self.received,
            "published": self.published,
            "open_steps": self.merger.open_steps,
            "forwarded_undecodable": self.forwarded_undecodable,
        }


class RelayClient:
    """The rank side: send encoded step records to the node relay, never blocking.

    ``send`` returns False when the record must go to Kafka directly: no relay socket,
    the relay went away, or its queue is full (``net.unix.max_dgram_qlen`` datagrams, 10
    by default: a burst). After the relay was absent or gone it is not tried again for
    ``retry_s``.
    """

    def __init__(self, path: str | Path, retry_s: float = 5.0) -> None:
        self.path = str(path)
        self.retry_s = retry_s
        self._sock: socket.socket | None = None
        self._retry_at = 0.0

    def send(self, value: bytes) -> bool:
        """Hand one encoded record to the relay; False if it did not take it."""
        sock = self._sock
        if sock is None:
            if time.monotonic() < self._retry_at:
                return False
            sock = self._connect()
            if sock is None:
                return False
        try:
            sock.send(value)
            return True
        except OSError as exc:
            if exc.errno in _THIS_RECORD_ONLY:  # a burst, or one record too big: it goes direct
                return False
            log.info("node relay at %s unusable (%s): publishing to Kafka directly", self.path, exc)
            self._drop()
            return False

    def _connect(self) -> socket.socket | None:
        try:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
            self._sock.connect(self.path)
        except OSError:  # no relay (yet), or out of file descriptors
            self._drop()
        return self._sock

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._retry_at = time.monotonic() + self.retry_s

    def close(self) -> None:
        """Close the socket."""
        self._drop()
