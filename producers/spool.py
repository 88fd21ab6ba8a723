"""A bounded on-disk spool of encoded records, replayed in the order they were written.

Records are appended to segment files (``<number>.seg``) in one directory; a record is a
header ``>HII`` (topic, key and value lengths) followed by the three byte strings. Segments
are read in number order; a segment is deleted once every record in it was handed out and
the caller confirmed delivery (:meth:`Spool.commit`), so a crash replays at least what was
not confirmed (at-least-once; the sinks deduplicate). Records older than everything spooled
(still in flight when a process shut down) go through :meth:`Spool.prepend` into a segment
numbered before the others. Segments left by an earlier process are replayed first.

Plain file I/O, no Kafka: the publisher decides what goes in and when it comes out.
"""

from __future__ import annotations

import builtins
import logging
import os
import struct
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["Spool", "SpoolRecord"]

log = logging.getLogger("argus.spool")

_HEAD = struct.Struct(">HII")
_FIRST = 10**12  # segment numbers start here so that prepends can count down
SpoolRecord = tuple[str, bytes, bytes]
"""(topic, key, value) as written."""


def _pack(records: Iterable[SpoolRecord]) -> bytes:
    buf = bytearray()
    for topic, key, value in records:
        t = topic.encode()
        buf += _HEAD.pack(len(t), len(key), len(value))
        buf += t + key + value
    return bytes(buf)


def _unpack(data: bytes, pos: int, limit: int) -> tuple[list[SpoolRecord], int]:
    """Up to ``limit`` whole records of ``data`` from ``pos``; the position after them."""
    out: list[SpoolRecord] = []
    while len(out) < limit and pos + _HEAD.size <= len(data):
        if len(out) % 256 == 255:
            time.sleep(0)  # a replay thread must not hold the GIL for long
        t, k, v = _HEAD.unpack_from(data, pos)
        o = pos + _HEAD.size
        end = o + t + k + v
        if end > len(data):
            break
        out.append((data[o : o + t].decode(), data[o + t : o + t + k], data[o + t + k : end]))
        pos = end
    return out, pos


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
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._segments = sorted(int(p.stem) for p in self.dir.glob("*.seg") if p.stem.isdigit())
        self._bytes = sum(self._path(n).stat().st_size for n in self._segments)
        self._records = 0
        for n in self._segments:
            data = self._path(n).read_bytes()
            recs, end = _unpack(data, 0, len(data))
            if end < len(data):
                log.warning(
                    "spool segment %s ends in a torn record (%d bytes); it is ignored", n, len(data) - end
                )
            self._records += len(recs)
        self._cursor: tuple[int, int] | None = None  # (segment, byte position) of the next read
        self._done: list[int] = []  # segments read to the end, not yet committed

    @property
    def bytes(self) -> int:
        """Bytes on disk (including records handed out but not committed)."""
        return self._bytes

    def __len__(self) -> int:
        """Records on disk not yet handed out by :meth:`read`."""
        return self._records

    def _path(self, n: int) -> Path:
        return self.dir / f"{n}.seg"

    def _fit(self, records: Iterable[SpoolRecord]) -> tuple[list[SpoolRecord], int]:
        """The leading records that fit within ``max_bytes``, and how many did not."""
        room = self.max_bytes - self._bytes
        kept: list[SpoolRecord] = []
        rejected = 0
        for rec in records:
            size = _HEAD.size + len(rec[0]) + len(rec[1]) + len(rec[2])
            if rejected or size > room:
                rejected += 1  # keep order: after one record does not fit, none goes in
                continue
            kept.append(rec)
            room -= size
        return kept, rejected

    def _write(self, number: int, data: builtins.bytes) -> None:
        with open(self._path(number), "ab") as f:
            f.write(data)
        self._bytes += len(data)

    def append(self, records: Iterable[SpoolRecord]) -> int:
        """Append records at the tail; return how many did not fit (the caller counts them)."""
        kept, rejected = self._fit(records)
        if not kept:
            return rejected
        data = _pack(kept)
        last = self._segments[-1] if self._segments else None
        if last is None or last in self._done or self._path(last).stat().st_size >= self.segment_bytes:
            last = (last + 1) if last is not None else _FIRST
            self._segments.append(last)
        self._write(last, data)
        self._records += len(kept)
        return rejected

    def prepend(self, records: Iterable[SpoolRecord]) -> int:
        """Write records before everything spooled (they are older); return how many did not fit."""
        kept, rejected = self._fit(records)
        if not kept:
            return rejected
        number = (self._segments[0] - 1) if self._segments else _FIRST
        self._write(number, _pack(kept))
        self._segments.insert(0, number)
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
            pos = self._cursor[1] if self._cursor and self._cursor[0] == seg else 0
            with open(self._path(seg), "rb") as f:
                f.seek(pos)
                data = f.read()
            want = limit - len(out)
            recs, used = _unpack(data, 0, want)
            out.extend(recs)
            if used == len(data) or len(recs) < want:  # read to the end (or to a torn tail)
                self._done.append(seg)
                self._cursor = None
            else:
                self._cursor = (seg, pos + used)
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
        self._done.clear()
