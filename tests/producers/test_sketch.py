"""Rank-side kernel sketches: stats match numpy, idle time, interner, encoder chain, speed, ratio."""

from __future__ import annotations

import time

import numpy as np

from argus.producers.sketch import ALL_STREAMS, NameInterner, RankSketchEncoder, kernel_stats, stream_idle
from argus.producers.sketch._synthetic import SyntheticJob
from argus.schemas import KernelNames, encode
from argus.schemas.kernel_codec import DEFAULT_PROBS, decode_payload


def test_kernel_stats_match_numpy_per_kernel() -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 40, 5000)
    dur = rng.lognormal(9, 1.0, 5000).astype(np.int64)
    start = rng.integers(0, 10**9, 5000)
    st = kernel_stats(ids, start, start + dur)
    assert list(st.ids) == sorted(set(ids.tolist()))
    for row, k in enumerate(st.ids):
        d = dur[ids == k]
        assert st.count[row] == len(d)
        assert st.total_ns[row] == d.sum()
        assert st.min_ns[row] == d.min() and st.max_ns[row] == d.max()
        assert np.allclose(st.quantiles_ns[row], np.quantile(d, DEFAULT_PROBS))


def test_idle_time_per_stream_and_device() -> None:
    # stream 1: [0,10) [20,30) [25,40) -> idle 10; stream 2: [5,15) [50,60) -> idle 35
    start = np.array([0, 20, 25, 5, 50])
    end = np.array([10, 30, 40, 15, 60])
    stream = np.array([1, 1, 1, 2, 2])
    ids, idle = stream_idle(start, end, stream)
    got = dict(zip(ids.tolist(), idle.tolist(), strict=True))
    assert got == {ALL_STREAMS: 5 + 10, 1: 10, 2: 35}  # device busy [0,15) [20,40) [50,60)


def test_interner_sends_names_once_and_only_new_ones() -> None:
    n = NameInterner("j", 0, 3)
    assert n.intern_many(["a", "b", "a"]).tolist() == [0, 1, 0]
    first = n.pending()
    assert isinstance(first, KernelNames) and first.names == ("a", "b") and first.ids == (0, 1)
    assert n.pending() is None
    assert n.intern("c") == 2 and n.intern("a") == 0
    again = n.pending()
    assert again is not None and again.names == ("c",) and again.ids == (2,)
    encode(again)


def test_encoder_chain_key_frames_and_gaps() -> None:
    job = SyntheticJob(3, events=3000, kernels=40)
    enc = RankSketchEncoder("j", 0, 1, key_every=4)
    prev = None
    bases = []
    for step in [0, 1, 2, 3, 4, 5, 7, 8]:
        ev = job.events(step)
        st = kernel_stats(ev["ids"], ev["start_ns"], ev["end_ns"], ev["stream"])
        rec = enc.encode(step, st)
        bases.append(rec.base_step)
        dec = decode_payload(rec.payload, prev if rec.base_step >= 0 else None)
        assert np.array_equal(dec.count, st.count) and np.array_equal(dec.total_ns, st.total_ns)
        prev = dec
    assert bases == [-1, 0, 1, 2, -1, 4, -1, 7]  # key every 4th; a missing step forces a key frame


def test_encoding_a_50k_event_step_takes_under_20_ms() -> None:
    job = SyntheticJob(5)
    enc = RankSketchEncoder("j", 0, 0)
    times = []
    for step in range(8):
        ev = job.events(step)
        t = time.perf_counter()
        enc.encode(step, kernel_stats(ev["ids"], ev["start_ns"], ev["end_ns"], ev["stream"]))
        times.append(time.perf_counter() - t)
    assert min(times[1:]) < 0.020, times


def test_heavy_step_steady_state_ratio_is_at_least_10000() -> None:
    job = SyntheticJob(7)
    names = NameInterner("job-0001", 0, 0)
    names.intern_many(job.names)
    names_rec = names.pending()
    assert names_rec is not None
    enc = RankSketchEncoder("job-0001", 0, 0, key_every=32)
    sizes = []
    for step in range(33):  # one key frame, 32 deltas, the next key frame
        ev = job.events(step)
        sizes.append(
            len(encode(enc.encode(step, kernel_stats(ev["ids"], ev["start_ns"], ev["end_ns"], ev["stream"]))))
        )
    per_step = np.mean(sizes) + len(encode(names_rec)) / 100
    assert job.kineto_bytes(0) / per_step >= 10_000, per_step
