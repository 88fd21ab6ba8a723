"""Stream the events of a Chrome-trace JSON file (plain or gzip), a chunk at a time.

The ``traceEvents`` array is cut into chunks of about a megabyte at event boundaries
(``}`` ``,`` ``{`` between events) and each chunk is decoded by msgspec into small typed
structs holding only the fields the importer reads, so memory stays bounded by the chunk
whatever the file size. A cut that falls inside a string makes the chunk invalid JSON; the
chunk is then grown to the next boundary, so a wrong cut costs time, never correctness. The
top-level keys around the array (``distributedInfo`` before it, ``baseTimeNanoseconds``
after it in newer traces) land in :attr:`TraceReader.meta`.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from ._errors import TraceError

__all__ = ["Args", "Event", "TraceReader"]


class Args(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` of a trace event that the importer reads (the rest is skipped)."""

    stream: int | None = None
    correlation: int | None = None
    collective: str | None = msgspec.field(name="Collective name", default=None)
    in_nelems: int | None = msgspec.field(name="In msg nelems", default=None)
    out_nelems: int | None = msgspec.field(name="Out msg nelems", default=None)
    group_size: int | None = msgspec.field(name="Group size", default=None)
    dtype: str | None = None
    pg_name: str | None = msgspec.field(name="Process Group Name", default=None)
    pg_ranks: str | None = msgspec.field(name="Process Group Ranks", default=None)


