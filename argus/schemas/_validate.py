"""Range checks on decoded records: what passes here is safe for detectors and sinks.

The bounds are generous (no real job comes near them) but finite, so that a hostile or
broken producer cannot push NaN, negative durations, 10 million ranks or megabyte names
into the pipeline. They also match every column of the store (``sinks/ddl/*.sql``, filled
by ``sinks/rows.py``): an integer that lands in a ``UInt32`` column is checked against
``[0, 2**32)``, a float that lands in a ``Float32`` column is finite and below
``MAX_FLOAT``, a time that partitions a table lies in 2000..2100 — so a record that passes
here converts to Arrow and inserts without overflow or wrap-around
(``tests/schemas/test_validate.py`` inserts records at every bound into chDB).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ._errors import SchemaError, ValidationError
from ._findings import Finding, JobOrder, StepFindings
from ._heartbeats import HeartbeatBatch, PackedHeartbeats
from ._records import (
    FLOAT_COLUMNS,
    INT_COLUMNS,
    Anomaly,
    DeadLetter,
    GpuSample,
    Heartbeat,
    KernelNames,
    KernelSketch,
    PackedSteps,
    StackSample,
    StepBatch,
    StepSummary,
)

__all__ = [
    "LIMITS",
    "MAX_FLOAT",
    "valid_steps",
    "validate",
    "validate_heartbeat_batches",
    "validate_packed",
    "validate_packed_heartbeats",
]

LIMITS: dict[str, int] = {
    "max_rank": 1 << 20,  # 1,048,576 ranks
    "max_rows": 1 << 17,  # rows in one StepBatch
    "max_step": 10**12,
    "min_time_ns": 946_684_800 * 10**9,  # 2000-01-01
    "max_time_ns": 4_102_444_800 * 10**9,  # 2100-01-01
    "max_duration_ms": 86_400_000,  # one day
    "max_id_len": 256,  # job, host, GPU UUID, group
    "max_name_len": 4096,  # kernel names, summaries
    "max_stack_len": 65_536,  # one folded stack
    "max_entries": 1 << 16,  # entries in a list field
    "max_payload": 4 << 20,  # bytes in a kernel payload
    "max_dead_payload": 64 << 10,  # bytes of the bad input a dead letter keeps
    "max_groups": 1024,  # process groups of one rank in a heartbeat batch
    "max_listed_ranks": 1024,  # ranks an anomaly names (the rest are in its summary's count)
}
MAX_FLOAT = 1e30
"""Largest magnitude of a float that lands in a Float32 column (float32 overflows near 3.4e38)."""
_U16, _U32, _I32 = 1 << 16, 1 << 32, 1 << 31
_I64 = 1 << 63


def _fail(record: object, message: str) -> ValidationError:
    return ValidationError(f"{type(record).__name__}: {message}")


def _text(record: object, name: str, value: str, limit: str = "max_id_len") -> None:
    if len(value) > LIMITS[limit]:
        raise _fail(record, f"{name} is {len(value)} characters, limit {LIMITS[limit]}")


def _texts(record: object, name: str, values: Iterable[str], limit: str) -> None:
    for v in values:
        _text(record, name, v, limit)


def _int_range(record: object, name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value < hi:
        raise _fail(record, f"{name}={value} outside [{lo}, {hi})")


def _time(record: object, name: str, value: int) -> None:
    _int_range(record, name, value, LIMITS["min_time_ns"], LIMITS["max_time_ns"])


def _length(record: object, name: str, n: int) -> None:
    if n > LIMITS["max_entries"]:
        raise _fail(record, f"{name} has {n} entries, limit {LIMITS['max_entries']}")


def _nonneg_finite(record: object, name: str, value: float, hi: float = MAX_FLOAT) -> None:
    if not (math.isfinite(value) and 0 <= value <= hi):
        raise _fail(record, f"{name}={value} is not a finite number in [0, {hi:g}]")


def _finite(record: object, name: str, value: float) -> None:
    if not (math.isfinite(value) and abs(value) <= MAX_FLOAT):
        raise _fail(record, f"{name}={value} is not a finite number within ±{MAX_FLOAT:g}")


def _ints(record: object, name: str, values: Iterable[int], lo: int, hi: int) -> None:
    """Every entry of a list field in ``[lo, hi)``."""
    values = list(values)
    _length(record, name, len(values))
    if values and not (lo <= min(values) and max(values) < hi):
        raise _fail(record, f"{name} holds values outside [{lo}, {hi})")


def _step_batch(b: StepBatch) -> None:
    _step_rows(PackedSteps.of([b]), b)


def valid_steps(batches: Sequence[StepBatch]) -> bool:
    """Whether every one of ``batches`` passes :func:`validate`, in one vectorized pass (for
    a 1-row batch, checking costs as much as encoding it; this checks many for about the
    price of one). False says only that one failed: check them one by one to know which."""
    try:
        validate_packed(PackedSteps.of(batches))
    except (SchemaError, TypeError, ValueError):
        return False
    return True


def validate_packed(packed: PackedSteps) -> None:
    """Raise :class:`ValidationError` unless every StepBatch of ``packed`` is valid (one
    vectorized pass; it does not say which batch failed: check those one by one)."""
    _step_rows(packed, packed)


def _step_rows(packed: PackedSteps, record: object) -> None:
    """The StepBatch checks over the columns of one or many batches; errors name ``record``."""
    lengths = packed.lengths.tolist()
    ints, times = packed.ints, packed.floats
    for (job, run, step), n in zip(packed.heads, lengths, strict=True):
        _text(record, "job", job)
        _int_range(record, "run", run, 0, 1 << 31)
        _int_range(record, "step", step, 0, LIMITS["max_step"])
        if not 0 < n <= LIMITS["max_rows"]:
            raise _fail(record, f"{n} rows, expected 1..{LIMITS['max_rows']}")
    bad = (ints.min(axis=1) < _INTS_LO) | (ints.max(axis=1) > _INTS_HI)
    if bad.any():
        raise _fail(record, _INT_PROBLEM[INT_COLUMNS[int(bad.argmax())]])
    wall_ns = ints[_END] - ints[_START]
    if wall_ns.min() < 0 or wall_ns.max() > LIMITS["max_duration_ms"] * 1_000_000:
        raise _fail(record, "step wall time negative or longer than a day")
    if ints.shape[1] > 1:
        # rank < 2**20 (checked above): batch << 20 | rank is unique per batch and rank
        batch = np.repeat(np.arange(len(lengths), dtype=np.int64) << 20, lengths)
        ranks = np.sort(batch + ints[_RANK])
        if (ranks[1:] == ranks[:-1]).any():
            raise _fail(record, "a rank appears twice in one step")
    # NaN fails both comparisons, -inf the first, inf the second.
    ok = (times.min(axis=1) >= 0) & (times.max(axis=1) <= LIMITS["max_duration_ms"])
    if not ok.all():
        raise _fail(record, f"{FLOAT_COLUMNS[int(np.argmin(ok))]} holds NaN, inf, negative or absurd values")
    for name, values in packed.strings.items():
        if max(map(len, values)) > LIMITS["max_id_len"]:
            raise _fail(record, f"{name} longer than {LIMITS['max_id_len']} characters")
        if "\n" in "".join(values):
            raise _fail(record, f"{name} contains a newline")


_COORDS = ("rank", "dp", "tp", "pp", "ep", "cp")
_RANK, _START, _END = (INT_COLUMNS.index(name) for name in ("rank", "start_ns", "end_ns"))
_INT_BOUNDS = {
    **{name: (0, LIMITS["max_rank"] - 1, f"{name} outside [0, {LIMITS['max_rank']})") for name in _COORDS},
    **{
        name: (LIMITS["min_time_ns"], LIMITS["max_time_ns"] - 1, "start_ns/end_ns outside years 2000..2100")
        for name in ("start_ns", "end_ns")
    },
    **{name: (0, np.iinfo(np.int64).max, "samples/tokens negative") for name in ("samples", "tokens")},
}
_INTS_LO = np.array([_INT_BOUNDS[name][0] for name in INT_COLUMNS], dtype=np.int64)
_INTS_HI = np.array([_INT_BOUNDS[name][1] for name in INT_COLUMNS], dtype=np.int64)
_INT_PROBLEM = {name: bound[2] for name, bound in _INT_BOUNDS.items()}


def _rank_header(r: Any) -> None:
    _text(r, "job", r.job)
    _int_range(r, "run", r.run, 0, _I32)
    _int_range(r, "rank", r.rank, 0, LIMITS["max_rank"])


def _kernel_sketch(k: KernelSketch) -> None:
    _rank_header(k)
    _int_range(k, "step", k.step, 0, LIMITS["max_step"])
    _int_range(k, "codec", k.codec, 0, _U16)  # kernel_sketches.codec UInt16
    _int_range(k, "base_step", k.base_step, -1, k.step)
    if len(k.payload) > LIMITS["max_payload"]:
        raise _fail(k, f"payload of {len(k.payload)} bytes")


def _kernel_names(k: KernelNames) -> None:
    _rank_header(k)
    if len(k.ids) != len(k.names):
        raise _fail(k, "ids and names differ in length")
    _ints(k, "ids", k.ids, 0, _U32)  # kernel_names.kernel_id UInt32
    _texts(k, "names", k.names, "max_name_len")


def _stack_sample(s: StackSample) -> None:
    _rank_header(s)
    _int_range(s, "step", s.step, 0, LIMITS["max_step"])
    _time(s, "start_ns", s.start_ns)
    _time(s, "end_ns", s.end_ns)
    if len(s.stacks) != len(s.counts):
        raise _fail(s, "stacks and counts differ in length")
    _length(s, "stacks", len(s.stacks))
    _texts(s, "stacks", s.stacks, "max_stack_len")
    _ints(s, "counts", s.counts, 0, _U32)  # stacks.count UInt32


def _gpu_sample(g: GpuSample) -> None:
    _text(g, "host", g.host)
    _text(g, "gpu_uuid", g.gpu_uuid)
    _int_range(g, "gpu_index", g.gpu_index, 0, 1024)
    _time(g, "time_ns", g.time_ns)
    for name in ("gpu_util", "sm_clock_mhz", "power_w", "temp_c"):
        _nonneg_finite(g, name, getattr(g, name))
    _int_range(g, "xid", g.xid, 0, _U32)  # gpu_samples.xid UInt32
    for name in ("clock_event_reasons", "ecc_dbe", "remapped_rows", "nvlink_tx_bytes", "nvlink_rx_bytes"):
        _int_range(g, name, getattr(g, name), 0, _I64)  # UInt64 columns
    _int_range(g, "nvlink_errors", g.nvlink_errors, 0, _I64)


def _heartbeat(h: Heartbeat) -> None:
    _rank_header(h)
    _text(h, "host", h.host)
    _time(h, "time_ns", h.time_ns)
    _int_range(h, "last_step", h.last_step, -1, LIMITS["max_step"])
    n = len(h.groups)
    _length(h, "groups", n)
    if not len(h.seq_entered) == len(h.seq_finished) == len(h.kinds) == len(h.nbytes) == n:
        raise _fail(h, "per-group fields differ in length")
    _texts(h, "groups", h.groups, "max_id_len")
    _texts(h, "kinds", h.kinds, "max_id_len")
    _ints(h, "seq_entered", h.seq_entered, -1, _I64)
    _ints(h, "seq_finished", h.seq_finished, -1, _I64)
    _ints(h, "nbytes", h.nbytes, 0, _I64)
    _text(h, "stack", h.stack, "max_stack_len")
    _text(h, "pause", h.pause)
    _int_range(h, "pause_until_ns", h.pause_until_ns, 0, LIMITS["max_time_ns"])


def _heartbeat_batch(b: HeartbeatBatch) -> None:
    validate_heartbeat_batches([b])


def validate_heartbeat_batches(batches: Sequence[HeartbeatBatch]) -> None:
    """Raise :class:`ValidationError` unless every batch is valid: the checks of a
    :class:`Heartbeat` on every row, a rank at most once per batch; one vectorized pass over
    all of them (it does not say which batch failed when there are several)."""
    validate_packed_heartbeats(PackedHeartbeats.of(batches), batches[0] if len(batches) == 1 else None)


def validate_packed_heartbeats(packed: PackedHeartbeats, record: object = None) -> None:
    """The checks of :func:`validate_heartbeat_batches` over a consumer batch read together."""
    record = record if record is not None else "HeartbeatBatch"
    lengths = packed.lengths.tolist()
    width = packed.width
    for (job, run), n in zip(packed.heads, lengths, strict=True):
        _text(record, "job", job)
        _int_range(record, "run", run, 0, _I32)
        if not 0 < n <= LIMITS["max_rows"] or n * width > LIMITS["max_entries"]:
            raise _fail(
                record,
                f"{n} rows × {width} groups, limit {LIMITS['max_rows']} rows, {LIMITS['max_entries']} entries",
            )
    if width > LIMITS["max_groups"]:
        raise _fail(record, f"{width} groups, limit {LIMITS['max_groups']}")
    c = packed.columns
    for name, lo, hi in (
        ("rank", 0, LIMITS["max_rank"]),
        ("time_ns", LIMITS["min_time_ns"], LIMITS["max_time_ns"]),
        ("last_step", -1, LIMITS["max_step"]),
        ("pause_until_ns", 0, LIMITS["max_time_ns"]),
        ("ngroups", 0, width + 1),
    ):
        if c[name].min() < lo or c[name].max() >= hi:
            raise _fail(record, f"{name} holds values outside [{lo}, {hi})")
    if len(c["rank"]) > 1:
        batch = np.repeat(np.arange(len(lengths), dtype=np.int64) << 20, lengths)
        keys = np.sort(batch + c["rank"])
        if (keys[1:] == keys[:-1]).any():
            raise _fail(record, "a rank appears twice in one batch")
    if width:
        for name, lo in (("seq_entered", -1), ("seq_finished", -1), ("nbytes", 0)):
            if c[name].min() < lo:
                raise _fail(record, f"{name} holds values below {lo}")
    texts = [("host", "max_id_len"), ("pause", "max_id_len"), ("stack", "max_stack_len")]
    if width:
        texts += [("groups", "max_id_len"), ("kinds", "max_id_len")]
    for name, limit in texts:
        if packed.longest is not None and packed.longest.get(name, LIMITS[limit] + 1) <= LIMITS[limit]:
            continue  # every value is part of a message's text no longer than the limit
        if max(map(len, c[name].ravel().tolist()), default=0) > LIMITS[limit]:
            raise _fail(record, f"{name} longer than {LIMITS[limit]} characters")


def _step_summary(s: StepSummary) -> None:
    _text(s, "job", s.job)
    _int_range(s, "run", s.run, 0, _I32)
    _int_range(s, "step", s.step, 0, LIMITS["max_step"])
    _time(s, "end_ns", s.end_ns)
    _int_range(s, "ranks", s.ranks, 0, LIMITS["max_rank"])
    _ints(s, "missing", s.missing, 0, LIMITS["max_rank"])
    _ints(s, "suspects", s.suspects, 0, LIMITS["max_rank"])
    for name in StepSummary.FIGURES:
        _nonneg_finite(s, name, getattr(s, name))
    _int_range(s, "tokens", s.tokens, 0, _I64)


def _anomaly(a: Anomaly) -> None:
    _text(a, "id", a.id)
    _text(a, "job", a.job)
    _int_range(a, "run", a.run, 0, _I32)
    if a.level not in Anomaly.LEVELS:
        raise _fail(a, f"level {a.level!r} not one of {sorted(Anomaly.LEVELS)}")
    if a.severity not in Anomaly.SEVERITIES:
        raise _fail(a, f"severity {a.severity!r} not one of {list(Anomaly.SEVERITIES)}")
    if not 0 <= a.start_step <= a.end_step < LIMITS["max_step"]:
        raise _fail(a, f"window {a.start_step}..{a.end_step} is not a window")
    _text(a, "suspect_kind", a.suspect_kind)
    _text(a, "suspect", a.suspect)
    _text(a, "cause", a.cause)
    _nonneg_finite(a, "score", a.score)
    _text(a, "summary", a.summary, "max_name_len")
    _ints(a, "ranks", a.ranks, 0, LIMITS["max_rank"])
    _evidence(a, a.evidence)
    _finite(a, "step_ms_added", a.step_ms_added)
    _finite(a, "gpu_hours_lost", a.gpu_hours_lost)
    _int_range(a, "detected_ns", a.detected_ns, 0, LIMITS["max_time_ns"])


def _evidence(record: object, evidence: Mapping[str, float]) -> None:
    _length(record, "evidence", len(evidence))
    for k, v in evidence.items():
        _text(record, "evidence key", k)
        _finite(record, f"evidence {k}", v)


def _finding(s: StepFindings, f: Finding) -> None:
    if not isinstance(f, Finding):
        raise _fail(s, f"findings hold a {type(f).__name__}")
    if f.level not in Anomaly.LEVELS:
        raise _fail(s, f"a finding's level {f.level!r} is not one of {sorted(Anomaly.LEVELS)}")
    for name in ("cause", "suspect_kind", "suspect", "decided_by"):
        _text(s, f"a finding's {name}", getattr(f, name))
    _ints(s, "a finding's ranks", f.ranks, 0, LIMITS["max_rank"])
    _finite(s, "a finding's score", f.score)
    _finite(s, "a finding's step_ms_added", f.step_ms_added)
    _evidence(s, f.evidence)


def _step_findings(s: StepFindings) -> None:
    _step_summary(s.summary)  # the step's job, run, step and end are its summary's
    if (s.summary.job, s.summary.run, s.summary.step, s.summary.end_ns) != (s.job, s.run, s.step, s.end_ns):
        raise _fail(s, "the summary is of another step")
    _int_range(s, "n_ranks", s.n_ranks, 0, LIMITS["max_rank"])
    _nonneg_finite(s, "step_ms", s.step_ms)
    _finite(s, "job_ms", s.job_ms)
    _length(s, "job_median", len(s.job_median))
    if not np.all(np.abs(np.asarray(s.job_median, dtype=float)) <= MAX_FLOAT):
        raise _fail(s, f"job_median holds NaN or values beyond ±{MAX_FLOAT:g}")
    _length(s, "findings", len(s.findings))
    for f in s.findings:
        _finding(s, f)
    _ints(s, "weak", s.weak, 0, LIMITS["max_rank"])
    _ints(s, "peer ranks", s.peers, 0, LIMITS["max_rank"])
    for peers in s.peers.values():
        _ints(s, "peers", peers, 0, LIMITS["max_rank"])
    if s.residuals is not None:
        res = s.residuals
        ranks = np.asarray(res.ranks)
        if len(ranks) > LIMITS["max_rank"] or (
            len(ranks) and not (ranks.min() >= 0 and ranks.max() < LIMITS["max_rank"])
        ):
            raise _fail(s, f"the residuals' ranks hold values outside [0, {LIMITS['max_rank']})")
        if not np.all(np.isfinite(res.lw)) or not np.isfinite(res.work_ms) or res.work_ms < 0:
            raise _fail(s, "the residuals' log work or work_ms is not finite")
        if (
            len({len(res.ranks), len(res.lw), len(res.phase), len(res.hosts), len(res.dp), len(res.group)})
            != 1
        ):
            raise _fail(s, "the residuals' columns differ in length")


def _job_order(o: JobOrder) -> None:
    _text(o, "job", o.job)
    _int_range(o, "run", o.run, 0, _I32)
    if o.action not in JobOrder.ACTIONS:
        raise _fail(o, f"action {o.action!r} not one of {sorted(JobOrder.ACTIONS)}")


def _dead_letter(d: DeadLetter) -> None:
    _text(d, "topic", d.topic)
    _int_range(d, "partition", d.partition, 0, _I32)
    _int_range(d, "offset", d.offset, 0, _I64)
    _text(d, "reason", d.reason)
    _text(d, "error", d.error, "max_name_len")
    _int_range(d, "time_ns", d.time_ns, 0, LIMITS["max_time_ns"])
    if len(d.payload) > LIMITS["max_dead_payload"]:
        raise _fail(d, f"payload of {len(d.payload)} bytes, limit {LIMITS['max_dead_payload']}")


_CHECKS: dict[type, Callable[[Any], None]] = {
    StepBatch: _step_batch,
    KernelSketch: _kernel_sketch,
    KernelNames: _kernel_names,
    StackSample: _stack_sample,
    GpuSample: _gpu_sample,
    Heartbeat: _heartbeat,
    HeartbeatBatch: _heartbeat_batch,
    StepSummary: _step_summary,
    Anomaly: _anomaly,
    DeadLetter: _dead_letter,
    StepFindings: _step_findings,
    JobOrder: _job_order,
}


def validate(record: object) -> None:
    """Raise :class:`ValidationError` if the record is outside the contract's ranges."""
    check = _CHECKS.get(type(record))
    if check is None:
        raise TypeError(f"not a record type: {type(record).__name__}")
    try:
        check(record)
    except ValidationError:
        raise
    except (TypeError, ValueError) as exc:  # e.g. a None where a number belongs
        raise _fail(record, str(exc)) from exc
