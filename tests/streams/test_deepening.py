"""The kernel level in the stream worker: the bounded history of kernel sketches and stack
samples (pure), and the real worker on the real broker naming the slow kernel or frame."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from argus.detectors import DiagnoserConfig, JobState, apply_findings, refresh, step_findings
from argus.kafka_admin import ensure_topics, read_records, skip_worker_to_end
from argus.producers.publisher import Publisher
from argus.producers.simulator import CLEAN, ClusterSimulator, Fault, Layout, kernel_names
from argus.producers.simulator.scoring import named_kernels
from argus.producers.sketch import RankSketchEncoder
from argus.producers.sketch import kernel_stats as sketch_stats
from argus.schemas import (
    ANOMALIES,
    STEP_SUMMARIES,
    Anomaly,
    SchemaError,
    StackSample,
    encode,
    rank_key,
)
from argus.simulate import layout_for, parse_fault, publish_simulation
from argus.streams.deepening import EVIDENCE_TOPIC, EvidenceHistory, HistoryConfig, evidence_key
from tests.figures import report

LAYOUT = Layout(dp=4, tp=8, pp=2)
T0 = 1_767_225_600 * 10**9


def _records(sim: ClusterSimulator, steps: int, ranks: list[int]) -> list[list[bytes]]:
    """Per step, the encoded kernel names (first step), sketches and stacks of ``ranks``."""
    enc = {r: RankSketchEncoder(sim.job, 0, r, key_every=4) for r in ranks}
    out = []
    for s in sim.run(steps):
        msgs = [encode(kernel_names(sim.job, 0, r)) for r in ranks] if s.step == 0 else []
        msgs += [encode(enc[r].encode(s.step, st)) for r, st in s.kernel_stats(ranks).items()]
        msgs += [encode(st) for st in s.stacks(ranks).values()]
        out.append(msgs)
    return out


def test_the_history_keeps_a_few_steps_per_rank_within_its_stated_bytes() -> None:
    cfg = HistoryConfig(steps=3)
    hist = EvidenceHistory(cfg)
    sim = ClusterSimulator(LAYOUT, seed=1, job="h", noise=CLEAN)
    ranks = list(range(16))
    for msgs in _records(sim, 10, ranks):  # delta frames, a key frame every 4 steps
        hist.add_many(msgs)
    assert hist.undecodable == 0 and hist.invalid == 0 and hist.ranks("h", 0) == 16
    rank = hist._jobs[("h", 0)].ranks[3]
    assert len(rank.frames) == 10 and not rank.kernels  # held undecoded until asked for
    kernels, stacks, names = hist.evidence("h", 0, ranks)
    assert sorted(kernels) == sorted(stacks) == ranks and len(names) == 13 and not rank.frames
    assert [st for st, _ in rank.kernels] == [7, 8, 9] and [st for st, _ in rank.stacks] == [7, 8, 9]
    assert 0 < hist.nbytes <= 16 * cfg.bytes_per_rank()
    per_rank = hist.nbytes / 16
    assert per_rank < 20_000, per_rank  # the simulator's 13 kernels and 10 stacks per step
    # a replay (redelivered after a restart) changes nothing: each rank's newer steps stay
    before = hist.nbytes
    for msgs in _records(ClusterSimulator(LAYOUT, seed=1, job="h", noise=CLEAN), 10, ranks):
        hist.add_many(msgs)
    hist.evidence("h", 0, ranks)
    assert hist.nbytes == before and hist.replayed == 16 * 20
    assert [st for st, _ in rank.kernels] == [7, 8, 9]


def test_frames_held_undecoded_are_bounded_by_key_frames() -> None:
    hist = EvidenceHistory(HistoryConfig(max_pending=6))
    sim = ClusterSimulator(LAYOUT, seed=1, job="p", noise=CLEAN)
    for msgs in _records(sim, 10, [0, 1]):  # key frames at steps 0, 4, 8
        hist.add_many(msgs)
    rank = hist._jobs[("p", 0)].ranks[0]
    assert [f.step for f in rank.frames] == [4, 5, 6, 7, 8, 9]
    hist.evidence("p", 0, [0, 1])
    assert [st for st, _ in rank.kernels] == [7, 8, 9] and hist.undecodable == 0
    # without key frames to cut at, the frames are decoded as they come
    hist = EvidenceHistory(HistoryConfig(max_pending=2))
    enc = RankSketchEncoder("p", 0, 0, key_every=100)
    for s in ClusterSimulator(LAYOUT, seed=1, job="p", noise=CLEAN).run(10):
        hist.add(enc.encode(s.step, s.kernel_stats([0])[0]))
    rank = hist._jobs[("p", 0)].ranks[0]
    assert len(rank.frames) <= 2 and [st for st, _ in rank.kernels] == [6, 7, 8]


def test_a_hostile_rank_is_cut_to_the_bounds_and_old_jobs_make_room() -> None:
    cfg = HistoryConfig(steps=2, max_kernels=8, max_stacks=4, max_stack_chars=64, max_names=16)
    hist = EvidenceHistory(cfg)
    k = 5000
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(k), 3)
    start = np.sort(rng.integers(T0, T0 + 10**9, len(ids)))
    dur = (ids + 1) * 1000 + rng.integers(0, 500, len(ids))  # kernel i takes ~i µs: the last ones most
    huge = sketch_stats(ids, start, start + dur, np.zeros(len(ids), np.int64))
    enc = RankSketchEncoder("big", 0, 1)
    many = StackSample(
        "big", 0, 1, 0, T0, T0 + 1, tuple(f"a;{'x' * 4000};f{i}" for i in range(500)), (1,) * 500
    )
    names = kernel_names("big", 0, 1)
    long_names = type(names)("big", 0, 1, tuple(range(100)), tuple("n" * 4000 for _ in range(100)))
    hist.add_many([encode(long_names), encode(enc.encode(0, huge)), encode(many)])
    hist.evidence("big", 0, [1])
    rank = hist._jobs[("big", 0)].ranks[1]
    (_, kept), (_, stacks) = rank.kernels[0], rank.stacks[0]
    assert len(kept.ids) == 8 and set(kept.ids.tolist()) == set(range(k - 8, k))  # the most time
    assert len(stacks.stacks) == 4 and max(map(len, stacks.stacks)) == 64 and stacks.stacks[0].endswith(";f0")
    assert len(rank.names) == 16 and max(map(len, rank.names.values())) == cfg.max_name_chars
    assert rank.base is None  # too big a base to keep: its delta frames wait for a key frame
    hist.add_many([encode(enc.encode(1, huge))])
    hist.evidence("big", 0, [1])
    assert hist.undecodable == 1 and [st for st, _ in rank.kernels] == [0]
    assert hist.nbytes <= cfg.bytes_per_rank()
    # a global bound: the least recently fed job goes first, then a job's oldest ranks
    one = EvidenceHistory()
    for msgs in _records(ClusterSimulator(LAYOUT, seed=2, job="a", noise=CLEAN), 3, list(range(64))):
        one.add_many(msgs)
    small = EvidenceHistory(HistoryConfig(max_bytes=one.nbytes * 3 // 2))
    for job in ("a", "b"):
        for msgs in _records(ClusterSimulator(LAYOUT, seed=2, job=job, noise=CLEAN), 3, list(range(64))):
            small.add_many(msgs)
    assert small.nbytes <= small.config.max_bytes and small.dropped_jobs == 1
    assert small.ranks("b", 0) == 64 and small.ranks("a", 0) == 0
    tiny = EvidenceHistory(HistoryConfig(max_bytes=one.nbytes // 2))
    for msgs in _records(ClusterSimulator(LAYOUT, seed=2, job="a", noise=CLEAN), 3, list(range(64))):
        tiny.add_many(msgs)
    assert tiny.nbytes <= tiny.config.max_bytes and 0 < tiny.ranks("a", 0) < 64 and tiny.dropped_ranks > 0


def test_evidence_is_rekeyed_by_job() -> None:
    assert evidence_key(rank_key("job/with/slash", 17), b"") == b"job/with/slash"
    st = StackSample("j-1", 0, 3, 0, T0, T0 + 1, ("a;b",), (1,))
    assert evidence_key(b"not-a-rank-key", encode(st)) == b"j-1"
    bad = evidence_key(None, b"\x00garbage")
    assert isinstance(bad, SchemaError)


def test_sketches_that_come_after_the_confirmation_still_deepen_the_open_anomaly() -> None:
    """The worker never waits for sketches: the anomaly goes out at rank level, and is sent
    again at kernel level on the first step the suspect's sketches are there."""
    cfg = DiagnoserConfig()
    fault = Fault("compute_straggler", 10, 30, (21,), 1.3, kernel="gemm")
    sim = ClusterSimulator(LAYOUT, seed=4, job="late", noise=CLEAN, faults=[fault])
    hist = EvidenceHistory()
    state = JobState.new("late", 0, cfg)
    versions: list[tuple[int, Anomaly]] = []
    enc = {r: RankSketchEncoder("late", 0, r) for r in range(LAYOUT.n_ranks)}
    for s in sim.run(30):
        if s.step >= 20:  # the kernel sketches begin to arrive only now
            for r, st in s.kernel_stats(range(LAYOUT.n_ranks)).items():
                if s.step == 20:
                    hist.add(kernel_names("late", 0, r))
                hist.add(enc[r].encode(s.step, st))
        res = apply_findings(state, step_findings(s.batch, cfg), cfg, deepen=hist.deepener("late", 0, cfg))
        versions += [(s.step, a) for a in res.anomalies]
    first_step, first = versions[0]
    assert first.level == "cross_rank" and first.suspect == "rank:21" and first_step < 20
    assert all(a.level == "cross_rank" for st, a in versions if st < 20)
    (kstep, kernel), *_ = [(st, a) for st, a in versions if a.level == "kernel"]
    assert kstep == 20 and kernel.id == first.id and kernel.start_step == first.start_step == 10
    assert named_kernels(kernel)[0] == "gemm" and "slow kernels: gemm" in kernel.summary
    assert 1.2 <= kernel.evidence["kernel_family:gemm"] <= 1.4


