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
* the relay side (:class:`StepMerger`, pure: the merging core it shares with the stream
  worker's step assembly, :class:`~schemas.PartMerger`) publishes a step's parts as soon
  as every rank the node has for that job arrived, or ``max_wait_s`` after the first part:
  a slow rank's record follows in its own message (the worker assembles steps from any
  number of parts).

Heartbeats take the same way (:class:`HeartbeatMerger`): the relay keeps the latest
heartbeat of each local rank of a job and publishes them as one ``HeartbeatBatch`` per job
per heartbeat period, when every local rank of the job has sent one since the last
batch, or ``heartbeat_max_wait_s`` after the first, whichever comes first: at 8 ranks per
node, 8× fewer heartbeat messages for the workers. Ranks without a relay keep sending
their own ``Heartbeat``; the worker takes both.

Records that do not decode as a ``StepBatch`` or a ``Heartbeat`` are forwarded unchanged
(to the steps or the heartbeats topic, by their schema id), so the worker dead-letters
them exactly as it would have.

Loss window: what the relay holds is in its memory only. A relay killed with SIGKILL
loses the step parts it held (at most ``max_wait_s``, 0.2 s of steps) and the heartbeats it
held (at most ``heartbeat_max_wait_s``, 2 s), plus what its publisher had not yet handed to
Kafka or its spool. A lost step part shows as missing ranks of that step; a lost heartbeat
is one beat of a rank that sends one every few seconds (the hang detector calls a rank lost
only after ``3 ×`` its interval). A clean stop (SIGTERM) publishes everything it holds.

Only the node's own ranks write through the relay. Every datagram carries its sender's
credentials (``SO_PASSCRED``: the kernel attaches the sending process's pid, uid and gid
to each datagram, which cannot be forged without CAP_SETUID); a datagram from a uid or
primary gid not allowed (by default: the relay's own uid) is refused, counted in
``refused["peer"]`` and never forwarded. A datagram over ``max_datagram`` bytes (a
one-row step record is under 2 KB) is refused the same way (``refused["size"]``): rank
clients send such a record to Kafka directly instead. The socket's directory is made 0750
and the socket 0660: ranks reach it through the directory's group. A directory it was given
is never chmodded: in one writable by others (``/tmp``) it makes its own private
subdirectory, ``argus-relay/``, and serves there (:func:`served_path`, which the rank side
resolves the same way).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol

from argus.schemas import (
    HEARTBEATS,
    SCHEMAS,
    STEPS,
    Heartbeat,
    HeartbeatBatch,
    Record,
    SchemaError,
    StepBatch,
    decode_many,
    job_key,
    peek_schema_id,
    step_key,
)

from ._errors import RelayError
from ._node_merge import HeartbeatMerger, R, StepMerger

__all__ = [
    "MAX_DATAGRAM",
    "RELAYED_TOPICS",
    "HeartbeatMerger",
    "NodeRelay",
    "RelayClient",
    "RelayError",
    "StepMerger",
    "served_path",
]

_OWN_DIR = "argus-relay"


def served_path(path: str | Path) -> Path:
    """Where the relay configured at ``path`` serves its socket, as both ends resolve it:
    ``path`` itself, or ``<dir>/argus-relay/<name>`` when ``path``'s directory is writable
    by others (``/tmp``: 1777): a private subdirectory the relay makes there, because it
    never changes the mode of a directory it was given (0750 on ``/tmp`` locked every other
    user out of it)."""
    p = Path(path)
    try:
        shared = p.parent.stat().st_mode & 0o022
    except OSError:  # not there (yet): the relay creates it, private
        return p
    return p.parent / _OWN_DIR / p.name if shared else p


RELAYED_TOPICS = frozenset({STEPS, HEARTBEATS})
"""The topics whose records a rank's publisher hands to the relay."""
_HEARTBEAT_IDS = frozenset(sid for sid, info in SCHEMAS.items() if info.record_type is Heartbeat)

log = logging.getLogger("argus.relay")

MAX_DATAGRAM = 64 << 10
"""The largest datagram the relay takes (a one-row step record is well under 2 KB)."""
_MAX_BATCH = 512
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
_CRED_SPACE = socket.CMSG_SPACE(_UCRED.size)
_LOG_EVERY_S = 60.0
_THIS_RECORD_ONLY = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.EMSGSIZE})


class Sink(Protocol):
    """Where the relay publishes (a :class:`~producers.publisher.Publisher`)."""

    def publish(self, topic: str, key: bytes, record: Record) -> None: ...

    def publish_raw(self, topic: str, key: bytes, value: bytes) -> None: ...


@dataclass
class _Lane(Generic[R]):
    """One kind of record the relay merges: its topic and type, its merger, the Kafka key of
    a record or batch, how a log names a record, and which records it may merge at all (the
    others go on as the rank sent them)."""

    topic: str
    expect: type[R]
    merger: StepMerger | HeartbeatMerger
    key: Callable[[Any], bytes]
    name: Callable[[R], str]
    takes: Callable[[R], bool] = lambda _: True
    published: int = 0


