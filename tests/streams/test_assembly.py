"""Step assembly: complete on all ranks, on settling, on timeout; missing ranks named."""

from __future__ import annotations

import numpy as np

from argus.producers.simulator import ClusterSimulator, Layout
from argus.schemas import StepBatch
from argus.streams import AssemblyConfig, StepAssembler


def parts(step_batch, size: int):
    return [
        step_batch.take(np.arange(i, min(i + size, len(step_batch)))) for i in range(0, len(step_batch), size)
    ]


def test_steps_complete_when_every_rank_arrived() -> None:
    sim = ClusterSimulator(Layout(dp=4, tp=8, pp=2), seed=1, job="a")
    asm = StepAssembler(AssemblyConfig(settle_s=1.0, max_wait_s=5.0))
    first, second = (s.batch for s in sim.run(2))
    out = [c for i, p in enumerate(parts(first, 16)) for c in asm.add(p, i, now=0.0)]
    assert out == []  # the world is unknown until the first step completes by waiting
    assert [c.reason for c in asm.due(now=5.0)] == ["timeout"]
    done = [c for i, p in enumerate(parts(second, 16)) for c in asm.add(p, i, now=6.0)]
    assert [c.reason for c in done] == ["all_ranks"]
    assert len(done[0].batch) == 64 and done[0].missing == () and done[0].tokens == (0, 1, 2, 3)


def test_a_rank_that_never_arrives_is_reported_missing() -> None:
    sim = ClusterSimulator(Layout(dp=4, tp=8, pp=2), seed=1, job="b")
    steps = [s.batch for s in sim.run(3)]
    asm = StepAssembler(AssemblyConfig(settle_s=0.5, max_wait_s=30.0))
    for p in parts(steps[0], 64):
        asm.add(p, None, now=0.0)
    assert len(asm.due(now=31.0)) == 1
    lost = steps[1].take(np.flatnonzero(steps[1]["rank"] != 13))
    assert asm.add(lost, "x", now=32.0) == []
    asm.add(steps[2].take(np.arange(8)), "y", now=32.1)  # the job moved on
    assert asm.due(now=32.3) == []  # not settled yet
    (done,) = asm.due(now=32.7)
    assert done.reason == "settled" and done.missing == (13,) and done.batch.step == 1


def test_duplicate_parts_count_once_and_late_parts_are_acknowledged() -> None:
    sim = ClusterSimulator(Layout(dp=1, tp=8, pp=1), seed=1, job="c")
    s0, s1 = (s.batch for s in sim.run(2))
    asm = StepAssembler()
    asm.add(s0, 1, now=0.0)
    asm.due(now=100.0)
    half = s1.take(np.arange(4))
    assert asm.add(half, 2, now=101.0) + asm.add(half, 3, now=101.0) == []  # a retry is no progress
    (done,) = asm.add(s1.take(np.arange(4, 8)), 4, now=101.0)
    assert (
        done.reason == "all_ranks" and len(done.batch) == 8 and done.batch["rank"].tolist() == list(range(8))
    )
    (late,) = asm.add(half, 5, now=102.0)
    assert late.reason == "late" and late.tokens == (5,)
    # a late part claiming only ranks no world of 8 could have is refused (dead-lettered), not
    # acknowledged as a straggler's record
    absurd = StepBatch(s1.job, s1.run, s1.step, {**s1.take([0]).columns, "rank": np.array([(1 << 20) - 1])})
    (refused,) = asm.add(absurd, 6, now=102.0)
    assert refused.reason == "absurd_rank" and refused.rejected == (6,) and refused.tokens == ()


def test_memory_is_bounded_by_open_steps() -> None:
    sim = ClusterSimulator(Layout(dp=1, tp=8, pp=1), seed=1, job="d")
    asm = StepAssembler(AssemblyConfig(max_open=4, max_wait_s=1e9, settle_s=1e9))
    done = []
    for s in sim.run(10):
        done += asm.add(s.batch.take(np.arange(4)), s.step, now=float(s.step))
        assert asm.open_steps <= 4
    done += asm.due(now=10.0)
    assert done[0].reason == "overflow" and sorted(t for c in done for t in c.tokens) == list(range(10))


def test_out_of_order_steps_are_released_as_they_complete_and_none_dropped() -> None:
    sim = ClusterSimulator(Layout(dp=1, tp=8, pp=1), seed=2, job="e")
    batches = [s.batch for s in sim.run(6)]
    asm = StepAssembler(AssemblyConfig(settle_s=0.5))
    asm.add(batches[0], 0, now=0.0)
    assert [c.batch.step for c in asm.due(now=31.0)] == [0]  # by timeout; world now 8
    out = []
    for step in (3, 1, 2, 5, 4):  # catching up: partitions deliver out of order
        out += asm.add(batches[step], step, now=33.0)
    assert [c.batch.step for c in out] == [3, 1, 2, 5, 4]
    (late,) = asm.add(batches[4], 9, now=35.0)
    assert late.reason == "late" and late.tokens == (9,)


