"""The cluster simulator: determinism, valid records, the fault physics, speed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from argus import detectors
from argus.producers.simulator import (
    COMPUTE_STRAGGLER,
    FAULT_KINDS,
    KERNEL_NAMES,
    LINK_DEGRADATION,
    MASKED_COMPUTE_STRAGGLER,
    ClusterSimulator,
    Fault,
    Layout,
    random_fault,
)
from argus.schemas import StepBatch, decode, encode, validate

LAYOUT = Layout(dp=8, tp=4, pp=2)


def _same(a: StepBatch, b: StepBatch) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in a.columns)


def test_fault_kinds_are_the_detectors_classes() -> None:
    assert set(FAULT_KINDS) == set(detectors.ROOT_CAUSES) - {detectors.UNKNOWN}


def test_layout_coordinates_and_hosts() -> None:
    lay = Layout(dp=4, tp=8, pp=2)
    c = lay.coords
    assert lay.n_ranks == 64 and lay.n_hosts == 8
    r = lay.rank_at(pp=1, dp=2, tp=3)
    assert (c["pp"][r], c["dp"][r], c["tp"][r]) == (1, 2, 3)
    assert lay.ranks_of_host(lay.host_of(r)) == tuple(range(48, 56))  # a tp group shares a host


def test_same_seed_same_records_other_seed_differs() -> None:
    a = [s.batch for s in ClusterSimulator(LAYOUT, seed=3).run(8)]
    b = [s.batch for s in ClusterSimulator(LAYOUT, seed=3).run(8)]
    c = [s.batch for s in ClusterSimulator(LAYOUT, seed=4).run(8)]
    assert all(_same(x, y) for x, y in zip(a, b, strict=True))
    assert not _same(a[6], c[6])


def test_records_validate_and_round_trip() -> None:
    sim = ClusterSimulator(LAYOUT, seed=1, job="j")
    s = list(sim.run(3))[-1]
    validate(s.batch)
    back = decode(encode(s.batch))
    assert isinstance(back, StepBatch) and _same(back, s.batch)
    for hb in s.heartbeats([0, 5]):
        validate(hb)
        assert hb.last_step == 2 and hb.seq_entered == hb.seq_finished
    st = s.stacks([3])[3]
    validate(st)
    assert st.start_ns == s.batch["start_ns"][3] and sum(st.counts) > 0
    ks = s.kernel_stats([3])[3]
    assert ks.quantiles_ns.shape == (len(ks), 7) and np.all(np.diff(ks.quantiles_ns, axis=1) >= 0)
    assert len(KERNEL_NAMES) > int(ks.ids.max())
    parts = s.host_batches()
    assert len(parts) == LAYOUT.n_hosts and sum(len(p) for p in parts) == LAYOUT.n_ranks
    assert all(len(set(p["host"])) == 1 for p in parts)


def test_synchronous_step_and_the_culprit_waits_least() -> None:
    f = Fault(COMPUTE_STRAGGLER, 6, 4, (10,), magnitude=1.5)
    s = list(ClusterSimulator(LAYOUT, seed=2, faults=[f]).run(8))[-1]
    b = s.batch
    step_ms = b.step_ms
    assert np.ptp(step_ms) < 0.01  # every rank's step lasts the same
    compute = b["forward_ms"] + b["backward_ms"] + b["optimizer_ms"]
    coll = b["p2p_ms"] + b["all_reduce_ms"] + b["all_gather_ms"] + b["reduce_scatter_ms"]
    assert np.argmax(compute) == 10 and np.argmin(coll) == 10


def test_masked_straggler_hides_from_phase_timers_but_not_from_kernels() -> None:
    f = Fault(MASKED_COMPUTE_STRAGGLER, 6, 4, (10,), magnitude=1.5)
    s = list(ClusterSimulator(LAYOUT, seed=2, faults=[f]).run(8))[-1]
    compute = s.batch["forward_ms"] + s.batch["backward_ms"]
    assert compute[10] < np.percentile(compute, 99.9) * 1.05
    ks = s.kernel_stats([10, 11])
    gemm = KERNEL_NAMES.index(next(n for n in KERNEL_NAMES if "gemm" in n))
    assert ks[10].quantiles_ns[gemm, 3] > 1.3 * ks[11].quantiles_ns[gemm, 3]


def test_link_degradation_slows_the_two_ends() -> None:
    rng = np.random.default_rng(0)
    f = random_fault(LINK_DEGRADATION, LAYOUT, rng, 6)
    sim = ClusterSimulator(LAYOUT, seed=2, faults=[f])
    b = list(sim.run(8))[-1].batch
    top2 = set(np.argsort(b["all_reduce_ms"])[-2:].tolist())
    assert top2 == set(f.ranks)
    (lab,) = sim.labels
    assert lab.suspect_kind == "link" and "<->" in lab.suspect


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_every_kind_has_labels(kind: str) -> None:
    f = random_fault(kind, LAYOUT, np.random.default_rng(1), 10)
    sim = ClusterSimulator(LAYOUT, seed=1, faults=[f], checkpoint_every=20)
    labels = sim.labels
    assert labels and all(lab.kind == kind and lab.first_step >= 10 for lab in labels)


def test_one_step_of_100k_ranks_well_under_a_second() -> None:
    sim = ClusterSimulator(Layout(dp=125, tp=8, pp=100), seed=0)
    sim.step(0)
    t0 = time.perf_counter()
    s = sim.step(1)
    assert time.perf_counter() - t0 < 0.5
    assert len(s.batch) == 100_000
    validate(s.batch)
