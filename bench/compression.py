"""Kernel-sketch compression: raw Kineto kernel events per rank per step vs Kafka-ready bytes.

Inputs: a synthetic heavy step (50,000 kernel events, 200 names, unimodal and bimodal
log-normal durations, seeded; 100 consecutive steps with fresh durations) and the real
traces in ``$ARGUS_KINETO_DATA`` (default ../shared/data/kineto). Sketches measured side by
side in the same run:

- ``argus`` (ours): exact count/total/min/max + 7 log-grid quantiles, delta frames, zstd
  (key frame every 32 steps);
- ``argus-key``: the same, every step a key frame (no delta coding);
- ``ddsketch``: DDSketch buckets at 1 % relative accuracy (sparse, zstd);
- ``kde``: ARGUS-style KDE clusters keeping count, p50, p99 per density cluster (zstd).

Errors are relative to numpy's exact quantiles of the step's durations, for kernels with
≥ 20 calls. Run: ``.venv/bin/python bench/compression.py [--quick | --smoke]``; the last line is
JSON. ``--smoke`` (CI: does it still run?) takes 8 synthetic steps and the smallest real trace.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if sys.version_info >= (3, 14):  # pragma: no cover
    from compression import zstd
else:
    from backports import zstd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from argus.producers.kineto import KinetoImport
from argus.producers.sketch import NameInterner, RankSketchEncoder, kernel_stats
from argus.producers.sketch._synthetic import SyntheticJob
from argus.schemas import KernelSketch, encode
from argus.schemas.kernel_codec import decode_payload, encode_payload

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ARGUS_KINETO_DATA", REPO.parent / "shared" / "data" / "kineto"))
PROBS = np.array([0.5, 0.9, 0.99])
MIN_CALLS = 20


# --------------------------------------------------------------------------- alternatives


def _envelope(payload: bytes, step: int) -> int:
    """Kafka-ready bytes of a payload in the KernelSketch Avro envelope (Confluent wire format)."""
    return len(encode(KernelSketch("job-0001", 0, 0, step, 99, -1, payload), check=False))


def _varint_bytes(values: np.ndarray) -> bytes:
    from argus.schemas.kernel_codec import _varints

    return _varints(np.asarray(values, np.uint64))


def _groups(ids: np.ndarray, dur: np.ndarray) -> list[tuple[int, np.ndarray]]:
    order = np.lexsort((dur, ids))
    ids, dur = ids[order], dur[order]
    cut = np.flatnonzero(np.diff(ids)) + 1
    return [(int(g[0]), d) for g, d in zip(np.split(ids, cut), np.split(dur, cut), strict=True)]


def kde_clusters(d: np.ndarray) -> list[tuple[int, float, float]]:
    """ARGUS-style: split log-durations at the minima of a Gaussian KDE; (count, p50, p99) per cluster."""
    x = np.log(np.maximum(d, 1).astype(np.float64))
    if len(x) < 4 or x.std() == 0:
        return [(len(d), float(np.quantile(d, 0.5)), float(np.quantile(d, 0.99)))]
    bw = 1.06 * x.std() * len(x) ** -0.2
    grid = np.linspace(x.min(), x.max(), 128)
    sample = x if len(x) <= 2000 else np.quantile(x, np.linspace(0, 1, 2000))
    dens = np.exp(-0.5 * ((grid[:, None] - sample[None, :]) / bw) ** 2).sum(axis=1)
    minima = grid[1:-1][(dens[1:-1] < dens[:-2]) & (dens[1:-1] < dens[2:])]
    edges = np.concatenate(([-np.inf], minima, [np.inf]))
    out = []
    for lo, hi in itertools.pairwise(edges):
        c = d[(x > lo) & (x <= hi)]
        if len(c):
            out.append((len(c), float(np.quantile(c, 0.5)), float(np.quantile(c, 0.99))))
    return out


def kde_payload(
    groups: list[tuple[int, np.ndarray]],
) -> tuple[bytes, dict[int, list[tuple[int, float, float]]]]:
    clusters = {i: kde_clusters(d) for i, d in groups}
    head = [len(groups)] + [c for i, _ in groups for c in (i, len(clusters[i]))]
    counts = [c[0] for i, _ in groups for c in clusters[i]]
    floats = np.array([v for i, _ in groups for c in clusters[i] for v in c[1:]], np.float32)
    body = _varint_bytes(np.array(head + counts)) + floats.tobytes()
    return zstd.compress(body, level=19), clusters


def kde_quantiles(clusters: list[tuple[int, float, float]], probs: np.ndarray) -> np.ndarray:
    """Quantiles of the mixture of per-cluster log-normals fitted to (p50, p99)."""
    from scipy.stats import norm

    n = np.array([c[0] for c in clusters], float)
    mu = np.log([max(c[1], 1.0) for c in clusters])
    sig = np.maximum((np.log([max(c[2], 1.0) for c in clusters]) - mu) / 2.326, 1e-6)
    grid = np.linspace(mu.min() - 4 * sig.max(), mu.max() + 4 * sig.max(), 4000)
    f = (n[:, None] * norm.cdf((grid[None, :] - mu[:, None]) / sig[:, None])).sum(0) / n.sum()
    out: np.ndarray = np.exp(np.interp(probs, f, grid))
    return out


GAMMA_DD = 1.01 / 0.99


def dd_payload(
    groups: list[tuple[int, np.ndarray]],
) -> tuple[bytes, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """DDSketch at 1 % relative accuracy: sparse (bucket, count) per kernel."""
    sk = {}
    cols: list[np.ndarray] = [np.array([len(groups)])]
    for i, d in groups:
        b = np.ceil(np.log(np.maximum(d, 1)) / np.log(GAMMA_DD)).astype(np.int64)
        ub, cnt = np.unique(b, return_counts=True)
        sk[i] = (ub, cnt)
        cols += [np.array([i, len(ub), ub[0]]), np.diff(ub), cnt]
    return zstd.compress(_varint_bytes(np.concatenate(cols)), level=19), sk


def dd_quantiles(ub: np.ndarray, cnt: np.ndarray, probs: np.ndarray) -> np.ndarray:
    rank = probs * (cnt.sum() - 1)
    j = np.searchsorted(np.cumsum(cnt) - 1, rank, side="left")
    out: np.ndarray = 2 * GAMMA_DD ** ub[j] / (GAMMA_DD + 1)
    return out


# --------------------------------------------------------------------------- measuring


class Errors:
    def __init__(self) -> None:
        self.e: list[np.ndarray] = []

    def add(self, est: np.ndarray, truth: np.ndarray) -> None:
        self.e.append(np.abs(np.asarray(est) / np.asarray(truth) - 1))

    def stats(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.e:
            return np.full(3, np.nan), np.full(3, np.nan)
        a = np.vstack(self.e)
        return a.mean(axis=0), a.max(axis=0)


def measure_steps(
    name: str,
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    raw: list[int],
    names_bytes: int,
    table: list[dict[str, Any]],
    alt_steps: int | None = None,
) -> dict[str, Any]:
    """Encode the steps with every method; record bytes and p50/p90/p99 errors.

    The alternatives (key frames only, DDSketch, KDE) run on the first ``alt_steps`` steps.
    """
    alt_steps = len(steps) if alt_steps is None else alt_steps
    enc = RankSketchEncoder("job-0001", 0, 0, key_every=32)
    sizes: dict[str, list[int]] = {"argus": [], "argus-key": [], "ddsketch": [], "kde": []}
    errs = {k: Errors() for k in sizes}
    prev = None
    for s, (ids, start, end, stream) in enumerate(steps):
        st = kernel_stats(ids, start, end, stream)
        rec = enc.encode(s, st)
        sizes["argus"].append(len(encode(rec)))
        dec = decode_payload(rec.payload, prev if rec.base_step >= 0 else None)
        prev = dec
        assert np.array_equal(dec.count, st.count) and np.array_equal(dec.total_ns, st.total_ns)
        dur = end - start
        groups = _groups(ids, dur)
        big = [(i, d) for i, d in groups if len(d) >= MIN_CALLS]
        truth = np.array([np.quantile(d, PROBS) for _, d in big])
        if big:
            row = {int(k): j for j, k in enumerate(dec.ids)}
            ours = np.array([dec.quantiles_ns[row[i]][[2, 4, 6]] for i, _ in big])
            errs["argus"].add(ours, truth)
        if s >= alt_steps:
            continue
        sizes["argus-key"].append(_envelope(encode_payload(st), s))
        kde_bytes, clusters = kde_payload(groups)
        dd_bytes, dd = dd_payload(groups)
        sizes["kde"].append(_envelope(kde_bytes, s))
        sizes["ddsketch"].append(_envelope(dd_bytes, s))
        if not big:
            continue
        errs["argus-key"].add(ours, truth)
        errs["kde"].add(np.array([kde_quantiles(clusters[i], PROBS) for i, _ in big]), truth)
        errs["ddsketch"].add(np.array([dd_quantiles(*dd[i], PROBS) for i, _ in big]), truth)
    raw_mean = float(np.mean(raw))
    out = {}
    for method, sz in sizes.items():
        enc_mean = float(np.mean(sz)) + names_bytes / len(steps)
        mean, mx = errs[method].stats()
        table.append(
            {
                "input": name,
                "method": method,
                "raw_B": raw_mean,
                "enc_B": enc_mean,
                "ratio": raw_mean / enc_mean,
                "p50": (mean[0], mx[0]),
                "p90": (mean[1], mx[1]),
                "p99": (mean[2], mx[2]),
            }
        )
        out[method] = table[-1]
    return out


def synthetic(n_steps: int, alt_steps: int, table: list[dict[str, Any]]) -> tuple[dict[str, Any], float]:
    job = SyntheticJob(seed=7, events=50_000, kernels=200)
    raw = [job.kineto_bytes(0)]  # the JSON size barely moves between steps
    names = NameInterner("job-0001", 0, 0)
    names.intern_many(job.names)
    names_bytes = len(encode(names.pending()))  # type: ignore[arg-type]
    steps = []
    for s in range(n_steps):
        ev = job.events(s)
        steps.append((ev["ids"], ev["start_ns"], ev["end_ns"], ev["stream"]))
    out = measure_steps("synthetic 50k", steps, raw, names_bytes, table, alt_steps)
    # encode time of one 50,000-event step on one core: stats + delta payload, median of runs
    enc = RankSketchEncoder("job-0001", 0, 0)
    times = []
    for s in range(min(n_steps, 30)):
        ids, start, end, stream = steps[s]
        t = time.perf_counter()
        enc.encode(s, kernel_stats(ids, start, end, stream))
        times.append(time.perf_counter() - t)
    return out, float(np.median(times[3:]) * 1e3)


def real_trace(
    path: Path,
) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], list[int], int]:
    """Per step: the kernel events (as the importer assigns them) and their raw JSON bytes."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as fh:
            text = fh.read()
    else:
        text = path.read_text()
    dec = json.JSONDecoder()
    i = text.index("[", text.index('"traceEvents"')) + 1
    kernels, runtime, steps = [], {}, []
    while True:
        while text[i] in " \t\r\n,":
            i += 1
        if text[i] == "]":
            break
        e, j = dec.raw_decode(text, i)
        cat, args = e.get("cat"), e.get("args") or {}
        if cat == "kernel":
            kernels.append(
                (
                    e["name"],
                    float(e["ts"]),
                    float(e["dur"]),
                    args.get("stream", 0),
                    args.get("correlation", -1),
                    j - i + 4,
                )
            )
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            runtime[args["correlation"]] = float(e["ts"])
        elif str(e.get("name", "")).startswith("ProfilerStep#"):
            steps.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
        i = j
    steps.sort()
    starts = np.array([s for s, _ in steps])
    launch = np.array([runtime.get(k[4], k[1]) for k in kernels])
    idx = np.searchsorted(starts, launch, side="right") - 1
    idx[(idx == len(steps) - 1) & (launch > steps[-1][1])] = -1
    names = NameInterner("job", 0, 0)
    ids_all = names.intern_many(k[0] for k in kernels)
    out, raw = [], []
    for s in range(len(steps)):
        sel = np.flatnonzero(idx == s)
        ts = np.array([kernels[j][1] for j in sel])
        dur = np.rint(np.array([kernels[j][2] for j in sel]) * 1e3).astype(np.int64)
        start = np.rint((ts - ts.min()) * 1e3).astype(np.int64) if len(sel) else np.zeros(0, np.int64)
        out.append((ids_all[sel], start, start + dur, np.array([kernels[j][3] for j in sel], np.int64)))
        raw.append(int(sum(kernels[j][5] for j in sel)))
    names_rec = names.pending()
    return out, raw, len(encode(names_rec)) if names_rec else 0


