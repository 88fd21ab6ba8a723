"""Decode side of kernel sketches: quantiles, CDF, merging across steps and ranks."""

from __future__ import annotations

import numpy as np

from argus.detectors.sketches import cdf, knots, mean_ns, merge, quantiles
from argus.producers.sketch import kernel_stats
from argus.producers.sketch._synthetic import SyntheticJob
from argus.schemas import KernelStats
from argus.schemas.kernel_codec import DEFAULT_PROBS, decode_payload, encode_payload


def _step(job: SyntheticJob, step: int) -> tuple[KernelStats, dict[str, np.ndarray]]:
    ev = job.events(step)
    return kernel_stats(ev["ids"], ev["start_ns"], ev["end_ns"], ev["stream"]), ev


def test_quantiles_hit_the_stored_points_and_the_ends() -> None:
    st = decode_payload(encode_payload(_step(SyntheticJob(1, events=5000, kernels=30), 0)[0]))
    q = quantiles(st, np.concatenate(([0.0], DEFAULT_PROBS, [1.0])))
    assert np.allclose(q[:, 1:-1], st.quantiles_ns)
    assert np.allclose(q[:, 0], st.min_ns) and np.allclose(q[:, -1], st.max_ns)
    assert np.all(np.diff(quantiles(st, np.linspace(0, 1, 50)), axis=1) >= 0)


def test_cdf_inverts_quantiles() -> None:
    st = _step(SyntheticJob(2, events=5000, kernels=30), 0)[0]
    _, v = knots(st)
    many = st.count >= 3
    for j, p in enumerate(DEFAULT_PROBS):
        c = cdf(st, v[many, j + 1])
        diag = np.diag(c)
        distinct = v[many, j + 1] > v[many, j]  # a flat stretch makes the CDF jump over p
        assert np.allclose(diag[distinct], p, atol=1e-9)
    assert np.allclose(mean_ns(st), st.total_ns / st.count)


def test_merge_across_steps_is_exact_for_counts_and_close_for_quantiles() -> None:
    job = SyntheticJob(4, events=20_000, kernels=60, bimodal=0.0)
    parts, durs, ids = [], [], []
    for s in range(8):
        st, ev = _step(job, s)
        parts.append(decode_payload(encode_payload(st)))
        durs.append(ev["end_ns"] - ev["start_ns"])
        ids.append(ev["ids"])
    pooled = kernel_stats(np.concatenate(ids), np.zeros(sum(map(len, durs)), np.int64), np.concatenate(durs))
    m = merge(parts)
    for name in ("ids", "count", "total_ns", "min_ns", "max_ns"):
        assert np.array_equal(getattr(m, name), getattr(pooled, name)), name
    big = pooled.count >= 800  # >= 100 calls a step; fewer calls merge less well (p99 up to ~13 %)
    rel = np.abs(m.quantiles_ns[big] / pooled.quantiles_ns[big] - 1)
    assert rel[:, [2, 4, 6]].max() < 0.04  # p50, p90, p99 of the pooled data within 4 %
    assert np.array_equal(merge(parts).idle_ns, np.sum([p.idle_ns for p in parts], axis=0))


def test_merge_across_ranks_with_different_kernels() -> None:
    a = kernel_stats(np.array([0, 0, 0, 1]), np.zeros(4, np.int64), np.array([10, 20, 30, 5]))
    b = kernel_stats(np.array([1, 1, 2]), np.zeros(3, np.int64), np.array([7, 9, 100]))
    m = merge([a, b])
    assert m.ids.tolist() == [0, 1, 2]
    assert m.count.tolist() == [3, 3, 1]
    assert m.total_ns.tolist() == [60, 21, 100]
    assert m.min_ns.tolist() == [10, 5, 100] and m.max_ns.tolist() == [30, 9, 100]
    one = merge([a])
    assert np.allclose(one.quantiles_ns, a.quantiles_ns)


def test_merge_of_identical_steps_keeps_bimodal_quantiles() -> None:
    st = _step(SyntheticJob(6, events=20_000, kernels=40, bimodal=1.0), 0)[0]
    m = merge([st, st, st])
    assert np.array_equal(m.count, 3 * st.count)
    assert np.allclose(m.quantiles_ns, st.quantiles_ns, rtol=1e-9)