class Event(msgspec.Struct, frozen=True, gc=False):
    """One trace event: phase, category, name, start and duration (µs), args."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    args: Args | None = None


_DECODER = msgspec.json.Decoder(list[Event])
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_WS = re.compile(r"[ \t\n\r]*")
_READ = 4 << 20
_CHUNK = 1 << 20
_MAX_VALUE = 64 << 20  # no single event or header is larger than this


def _tolerant(raw: Any) -> Event | None:
    """An Event from a generic decoded value; None if it is not an event."""
    if not isinstance(raw, dict):
        return None
    try:
        return msgspec.convert(raw, Event, strict=False)
    except msgspec.ValidationError:
        return None


class TraceReader:
    """Iterate the events of one trace file; ``meta`` fills with the other top-level keys.

    ``progress`` is called with the number of on-disk bytes consumed so far. Every problem
    (missing file, not gzip, not JSON, truncated, no ``traceEvents``) raises
    :class:`TraceError` naming the file; events whose fields have unexpected types are
    skipped and counted in :attr:`skipped`.
    """

    def __init__(self, path: str | os.PathLike[str], progress: Callable[[int], None] | None = None) -> None:
        self.path = os.fspath(path)
        self.meta: dict[str, Any] = {}
        self.skipped = 0
        self._progress = progress
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._offset = 0
        self._bare = False

    # -- input -----------------------------------------------------------------------------

    def _read(self, stream: Any, raw: Any) -> bool:
        if self._eof:
            return False
        try:
            data = stream.read(_READ)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(self.path, f"unreadable ({type(exc).__name__}: {exc})") from None
        if self._progress is not None:
            self._progress(raw.tell())
        if not data:
            self._eof = True
            return False
        if self._pos:
            self._offset += self._pos
            self._buf = self._buf[self._pos :]
            self._pos = 0
        self._buf += data
        return True

    def _fail(self, what: str, at: int | None = None) -> TraceError:
        where = f" near byte {self._offset + at}" if at is not None else ""
        return TraceError(self.path, f"{what}{where}")

    def events(self) -> Iterator[Event]:
        """Every trace event, in file order."""
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[Event]]:
        """The trace events in file order, a list (about a megabyte of JSON) at a time."""
        try:
            raw = open(self.path, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise TraceError(self.path, f"cannot open: {exc.strerror or exc}") from None
        with raw:
            stream: Any = gzip.GzipFile(fileobj=raw, mode="rb") if raw.peek(2)[:2] == b"\x1f\x8b" else raw
            self._header(stream, raw)
            yield from self._chunks(stream, raw)
            yield list(self._tail())

    # -- parts of the file -----------------------------------------------------------------

    def _header(self, stream: Any, raw: Any) -> None:
        while True:
            m = _KEY.search(self._buf)
            if m is not None:
                break
            if len(self._buf) > _MAX_VALUE or not self._read(stream, raw):
                head = self._buf.lstrip()[:1]
                if not head:
                    raise self._fail("empty file")
                if head == b"[":  # the bare-array form of the Chrome trace format
                    self._pos = self._buf.index(b"[") + 1
                    self.meta["traceEvents"] = True
                    self._bare = True
                    return
                if head != b"{":
                    raise self._fail("not JSON (a Chrome trace starts with '{')")
                raise self._fail("no traceEvents array")
        prefix = self._buf[: m.start()].strip()
        if not prefix.startswith(b"{"):
            raise self._fail("not a Chrome trace: traceEvents is not a top-level key")
        if prefix.rstrip(b"{ \t\r\n"):  # keys before traceEvents
            try:
                head_meta = json.loads(prefix.rstrip(b",") + b"}")
            except ValueError:
                raise self._fail("not valid JSON before traceEvents") from None
            except RecursionError:
                raise self._fail(
                    "JSON nested too deeply before traceEvents (a Chrome trace is shallow)"
                ) from None
            if isinstance(head_meta, dict):
                self.meta.update(head_meta)
        self.meta["traceEvents"] = True
        self._pos = m.end()

    def _chunks(self, stream: Any, raw: Any) -> Iterator[list[Event]]:
        while True:
            while len(self._buf) - self._pos < 2 * _CHUNK and self._read(stream, raw):
                pass
            if self._eof and len(self._buf) - self._pos < 2 * _CHUNK:
                last = self._last_chunk()
                if last:
                    yield last
                return  # the rest (the last event, the closing keys) goes through _tail
            yield self._decode_chunk(stream, raw)

    def _last_chunk(self) -> list[Event]:
        """At the end of the file: the events up to the last boundary, if they decode fast."""
        m = None
        for m in _BOUNDARY.finditer(self._buf, self._pos):  # noqa: B007 - want the last match
            pass
        if m is None:
            return []
        chunk = b"[" + self._buf[self._pos : m.start() + 1] + b"]"
        try:
            events: list[Event] | None = _DECODER.decode(chunk)
        except msgspec.ValidationError:
            events = self._generic(chunk)
        except msgspec.DecodeError:
            return []  # a cut inside a string: leave it all to the careful path
        if events is None:
            return []
        self._pos = m.end() - 1
        return events

    def _decode_chunk(self, stream: Any, raw: Any) -> list[Event]:
        """Decode the events in the next ~chunk of the buffer and advance past them."""
        window = self._pos + _CHUNK
        for _attempt in range(64):
            m = _BOUNDARY.search(self._buf, window)
            while m is None:
                if len(self._buf) - self._pos > _MAX_VALUE or not self._read(stream, raw):
                    raise self._fail("not valid JSON (no event boundary found)", self._pos)
                m = _BOUNDARY.search(self._buf, window)
            chunk = b"[" + self._buf[self._pos : m.start() + 1] + b"]"
            events: list[Event] | None
            try:
                events = _DECODER.decode(chunk)
            except msgspec.ValidationError:  # valid JSON, odd field types: decode generically
                events = self._generic(chunk)
            except msgspec.DecodeError:  # cut inside a string, or broken JSON: grow
                window = m.end()
                continue
            if events is None:
                window = m.end()
                continue
            self._pos = m.end() - 1
            return events
        raise self._fail("not valid JSON", self._pos)

    def _generic(self, chunk: bytes) -> list[Event] | None:
        try:
            values = msgspec.json.decode(chunk)
        except msgspec.DecodeError:
            return None
        out = []
        for v in values:
            e = _tolerant(v)
            if e is None:
                self.skipped += 1
            else:
                out.append(e)
        return out

    def _tail(self) -> Iterator[Event]:
        """The last events and the keys after the array, decoded one value at a time."""
        try:
            text = self._buf[self._pos :].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._fail("not UTF-8 text", self._pos + exc.start) from None
        dec = json.JSONDecoder()
        pos = 0

        def skip() -> str:
            nonlocal pos
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            return text[pos] if pos < len(text) else ""

        def value() -> Any:
            nonlocal pos
            skip()
            try:
                v, pos = dec.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise self._fail(
                    "truncated or not valid JSON", self._pos + len(text[: exc.pos].encode())
                ) from None
            except RecursionError:
                raise self._fail(
                    "JSON nested too deeply (a Chrome trace is shallow)", self._pos + len(text[:pos].encode())
                ) from None
            return v

        def expect(chars: str, where: str) -> str:
            nonlocal pos
            c = skip()
            if not c or c not in chars:
                found = repr(c) if c else "the end of the file (truncated?)"
                raise self._fail(f"expected {chars!r} {where}, found {found}")
            pos += 1
            return c

        if skip() != "]":
            while True:
                ev = _tolerant(value())
                if ev is None:
                    self.skipped += 1
                else:
                    yield ev
                if expect(",]", "between trace events") == "]":
                    break
        else:
            pos += 1
        if self._bare:
            if skip():
                raise self._fail("trailing data after the trace array")
            return
        if skip() == "}":
            pos += 1
        else:
            while expect(",}", "after the traceEvents array") == ",":
                key = value()
                expect(":", f"after key {key!r}")
                self.meta[str(key)] = value()
        if skip():
            raise self._fail("trailing data after the trace object")