def fmt_err(pair: tuple[float, float]) -> str:
    return f"{pair[0] * 100:6.2f}/{pair[1] * 100:7.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="alternatives on 10 synthetic steps instead of 100")
    ap.add_argument(
        "--smoke", action="store_true", help="8 synthetic steps, the smallest trace: runs, figures unchecked"
    )
    args = ap.parse_args()
    table: list[dict[str, Any]] = []
    n_steps, alt_steps = (8, 2) if args.smoke else (100, 10 if args.quick else 100)
    syn, encode_ms = synthetic(n_steps, alt_steps, table)
    traces = sorted(DATA.glob("*/*.json*"))
    if args.smoke:
        traces = sorted(traces, key=lambda p: p.stat().st_size)[:1]
    # the importer must agree with the bench's own step split (a cross-check of both)
    for path in traces:
        steps, raw, names_bytes = real_trace(path)
        imp = KinetoImport(path, job="bench")
        n_sketch = sum(1 for r in imp.records() if isinstance(r, KernelSketch))
        assert n_sketch == len(steps), (path, n_sketch, len(steps))
        measure_steps(path.name.split(".")[0], steps, raw, names_bytes, table)
    print(
        f"{'input':22} {'method':10} {'raw B/step':>12} {'enc B/step':>10} {'ratio':>9}  "
        f"{'p50 err % mean/max':>18} {'p90 err % mean/max':>18} {'p99 err % mean/max':>18}"
    )
    for r in table:
        print(
            f"{r['input']:22} {r['method']:10} {r['raw_B']:12,.0f} {r['enc_B']:10,.0f} {r['ratio']:9,.0f}  "
            f"{fmt_err(r['p50']):>18} {fmt_err(r['p90']):>18} {fmt_err(r['p99']):>18}"
        )
    print(f"synthetic: {n_steps} steps, names counted once; alternatives on {alt_steps} steps")
    print(f"encode (stats + delta payload) of one 50,000-event step: {encode_ms:.1f} ms on one core")
    ours, kde = syn["argus"], syn["kde"]
    print(
        json.dumps(
            {
                "ratio": round(ours["ratio"], 1),
                "p50_err_max": round(float(ours["p50"][1]), 5),
                "p90_err_max": round(float(ours["p90"][1]), 5),
                "p99_err_max": round(float(ours["p99"][1]), 5),
                "encode_ms_50k": round(encode_ms, 2),
                "kde_p90_err_mean": round(float(kde["p90"][0]), 5),
                "kde_ratio": round(kde["ratio"], 1),
                "ddsketch_ratio": round(syn["ddsketch"]["ratio"], 1),
                "keyframe_only_ratio": round(syn["argus-key"]["ratio"], 1),
            }
        )
    )


if __name__ == "__main__":
    main()