def test_a_jobs_first_step_completes_once_a_later_step_is_as_large() -> None:
    sim = ClusterSimulator(Layout(dp=1, tp=8, pp=1), seed=4, job="f")
    s0, s1 = (s.batch for s in sim.run(2))
    asm = StepAssembler(AssemblyConfig(quiet_s=0.25))
    assert asm.add(s0, 0, now=0.0) == [] and asm.add(s1.take(np.arange(4)), 1, now=0.1) == []
    assert asm.due(now=0.3) == []  # the next step is smaller so far: step 0 may still grow
    asm.add(s1.take(np.arange(4, 8)), 2, now=0.35)
    done = asm.due(now=0.4)
    assert [(c.batch.step, c.reason) for c in done] == [(0, "peers_done")]
    assert asm.world("f", 0) == 8  # and step 1 completes as soon as the world is known
    assert [(c.batch.step, c.reason) for c in asm.due(now=0.41)] == [(1, "all_ranks")]


def test_a_backlog_of_a_new_job_is_released_in_step_order() -> None:
    # A worker (re)started after the job published many steps: the world is unknown and
    # every step completes by waiting in the same call; the temporal stage wants them in order.
    sim = ClusterSimulator(Layout(dp=1, tp=8, pp=1), seed=5, job="g")
    asm = StepAssembler(AssemblyConfig(quiet_s=0.25))
    for s in sim.run(12):
        assert asm.add(s.batch, s.batch.step, now=0.0) == []
    steps = [c.batch.step for c in asm.due(now=1.0)]
    steps += [c.batch.step for c in asm.due(now=1.0)]
    assert steps == list(range(12))


def test_an_absurd_rank_neither_sets_the_world_nor_grows_the_summary() -> None:
    """Issue 17, item 1: one row claiming rank 1,048,575 made the world 1,048,576 and the
    step summary list 1,048,575 missing ranks (3 MB: the worker died on the producer limit)."""
    from argus.detectors import DiagnoserConfig
    from argus.schemas import decode
    from argus.streams.outputs import step_outputs

    sim = ClusterSimulator(Layout(dp=1, tp=8, pp=1), seed=6, job="poison")
    s0, s1, s2 = (s.batch for s in sim.run(3))
    asm = StepAssembler(AssemblyConfig(quiet_s=0.25))
    asm.add(s0, "s0", now=0.0)
    assert [c.reason for c in asm.due(now=31.0)] == ["timeout"] and asm.world("poison", 0) == 8
    poison = s1.take([0])
    poison = type(poison)(
        poison.job, poison.run, poison.step, {**poison.columns, "rank": np.array([(1 << 20) - 1])}
    )
    assert asm.add(poison, "poison", now=32.0) == []
    assert asm.add(s1.take(np.arange(7)), "good", now=32.0) == []
    (done,) = asm.due(now=62.0)  # rank 7 never came: the step times out
    assert asm.world("poison", 0) == 8
    assert done.missing == (7,) and done.rejected == ("poison",) and done.tokens == ("good",)
    sf, findings = step_outputs(done, DiagnoserConfig())
    assert sf.summary.missing == (7,) and len(findings) < 20_000
    assert decode(findings).summary.missing == (7,)
    # Inside a part with real ranks (a relay's merged part) it is diagnosed, never a world.
    mixed = s2.take(np.arange(8))
    ranks = mixed["rank"].copy()
    ranks[3] = (1 << 20) - 1
    mixed = type(mixed)(mixed.job, mixed.run, mixed.step, {**mixed.columns, "rank": ranks})
    asm.add(mixed, "mixed", now=70.0)
    (done,) = asm.due(now=101.0)
    assert asm.world("poison", 0) == 8 and done.missing == (3,) and done.rejected == ()
    # Alone, in a job of its own: rejected whole, no world at all.
    lone = type(poison)("lone", 0, 5, poison.columns)
    asm.add(lone, "lone", now=102.0)
    (done,) = asm.due(now=133.0)
    assert done.reason == "absurd_rank" and done.rejected == ("lone",) and done.tokens == ()
    assert asm.world("lone", 0) == 0


