"""The rank agent in one process: spans, layout, stacks, hooks on a real torch loop."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

from argus.producers.agent import (
    COLUMNS,
    AgentConfig,
    RankAgent,
    RankInfo,
    StackFolder,
    coordinates,
    detect_rank_info,
    exclusive_ms,
)
from argus.schemas import (
    HEARTBEATS,
    STACKS,
    STEP_COLUMNS,
    STEPS,
    Heartbeat,
    StackSample,
    StepBatch,
    decode,
    encode,
)
from tests.helpers.sinks import ListSink

IDX = {c: i for i, c in enumerate(COLUMNS)}


def test_exclusive_times_subtract_nested_spans():
    # backward 0-10 ms holding a GC pause 0-1 and an all-reduce 3-7 (nested: a sync call)
    cols = [IDX["backward_ms"], IDX["gc_ms"], IDX["all_reduce_ms"]]
    ms = exclusive_ms(cols, [0.0, 0.0, 3.0], [10.0, 1.0, 7.0], [-1, 0, 0])
    assert ms[IDX["backward_ms"]] == 5.0 and ms[IDX["all_reduce_ms"]] == 4.0 and ms[IDX["gc_ms"]] == 1.0
    assert ms.sum() == 10.0


def test_overlapping_collectives_count_once_and_leave_backward_its_compute():
    # DDP: backward 0-10 launches bucket all-reduces 2-6 and 4-8 (in flight together); an
    # FSDP-like all-gather 7-9 overlaps the second; a GC pause 0-1 inside backward
    cols = [
        IDX["backward_ms"],
        IDX["all_reduce_ms"],
        IDX["all_reduce_ms"],
        IDX["gc_ms"],
        IDX["all_gather_ms"],
    ]
    ms = exclusive_ms(cols, [0, 2, 4, 0, 7], [10, 6, 8, 1, 9], [-1, 0, 0, 0, 0])
    assert ms[IDX["all_reduce_ms"]] == 5.5  # 2-8, sharing 7-8 with the all-gather
    assert ms[IDX["all_gather_ms"]] == 1.5
    assert ms[IDX["backward_ms"]] == 2.0  # 10 - 1 (GC) - 7 (some collective in flight)
    assert ms.sum() == 10.0
    # a collective that started on another thread (parent -1) still counts against backward
    ms = exclusive_ms([IDX["backward_ms"], IDX["all_reduce_ms"]], [0.0, 8.0], [10.0, 12.0], [-1, -1])
    assert ms[IDX["backward_ms"]] == 8.0 and ms[IDX["all_reduce_ms"]] == 4.0


def test_layout_megatron_order_and_environment():
    assert coordinates(13, 16, tp_size=2, pp_size=2) == (2, 1, 1)
    info = detect_rank_info(
        "j", env={"RANK": "5", "WORLD_SIZE": "8", "TORCHELASTIC_RESTART_COUNT": "2"}, tp_size=2
    )
    assert (info.rank, info.world, info.run, info.dp, info.tp, info.pp) == (5, 8, 2, 2, 1, 0)
    with pytest.raises(ValueError):
        detect_rank_info("j", env={}, rank=9, world=4)


def test_stack_folder_names_frames_like_the_detectors():
    folder = StackFolder()
    box: list[str] = []
    ready, done = threading.Event(), threading.Event()

    def inner_work() -> None:
        ready.set()
        done.wait(5)

    t = threading.Thread(target=inner_work)
    t.start()
    ready.wait(5)
    box.append(folder.sample(t.ident) or "")
    done.set()
    t.join()
    assert "test_agent.py:inner_work;threading.py:wait" in box[0]
    assert box[0].startswith("threading.py:_bootstrap")


def test_agent_on_a_real_torch_loop():
    import torch

    sink = ListSink()
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1)), batch_size=8
    )
    info = RankInfo("job-a", 0, 3, 4, 3, "hostA", dp=3)
    agent = RankAgent(sink, info, AgentConfig(stack_hz=200, heartbeat_s=0.05, cupti=False))
    agent.install(model, opt)
    try:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            time.sleep(0.01)
            gc.collect()
            opt.step()
        time.sleep(0.2)
    finally:
        agent.close()
    steps = [r for t, _k, r in sink.records if t == STEPS]
    assert [b.step for b in steps] == list(range(8))
    assert all(isinstance(b, StepBatch) and len(b) == 1 for b in steps)
    for b in steps:  # built column by column (not from a StepRecord): valid on the wire, whole
        back = decode(encode(b))
        assert back.step == b.step and all(np.array_equal(back[c], b[c]) for c in STEP_COLUMNS)
    assert len({b["forward_ms"].ctypes.data for b in steps}) == len(steps)  # no figures shared
    rec = steps[3].records()[0]
    assert (rec.rank, rec.host, rec.dp) == (3, "hostA", 3)
    assert rec.forward_ms > 0 and rec.backward_ms > 0 and rec.optimizer_ms > 0 and rec.dataloader_ms > 0
    assert rec.gc_ms > 0
    phases = sum(getattr(rec, c) for c in COLUMNS)
    assert phases <= rec.step_ms + 0.01
    assert rec.step_ms > 10
    stacks = [r for t, _k, r in sink.records if t == STACKS]
    assert stacks and all(isinstance(s, StackSample) for s in stacks)
    assert any("test_agent.py:test_agent_on_a_real_torch_loop" in st for s in stacks for st in s.stacks)
    beats = [r for t, _k, r in sink.records if t == HEARTBEATS]
    assert isinstance(beats[-1], Heartbeat) and beats[-1].last_step == 7
    # hooks are gone after close
    import torch.autograd

    assert torch.autograd.backward.__module__ == "torch.autograd"
    assert not any("callback" in repr(cb) and "Instrumentation" in repr(cb) for cb in gc.callbacks)
    assert np.isfinite([rec.forward_ms, rec.backward_ms]).all()


def test_a_declared_pause_goes_out_at_once_and_ends_explicitly():
    from argus.schemas import decode, encode

    sink = ListSink()
    agent = RankAgent(sink, RankInfo("job-p", 0, 1, 2, 1, "hostB"), AgentConfig(stacks=False, cupti=False))
    before = time.time_ns()
    agent.declare_pause("checkpoint\nshard 3", seconds=120)
    agent.end_pause()
    agent.end_pause()  # no pause open: nothing more is sent
    beats = [decode(encode(r)) for t, _k, r in sink.records if t == HEARTBEATS]
    assert len(beats) == 2
    declared, ended = beats
    assert declared.pause == "checkpoint shard 3"
    assert before + 119e9 < declared.pause_until_ns < time.time_ns() + 121e9
    assert (ended.pause, ended.pause_until_ns) == ("", 0)


def test_the_agent_wakes_its_sink_after_each_round_and_a_declared_pause():
    """A sink that sends in the background (the Publisher) is woken by the agent after each
    publishing round, so a step leaves in the round that made it, not at the sender's own
    (rarer) wake-up; a declared pause is sent at once the same way. Rounds come at multiples
    of ``publish_s`` on the wall clock, so every rank of a job publishes at the same moments."""

    class WakeSink(ListSink):
        def __init__(self) -> None:
            super().__init__()
            self.wakes: list[int] = []  # records kept when each wake came
            self.at: list[float] = []  # wall clock of each wake

        def wake(self) -> None:
            self.wakes.append(len(self.records))
            self.at.append(time.time())

    sink = WakeSink()
    agent = RankAgent(
        sink, RankInfo("job-w", 0, 0, 1, 0, "h"), AgentConfig(stacks=False, cupti=False, publish_s=0.2)
    )
    agent.install()
    try:
        for _ in range(3):
            agent.begin_step()
            time.sleep(0.01)
            agent.end_step()
        deadline = time.monotonic() + 5
        while len(sink.of(StepBatch)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(sink.of(StepBatch)) == 3
        assert sink.wakes and sink.wakes[-1] >= 3  # woken after the round that published them
        while len(sink.at) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        late = sorted(t % 0.2 for t in sink.at[1:])  # the first round comes at start
        assert len(late) >= 5 and late[len(late) // 2] < 0.02, late  # on the grid, give or take a wake-up
        agent.declare_pause("eval", 10)
        assert sink.wakes[-1] == len(sink.records)  # the pause's heartbeat, then the wake
    finally:
        agent.close()
