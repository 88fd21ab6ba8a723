"""HeartbeatBatch: the heartbeats of one job's ranks on one node, as columns.

A rank sends a :class:`Heartbeat` every few seconds. At 100,000 ranks and one heartbeat
per 5 s that is 20,000 messages/s, and a stream worker's cost is per message; the node
relay (:mod:`producers.relay`) sends one ``HeartbeatBatch`` per job per node per
heartbeat period instead (8 rows on an 8-GPU node), and the worker's hang state takes it
in one vectorized pass (:meth:`detectors.HangState.observe_batch`).

Per-group fields are ``rows × width`` matrices: a rank's groups fill the first
``ngroups`` slots of its row, the rest are padding (empty name, zeros).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from ._records import ColumnarRecord, Heartbeat

__all__ = ["HEARTBEAT_COLUMNS", "HeartbeatBatch", "PackedHeartbeats"]

_INT_ROWS = ("rank", "time_ns", "last_step", "ngroups", "pause_until_ns")
_TEXT_ROWS = ("host", "stack", "pause")
_INT_SLOTS = ("seq_entered", "seq_finished", "nbytes")
_TEXT_SLOTS = ("groups", "kinds")
HEARTBEAT_COLUMNS: tuple[str, ...] = _INT_ROWS + _TEXT_ROWS + _INT_SLOTS + _TEXT_SLOTS
"""Every column of a HeartbeatBatch: per row, then per row and group slot."""


def _split(text: str, n: int, name: str) -> np.ndarray:
    values = text.split("\n") if n else []
    if len(values) != n:
        raise ValueError(f"{name} holds {len(values)} values, expected {n}")
    out = np.empty(n, object)
    out[:] = values
    return out


def _ints(raw: Any, n: int, name: str) -> np.ndarray:
    if not isinstance(raw, bytes) or len(raw) != 8 * n:
        raise ValueError(
            f"{name} is {len(raw) if isinstance(raw, bytes) else type(raw).__name__} bytes, expected {8 * n}"
        )
    return np.frombuffer(raw, dtype="<i8").astype(np.int64, copy=False)


@dataclass(frozen=True, eq=False)
class HeartbeatBatch(ColumnarRecord):
    """Heartbeats of ranks of one job run, one row per rank (see the module docstring).

    ``columns`` maps every name of :data:`HEARTBEAT_COLUMNS` to an array: per-row columns
    of length ``rows``, per-slot columns of shape ``(rows, width)``; int64 or object (str).
    """

    job: str
    run: int
    columns: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        n = len(self.columns["rank"])
        missing = set(HEARTBEAT_COLUMNS).difference(self.columns)
        if missing:
            raise ValueError(f"HeartbeatBatch lacks columns: {sorted(missing)}")
        for name in _INT_ROWS + _TEXT_ROWS:
            if self.columns[name].shape != (n,):
                raise ValueError(f"HeartbeatBatch column {name} is not one entry per row")
        width = self.columns["groups"].shape[1] if self.columns["groups"].ndim == 2 else -1
        for name in _INT_SLOTS + _TEXT_SLOTS:
            if self.columns[name].shape != (n, width):
                raise ValueError(f"HeartbeatBatch column {name} is not rows × width")

    @property
    def width(self) -> int:
        """Group slots per row."""
        return int(self.columns["groups"].shape[1])

    @staticmethod
    def takes(beat: Heartbeat) -> bool:
        """Whether a heartbeat can travel in a batch: its text fields are joined by newlines
        on the wire, so one with a newline in them goes on alone."""
        return "\n" not in "".join((beat.host, beat.stack, beat.pause, *beat.groups, *beat.kinds))

    @classmethod
    def from_beats(cls, beats: Sequence[Heartbeat]) -> HeartbeatBatch:
        """Columnize heartbeats of one job run (ValueError if they are of several)."""
        if not beats:
            raise ValueError("HeartbeatBatch.from_beats needs at least one heartbeat")
        head = beats[0]
        if any(b.job != head.job or b.run != head.run for b in beats):
            raise ValueError("a HeartbeatBatch holds one job run")
        n, width = len(beats), max(len(b.groups) for b in beats)
        cols: dict[str, np.ndarray] = {
            "rank": np.array([b.rank for b in beats], np.int64),
            "time_ns": np.array([b.time_ns for b in beats], np.int64),
            "last_step": np.array([b.last_step for b in beats], np.int64),
            "ngroups": np.array([len(b.groups) for b in beats], np.int64),
            "pause_until_ns": np.array([b.pause_until_ns for b in beats], np.int64),
        }
        for name in _TEXT_ROWS:
            cols[name] = np.empty(n, object)
            cols[name][:] = [getattr(b, name) for b in beats]
        for b in beats:
            k = len(b.groups)
            if not len(b.seq_entered) == len(b.seq_finished) == len(b.kinds) == len(b.nbytes) == k:
                raise ValueError(f"rank {b.rank}: per-group fields differ in length")
        used = np.arange(width) < cols["ngroups"][:, None]  # a row's groups fill its first slots
        for name in _INT_SLOTS + _TEXT_SLOTS:
            col = np.full((n, width), "", object) if name in _TEXT_SLOTS else np.zeros((n, width), np.int64)
            if width:
                col[used] = list(chain.from_iterable(map(attrgetter(name), beats)))
            cols[name] = col
        return cls(head.job, head.run, cols)

    def beats(self) -> list[Heartbeat]:
        """One Heartbeat per row."""
        c = {name: self.columns[name].tolist() for name in HEARTBEAT_COLUMNS}
        out = []
        for i, k in enumerate(c["ngroups"]):
            slots = {name: tuple(c[name][i][:k]) for name in _INT_SLOTS + _TEXT_SLOTS}
            out.append(
                Heartbeat(
                    self.job,
                    self.run,
                    c["rank"][i],
                    c["host"][i],
                    c["time_ns"][i],
                    c["last_step"][i],
                    stack=c["stack"][i],
                    pause=c["pause"][i],
                    pause_until_ns=c["pause_until_ns"][i],
                    **slots,
                )
            )
        return out

    @classmethod
    def _unchecked(cls, job: str, run: int, columns: Mapping[str, np.ndarray]) -> HeartbeatBatch:
        """A batch of columns known to be consistent (views of a checked PackedHeartbeats)."""
        batch = object.__new__(cls)
        object.__setattr__(batch, "job", job)
        object.__setattr__(batch, "run", run)
        object.__setattr__(batch, "columns", columns)
        return batch

    @classmethod
    def concat(cls, parts: Sequence[HeartbeatBatch]) -> HeartbeatBatch:
        """One batch of the rows of many batches of one job run (rows kept in order; a rank
        may appear more than once: :meth:`HangState.observe_batch` keeps its latest)."""
        return cls.concat_any(parts)

    @classmethod
    def concat_any(cls, parts: Sequence[HeartbeatBatch]) -> HeartbeatBatch:
        """The rows of many batches in one (named after the first part's job run, whatever
        theirs: for checking many at once)."""
        head = parts[0]
        if len(parts) == 1:
            return head
        joined = _adjacent_rows(parts)
        if joined is not None:
            return cls._unchecked(head.job, head.run, joined)
        width = max(p.width for p in parts)
        cols: dict[str, np.ndarray] = {}
        for name in _INT_ROWS + _TEXT_ROWS:
            cols[name] = np.concatenate([p.columns[name] for p in parts])
        for name in _INT_SLOTS + _TEXT_SLOTS:
            fill: Any = "" if name in _TEXT_SLOTS else 0
            cols[name] = np.concatenate(
                [
                    p.columns[name]
                    if p.width == width
                    else np.pad(p.columns[name], ((0, 0), (0, width - p.width)), constant_values=fill)
                    for p in parts
                ]
            )
        return cls._unchecked(head.job, head.run, cols)

    def to_avro(self) -> dict[str, Any]:
        """The wire form: integers packed little-endian, text newline-joined (row-major)."""
        out: dict[str, Any] = {"job": self.job, "run": self.run, "rows": len(self), "width": self.width}
        for name in _INT_ROWS + _INT_SLOTS:
            out[name] = np.ascontiguousarray(self.columns[name], dtype="<i8").tobytes()
        for name in _TEXT_ROWS + _TEXT_SLOTS:
            out[name] = "\n".join(self.columns[name].ravel().tolist())
        return out

    @classmethod
    def from_avro(cls, data: Mapping[str, Any]) -> HeartbeatBatch:
        """Build the batch from the dict fastavro read; ValueError when the columns do not
        match ``rows`` and ``width`` (sizes are checked against the bytes, never trusted)."""
        n, width = int(data["rows"]), int(data["width"])
        if n < 0 or width < 0:
            raise ValueError(f"rows={n}, width={width}")
        cols: dict[str, np.ndarray] = {}
        for name in _INT_ROWS:
            cols[name] = _ints(data[name], n, name)
        for name in _INT_SLOTS:
            cols[name] = _ints(data[name], n * width, name).reshape(n, width)
        for name in _TEXT_ROWS:
            cols[name] = _split(data[name], n, name)
        for name in _TEXT_SLOTS:
            text = data[name]
            if n * width == 0:
                if text:
                    raise ValueError(f"{name} holds values, expected none")
                cols[name] = np.empty((n, width), object)
            else:
                cols[name] = _split(text, n * width, name).reshape(n, width)
        return cls(data["job"], data["run"], cols)


@dataclass(frozen=True, eq=False)
class PackedHeartbeats:
    """Many HeartbeatBatches (a consumer batch) as one set of columns: every row of every
    batch, in message order; ``heads`` (job, run) and ``lengths`` per batch, one ``width``.

    A worker reads thousands of small node batches per second; per-message overhead, not
    rows, is what that costs, so they are read and checked once per consumer batch, and each
    batch's columns are views of these arrays.
    """

    heads: tuple[tuple[str, int], ...]
    lengths: np.ndarray
    width: int
    columns: Mapping[str, np.ndarray]
    longest: Mapping[str, int] | None = None
    """Per text column, a bound on its longest value (the longest newline-joined text of one
    message read): when under a limit, no value needs measuring. None: unknown."""

    @classmethod
    def read(cls, raws: Sequence[Mapping[str, Any]]) -> PackedHeartbeats | None:
        """The dicts fastavro read, together; None unless they all have one width and
        columns that match their rows (then build them one by one, which names the bad one)."""
        try:
            lengths = [int(r) for r in map(itemgetter("rows"), raws)]
            widths = set(map(itemgetter("width"), raws))
            if not raws or min(lengths) < 1 or len(widths) != 1:
                return None
            width = int(widths.pop())
            if width < 0:
                return None
            total = sum(lengths)
            cols: dict[str, np.ndarray] = {}
            groups: tuple[tuple[tuple[str, ...], bool], ...] = ((_INT_ROWS, False), (_INT_SLOTS, True))
            for names, slots in groups:
                per = width if slots else 1
                expected = [8 * per * n for n in lengths]
                for name in names:
                    values = list(map(itemgetter(name), raws))
                    if list(map(len, values)) != expected:
                        return None
                    flat = np.frombuffer(b"".join(values), dtype="<i8")
                    cols[name] = flat.reshape(total, width) if slots else flat
            longest: dict[str, int] = {}
            groups = ((_TEXT_ROWS, False), (_TEXT_SLOTS, True))
            for names, slots in groups:
                per = width if slots else 1
                for name in names:
                    values = list(map(itemgetter(name), raws))
                    if not per:
                        if any(values):
                            return None
                        cols[name] = np.empty((total, 0), object)
                        continue
                    if [v.count("\n") + 1 for v in values] != [per * n for n in lengths]:
                        return None
                    longest[name] = max(map(len, values))
                    col = np.empty(total * per, object)
                    col[:] = "\n".join(values).split("\n")
                    cols[name] = col.reshape(total, width) if slots else col
            heads = tuple(zip(map(itemgetter("job"), raws), map(itemgetter("run"), raws), strict=True))
        except (KeyError, TypeError, AttributeError, ValueError):
            return None
        return cls(heads, np.asarray(lengths), width, cols, longest)

    @classmethod
    def of(cls, batches: Sequence[HeartbeatBatch]) -> PackedHeartbeats:
        """The same layout built from batches (narrower ones padded), to check them together."""
        joined = HeartbeatBatch.concat_any(batches)
        return cls(
            tuple((b.job, b.run) for b in batches),
            np.array([len(b) for b in batches]),
            joined.width,
            joined.columns,
        )

    def batches(self) -> list[HeartbeatBatch]:
        """One HeartbeatBatch per message; its columns are read-only views of the shared arrays."""
        out = []
        lo = 0
        for (job, run), n in zip(self.heads, self.lengths.tolist(), strict=True):
            hi = lo + n
            out.append(HeartbeatBatch._unchecked(job, run, _Rows(self.columns, lo, hi)))
            lo = hi
        return out


class _Rows(Mapping[str, np.ndarray]):
    """Rows ``lo:hi`` of shared columns, sliced when a column is read (a worker reads only
    the ranks of most batches before joining them again: :func:`_adjacent_rows`)."""

    __slots__ = ("hi", "lo", "whole")

    def __init__(self, whole: Mapping[str, np.ndarray], lo: int, hi: int) -> None:
        self.whole, self.lo, self.hi = whole, lo, hi

    def __getitem__(self, name: str) -> np.ndarray:
        return self.whole[name][self.lo : self.hi]

    def __iter__(self) -> Iterator[str]:
        return iter(self.whole)

    def __len__(self) -> int:
        return len(self.whole)


def _adjacent_rows(parts: Sequence[HeartbeatBatch]) -> Mapping[str, np.ndarray] | None:
    """The columns of ``parts`` joined without a copy when they are consecutive rows of one
    :class:`PackedHeartbeats` (a consumer batch of one job's node batches, the usual case);
    None otherwise."""
    views = [p.columns for p in parts]
    first, last = views[0], views[-1]
    if not isinstance(first, _Rows) or not isinstance(last, _Rows):
        return None
    end = first.hi
    for view in views[1:]:
        if not isinstance(view, _Rows) or view.whole is not first.whole or view.lo != end:
            return None
        end = view.hi
    return _Rows(first.whole, first.lo, last.hi)