def test_a_step_far_ahead_of_the_jobs_frontier_is_rejected() -> None:
    """Issue 17, item 3: a step near 10**12 was later released "in order", after which every
    real step of the job looked old for six hours."""
    sim = ClusterSimulator(Layout(dp=1, tp=8, pp=1), seed=7, job="victim")
    batches = [s.batch for s in sim.run(4)]
    asm = StepAssembler(AssemblyConfig(quiet_s=0.25))
    asm.add(batches[0], 0, now=0.0)
    asm.due(now=31.0)
    far = type(batches[1])("victim", batches[1].run, 10**12 - 1, batches[1].columns)
    (rejected,) = asm.add(far, "far", now=32.0)
    assert rejected.reason == "far_future" and rejected.tokens == ("far",)
    done = [c for i in (1, 2, 3) for c in asm.add(batches[i], i, now=33.0)]
    assert [(c.batch.step, c.reason) for c in done] == [(1, "all_ranks"), (2, "all_ranks"), (3, "all_ranks")]
    ahead = type(batches[1])("victim", batches[1].run, 3 + 4096, batches[1].columns)
    (done,) = asm.add(ahead, "ok", now=34.0)  # within the floor: a step like any other
    assert done.reason == "all_ranks"


def test_a_step_further_ahead_than_the_job_could_have_run_is_rejected() -> None:
    """Issue 34, item 3: one record 50,000 steps ahead of a job running 10 steps/s (inside
    the fixed 100,000 bound) was taken, held, released and then made every real step look
    old. "Ahead" is judged by the job's pace since its frontier moved, on the receiver's clock."""
    sim = ClusterSimulator(Layout(dp=1, tp=8, pp=1), seed=7, job="paced")
    batches = [s.batch for s in sim.run(40)]
    asm = StepAssembler(AssemblyConfig(quiet_s=0.25))
    asm.add(batches[0], 0, now=0.0)
    asm.due(now=31.0)  # the first step completes by waiting: the world is learned
    done = [c for i in range(1, 40) for c in asm.add(batches[i], i, now=31.0 + 0.1 * i)]
    assert len(done) == 39  # 10 steps/s
    far = type(batches[1])("paced", batches[1].run, 39 + 50_000, batches[1].columns)
    (rejected,) = asm.add(far, "far", now=35.0)
    assert rejected.reason == "far_future" and rejected.tokens == ("far",)
    nxt = type(batches[1])("paced", batches[1].run, 40, batches[1].columns)
    (done_40,) = asm.add(nxt, 40, now=35.1)
    assert (done_40.batch.step, done_40.reason) == (40, "all_ranks")
    # After an hour of silence a job of 10 steps/s may well be 50,000 steps on.
    resumed = type(batches[1])("paced", batches[1].run, 40 + 50_000, batches[1].columns)
    (done_resumed,) = asm.add(resumed, "resumed", now=35.1 + 3600)
    assert done_resumed.reason == "all_ranks"


def test_late_parts_beyond_the_world_grow_it() -> None:
    """The world learned from a step that completed short grows back when that step's late
    parts come, so the next steps wait for every rank."""
    sim = ClusterSimulator(Layout(dp=8, tp=8, pp=1), seed=6, job="h")
    s0, s1 = (s.batch for s in sim.run(2))
    asm = StepAssembler(AssemblyConfig(max_wait_s=1.0))
    head, tail = s0.take(np.arange(40)), s0.take(np.arange(40, 64))
    asm.add(head, 0, now=0.0)
    assert [len(c.batch) for c in asm.due(now=2.0)] == [40] and asm.world("h", 0) == 40
    (late,) = asm.add(tail, 1, now=2.1)
    assert late.reason == "late" and asm.world("h", 0) == 64
    assert asm.add(s1.take(np.arange(40)), 2, now=3.0) == []  # 40 ranks are no longer all
    (done,) = asm.add(s1.take(np.arange(40, 64)), 3, now=3.1)
    assert done.reason == "all_ranks" and len(done.batch) == 64
    far = s1.take(np.arange(1))
    far.columns["rank"][:] = 10_000  # a claim far beyond the world grows nothing
    asm.add(far, 4, now=3.2)
    assert asm.world("h", 0) == 64