class NodeRelay:
    """Serve the relay socket: receive rank records, merge per step, publish.

    Args:
        path: the Unix socket path (``ARGUS_RELAY_SOCKET``); its directory is created 0750.
        sink: where merged batches go (the node agent's publisher, with its spool).
        max_wait_s: how long a step waits for the node's other ranks.
        heartbeat_max_wait_s: how long a heartbeat waits for the node's other ranks' ones.
        allowed_uids: senders whose uid is one of these are served; None: the relay's own
            uid (``ARGUS_RELAY_ALLOWED_UIDS``).
        allowed_gids: senders whose primary gid is one of these are served too
            (``ARGUS_RELAY_ALLOWED_GIDS``).
        max_datagram: larger datagrams are refused and counted.

    Counters: ``received`` (datagrams served), ``published`` (step batches),
    ``published_heartbeats`` (heartbeat batches), ``forwarded_undecodable``,
    ``refused`` (Counter by reason: ``peer``, ``size``, ``no credentials``).
    """

    def __init__(
        self,
        path: str | Path,
        sink: Sink,
        *,
        max_wait_s: float = 0.2,
        heartbeat_max_wait_s: float = 2.0,
        allowed_uids: Iterable[int] | None = None,
        allowed_gids: Iterable[int] = (),
        max_datagram: int = MAX_DATAGRAM,
    ) -> None:
        if max_datagram < 1:
            raise ValueError("max_datagram must be positive")
        self.path = Path(path)
        self.sink = sink
        self.merger = StepMerger(max_wait_s)
        self.beats = HeartbeatMerger(heartbeat_max_wait_s)
        self._step_lane = _Lane(
            STEPS,
            StepBatch,
            self.merger,
            lambda b: step_key(b.job, b.step),
            lambda p: f"a part of step {p.step}",
        )
        self._beat_lane = _Lane(
            HEARTBEATS,
            Heartbeat,
            self.beats,
            lambda b: job_key(b.job),
            lambda b: f"a heartbeat of rank {b.rank}",
            takes=HeartbeatBatch.takes,
        )
        self.allowed_uids = frozenset({os.geteuid()} if allowed_uids is None else allowed_uids)
        self.allowed_gids = frozenset(allowed_gids)
        self.max_datagram = max_datagram
        self.received = 0
        self.forwarded_undecodable = 0
        self.refused: Counter[str] = Counter()
        self._logged_at: dict[str, float] = {}
        self._inode = 0
        self._buf = bytearray(max_datagram)
        self._sock = self._bind()

    def _bind(self) -> socket.socket:
        self.path = self._private_dir()
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
            # every datagram then carries its sender's pid/uid/gid, filled in by the kernel
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(str(self.path))
            # The directory's group reaches it (0750); who may write is checked per datagram.
            os.chmod(self.path, 0o660)
            self._inode = self.path.stat().st_ino
        except OSError as exc:
            sock.close()
            raise RelayError(f"cannot serve {self.path}: {exc.strerror}") from None
        sock.setblocking(False)
        return sock

    def _private_dir(self) -> Path:
        """The socket's path (:func:`served_path`), its directory made private (0750) where
        the relay creates it: a missing directory, or its own subdirectory of a shared one.
        A directory it was given is never chmodded."""
        parent = self.path.parent
        existed = parent.is_dir()
        try:
            parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            if not existed:
                os.chmod(parent, 0o750)  # mkdir's mode is cut by the umask
        except OSError as exc:
            raise RelayError(f"cannot create {parent}: {exc.strerror}") from None
        served = served_path(self.path)
        if served == self.path:
            return served
        own = served.parent
        try:
            own.mkdir(mode=0o750, exist_ok=True)
            st = own.lstat()
        except OSError as exc:
            raise RelayError(f"cannot create {own}: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            # someone else made it in the shared directory first: it is not private
            raise RelayError(f"cannot serve in {own}: it exists and is not a directory of this user's")
        if stat.S_IMODE(st.st_mode) != 0o750:
            os.chmod(own, 0o750)  # our own subdirectory
        log.info(
            "%s is shared (mode %o): serving the relay in %s",
            parent,
            stat.S_IMODE(parent.stat().st_mode),
            own,
        )
        return served

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
                    self._round(min(0.05, self.merger.max_wait_s / 2))
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
                for lane in (self._step_lane, self._beat_lane):
                    for batch in lane.merger.drain():
                        self._send(lane, batch)
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
        for lane in (self._step_lane, self._beat_lane):
            for batch in lane.merger.due(now):
                self._send(lane, batch)
        return len(raws)

    def _receive(self, timeout: float) -> list[bytes]:
        """Wait up to ``timeout`` for datagrams; take all that are queued (at most _MAX_BATCH),
        keeping those of allowed senders within the size bound."""
        raws: list[bytes] = []
        if not select.select([self._sock], [], [], timeout)[0]:
            return raws
        view = memoryview(self._buf)
        for _ in range(_MAX_BATCH):
            try:
                n, anc, flags, _addr = self._sock.recvmsg_into([view], _CRED_SPACE)
            except BlockingIOError:
                break
            reason = self._refusal(anc, flags)
            if reason is None:
                raws.append(bytes(view[:n]))
        return raws

    def _refusal(self, anc: list[tuple[int, int, bytes]], flags: int) -> str | None:
        """Why a datagram is refused (counted and logged), or None to serve it."""
        cred = None
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
                cred = _UCRED.unpack_from(data)
        if cred is None:
            reason, detail = "no credentials", "a datagram without sender credentials"
        elif cred[1] not in self.allowed_uids and cred[2] not in self.allowed_gids:
            reason = "peer"
            detail = f"a datagram from pid {cred[0]} uid {cred[1]} gid {cred[2]} (not an allowed uid or gid)"
        elif flags & socket.MSG_TRUNC:
            reason, detail = "size", f"a datagram over {self.max_datagram} bytes from pid {cred[0]}"
        else:
            return None
        self.refused[reason] += 1
        now = time.monotonic()
        if now - self._logged_at.get(reason, -_LOG_EVERY_S) >= _LOG_EVERY_S:
            self._logged_at[reason] = now
            log.warning(
                "node relay at %s refused %s (%d refused so far for this reason)",
                self.path,
                detail,
                self.refused[reason],
            )
        return reason

    def _take(self, raws: list[bytes], now: float) -> None:
        beats = [raw for raw in raws if _is_heartbeat(raw)]
        if beats:
            raws = [raw for raw in raws if not _is_heartbeat(raw)]
            self._take_lane(self._beat_lane, beats, now)
        self._take_lane(self._step_lane, raws, now)

    def _take_lane(self, lane: _Lane[Any], raws: list[bytes], now: float) -> None:
        # One decode for all: the records' columns are range-checked in one vectorized pass.
        for raw, record in zip(raws, decode_many(raws, expect=lane.expect), strict=True):
            if isinstance(record, SchemaError):
                self.forwarded_undecodable += 1
                self.sink.publish_raw(lane.topic, b"", raw)
                continue
            if not lane.takes(record):  # e.g. a heartbeat with a newline in its text: it goes on alone
                self.sink.publish_raw(lane.topic, lane.key(record), raw)
                continue
            try:
                released = lane.merger.add(record, now)
            except Exception:  # never lose a record: it goes on as the rank sent it
                log.exception("node relay: cannot merge %s (forwarded as is)", lane.name(record))
                self.sink.publish_raw(lane.topic, lane.key(record), raw)
                continue
            for batch in released:
                self._send(lane, batch)

    def _send(self, lane: _Lane[Any], batch: StepBatch | HeartbeatBatch) -> None:
        self.sink.publish(lane.topic, lane.key(batch), batch)
        lane.published += 1

    @property
    def published(self) -> int:
        """Step batches published."""
        return self._step_lane.published

    @property
    def published_heartbeats(self) -> int:
        """Heartbeat batches published."""
        return self._beat_lane.published

    def stats(self) -> dict[str, int]:
        """Counters for logs."""
        return {
            "received": self.received,
            "published": self.published,
            "published_heartbeats": self.published_heartbeats,
            "held_heartbeats": self.beats.held,
            "open_steps": self.merger.open_steps,
            "forwarded_undecodable": self.forwarded_undecodable,
            "refused": sum(self.refused.values()),
            **{f"refused_{k.replace(' ', '_')}": v for k, v in sorted(self.refused.items())},
        }


def _is_heartbeat(raw: bytes) -> bool:
    try:
        return peek_schema_id(raw) in _HEARTBEAT_IDS
    except SchemaError:
        return False


class RelayClient:
    """The rank side: send encoded step records and heartbeats to the node relay, never blocking.

    ``send`` returns False when the record must go to Kafka directly: no relay socket,
    the relay went away, or its queue is full (``net.unix.max_dgram_qlen`` datagrams, 10
    by default: a burst). After the relay was absent or gone it is not tried again for
    ``retry_s``.
    """

    def __init__(self, path: str | Path, retry_s: float = 5.0) -> None:
        self.path = str(path)  # the relay's configured path: resolved at each connect (served_path)
        self.retry_s = retry_s
        self._sock: socket.socket | None = None
        self._retry_at = 0.0

    def send(self, value: bytes) -> bool:
        """Hand one encoded record to the relay; False if it did not take it."""
        if len(value) > MAX_DATAGRAM:  # the relay would refuse it: straight to Kafka
            return False
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
            self._sock.connect(str(served_path(self.path)))
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
