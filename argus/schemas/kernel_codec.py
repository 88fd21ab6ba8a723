"""The payload codec of :class:`~schemas.KernelSketch`: :class:`~schemas.KernelStats` ⇄ bytes.

Codec 1 (``CODEC_ID``) stores, per kernel, the exact count, total, min and max (ns) and the
duration quantiles at fixed probabilities (:data:`DEFAULT_PROBS`, which hold p50, p90 and
p99) snapped to a logarithmic grid of ratio :data:`GAMMA` = 1.02 — so every stored quantile
is within ``sqrt(GAMMA) - 1`` < 1 % of the exact empirical quantile — plus the GPU idle time
per stream. A kernel with fewer than three calls stores no quantiles: with numpy's linear
interpolation they follow from min and max exactly.

Layout (all integers LEB128 varints, signed ones zig-zag coded)::

    byte 0   format version (1)
    byte 1   flags: 1 = delta frame (coded against the rank's previous step), 2 = body is zstd
    body     k, q, probability set (0 = DEFAULT_PROBS, 1 = q explicit probabilities in 1/65535),
             s (streams), then column by column: id gaps, count, total, min, max,
             quantile codes, stream ids, idle

In a delta frame every column of a kernel (stream) that the base step also holds is the
difference to the base value; training steps repeat, so counts difference to zero and the
rest shrinks to the step-to-step noise. Columns keep like numbers together for zstd.

Decoding is defensive: any garbage raises :class:`~schemas.DecodeError`, and nothing larger
than :data:`MAX_BODY` bytes is ever inflated.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np

from ._errors import DecodeError
from ._kernels import KernelStats

if sys.version_info >= (3, 14):  # pragma: no cover - the stdlib module of 3.14
    from compression import zstd
else:
    from backports import zstd

__all__ = [
    "CODEC_ID",
    "DEFAULT_PROBS",
    "GAMMA",
    "MAX_BODY",
    "MAX_KERNELS",
    "decode_payload",
    "encode_payload",
    "grid_codes",
    "is_delta",
    "quantize",
]

CODEC_ID = 1
"""Value of ``KernelSketch.codec`` for payloads of this module."""
GAMMA = 1.02
"""Ratio of the quantile grid: a stored quantile is within sqrt(GAMMA) - 1 (0.995 %) of the exact one."""
DEFAULT_PROBS = np.array([0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99])
"""Quantile probabilities the producers store (min and max are exact and stored beside)."""
MAX_KERNELS = 1 << 16
MAX_PROBS = 64
MAX_STREAMS = 1 << 12
MAX_BODY = 8 << 20
"""Largest inflated body a decoder accepts (bytes)."""

_VERSION = 1
_DELTA = 1
_ZSTD = 2
_LN_GAMMA = float(np.log(GAMMA))
_ZSTD_LEVEL = 19
_PROB_SCALE = 65535
_THRESHOLDS = np.array([1 << (7 * i) for i in range(1, 10)], dtype=np.uint64)
_MIN_QUANTILE_CALLS = 3


# --------------------------------------------------------------------------- varints


def _zigzag(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


def _unzigzag(u: np.ndarray) -> np.ndarray:
    u = u.astype(np.uint64, copy=False)
    return ((u >> np.uint64(1)).astype(np.int64)) ^ -((u & np.uint64(1)).astype(np.int64))


def _varints(u: np.ndarray) -> bytes:
    """LEB128 bytes of unsigned integers (vectorized)."""
    u = np.ascontiguousarray(u, dtype=np.uint64)
    if len(u) == 0:
        return b""
    nbytes = 1 + np.searchsorted(_THRESHOLDS, u, side="right")
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.zeros(int(ends[-1]), dtype=np.uint8)
    for i in range(int(nbytes.max())):
        sel = nbytes > i
        byte = (u[sel] >> np.uint64(7 * i)) & np.uint64(0x7F)
        more = np.where(nbytes[sel] > i + 1, 0x80, 0).astype(np.uint64)
        out[starts[sel] + i] = (byte | more).astype(np.uint8)
    return out.tobytes()


class _Reader:
    """Reads the varint columns of a body; every shortfall is a DecodeError."""

    def __init__(self, body: bytes) -> None:
        b = np.frombuffer(body, dtype=np.uint8)
        ends = np.flatnonzero(b < 0x80)
        if len(b) and (len(ends) == 0 or ends[-1] != len(b) - 1):
            raise DecodeError("kernel payload: truncated varint at the end")
        starts = np.concatenate(([0], ends[:-1] + 1)) if len(ends) else ends
        lengths = ends - starts + 1
        if len(lengths) and lengths.max() > 10:
            raise DecodeError("kernel payload: varint longer than 10 bytes")
        shift = (np.arange(len(b)) - np.repeat(starts, lengths)) * 7
        parts = (b & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
        self.values = np.bitwise_or.reduceat(parts, starts) if len(b) else np.zeros(0, np.uint64)
        self.pos = 0

    def take(self, n: int, what: str) -> np.ndarray:
        if n < 0 or self.pos + n > len(self.values):
            raise DecodeError(f"kernel payload: too short for {what}")
        out = self.values[self.pos : self.pos + n]
        self.pos += n
        return out

    def one(self, what: str, limit: int) -> int:
        v = int(self.take(1, what)[0])
        if v > limit:
            raise DecodeError(f"kernel payload: {what}={v} exceeds {limit}")
        return v

    def signed(self, n: int, what: str) -> np.ndarray:
        return _unzigzag(self.take(n, what))


# --------------------------------------------------------------------------- grid


def grid_codes(values_ns: np.ndarray) -> np.ndarray:
    """Codes on the quantile grid: ``round(log(v) / log(GAMMA))``, values below 1 ns as 1 ns."""
    v = np.maximum(np.asarray(values_ns, dtype=np.float64), 1.0)
    return np.rint(np.log(v) / _LN_GAMMA).astype(np.int64)


def _grid_values(codes: np.ndarray) -> np.ndarray:
    return np.exp(codes.astype(np.float64) * _LN_GAMMA)


def _snap(
    codes: np.ndarray, count: np.ndarray, lo: np.ndarray, hi: np.ndarray, probs: np.ndarray
) -> np.ndarray:
    """Quantile values of grid codes, clipped to [min, max]; exact for kernels of 1 or 2 calls."""
    q: np.ndarray = np.clip(
        _grid_values(codes), lo[:, None].astype(np.float64), hi[:, None].astype(np.float64)
    )
    few = count < _MIN_QUANTILE_CALLS
    if few.any():
        q[few] = lo[few, None] + probs[None, :] * (hi[few] - lo[few])[:, None]
    return q


def quantize(stats: KernelStats) -> KernelStats:
    """The stats as a decoder sees them after a round trip (quantiles snapped to the grid)."""
    codes = grid_codes(stats.quantiles_ns)
    q = _snap(codes, stats.count, stats.min_ns, stats.max_ns, stats.probs)
    return replace(stats, quantiles_ns=q)


# --------------------------------------------------------------------------- encode


def _aligned(ids: np.ndarray, base_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each id, whether the base holds it and where."""
    if len(base_ids) == 0:
        return np.zeros(len(ids), bool), np.zeros(len(ids), np.int64)
    order = np.argsort(base_ids, kind="stable")
    pos = np.searchsorted(base_ids[order], ids)
    pos = np.minimum(pos, len(base_ids) - 1)
    hit = base_ids[order][pos] == ids
    return hit, order[pos]


