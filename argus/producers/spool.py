"""A bounded on-disk spool of encoded records, replayed in the order they were written.

Records are appended to segment files (``<number>.seg``) in one directory. Each record is
a frame: a header ``>II`` (payload length, CRC-32 of the payload) and the payload, itself
``>HII`` (topic, key and value lengths) followed by the three byte strings. A frame that is
cut short or fails its checksum ends the segment's readable part (a *torn tail*: a crash
or a full disk mid-write); nothing is ever appended after one: a segment found torn when
the spool opens, or whose write failed and could not be taken back, is sealed and new
records go to a new segment. A failed write is truncated back when the file system allows
it, and :attr:`Spool.bytes` always counts what is on disk.

Segments are read in number order; a segment is deleted once every record in it was
handed out and the caller confirmed delivery (:meth:`Spool.commit`), so a crash replays at
least what was not confirmed (at-least-once; the sinks deduplicate). Records older than
everything spooled (still in flight when a process shut down, or handed out by a replay
that librdkafka did not take) go through :meth:`Spool.prepend` into a segment numbered
before the others; each segment keeps its own read position, so a prepend after a partial
replay does not make the replay start over. Segments left by an earlier process are
replayed first. Directories are created 0700 and segment files 0600: records may hold
stack frames, host names and job names.

Plain file I/O, no Kafka: the publisher decides what goes in and when it comes out.
"""

from __future__ import annotations

import builtins
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterable
from pathlib import Path

__all__ = ["Spool", "SpoolRecord", "private_dir"]

log = logging.getLogger("argus.spool")

_FRAME = struct.Struct(">II")  # payload length, CRC-32 of the payload
_HEAD = struct.Struct(">HII")  # topic, key and value lengths
_MAX_PAYLOAD = 1 << 28  # a length beyond this is a torn or corrupt frame, never a record
_FIRST = 10**12  # segment numbers start here so that prepends can count down
SpoolRecord = tuple[str, bytes, bytes]
"""(topic, key, value) as written."""


def _frame_size(rec: SpoolRecord) -> int:
    return _FRAME.size + _HEAD.size + len(rec[0].encode()) + len(rec[1]) + len(rec[2])


def _pack(records: Iterable[SpoolRecord]) -> bytes:
    buf = bytearray()
    for topic, key, value in records:
        t = topic.encode()
        payload = _HEAD.pack(len(t), len(key), len(value)) + t + key + value
        buf += _FRAME.pack(len(payload), zlib.crc32(payload))
        buf += payload
    return bytes(buf)


def _unpack(data: bytes, pos: int, limit: int) -> tuple[list[SpoolRecord], int, bool]:
    """Up to ``limit`` whole, intact records of ``data`` from ``pos``; the position after
    them; and whether the bytes there are a torn or corrupt frame (not simply the end)."""
    out: list[SpoolRecord] = []
    while len(out) < limit:
        if pos == len(data):
            return out, pos, False
        if len(out) % 256 == 255:
            time.sleep(0)  # a replay thread must not hold the GIL for long
        if pos + _FRAME.size > len(data):
            return out, pos, True
        size, crc = _FRAME.unpack_from(data, pos)
        start = pos + _FRAME.size
        end = start + size
        if size < _HEAD.size or size > _MAX_PAYLOAD or end > len(data):
            return out, pos, True
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            return out, pos, True
        t, k, v = _HEAD.unpack_from(payload, 0)
        if _HEAD.size + t + k + v != size:
            return out, pos, True
        o = _HEAD.size
        try:
            topic = payload[o : o + t].decode()
        except UnicodeDecodeError:
            return out, pos, True
        out.append((topic, payload[o + t : o + t + k], payload[o + t + k :]))
        pos = end
    return out, pos, False


