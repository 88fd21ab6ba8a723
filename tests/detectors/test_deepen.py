"""The kernel level: kernel families, the one quantile function, and deepening a suspect."""

from __future__ import annotations

import re

import numpy as np
import pytest

from argus import detectors as d
from argus.producers.simulator import CLEAN, KERNEL_NAMES, ClusterSimulator, Fault, Layout
from argus.producers.sketch import kernel_stats
from argus.producers.sketch._synthetic import SyntheticJob
from argus.schemas.kernel_codec import DEFAULT_PROBS, decode_payload, encode_payload

LAYOUT = Layout(dp=4, tp=8, pp=2)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", "gemm"),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)", "gemm"),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "nccl:AllReduce"),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "nccl:AllGather"),
        ("void fbgemm_gpu::split_embedding_codegen_forward_unweighted_kernel<float>(int)", "split_embedding"),
        ("flash_fwd_kernel", "flash_attention"),
        ("void at::native::unrolled_elementwise_kernel<foo>(int)", "elementwise"),
        ("my_custom_kernel<3>(float*)", "my_custom_kernel"),
    ],
)
def test_kernel_family_names_what_a_person_would(name: str, family: str) -> None:
    assert d.kernel_family(name) == family


def test_the_one_quantile_function_hits_the_stored_points_and_the_ends() -> None:
    job = SyntheticJob(1, events=5000, kernels=30)
    ev = job.events(0)
    st = decode_payload(encode_payload(kernel_stats(ev["ids"], ev["start_ns"], ev["end_ns"], ev["stream"])))
    q = st.quantiles_at(np.concatenate(([0.0], DEFAULT_PROBS, [1.0])))
    assert np.allclose(q[:, 1:-1], st.quantiles_ns)
    assert np.allclose(q[:, 0], st.min_ns) and np.allclose(q[:, -1], st.max_ns)
    assert np.all(np.diff(st.quantiles_at(np.linspace(0, 1, 50)), axis=1) >= 0)


def _step(fault: Fault, step: int = 12) -> object:
    sim = ClusterSimulator(LAYOUT, seed=5, faults=[fault], noise=CLEAN)
    return list(sim.run(step + 1))[-1]


def test_a_gemm_slowdown_is_named_gemm_with_its_p50_and_p90_shift() -> None:
    s = _step(Fault("compute_straggler", 10, 5, (21,), magnitude=1.3, kernel="gemm"))
    ks = s.kernel_stats([21, 16, 17, 18, 19])  # type: ignore[attr-defined]
    deep = d.deepen_ranks([21], [16, 17, 18, 19], ks, {}, KERNEL_NAMES)
    assert deep is not None and deep.explained and deep.rank == 21
    assert 1.25 <= deep.evidence["kernel_family:gemm"] <= 1.35
    assert [k for k in deep.evidence if k.startswith("kernel_family:")] == ["kernel_family:gemm"]
    assert re.search(r"slow kernels: gemm p50 x1\.[23]\d p90 x1\.[23]\d \(sm90_xmma_gemm", deep.summary)


def test_a_slow_link_is_named_by_its_nccl_kernel() -> None:
    s = _step(Fault("link_degradation", 10, 5, (3, 11), magnitude=2.5))
    ks = s.kernel_stats([3, 0, 1, 2, 4])  # type: ignore[attr-defined]
    deep = d.deepen_ranks([3, 11], [0, 1, 2, 4], ks, {}, KERNEL_NAMES)
    assert deep is not None and deep.explained
    assert next(k for k in deep.evidence if k.startswith("kernel_family:")) == "kernel_family:nccl:AllReduce"


def test_a_data_loading_host_is_named_by_its_frame() -> None:
    s = _step(Fault("host_cpu_contention", 10, 5, host=1, magnitude=150.0))
    st = s.stacks([8, 0, 1, 16])  # type: ignore[attr-defined]
    deep = d.deepen_ranks([8], [0, 1, 16], {}, st)
    assert deep is not None and deep.explained
    top = max((k for k in deep.evidence if k.startswith("stack:")), key=deep.evidence.__getitem__)
    assert "dataloader" in top


def test_a_healthy_rank_explains_nothing_and_missing_data_says_so() -> None:
    s = _step(Fault("gc_pause", 12, 1, (5,), magnitude=300.0))
    ks, st = s.kernel_stats([20, 16, 17, 18]), s.stacks([20, 16, 17, 18])  # type: ignore[attr-defined]
    deep = d.deepen_ranks([20], [16, 17, 18], ks, st, KERNEL_NAMES)
    assert deep is not None and not deep.explained and deep.summary == ""
    assert d.deepen_ranks([20], [16, 17], {}, {}, KERNEL_NAMES) is None
    assert d.deepen_ranks([20], [], ks, st, KERNEL_NAMES) is None


def test_ranks_that_intern_names_differently_are_compared_by_name() -> None:
    s = _step(Fault("compute_straggler", 10, 5, (21,), magnitude=1.3, kernel="gemm"))
    ks = s.kernel_stats([21, 16, 17])  # type: ignore[attr-defined]
    k = len(KERNEL_NAMES)
    # rank 16 interned its names in reverse order
    rev = ks[16]
    ks[16] = type(rev)(
        (k - 1 - rev.ids).astype(np.int32), rev.count, rev.total_ns, rev.min_ns, rev.max_ns, rev.probs,
        rev.quantiles_ns, rev.stream_ids, rev.idle_ns,
    )  # fmt: skip
    names = {21: dict(enumerate(KERNEL_NAMES)), 17: dict(enumerate(KERNEL_NAMES))}
    names[16] = {k - 1 - i: n for i, n in enumerate(KERNEL_NAMES)}
    common, table = d.common_ids(ks, names)
    deep = d.deepen_ranks([21], [16, 17], common, {}, table)
    assert deep is not None and "kernel_family:gemm" in deep.evidence
    wrong = d.deepen_ranks([21], [16, 17], ks, {}, KERNEL_NAMES)  # the raw ids mismatch
    assert wrong is not None and wrong.evidence != deep.evidence