def _at(ref: np.ndarray, hit: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``ref[at]`` where ``hit``, else 0 (safe for an empty ``ref``)."""
    if len(ref) == 0:
        return np.zeros(len(hit), np.int64)
    return np.where(hit, ref[np.minimum(at, len(ref) - 1)], 0)


def _probs_header(probs: np.ndarray) -> list[int]:
    if len(probs) == len(DEFAULT_PROBS) and np.array_equal(probs, DEFAULT_PROBS):
        return [0]
    return [1, *np.rint(np.asarray(probs) * _PROB_SCALE).astype(np.int64).tolist()]


def _check_encodable(stats: KernelStats) -> None:
    if len(stats) > MAX_KERNELS or len(stats.probs) > MAX_PROBS or len(stats.stream_ids) > MAX_STREAMS:
        raise ValueError("KernelStats too large for codec 1")
    if len(stats) and (stats.count.min() < 1 or stats.min_ns.min() < 0 or stats.ids.min() < 0):
        raise ValueError("KernelStats with empty kernels, negative ids or negative durations")
    if len(np.unique(stats.ids)) != len(stats.ids):
        raise ValueError("KernelStats ids are not unique")
    if len(stats.stream_ids) and len(np.unique(stats.stream_ids)) != len(stats.stream_ids):
        raise ValueError("KernelStats stream ids are not unique")
    p = np.asarray(stats.probs)
    if len(p) and (p.min() <= 0 or p.max() >= 1 or np.any(np.diff(p) <= 0)):
        raise ValueError("probs must rise strictly inside (0, 1)")


def encode_payload(stats: KernelStats, base: KernelStats | None = None, *, level: int = _ZSTD_LEVEL) -> bytes:
    """Encode ``stats``; with ``base`` (the rank's previous step *as decoded*), a delta frame.

    ``base`` must be what the decoder will hold: the previous decode result, or
    :func:`quantize` of the previous step's stats. Counts, totals, min and max round-trip
    exactly; quantiles to within 1 %.
    """
    _check_encodable(stats)
    probs = np.asarray(stats.probs, dtype=np.float64)
    if base is not None and not np.array_equal(np.asarray(base.probs), probs):
        base = None  # another probability set: a key frame
    order = np.argsort(stats.ids, kind="stable")
    ids = stats.ids[order].astype(np.int64)
    count = stats.count[order].astype(np.int64)
    total = stats.total_ns[order].astype(np.int64)
    lo = stats.min_ns[order].astype(np.int64)
    hi = stats.max_ns[order].astype(np.int64)
    codes = grid_codes(stats.quantiles_ns[order]) if len(probs) else np.zeros((len(ids), 0), np.int64)
    sorder = np.argsort(stats.stream_ids, kind="stable")
    sids = stats.stream_ids[sorder].astype(np.int64)
    idle = stats.idle_ns[sorder].astype(np.int64)

    cols: list[np.ndarray] = []
    head = [len(ids), len(probs), *_probs_header(probs), len(sids)]
    cols.append(np.array(head, dtype=np.uint64))
    gaps = np.diff(ids, prepend=-1) - 1
    cols.append(gaps.astype(np.uint64))
    hit = np.zeros(len(ids), bool)
    if base is not None:
        hit, at = _aligned(ids, base.ids.astype(np.int64))
        for col, ref in ((count, base.count), (total, base.total_ns), (lo, base.min_ns), (hi, base.max_ns)):
            cols.append(_zigzag(col - _at(ref, hit, at)))
    else:
        cols.extend(_zigzag(c) for c in (count, total, lo, hi))
    many = count >= _MIN_QUANTILE_CALLS
    if len(probs):
        delta_q = many.copy()
        if base is not None:
            delta_q &= hit & (_at(base.count, hit, at) >= _MIN_QUANTILE_CALLS)
            base_codes = grid_codes(base.quantiles_ns[at[delta_q]])
            cols.append(_zigzag((codes[delta_q] - base_codes).ravel()))
        key_q = many & ~delta_q if base is not None else many
        kc = codes[key_q]
        cols.append(_zigzag(kc[:, 0]))
        cols.append(np.diff(kc, axis=1).ravel().astype(np.uint64))
    cols.append(_zigzag(sids))
    if base is not None and len(base.stream_ids):
        shit, sat = _aligned(sids, base.stream_ids.astype(np.int64))
        cols.append(_zigzag(idle - _at(base.idle_ns, shit, sat)))
    else:
        cols.append(_zigzag(idle))
    body = _varints(np.concatenate(cols))
    flags = _DELTA if base is not None else 0
    packed = zstd.compress(body, level=level)
    if len(packed) < len(body):
        flags |= _ZSTD
        body = packed
    return bytes([_VERSION, flags]) + body


# --------------------------------------------------------------------------- decode


def is_delta(payload: bytes) -> bool:
    """Whether the payload is a delta frame (needs the previous step to decode)."""
    if len(payload) < 2 or payload[0] != _VERSION:
        raise DecodeError("kernel payload: not codec 1")
    return bool(payload[1] & _DELTA)


def _inflate(data: bytes) -> bytes:
    try:
        d = zstd.ZstdDecompressor()
        out = d.decompress(data, max_length=MAX_BODY)
    except zstd.ZstdError as exc:
        raise DecodeError(f"kernel payload: zstd body is corrupt ({exc})") from None
    if not d.eof:
        raise DecodeError(f"kernel payload: zstd body truncated or larger than {MAX_BODY} bytes")
    if d.unused_data:
        raise DecodeError("kernel payload: trailing bytes after the zstd body")
    return out


def decode_payload(payload: bytes, base: KernelStats | None = None) -> KernelStats:
    """Decode a payload; a delta frame needs ``base``, the decoded stats of its base step.

    Raises :class:`~schemas.DecodeError` on anything that is not a valid codec-1 payload.
    """
    ref = _delta_base(payload, base)
    body = _inflate(payload[2:]) if payload[1] & _ZSTD else bytes(payload[2:])
    r = _Reader(body)
    k = r.one("kernel count", MAX_KERNELS)
    q = r.one("probability count", MAX_PROBS)
    probs = _read_probs(r, q)
    s = r.one("stream count", MAX_STREAMS)
    if ref is not None and not np.array_equal(np.asarray(ref.probs), probs):
        raise DecodeError("kernel payload: delta frame against a base with other probabilities")
    ids = _read_ids(r, k)
    hit, at = (
        _aligned(ids, ref.ids.astype(np.int64))
        if ref is not None
        else (np.zeros(k, bool), np.zeros(k, np.int64))
    )
    count, total, lo, hi = _read_totals(r, k, ref, hit, at)
    quantiles = _snap(_read_codes(r, q, count, ref, hit, at), count, lo, hi, probs)
    sids, idle = _read_streams(r, s, ref)
    if r.pos != len(r.values):
        raise DecodeError(f"kernel payload: {len(r.values) - r.pos} values after the last column")
    if s and (np.any(np.abs(sids) > np.iinfo(np.int32).max) or idle.min() < 0):
        raise DecodeError("kernel payload: stream ids or idle times out of range")
    return KernelStats(
        ids=ids.astype(np.int32),
        count=count,
        total_ns=total,
        min_ns=lo,
        max_ns=hi,
        probs=probs,
        quantiles_ns=quantiles,
        stream_ids=sids.astype(np.int32),
        idle_ns=idle,
    )


def _delta_base(payload: bytes, base: KernelStats | None) -> KernelStats | None:
    """What a payload is coded against: ``base`` for a delta frame (which needs one), None
    for a key frame; checks the header."""
    delta = is_delta(payload)
    if payload[1] & ~(_DELTA | _ZSTD):
        raise DecodeError(f"kernel payload: unknown flags {payload[1]:#x}")
    if delta and base is None:
        raise DecodeError("kernel payload: delta frame without its base step")
    return base if delta else None


def _read_probs(r: _Reader, q: int) -> np.ndarray:
    """The ``q`` quantile probabilities: the default set, or explicit ones rising inside (0, 1)."""
    if r.one("probability set", 1) == 0:
        if q != len(DEFAULT_PROBS):
            raise DecodeError("kernel payload: default probabilities with a wrong count")
        return DEFAULT_PROBS.copy()
    probs = r.take(q, "probabilities").astype(np.float64) / _PROB_SCALE
    if q and (probs.min() <= 0 or probs.max() >= 1 or np.any(np.diff(probs) <= 0)):
        raise DecodeError("kernel payload: probabilities do not rise inside (0, 1)")
    return probs


def _read_ids(r: _Reader, k: int) -> np.ndarray:
    """The ``k`` kernel ids (rising, from their gaps), each within int32."""
    gaps = r.take(k, "kernel ids")
    if k and gaps.max() > np.iinfo(np.int32).max:
        raise DecodeError("kernel payload: kernel id out of range")
    ids = np.cumsum(gaps.astype(np.int64) + 1) - 1
    if k and ids[-1] > np.iinfo(np.int32).max:
        raise DecodeError("kernel payload: kernel id out of range")
    return ids


def _read_totals(
    r: _Reader, k: int, ref: KernelStats | None, hit: np.ndarray, at: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel: count, total, min and max (ns), each plus the base's value in a delta
    frame (kernel ``i`` is the base's ``at[i]`` where ``hit[i]``); checked for range."""
    fields = [r.signed(k, name) for name in ("count", "total", "min", "max")]
    if ref is not None:
        refs = (ref.count, ref.total_ns, ref.min_ns, ref.max_ns)
        fields = [f + _at(x, hit, at) for f, x in zip(fields, refs, strict=True)]
    count, total, lo, hi = fields
    if k and (count.min() < 1 or lo.min() < 0 or np.any(hi < lo) or np.any(total < lo)):
        raise DecodeError("kernel payload: counts or durations out of range")
    return count, total, lo, hi


def _read_codes(
    r: _Reader, q: int, count: np.ndarray, ref: KernelStats | None, hit: np.ndarray, at: np.ndarray
) -> np.ndarray:
    """The (k, q) grid codes of the quantiles of kernels with enough calls: in a delta frame
    the difference to the base's codes where the base holds the kernel with enough calls,
    else the first code and the rising steps after it."""
    codes = np.zeros((len(count), q), np.int64)
    if not q:
        return codes
    many = count >= _MIN_QUANTILE_CALLS
    delta_q = many.copy()
    if ref is not None:
        delta_q &= hit & (_at(ref.count, hit, at) >= _MIN_QUANTILE_CALLS)
        n = int(delta_q.sum())
        d = r.signed(n * q, "quantile deltas").reshape(n, q)
        codes[delta_q] = grid_codes(ref.quantiles_ns[at[delta_q]]) + d
    key_q = many & ~delta_q if ref is not None else many
    n = int(key_q.sum())
    first = r.signed(n, "first quantiles")
    steps = r.take(n * (q - 1), "quantile steps").reshape(n, q - 1)
    if n and steps.max() > 1 << 20:
        raise DecodeError("kernel payload: quantile step out of range")
    codes[key_q] = np.cumsum(np.concatenate([first[:, None], steps.astype(np.int64)], axis=1), axis=1)
    if np.abs(codes).max(initial=0) > 4000:  # GAMMA**4000 ns is ~ 10^25 years
        raise DecodeError("kernel payload: quantile code out of range")
    return codes


def _read_streams(r: _Reader, s: int, ref: KernelStats | None) -> tuple[np.ndarray, np.ndarray]:
    """The ``s`` stream ids and their idle times (plus the base's idle time of the same
    stream in a delta frame)."""
    sids = r.signed(s, "stream ids")
    idle = r.signed(s, "idle times")
    if ref is not None and len(ref.stream_ids):
        shit, sat = _aligned(sids, ref.stream_ids.astype(np.int64))
        idle = idle + _at(ref.idle_ns, shit, sat)
    return sids, idle
