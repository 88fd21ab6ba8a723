"""Kernel codec 1: exact fields round-trip exactly, quantiles within 1 %, garbage is a DecodeError."""

from __future__ import annotations

import contextlib
from statistics import NormalDist

import numpy as np
import pytest

from argus.producers.sketch import kernel_stats
from argus.schemas import DecodeError, KernelStats
from argus.schemas.kernel_codec import (
    DEFAULT_PROBS,
    MAX_BODY,
    decode_payload,
    encode_payload,
    is_delta,
    quantize,
)

_Z = NormalDist()


def _grid_lognormal(n: int, median: float, sigma: float) -> np.ndarray:
    """n durations at the (i + 0.5) / n quantiles of a log-normal: quantiles known exactly."""
    z = np.array([_Z.inv_cdf((i + 0.5) / n) for i in range(n)])
    return np.rint(median * np.exp(sigma * z)).astype(np.int64)


def _mixture_quantile(p: float, modes: list[tuple[float, float, float]]) -> float:
    """Quantile of well-separated log-normal modes (weight, median, sigma), lowest first."""
    acc = 0.0
    for w, med, sig in modes:
        if p < acc + w:
            return med * float(np.exp(sig * _Z.inv_cdf((p - acc) / w)))
        acc += w
    raise AssertionError


def _stats_from(durations: dict[int, np.ndarray]) -> KernelStats:
    ids = np.concatenate([np.full(len(d), k) for k, d in durations.items()])
    dur = np.concatenate(list(durations.values()))
    start = np.cumsum(dur + 1000) - dur
    return kernel_stats(ids, start, start + dur, np.arange(len(ids)) % 3)