def test_a_rebalance_drops_open_steps_unacknowledged_and_the_next_owner_completes_them_whole() -> None:
    """The parts of a step still open at a rebalance are dropped (their tokens returned,
    not completed); the partition's next owner reads all of them again and the step comes
    out once, whole."""
    sim = ClusterSimulator(Layout(dp=4, tp=8, pp=2), seed=1, job="r")
    first, second = (s.batch for s in sim.run(2))
    before = StepAssembler(AssemblyConfig(settle_s=1.0, max_wait_s=5.0))
    for i, p in enumerate(parts(first, 16)):
        before.add(p, ("first", i), now=0.0)
    assert [c.reason for c in before.due(now=5.0)] == ["timeout"]
    halves = parts(second, 16)
    assert [c for i, p in enumerate(halves[:2]) for c in before.add(p, ("second", i), now=6.0)] == []
    assert sorted(before.drop_open()) == [("second", 0), ("second", 1)]
    assert before.open_steps == 0 and before.due(now=60.0) == []  # nothing left to complete short
    after = StepAssembler(AssemblyConfig(settle_s=1.0, max_wait_s=5.0))
    for i, p in enumerate(halves):
        after.add(p, ("second", i), now=7.0)
    (done,) = after.due(now=13.0)
    assert done.batch.step == second.step and len(done.batch) == 64 and done.missing == ()


def test_a_step_still_being_read_after_a_rebalance_waits_for_its_parts() -> None:
    """The world is known; the next owner of a step's partition is still reading its parts
    while later steps (other partitions) already have ranks it lacks: it is not completed
    short. A step missing only the ranks its later steps miss too (a lost rank) completes
    after the short quiet, not the settle time."""
    sim = ClusterSimulator(Layout(dp=4, tp=8, pp=2), seed=1, job="c")
    steps = [s.batch for s in sim.run(4)]
    asm = StepAssembler(AssemblyConfig(settle_s=5.0, max_wait_s=30.0, quiet_s=0.25))
    for p in parts(steps[0], 8):
        asm.add(p, None, now=0.0)
    assert [c.reason for c in asm.due(now=31.0)] == ["timeout"]  # the world (64) is known now
    first, rest = parts(steps[1], 8)[:3], parts(steps[1], 8)[3:]
    for p in first:  # the backlog of step 1's partition, read in part
        asm.add(p, None, now=32.0)
    no13 = [b.take(np.flatnonzero(b["rank"] != 13)) for b in steps]  # rank 13 is lost from step 2 on
    for p in parts(no13[2], 8)[:5]:  # step 2 (live, another partition) has more ranks already
        asm.add(p, None, now=32.0)
    assert asm.due(now=33.0) == []  # quiet for a second: step 1 still waits for its parts
    done = [c for p in rest for c in asm.add(p, None, now=33.1)]
    assert [(c.batch.step, c.reason, len(c.batch), c.missing) for c in done] == [(1, "all_ranks", 64, ())]
    for p in parts(no13[2], 8)[5:]:
        asm.add(p, None, now=34.0)
    asm.add(no13[3], None, now=34.0)
    assert asm.due(now=34.1) == []  # not quiet yet
    (short,) = asm.due(now=34.3)
    assert (short.batch.step, short.reason, short.missing) == (2, "peers_done", (13,))


def test_ranks_publishing_a_round_apart_give_whole_steps() -> None:
    """Each rank's agent sends its finished steps in rounds (every second), each at its own
    phase: one rank's round of ten steps comes before the others'. Those steps wait for the other ranks' round (once completed short, with three
    of four ranks "missing", a slowed rank's run broke into fragments in the demo); a rank that
    stays away is reported missing after the quiet."""
    sim = ClusterSimulator(Layout(dp=4, tp=1, pp=1), seed=9, job="rounds")
    steps = [s.batch for s in sim.run(21)]
    asm = StepAssembler()  # the worker's defaults
    asm.add(steps[0], None, now=0.0)
    assert [c.reason for c in asm.due(now=31.0)] == ["timeout"] and asm.world("rounds", 0) == 4
    rank = [[b.take(np.flatnonzero(b["rank"] == r)) for b in steps] for r in range(4)]
    for s in range(1, 11):  # rank 3's round of steps 1..10 first
        assert asm.add(rank[3][s], None, now=40.0) == []
    for t in (40.3, 40.6, 41.0, 41.2):  # the others' rounds come up to ~1.2 s later
        assert asm.due(now=t) == []
    done = [c for r in range(3) for s in range(1, 11) for c in asm.add(rank[r][s], None, now=41.2)]
    assert [(c.batch.step, c.reason, c.missing) for c in done] == [(s, "all_ranks", ()) for s in range(1, 11)]
    for s in range(11, 21):  # rank 0 is lost from step 11 on
        for r in (1, 2, 3):
            asm.add(rank[r][s], None, now=42.0)
    assert asm.due(now=43.5) == []
    short = asm.due(now=44.1)
    assert [(c.batch.step, c.reason, c.missing) for c in short] == [
        (s, "peers_done", (0,)) for s in range(11, 20)
    ]
