"""Users' per-rank step logs read into step batches (``argus diagnose --steps-csv``; the
engine runs them in :mod:`argus.csvlogs`), as the Kineto importer reads traces.

A log CSV has one row per rank per sample: a rank, a step or a time, and a value. It
becomes step batches, one per window, for the same :class:`JobDiagnoser` as a live job: windows are the log's steps, or bins of the ranks' median sampling interval
when it has times (ranks that log irregularly, start late or stop early simply miss some
windows). The value is the step time, or the phase its column names (``forward_ms``,
``dataloader_wait``, ``allreduce_time`` ...). Its unit is unknown, so values are scaled
to a median of 1,000 (a typical step of one second) on the way in and costs scaled back
on the way out: thresholds that are in milliseconds mean the same for every log.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict, Unpack

import numpy as np

from argus.schemas import StepBatch

from ._errors import ProducerError

__all__ = [
    "HOST_COLUMNS",
    "TIME_FORMATS",
    "TYPICAL_MS",
    "CsvError",
    "LogBatches",
    "LogOptions",
    "LogRows",
    "as_written",
    "log_batches",
    "phase_of",
    "read_series",
]

MAX_ROWS = 50_000_000
MAX_RANKS = 1 << 20
MAX_WINDOWS = 1_000_000
_T0_NS = 1_767_225_600 * 10**9  # windows are placed one second apart from 2026-01-01
TYPICAL_MS = 1000.0
"""A typical step in ms: a log's values are scaled to this median on the way in."""

_HINTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("compile", "jit"), "compile_ms"),
    (("checkpoint", "ckpt"), "checkpoint_ms"),
    (("dataloader", "data_loader", "loader", "input_wait", "data_wait"), "dataloader_ms"),
    (("h2d", "memcpy", "copy"), "h2d_ms"),
    (("gc",), "gc_ms"),
    (("p2p", "bubble", "pipeline", "send", "recv"), "p2p_ms"),
    (("all_gather", "allgather"), "all_gather_ms"),
    (("reduce_scatter", "reducescatter"), "reduce_scatter_ms"),
    (("all_to_all", "alltoall"), "all_to_all_ms"),
    (("all_reduce", "allreduce", "nccl", "comm", "collective"), "all_reduce_ms"),
    (("backward", "bwd"), "backward_ms"),
    (("optimizer", "optim"), "optimizer_ms"),
    (("forward", "fwd", "compute", "gemm", "kernel"), "forward_ms"),
)


class CsvError(ProducerError, ValueError):
    """The CSV cannot be read as rank, time (or step) and value columns."""


HOST_COLUMNS = ("host", "hostname", "host_name", "node", "nodename", "node_name")
"""Column names taken as the rank's host when no host column is given."""


@dataclass(frozen=True)
class LogRows:
    """The usable rows of a log CSV: rank, time (or step) and value per row, each rank's host
    (when the log names hosts), and notes on what was skipped or looks odd."""

    rank: np.ndarray
    t: np.ndarray
    value: np.ndarray
    hosts: dict[int, str] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    iso: bool = False
    """The time column was written as ISO 8601 times (``t`` holds them as epoch seconds)."""
    labels: dict[int, str] = dataclasses.field(default_factory=dict)
    """The log's own rank labels (``worker-3``) by the rank number given to each, when its
    rank column is not numbers; empty when it is."""

    def label(self, rank: int) -> str:
        """How the log names ``rank``."""
        return self.labels.get(rank, str(rank))


TIME_FORMATS = "a number (a step, or seconds), or an ISO 8601 time such as 2026-03-14T09:00:05Z"
"""What a time column may hold without ``time_format``, for error messages."""


