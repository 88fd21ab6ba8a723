"""A seeded synthetic heavy step: many kernel events with unimodal and bimodal log-normal
durations, fresh random durations every step (the benchmark and the tests use it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SyntheticJob", "kineto_kernel_event"]

_TEMPLATES = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<{t}>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<{t}>, at::detail::Array<char*, 3>)",
    "void cutlass::Kernel<cutlass_80_tensorop_{t}_s16816gemm_relu_{t}_{a}x{b}_32x3_nn_align8>"
    "(cutlass_80_tensorop_{t}_s16816gemm_relu_{t}_{a}x{b}_32x3_nn_align8::Params)",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<{t}, float>(int, float, "
    "{t} const*, {t} const*, {t} const*, float*, float*, {t}*)",
    "ampere_{t}_s16816gemm_{t}_{a}x{b}_ldg8_f2f_stages_32x{c}_tn",
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<{a}, {b}, {c}, 4, false, false, {t}, "
    "Flash_kernel_traits<{a}, {b}, {c}, 4, {t}> >, true, false, false, false, true, true, false>(Flash_fwd_params)",
    "ncclDevKernel_AllReduce_Sum_{t}_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
)
_TYPES = ("float", "c10::Half", "c10::BFloat16", "double")


def kineto_kernel_event(
    name: str, ts_us: float, dur_us: float, stream: int, correlation: int, device: int = 0
) -> str:
    """One kernel event as the PyTorch profiler (Kineto) writes it, with its trailing separator."""
    return (
        "  {\n"
        f'    "ph": "X", "cat": "kernel", "name": "{name}", "pid": {device}, "tid": {stream},\n'
        f'    "ts": {ts_us:.3f}, "dur": {dur_us:.3f},\n'
        '    "args": {\n'
        f'      "External id": {correlation},      "queued": 0, "device": {device}, "context": 1,'
        f'      "stream": {stream}, "correlation": {correlation},      "registers per thread": 96,'
        '      "shared memory": 42024,      "blocks per SM": 0.074074,      "warps per SM": 1.259259,'
        '      "grid": [108, 1, 1],      "block": [256, 1, 1],      "est. achieved occupancy %": 12\n'
        "    }\n"
        "  },\n"
    )


@dataclass(frozen=True)
class _Kernel:
    count: int
    median_ns: float
    sigma: float
    second_ratio: float  # 0 for a unimodal kernel
    second_weight: float
    stream: int


class SyntheticJob:
    """One rank of a job whose every step launches the same kernels the same number of times.

    ``events(step)`` draws fresh log-normal durations (``bimodal`` of the kernels mix two
    modes 2-8x apart) and lays the kernels out back to back on ``streams`` streams with
    small gaps. Seeded: the same seed gives the same job and the same steps.
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        events: int = 50_000,
        kernels: int = 200,
        bimodal: float = 0.3,
        streams: int = 4,
    ) -> None:
        rng = np.random.default_rng(seed)
        weights = rng.lognormal(0.0, 1.2, kernels)
        counts = np.maximum(1, np.floor(weights / weights.sum() * events)).astype(np.int64)
        counts[np.argmax(counts)] += events - counts.sum()
        self.seed = seed
        self.kernels = [
            _Kernel(
                int(c),
                float(np.exp(rng.uniform(np.log(2e3), np.log(2e6)))),
                float(rng.uniform(0.05, 0.6)),
                float(rng.uniform(2.0, 8.0)) if rng.random() < bimodal else 0.0,
                float(rng.uniform(0.15, 0.6)),
                int(rng.integers(streams)) * 4 + 7,
            )
            for c in counts
        ]
        self.names = [
            _TEMPLATES[i % len(_TEMPLATES)].format(
                t=_TYPES[(i // len(_TEMPLATES)) % len(_TYPES)], a=64 + i, b=128 + i % 7, c=i % 5 + 2
            )
            + f"_{i}"
            for i in range(kernels)
        ]

    def durations(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Kernel id and duration (ns, integer) of every event of one step."""
        ids = np.repeat(np.arange(len(self.kernels), dtype=np.int32), [k.count for k in self.kernels])
        median = np.repeat([k.median_ns for k in self.kernels], [k.count for k in self.kernels])
        sigma = np.repeat([k.sigma for k in self.kernels], [k.count for k in self.kernels])
        ratio = np.repeat([k.second_ratio for k in self.kernels], [k.count for k in self.kernels])
        weight = np.repeat([k.second_weight for k in self.kernels], [k.count for k in self.kernels])
        second = (ratio > 0) & (rng.random(len(ids)) < weight)
        median = np.where(second, median * np.where(ratio > 0, ratio, 1.0), median)
        dur = np.maximum(1, np.rint(median * np.exp(sigma * rng.standard_normal(len(ids))))).astype(np.int64)
        return ids, dur

    def events(self, step: int) -> dict[str, np.ndarray]:
        """The raw kernel events of ``step``: ``ids``, ``start_ns``, ``end_ns``, ``stream``."""
        rng = np.random.default_rng([self.seed, step])
        ids, dur = self.durations(rng)
        order = rng.permutation(len(ids))  # kernels interleave in launch order
        ids, dur = ids[order], dur[order]
        stream = np.array([k.stream for k in self.kernels], np.int32)[ids]
        gap = rng.integers(500, 5_000, len(ids))
        start = np.zeros(len(ids), np.int64)
        for s in np.unique(stream):
            sel = stream == s
            span = dur[sel] + gap[sel]
            start[sel] = np.cumsum(span) - span
        return {"ids": ids, "start_ns": start, "end_ns": start + dur, "stream": stream}

    def kineto_bytes(self, step: int, base_us: float = 1.7e15) -> int:
        """Bytes of the step's kernel events as Kineto JSON (counted, not kept)."""
        ev = self.events(step)
        total = 0
        for i, (k, s, e, st) in enumerate(
            zip(
                ev["ids"].tolist(),
                ev["start_ns"].tolist(),
                ev["end_ns"].tolist(),
                ev["stream"].tolist(),
                strict=True,
            )
        ):
            total += len(kineto_kernel_event(self.names[k], base_us + s / 1e3, (e - s) / 1e3, st, i))
        return total
