"""CUPTI activity records (cupti-python's own classes) → kernel sketches per step."""

from __future__ import annotations

import numpy as np
import pytest

from argus.producers.collectors.cupti import CuptiCollector, activity_arrays, step_events, sync_ns_per_step
from argus.schemas import KernelNames, KernelSketch
from argus.schemas.kernel_codec import decode_payload

cupti = pytest.importorskip("cupti.cupti")  # cupti-python is in the dev extra; it imports without a GPU

K = cupti.ActivityKind
CUSTOM0 = int(cupti.ExternalCorrelationKind.CUSTOM0)


def kernel(name, start, end, stream, corr):
    r = cupti.ActivityKernel11()
    r.kind, r.name, r.start, r.end, r.stream_id, r.correlation_id = (
        int(K.CONCURRENT_KERNEL),
        name,
        start,
        end,
        stream,
        corr,
    )
    return r


def memcpy(kind, nbytes, start, end, stream, corr):
    r = cupti.ActivityMemcpy6()
    r.kind, r.copy_kind, r.bytes, r.start, r.end, r.stream_id, r.correlation_id = (
        int(K.MEMCPY),
        int(kind),
        nbytes,
        start,
        end,
        stream,
        corr,
    )
    return r


def memset(nbytes, start, end, stream, corr):
    r = cupti.ActivityMemset4()
    r.kind, r.bytes, r.start, r.end, r.stream_id, r.correlation_id = (
        int(K.MEMSET),
        nbytes,
        start,
        end,
        stream,
        corr,
    )
    return r


def sync(start, end, corr):
    r = cupti.ActivitySynchronization2()
    r.kind, r.type, r.start, r.end, r.correlation_id = (
        int(K.SYNCHRONIZATION),
        int(cupti.ActivitySynchronizationType.STREAM_SYNCHRONIZE),
        start,
        end,
        corr,
    )
    return r


def tag(corr, step):
    r = cupti.ActivityExternalCorrelation()
    r.kind, r.external_kind, r.external_id, r.correlation_id = (
        int(K.EXTERNAL_CORRELATION),
        CUSTOM0,
        step,
        corr,
    )
    return r


def test_activity_arrays_reads_kernels_copies_sets_and_syncs():
    recs = [
        kernel("gemm", 1000, 1500, 7, 1),
        memcpy(cupti.ActivityMemcpyKind.HTOD, 4096, 1600, 1700, 8, 2),
        memset(512, 1700, 1710, 7, 3),
        sync(1800, 2100, 4),
        kernel("bad-timestamp", 0, 0, 7, 5),  # CUPTI could not time it: dropped
        tag(1, 0),
        tag(2, 0),
        tag(3, 1),
        tag(4, 1),
    ]
    a = activity_arrays(recs)
    assert a.names == ["gemm", "[memcpy HtoD]", "[memset]"]
    assert a.start_ns.tolist() == [1000, 1600, 1700] and a.end_ns.tolist() == [1500, 1700, 1710]
    assert a.stream_ids.tolist() == [7, 8, 7] and a.nbytes.tolist() == [0, 4096, 512]
    assert a.external == {1: 0, 2: 0, 3: 1, 4: 1}
    assert {k: v.tolist() for k, v in step_events(a).items()} == {0: [0, 1], 1: [2]}
    assert sync_ns_per_step(a) == {1: 300}