def _time(text: str, time_format: str | None = None) -> tuple[float, bool, bool]:
    """A time column's entry: a number, an ISO 8601 time or a time written as
    ``time_format`` (:func:`datetime.strptime`), as seconds since the epoch; whether it was a
    time of day; and whether it had no zone (read as UTC). Raises ValueError for anything else."""
    text = text.strip()
    if time_format is None:
        try:
            return float(text), False, False
        except ValueError:
            pass
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    else:
        when = datetime.strptime(text, time_format)
    zoneless = when.tzinfo is None
    if zoneless:
        when = when.replace(tzinfo=UTC)
    return when.timestamp(), True, zoneless


def _natural(label: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that puts ``worker-2`` before ``worker-10``."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", label) if p)


def _numbering(labels: set[str]) -> tuple[dict[str, int], dict[int, str]]:
    """Rank numbers for a rank column's distinct entries: their own numbers when every one
    is a whole number ``0 <= r < 2**20``; otherwise the labels numbered in natural order
    (``gpu-2`` before ``gpu-10``), with the labels by number."""
    try:
        numbers = {x: float(x) for x in labels}
        if all(0 <= r < MAX_RANKS and r == int(r) for r in numbers.values()):
            return {x: int(r) for x, r in numbers.items()}, {}
    except ValueError:
        pass
    names = dict(enumerate(sorted(labels, key=_natural)))
    return {x: i for i, x in names.items()}, names


def read_series(
    path: Path,
    rank_col: str,
    t_col: str,
    value_col: str,
    host_col: str | None = None,
    time_format: str | None = None,
) -> LogRows:
    """The rank, time (or step) and value columns as numbers, and the hosts of ``host_col``
    (default: the first of :data:`HOST_COLUMNS` in the header, if any); other columns are
    ignored. Rows with a blank, NaN or infinite value are skipped and counted in a note.
    Ranks may be labels (``worker-3``): they are numbered in natural order, with a note.
    Times are numbers, ISO 8601 times, or times written as ``time_format`` (``%d/%m/%Y
    %H:%M:%S``); a time without a zone is read as UTC, with a note.

    Raises :class:`CsvError` naming the file (and line) for anything it cannot use: a
    missing column, a value or time that is not one, no data rows.
    """
    labels: list[str] = []
    ts: list[float] = []
    vs: list[float] = []
    host_of: dict[str, str] = {}
    seen: dict[str, str] = {}
    skipped = 0
    iso = zoneless = False
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:  # -sig: a spreadsheet's BOM
            reader = csv.DictReader(fh)
            header = [h.strip() for h in reader.fieldnames or []]
            reader.fieldnames = header
            missing = [
                c for c in (rank_col, t_col, value_col, *([host_col] if host_col else [])) if c not in header
            ]
            if missing:
                raise CsvError(
                    f"{path}: missing column(s) {', '.join(missing)}; the header has {', '.join(header) or 'nothing'}"
                )
            host_col = host_col or next((h for h in header if h.lower() in HOST_COLUMNS), None)
            for line, row in enumerate(reader, start=2):
                raw = (row.get(rank_col), row.get(t_col), row.get(value_col))
                if any(v is None or v.strip() == "" for v in raw):
                    skipped += 1
                    continue
                try:
                    v = float(raw[2] or "")
                except ValueError:
                    raise CsvError(f"{path}:{line}: {value_col} is not a number: {raw[2]!r}") from None
                try:
                    t, is_time, no_zone = _time(raw[1] or "", time_format)
                except ValueError:
                    wanted = f"a time written as {time_format!r}" if time_format else TIME_FORMATS
                    hint = (
                        ""
                        if time_format
                        else " (other formats: --time-format, as for strptime: '%d/%m/%Y %H:%M:%S')"
                    )
                    raise CsvError(f"{path}:{line}: {t_col} must be {wanted}, got {raw[1]!r}{hint}") from None
                iso, zoneless = iso or is_time, zoneless or no_zone
                if not (math.isfinite(t) and math.isfinite(v)):
                    skipped += 1
                    continue
                if v < 0:
                    raise CsvError(f"{path}:{line}: {value_col} must not be negative, got {raw[2]!r}")
                label = (raw[0] or "").strip()[:256]
                label = seen.setdefault(label, label)  # one string per rank, not per row
                labels.append(label)
                ts.append(t)
                vs.append(v)
                if host_col and label not in host_of:
                    host_of[label] = (row.get(host_col) or "").strip()[:256]
                if len(vs) > MAX_ROWS or len(seen) > MAX_RANKS:
                    raise CsvError(f"{path}: more than {MAX_ROWS:,} rows or {MAX_RANKS:,} ranks")
    except OSError as exc:
        raise CsvError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise CsvError(f"{path} is not a readable CSV: {exc}") from None
    if not vs:
        raise CsvError(f"{path}: no data rows")
    number, names = _numbering(set(labels))
    hosts = {number[x]: h for x, h in host_of.items() if h}
    ranks = np.fromiter((number[x] for x in labels), np.int64, len(labels))
    rows = LogRows(ranks, np.array(ts), np.array(vs), hosts, iso=iso, labels=names)
    notes = [f"{skipped:,} row(s) with a blank, NaN or infinite value skipped"] if skipped else []
    if names:
        first = ", ".join(f"{names[i]} = {i}" for i in list(names)[:3])
        notes.append(
            f"{rank_col} holds labels, not rank numbers: {len(names):,} ranks numbered in natural order ({first}, ...)"
        )
    if zoneless:
        notes.append(f"{t_col} has times without a zone: read as UTC")
    return dataclasses.replace(rows, notes=(*notes, *_oddities(rows.rank, rows.t, t_col, iso)))