def test_a_job_that_stopped_before_its_sketches_came_is_deepened_when_idle() -> None:
    """The job's last steps confirm the anomaly at rank level, its sketches come after it
    stopped: the idle refresh (no more steps to diagnose) names the kernel, once."""
    cfg = DiagnoserConfig()
    fault = Fault("compute_straggler", 10, 30, (21,), 1.3, kernel="gemm")
    sim = ClusterSimulator(LAYOUT, seed=4, job="ended", noise=CLEAN, faults=[fault])
    hist = EvidenceHistory()
    state = JobState.new("ended", 0, cfg)
    steps = list(sim.run(22))
    sent = []
    for s in steps:
        sent += apply_findings(
            state, step_findings(s.batch, cfg), cfg, deepen=hist.deepener("ended", 0, cfg)
        ).anomalies
    assert sent and {a.level for a in sent} == {"cross_rank"}
    idle = refresh(state, hist.deepener("ended", 0, cfg))  # no sketches yet: its window as it stands
    assert [a.level for a in idle] in ([], ["cross_rank"])
    enc = {r: RankSketchEncoder("ended", 0, r) for r in range(LAYOUT.n_ranks)}
    for s in steps[-4:]:  # the last steps' sketches, after the job stopped
        for r, st in s.kernel_stats(range(LAYOUT.n_ranks)).items():
            if s is steps[-4]:
                hist.add(kernel_names("ended", 0, r))
            hist.add(enc[r].encode(s.step, st))
    (late,) = refresh(state, hist.deepener("ended", 0, cfg))
    assert late.level == "kernel" and late.id == sent[0].id and named_kernels(late)[0] == "gemm"
    assert refresh(state, hist.deepener("ended", 0, cfg)) == []  # explained: not again