def private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents 0700 (mkdir's ``parents`` would make them with
    the umask's mode); tighten ``path`` to 0700 if it exists. Returns ``path``.

    The spool, ARGUS_HOME and the chDB data hold job names, hosts, stacks and kernel
    names: nobody else on the machine reads them."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_mode & 0o077:
        try:
            os.chmod(path, 0o700)
        except OSError as exc:  # not ours: say so, go on (the files stay 0600)
            log.warning("cannot make %s private (0700): %s", path, exc.strerror)
    return path


class Spool:
    """Append-only segments under ``directory``, at most ``max_bytes`` in total.

    Not thread-safe: one owner (the publisher's worker thread) calls every method.
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, max_bytes: int = 1 << 30, segment_bytes: int = 4 << 20
    ) -> None:
        if max_bytes <= 0 or segment_bytes <= 0:
            raise ValueError("max_bytes and segment_bytes must be positive")
        self.dir = Path(directory)
        private_dir(self.dir)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._segments = sorted(int(p.stem) for p in self.dir.glob("*.seg") if p.stem.isdigit())
        self._bytes = 0
        self._records = 0
        self._sealed: set[int] = set()  # torn: never appended to again
        self._ends: dict[int, int] = {}  # torn segment -> end of its intact records
        self.torn_bytes = 0
        """Bytes of torn or corrupt frames found (not replayable; deleted with their segment)."""
        for n in self._segments:
            data = self._path(n).read_bytes()
            self._bytes += len(data)
            recs, end, _torn = _unpack(data, 0, len(data))
            if end < len(data):
                self._sealed.add(n)
                self._ends[n] = end
                self.torn_bytes += len(data) - end
                log.warning(
                    "spool segment %s ends in a torn record (%d bytes); the %d records before it "
                    "replay, new records go to a new segment",
                    n,
                    len(data) - end,
                    len(recs),
                )
            self._records += len(recs)
        self._pos: dict[int, int] = {}  # segment -> byte position of its next read
        self._done: list[int] = []  # segments read to the end, not yet committed

    @property
    def bytes(self) -> int:
        """Bytes on disk (including records handed out but not committed, and torn tails)."""
        return self._bytes

    def __len__(self) -> int:
        """Records on disk not yet handed out by :meth:`read`."""
        return self._records

    def _path(self, n: int) -> Path:
        return self.dir / f"{n}.seg"

    def _size(self, n: int) -> int:
        try:
            return self._path(n).stat().st_size
        except FileNotFoundError:
            return 0

    def _fit(self, records: Iterable[SpoolRecord]) -> tuple[list[SpoolRecord], int]:
        """The leading records that fit within ``max_bytes``, and how many did not."""
        room = self.max_bytes - self._bytes
        kept: list[SpoolRecord] = []
        rejected = 0
        for rec in records:
            size = _frame_size(rec)
            if rejected or size > room:
                rejected += 1  # keep order: after one record does not fit, none goes in
                continue
            kept.append(rec)
            room -= size
        return kept, rejected

    def _write(self, number: int, data: builtins.bytes) -> None:
        """Append ``data`` to segment ``number`` whole, or raise OSError with the segment
        as it was (truncated back) or sealed, and its bytes on disk counted."""
        fd = os.open(self._path(number), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            before = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                done = 0
                while done < len(data):
                    done += os.write(fd, view[done:])
            except OSError:
                try:
                    os.ftruncate(fd, before)
                except OSError:
                    self._sealed.add(number)  # a torn tail stays: nothing goes after it
                try:
                    now = os.fstat(fd).st_size
                except OSError:
                    now = before + done
                    self._sealed.add(number)
                if now > before:
                    self._sealed.add(number)
                    self._ends.setdefault(number, before)
                    self.torn_bytes += now - before
                self._bytes += now - before
                raise
        finally:
            os.close(fd)
        self._bytes += len(data)

    def append(self, records: Iterable[SpoolRecord]) -> int:
        """Append records at the tail; return how many did not fit (the caller counts them).

        Raises OSError when the file system refuses the write (disk full): then none of
        ``records`` is in the spool.
        """
        kept, rejected = self._fit(records)
        if not kept:
            return rejected
        data = _pack(kept)
        last = self._segments[-1] if self._segments else None
        if (
            last is None
            or last in self._done
            or last in self._sealed
            or self._size(last) >= self.segment_bytes
        ):
            last = (last + 1) if last is not None else _FIRST
            self._segments.append(last)
        self._write(last, data)
        self._records += len(kept)
        return rejected

    def prepend(self, records: Iterable[SpoolRecord]) -> int:
        """Write records before everything spooled (they are older); return how many did not fit.

        Raises OSError like :meth:`append`.
        """
        kept, rejected = self._fit(records)
        if not kept:
            return rejected
        number = (self._segments[0] - 1) if self._segments else _FIRST
        self._segments.insert(0, number)
        self._sealed.add(number)  # appends go to the tail, never here
        self._write(number, _pack(kept))
        self._records += len(kept)
        return rejected

    def read(self, limit: int) -> list[SpoolRecord]:
        """Up to ``limit`` records from the head, in order (handed out; deleted on commit)."""
        out: list[SpoolRecord] = []
        for seg in list(self._segments):
            if len(out) >= limit:
                break
            if seg in self._done:
                continue
            pos = self._pos.get(seg, 0)
            try:
                with open(self._path(seg), "rb") as f:
                    f.seek(pos)
                    data = f.read()
            except FileNotFoundError:  # removed under us: nothing to replay there
                data = b""
            want = limit - len(out)
            recs, used, torn = _unpack(data, 0, want)
            out.extend(recs)
            intact_end = self._ends.get(seg)
            at_tail = intact_end is not None and pos + used >= intact_end
            if used == len(data) or torn or at_tail:  # read to the end, or to a torn tail
                if torn and not at_tail:
                    log.warning(
                        "spool segment %s: %d bytes after its last intact record are torn (skipped)",
                        seg,
                        len(data) - used,
                    )
                self._done.append(seg)
                self._pos.pop(seg, None)
            else:
                self._pos[seg] = pos + used
                break
        self._records = max(self._records - len(out), 0)
        return out

    def commit(self) -> None:
        """Everything handed out so far was delivered: delete the segments read to the end."""
        for seg in self._done:
            path = self._path(seg)
            try:
                self._bytes -= path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                pass
            self._segments.remove(seg)
            self._sealed.discard(seg)
            self._ends.pop(seg, None)
        self._done.clear()