def test_collector_emits_names_once_and_sketches_with_exact_counts():
    rng = np.random.default_rng(3)
    c = CuptiCollector("job", 0, 5)
    recs, corr, t = [], 0, 10_000
    expected = {}
    for step in range(4):
        durs = {"gemm": rng.integers(100, 200, 30), "nccl:all_reduce": rng.integers(500, 900, 3)}
        expected[step] = durs
        for name, ds in durs.items():
            for d in ds:
                corr += 1
                recs.append(tag(corr, step))
                recs.append(kernel(name, t, t + int(d), 7 if name == "gemm" else 13, corr))
                t += int(d) + 50
    # records arrive split over two buffers, a tag before its kernel's buffer
    out = c.feed(recs[: len(recs) // 2], current_step=1) + c.feed(recs[len(recs) // 2 :], current_step=6)
    # the device's records trail the loop: a step waits for the device activity of the step
    # after the next (or the final drain, after CUPTI's last flush)
    assert [r.step for r in out if isinstance(r, KernelSketch)] == [0, 1]
    out += c.feed([], current_step=6, final=True)
    names = [r for r in out if isinstance(r, KernelNames)]
    sketches = [r for r in out if isinstance(r, KernelSketch)]
    assert [n.names for n in names] == [("gemm", "nccl:all_reduce")]
    assert [s.step for s in sketches] == [0, 1, 2, 3]
    prev = None
    for s in sketches:
        stats = decode_payload(s.payload, prev)
        prev = stats
        by_id = dict(zip(stats.ids.tolist(), range(len(stats.ids)), strict=True))
        for kid, name in enumerate(names[0].names):
            ds = expected[s.step][name]
            i = by_id[kid]
            assert stats.count[i] == len(ds) and stats.total_ns[i] == int(ds.sum())
            assert stats.min_ns[i] == ds.min() and stats.max_ns[i] == ds.max()
    assert c.dropped_records == 0


def test_kernels_from_other_threads_inside_a_step_join_it_and_late_ones_wait_for_a_tag():
    """Autograd's device thread launches the backward's kernels without the training thread's
    tag: their correlation ids lie between the step's tagged ones, so they belong to it."""
    from argus.producers.collectors.cupti import KIND_CONCURRENT_KERNEL, KIND_EXTERNAL_CORRELATION, Activity

    def k(corr, t):
        return Activity(KIND_CONCURRENT_KERNEL, f"k{corr % 3}", t, t + 100, 7, corr)

    def tag(corr, step):
        return Activity(KIND_EXTERNAL_CORRELATION, correlation_id=corr, external_kind=3, external_id=step)

    first = [tag(1, 0), k(1, 1000), k(2, 2000), k(3, 3000), tag(4, 0), k(4, 4000), k(5, 5000)]
    c = CuptiCollector("j", 0, 0)
    assert c.feed(first, current_step=0, lag=1) == []  # step 0 still open; k5 waits for a tag
    later = [tag(6, 1), k(6, 6000)]
    assert c.feed(later, current_step=1, lag=1) == []  # no device activity of step 2 yet
    out = c.feed([tag(8, 2), k(8, 8000)], current_step=2, lag=1)
    (sk,) = [r for r in out if isinstance(r, KernelSketch)]
    assert sk.step == 0
    assert int(decode_payload(sk.payload).count.sum()) == 5  # k1..k5: k2, k3 and k5 untagged
    assert c.dropped_records == 0


class _Recorder:
    """cupti-python's module surface the collector calls, recording each call in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.ActivityKind = K
        self.ExternalCorrelationKind = cupti.ExternalCorrelationKind

    def activity_register_callbacks(self, *_a: object) -> None:
        self.calls.append(("register", None))

    def activity_enable(self, kind: object) -> None:
        self.calls.append(("enable", kind))

    def activity_disable(self, kind: object) -> None:
        self.calls.append(("disable", kind))

    def activity_push_external_correlation_id(self, _kind: object, step: int) -> None:
        self.calls.append(("push", step))

    def activity_pop_external_correlation_id(self, _kind: object) -> None:
        self.calls.append(("pop", None))

    def activity_flush_all(self, _flag: int) -> None:
        self.calls.append(("flush", None))


@pytest.mark.parametrize("tagging", ["runtime", "marker"])
def test_tagging_modes_call_cupti_in_order(tagging: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime: API records on all run, the step's tag pushed at its begin and popped at its
    end; marker: API records on only around the one marker call at a step's begin."""
    import cupti as pkg

    rec = _Recorder()
    monkeypatch.setattr(pkg, "cupti", rec)
    c = CuptiCollector("j", 0, 0, tagging=tagging, marker=lambda: rec.calls.append(("marker", None)))
    c.start()
    enabled = [k for op, k in rec.calls if op == "enable"]
    assert (K.RUNTIME in enabled) == (tagging == "runtime")
    rec.calls.clear()
    c.begin_step(7)
    c.end_step(7)
    if tagging == "runtime":
        assert rec.calls == [("push", 7), ("pop", None)]
    else:
        assert rec.calls == [
            ("enable", K.RUNTIME),
            ("push", 7),
            ("marker", None),
            ("pop", None),
            ("disable", K.RUNTIME),
        ]
    rec.calls.clear()
    c.stop()
    assert (("disable", K.RUNTIME) in rec.calls) == (tagging == "runtime")


def test_marker_tags_alone_split_steps_and_syncs() -> None:
    """One tagged marker per step: every kernel and CPU wait between two markers is the step of
    the one below, the activity above the last marker waits for the next."""
    from argus.producers.collectors.cupti import (
        KIND_CONCURRENT_KERNEL,
        KIND_EXTERNAL_CORRELATION,
        KIND_SYNCHRONIZATION,
        Activity,
    )

    def k(corr: int) -> Activity:
        return Activity(KIND_CONCURRENT_KERNEL, "gemm", corr * 1000, corr * 1000 + 400, 7, corr)

    def mark(corr: int, step: int) -> Activity:
        return Activity(KIND_EXTERNAL_CORRELATION, correlation_id=corr, external_kind=3, external_id=step)

    wait = Activity(KIND_SYNCHRONIZATION, start=15_000, end=15_900, correlation_id=15)
    records = [
        mark(10, 0),
        *map(k, range(11, 15)),
        wait,
        mark(16, 1),
        *map(k, range(17, 20)),
        mark(20, 2),
        k(21),
    ]
    c = CuptiCollector("j", 0, 0, tagging="marker", marker=lambda: None)
    out = c.feed(records, current_step=3, lag=0)  # k21 (above marker 2) waits for marker 3
    out += c.feed([mark(22, 3), k(23)], current_step=4, lag=0)
    counts, base = {}, None
    for r in out:
        if isinstance(r, KernelSketch):
            base = decode_payload(r.payload, base)
            counts[r.step] = int(base.count.sum())
    assert counts == {0: 4}  # step 1 waits for device activity of step 3
    for r in c.feed([], current_step=4, final=True):  # after CUPTI's last flush: the rest
        if isinstance(r, KernelSketch):
            base = decode_payload(r.payload, base)
            counts[r.step] = int(base.count.sum())
    assert counts == {0: 4, 1: 3, 2: 1}
    assert c.sync_ns == {0: 900}
    assert c.dropped_records == 0


def test_marker_tagging_needs_a_marker() -> None:
    with pytest.raises(ValueError, match="marker"):
        CuptiCollector("j", 0, 0, tagging="marker")
    with pytest.raises(ValueError, match="tagging"):
        CuptiCollector("j", 0, 0, tagging="every")


def test_sampled_tracing_turns_the_device_kinds_on_for_a_traced_step_and_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One step in ``every``: the device kinds go on before the traced step's marker and off
    after the marker of the step after the next (whose tag closes the span); steps between
    touch CUPTI not at all."""
    import cupti as pkg

    rec = _Recorder()
    monkeypatch.setattr(pkg, "cupti", rec)
    c = CuptiCollector(
        "j", 0, 0, tagging="marker", marker=lambda: rec.calls.append(("marker", None)), every=4
    )
    c.start()
    assert [k for op, k in rec.calls if op == "enable"] == [K.EXTERNAL_CORRELATION]
    device = [getattr(K, k) for k in CuptiCollector.DEVICE_KINDS]
    marker = [("enable", K.RUNTIME), ("push", None), ("marker", None), ("pop", None), ("disable", K.RUNTIME)]
    seen = []
    for step in range(9):
        rec.calls.clear()
        c.begin_step(step)
        c.end_step(step)
        seen.append([(op, None if op == "push" else k) for op, k in rec.calls])
    on, off = [("enable", k) for k in device], [("disable", k) for k in device]
    assert seen == [on + marker, marker, marker + off, [], on + marker, marker, marker + off, [], on + marker]
    assert c.toggles == 5
    rec.calls.clear()
    c.stop()  # the device kinds are on (step 8 is traced): they go off with the rest
    assert {k for op, k in rec.calls if op == "disable"} == {*device, K.EXTERNAL_CORRELATION}


def test_sampled_tracing_emits_the_traced_steps_once_the_next_ones_activity_is_in() -> None:
    from argus.producers.collectors.cupti import KIND_CONCURRENT_KERNEL, KIND_EXTERNAL_CORRELATION, Activity

    corr = iter(range(1, 10_000))

    def mark(step: int) -> Activity:
        return Activity(
            KIND_EXTERNAL_CORRELATION, correlation_id=next(corr), external_kind=3, external_id=step
        )

    def kernels(n: int, dur: int) -> list[Activity]:
        out = []
        for _ in range(n):
            c = next(corr)
            out.append(Activity(KIND_CONCURRENT_KERNEL, "gemm", c * 1000, c * 1000 + dur, 7, c))
        return out

    c = CuptiCollector("j", 0, 0, tagging="marker", marker=lambda: None, every=4)
    first = [mark(0), *kernels(5, 300), mark(1), *kernels(4, 100)]
    assert c.feed(first, current_step=3, lag=0) == []  # step 1's activity waits for its closing tag
    out = c.feed([mark(2)], current_step=3, lag=0)
    (sk,) = [r for r in out if isinstance(r, KernelSketch)]
    stats = decode_payload(sk.payload)
    assert (sk.step, int(stats.count.sum()), int(stats.total_ns.sum())) == (0, 5, 1500)
    out = c.feed([mark(4), *kernels(3, 200), mark(5), *kernels(2, 100), mark(6)], current_step=7, lag=0)
    assert [r.step for r in out if isinstance(r, KernelSketch)] == [4]
    assert (c.untraced_records, c.dropped_records) == (6, 0)
    with pytest.raises(ValueError, match="every"):
        CuptiCollector("j", 0, 0, every=0)