KERNEL_FAULTS = {
    # a thermally throttled GPU: its GEMMs 1.3x slower
    "compute_straggler@15+25:77,kernel=gemm,x=1.3": ("rank:77", "gemm"),
    # NCCL slow on one link: the all-reduce kernels of the ring edge's ends
    "link_degradation@15+25:130,x=2.5": ("node-00016<->node-00017", "nccl:AllReduce"),
    # a host whose CPUs are starved: its data loaders wait
    "host_cpu_contention@15+25:host=20,x=150": ("node-00020", "dataloader"),
}


def _collect(
    kafka_conf: dict[str, Any], jobs: set[str], until: Any, timeout: float
) -> tuple[dict[str, list[Anomaly]], dict[str, set[int]]]:
    """Every version of every anomaly of ``jobs``, in the order sent, and their summarized steps."""
    versions: dict[str, list[Anomaly]] = {}
    steps: dict[str, set[int]] = {j: set() for j in jobs}

    def take(topic: str, r: Any) -> None:
        if r.job not in jobs:
            return
        if topic == ANOMALIES:
            versions.setdefault(r.id, []).append(r)
        else:
            steps[r.job].add(r.step)

    read_records(
        kafka_conf, [ANOMALIES, STEP_SUMMARIES], take, until=lambda: until(versions, steps), timeout=timeout
    )
    return versions, steps