def as_written(x: float, iso: bool = False) -> str:
    """A step or time as a log writes it: an epoch time whole (not as 1.75e+09), and with
    ``iso`` an ISO 8601 UTC time (``2026-11-23T01:50:00Z``)."""
    if iso:
        return (
            datetime.fromtimestamp(x, UTC)
            .isoformat(timespec="milliseconds" if x % 1 else "seconds")
            .replace("+00:00", "Z")
        )
    return f"{x:.0f}" if abs(x) >= 1e5 else f"{x:g}"


def _oddities(rank: np.ndarray, t: np.ndarray, t_col: str, iso: bool = False) -> list[str]:
    """What a reader should know about the rows: repeated (rank, time) pairs, which are
    averaged, and a rank whose time goes back in the file (a restarted run's counter)."""
    notes = []
    order = np.lexsort((t, rank))
    same = (rank[order][1:] == rank[order][:-1]) & (t[order][1:] == t[order][:-1])
    if same.any():
        notes.append(f"{int(same.sum()):,} repeated (rank, {t_col}) row(s): their values are averaged")
    by_rank = np.argsort(rank, kind="stable")  # each rank's rows in file order
    rr, tt = rank[by_rank], t[by_rank]
    back = np.flatnonzero((rr[1:] == rr[:-1]) & (tt[1:] < tt[:-1])) + 1
    # once or twice per rank: a counter that restarted (rows merely out of order go back often)
    if len(back) and np.bincount(rr[back]).max() <= 2:
        i = int(back[0])
        notes.append(
            f"{t_col} of rank {int(rr[i])} goes back in the file ({as_written(tt[i - 1], iso)} then {as_written(tt[i], iso)}): "
            "a restarted run? Both runs are diagnosed as one; split the file per run to tell them apart"
        )
    return notes


def phase_of(name: str) -> str | None:
    """The step-record column a value of this name is (None: the step's wall time)."""
    low = name.lower()
    for hints, column in _HINTS:
        if any(h in low for h in hints):
            return column
    return None


def _windows(rank: np.ndarray, t: np.ndarray, by_time: bool) -> tuple[np.ndarray, np.ndarray]:
    """Window index of every row, and the start label (in ``t``'s unit) of every window."""
    if not by_time:
        labels, inv = np.unique(t, return_inverse=True)
        return inv.astype(np.int64), labels.astype(float)
    order = np.lexsort((t, rank))
    dt = np.diff(t[order])
    same = rank[order][1:] == rank[order][:-1]
    gaps = dt[same & (dt > 0)]
    t0, span = float(t.min()), float(t.max() - t.min())
    width = float(np.median(gaps)) if len(gaps) else max(span, 1.0)
    width = max(width, span / MAX_WINDOWS, 1e-12)
    idx = np.floor((t - t0) / width + 1e-9).astype(np.int64)
    used, inv = np.unique(idx, return_inverse=True)
    return inv.astype(np.int64), t0 + width * used.astype(float)