def _assert_exact(a: KernelStats, b: KernelStats) -> None:
    for name in ("ids", "count", "total_ns", "min_ns", "max_ns", "stream_ids", "idle_ns"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_key_frame_round_trip_is_exact_and_quantiles_within_one_percent() -> None:
    rng = np.random.default_rng(1)
    durations = {
        k: rng.lognormal(np.log(1e3 * (k + 2)), 0.4, 5 + 40 * k).astype(np.int64) + 1 for k in range(30)
    }
    stats = _stats_from(durations)
    out = decode_payload(encode_payload(stats))
    _assert_exact(stats, out)
    assert np.array_equal(out.probs, DEFAULT_PROBS)
    rel = np.abs(out.quantiles_ns / stats.quantiles_ns - 1)
    assert rel.max() <= 0.01


def test_known_quantiles_of_unimodal_and_bimodal_kernels() -> None:
    modes_bi = [(0.3, 20_000.0, 0.08), (0.7, 160_000.0, 0.1)]  # p50, p90, p99 in the upper mode
    modes_bi2 = [(0.8, 5_000.0, 0.05), (0.2, 60_000.0, 0.05)]  # p50 low, p90 and p99 high
    durations = {
        0: _grid_lognormal(4000, 50_000.0, 0.5),
        1: np.concatenate([_grid_lognormal(1200, 20_000.0, 0.08), _grid_lognormal(2800, 160_000.0, 0.1)]),
        2: np.concatenate([_grid_lognormal(3200, 5_000.0, 0.05), _grid_lognormal(800, 60_000.0, 0.05)]),
    }
    truth = {
        0: [50_000.0 * float(np.exp(0.5 * _Z.inv_cdf(p))) for p in (0.5, 0.9, 0.99)],
        1: [_mixture_quantile(p, modes_bi) for p in (0.5, 0.9, 0.99)],
        2: [_mixture_quantile(p, modes_bi2) for p in (0.5, 0.9, 0.99)],
    }
    out = decode_payload(encode_payload(_stats_from(durations)))
    cols = [int(np.flatnonzero(p == DEFAULT_PROBS)[0]) for p in (0.5, 0.9, 0.99)]
    for row, kid in enumerate(out.ids):
        rel = np.abs(out.quantiles_ns[row, cols] / np.array(truth[int(kid)]) - 1)
        assert rel.max() <= 0.0101, (kid, rel)  # 1 % grid + < 0.01 % from the 4,000-point sample


def test_delta_chain_decodes_like_key_frames() -> None:
    rng = np.random.default_rng(2)
    base = None
    for step in range(6):
        durations = {k: rng.lognormal(np.log(5e4), 0.3, 100 + k).astype(np.int64) for k in range(10 + step)}
        stats = _stats_from(durations)
        payload = encode_payload(stats, base)
        assert is_delta(payload) == (base is not None)
        got = decode_payload(payload, base)
        _assert_exact(stats, got)
        assert np.allclose(got.quantiles_ns, decode_payload(encode_payload(stats)).quantiles_ns)
        assert np.allclose(got.quantiles_ns, quantize(stats).quantiles_ns)
        base = got


def test_delta_frame_without_base_is_an_error() -> None:
    s = _stats_from({0: np.arange(10, 100)})
    payload = encode_payload(s, quantize(s))
    with pytest.raises(DecodeError, match="base"):
        decode_payload(payload)


def test_one_and_two_call_kernels_have_exact_quantiles_and_custom_probs_travel() -> None:
    probs = np.array([0.05, 0.5, 0.999])
    ids = np.array([0, 1, 1, 2, 2, 2])
    dur = np.array([700, 100, 300, 10, 20, 30])
    stats = kernel_stats(ids, np.zeros(6, np.int64), dur, probs=probs)
    out = decode_payload(encode_payload(stats))
    assert np.array_equal(out.probs * 65535, np.rint(probs * 65535))
    assert np.allclose(out.quantiles_ns[0], 700)
    assert np.allclose(out.quantiles_ns[1], 100 + out.probs * 200)


def test_empty_stats_round_trip() -> None:
    stats = kernel_stats(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    out = decode_payload(encode_payload(stats))
    assert len(out) == 0


def _decode_or_decode_error(data: bytes, base: KernelStats | None = None) -> None:
    with contextlib.suppress(DecodeError):
        decode_payload(data, base)


def test_garbage_truncations_and_bit_flips_raise_only_decode_errors() -> None:
    rng = np.random.default_rng(3)
    stats = _stats_from({k: rng.integers(1000, 90_000, 50) for k in range(20)})
    good = encode_payload(stats)
    base = quantize(stats)
    delta = encode_payload(stats, base)
    for _ in range(300):
        _decode_or_decode_error(rng.bytes(int(rng.integers(0, 200))))
        _decode_or_decode_error(
            b"\x01" + bytes([int(rng.integers(0, 4))]) + rng.bytes(int(rng.integers(0, 100)))
        )
    for payload, b in ((good, None), (delta, base)):
        for cut in range(len(payload)):
            _decode_or_decode_error(payload[:cut], b)
        arr = np.frombuffer(payload, np.uint8)
        for _ in range(300):
            flipped = arr.copy()
            i = int(rng.integers(len(arr)))
            flipped[i] ^= np.uint8(1 << int(rng.integers(8)))
            _decode_or_decode_error(flipped.tobytes(), b)


def test_zstd_bomb_is_refused() -> None:
    from argus.schemas.kernel_codec import zstd  # type: ignore[attr-defined]

    bomb = bytes([1, 2]) + zstd.compress(b"\x00" * (MAX_BODY + 1024))
    with pytest.raises(DecodeError):
        decode_payload(bomb)


def test_delta_against_an_empty_step_and_back() -> None:
    empty = kernel_stats(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    full = _stats_from({0: np.arange(100, 200), 5: np.arange(1, 4)})
    got = decode_payload(encode_payload(full, empty), empty)
    _assert_exact(full, got)
    back = decode_payload(encode_payload(empty, quantize(full)), got)
    assert len(back) == 0