@pytest.mark.kafka
@pytest.mark.slow
def test_the_live_worker_names_the_slow_kernel_family_or_frame(kafka_conf, worker_factory, unique) -> None:
    job, quiet = f"deep-{unique}", f"deep-quiet-{unique}"
    app = f"d-{unique}"
    ensure_topics(kafka_conf, [EVIDENCE_TOPIC], partitions=16)
    skip_worker_to_end(kafka_conf, app)
    worker_factory(app)
    layout = layout_for(256)

    def publish(name: str, faults: list[str]) -> None:
        publisher = Publisher(kafka_conf)
        publish_simulation(
            publisher.publish,
            job=name,
            layout=layout if faults else layout_for(64),
            steps=45,
            faults=[parse_fault(f, layout) for f in faults],
            seed=7,
            rate=2.5,  # 400 ms steps; this 2-core machine also runs the broker and the publishers
            kernels=True,
        )
        assert publisher.flush(60) == 0

    with ThreadPoolExecutor(2) as pool:
        # a quiet job's kernels and stacks flow too: no anomaly, at any level
        done = [pool.submit(publish, job, list(KERNEL_FAULTS)), pool.submit(publish, quiet, [])]
        versions, steps = _collect(
            kafka_conf,
            {job, quiet},
            until=lambda v, s: (
                all(len(x) >= 45 for x in s.values())
                and sum(any(a.level == "kernel" for a in vs) for vs in v.values()) >= 3
            ),
            timeout=150,
        )
        for fut in done:
            fut.result()
    assert steps[job] == set(range(45)) and steps[quiet] == set(range(45))
    mine = {i: vs for i, vs in versions.items() if vs[0].job == job}
    assert not [vs[0] for vs in versions.values() if vs[0].job == quiet], "anomalies on the quiet job"
    by_suspect = {vs[0].suspect: vs for vs in mine.values()}
    assert set(by_suspect) == {s for s, _ in KERNEL_FAULTS.values()}, sorted(by_suspect)
    delays = {}
    for suspect, named in KERNEL_FAULTS.values():
        vs = by_suspect[suspect]
        confirmed = vs[0].end_step  # the step the rank-level anomaly was confirmed on
        deep = [a for a in vs if a.level == "kernel"]
        assert deep, (suspect, [(a.level, a.end_step) for a in vs], sorted(vs[-1].evidence), vs[0].summary)
        assert deep[0].end_step - confirmed <= 3, (suspect, confirmed, deep[0].end_step)
        delays[named] = deep[0].end_step - confirmed
        assert named in named_kernels(deep[0])[0], (suspect, named_kernels(deep[0]))
        assert deep[0].start_step == 15 and deep[0].ranks, deep[0]
        assert named in deep[0].summary
    report("kernel_level_live", steps_after_confirmation=delays)


def test_a_real_kineto_straggler_is_explained_by_its_embedding_kernels() -> None:
    """HTA's ``trace_filter_2rank``: rank 1 is the straggler, and its embedding kernels
    (FBGEMM's ``split_embedding_*``) run slower than rank 0's, as HTA's kernel breakdown
    shows. The kernel level reads what ``import-trace`` publishes (sketches, names,
    stacks), through the worker's history, as live."""
    from argus.cli.import_trace import StepParts, iter_imports
    from argus.detectors import diagnose
    from argus.schemas import KernelNames, KernelSketch, StepBatch

    traces = Path(__file__).resolve().parents[1] / "data" / "kineto" / "trace_filter_2rank"
    paths = sorted(str(p) for p in traces.glob("*.json*"))
    parts, hist = StepParts(), EvidenceHistory()
    for recs, _ in iter_imports(paths, job="hta-2rank"):
        for r in recs:
            if isinstance(r, StepBatch):
                parts.add(r)
            elif isinstance(r, KernelSketch | KernelNames | StackSample):
                hist.add(r)
    (a,) = diagnose(parts.steps(), job="hta-2rank", deepen=hist.deepener("hta-2rank", 0))
    assert (a.suspect, a.level) == ("rank:1", "kernel"), a
    assert named_kernels(a)[0] == "split_embedding", named_kernels(a)
    assert a.evidence["kernel_family:split_embedding"] > 2.0 and "split_embedding" in a.summary
    # without the kernel level, the same anomaly at rank level
    (plain,) = diagnose(parts.steps(), job="hta-2rank")
    assert (plain.id, plain.level) == (a.id, "cross_rank")