class LogOptions(TypedDict, total=False):
    """How a log's values are read (:func:`log_batches`, :func:`argus.csvlogs.diagnose_log`)."""

    metric: str
    """What the value is: the step time (``step_ms``, the default) or a phase (see :func:`phase_of`)."""
    higher_is_better: bool
    """The value is a throughput (a slow rank has a low value)."""
    job: str
    """The job's name in the anomalies (``log`` by default)."""
    hosts: Mapping[int, str] | None
    """Ranks' hosts (a rank without one is a host of its own)."""


@dataclass(frozen=True)
class LogBatches:
    """A log as step batches: one per window, the start label of every window (in the log's
    time or step unit), the scale the values were multiplied by (their median becomes 1,000)
    and the phase column they fill (None: the step time)."""

    batches: list[StepBatch]
    labels: np.ndarray
    scale: float
    phase: str | None


def log_batches(
    rank: np.ndarray, t: np.ndarray, value: np.ndarray, *, by_time: bool, **options: Unpack[LogOptions]
) -> LogBatches:
    """One StepBatch per window (a rank's samples in a window averaged).

    Raises:
        ValueError: arrays of different lengths, or no usable value.
    """
    higher_is_better, hosts = options.get("higher_is_better", False), options.get("hosts") or {}
    rank, t, value = np.asarray(rank, np.int64), np.asarray(t, float), np.asarray(value, float)
    if not len(rank) == len(t) == len(value) or not len(value):
        raise ValueError("rank, time and value need one entry per row")
    keep = np.isfinite(t) & np.isfinite(value) & (value >= 0)
    if higher_is_better:  # a throughput: a slow rank has a low value; time per unit instead
        keep &= value > 0
    rank, t, value = rank[keep], t[keep], value[keep]
    if not len(value):
        raise ValueError("no finite values to diagnose")
    if higher_is_better:
        value = 1.0 / value
    med = float(np.median(value))
    scale = TYPICAL_MS / med if med > 0 else 1.0
    with np.errstate(over="ignore"):  # a value near the float limit is capped, not a warning
        ms = np.minimum(value * scale, 1000.0 * TYPICAL_MS)
    win, labels = _windows(rank, t, by_time)
    # one value per (window, rank): the mean of its samples there
    key = win * (int(rank.max()) + 1) + rank
    cells, inv = np.unique(key, return_inverse=True)
    mean = np.bincount(inv, weights=ms) / np.bincount(inv)
    cw, cr = cells // (int(rank.max()) + 1), cells % (int(rank.max()) + 1)
    column = phase_of(options.get("metric", "step_ms"))
    bounds = np.flatnonzero(np.diff(cw)) + 1
    batches = []
    for w_rows in np.split(np.arange(len(cells)), bounds):
        w = int(cw[w_rows[0]])
        n = len(w_rows)
        cols = StepBatch.empty_columns(n)
        r = cr[w_rows]
        v = mean[w_rows]
        start = _T0_NS + w * 10**9 * 60
        cols.update(
            rank=r,
            dp=r,
            host=np.array([hosts.get(x) or f"rank-{x}" for x in r.tolist()], dtype=object),
            gpu_uuid=np.array([f"rank-{x}" for x in r.tolist()], dtype=object),
            start_ns=np.full(n, start, np.int64),
            end_ns=start + np.round(v * 1e6).astype(np.int64),
        )
        if column is not None:
            cols[column] = v
        batches.append(StepBatch(options.get("job", "log"), 0, w, cols))
    return LogBatches(batches, labels, scale, column)
