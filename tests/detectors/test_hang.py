"""Hang detector: every simulated hang scenario at 1,024 and 16,384 ranks, and its rules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from argus.detectors import (
    HANG,
    LOST_RANK,
    HangConfig,
    HangState,
    HangVerdict,
    detect_hang,
    hang_anomalies,
    stack_where,
)
from argus.producers.simulator import HANG_SCENARIOS, HangScenario, HangSimulator, Layout
from argus.schemas import Anomaly, Heartbeat, decode, encode

LAYOUTS = {1024: Layout(dp=16, tp=8, pp=8), 16384: Layout(dp=64, tp=8, pp=32)}
AT_S = 40.0


def first_alarm(
    sim: HangSimulator, until_s: float, config: HangConfig | None = None
) -> tuple[float, HangVerdict] | None:
    """Replay the heartbeats with a 1 s detector tick; the first alarm (seconds after the hang)."""
    state = HangState(sim.job)
    for now, beats in sim.ticks(1.0, until_s, from_s=AT_S - 12.0):
        state.observe(beats)
        verdict = detect_hang(state, now, config)
        if verdict.hung:
            return (now - sim.hang_ns) / 1e9, verdict
    return None


@pytest.mark.parametrize("n_ranks", sorted(LAYOUTS))
@pytest.mark.parametrize("kind", [k for k in HANG_SCENARIOS if k != "declared_checkpoint"])
def test_each_hang_is_named_within_30_s(kind: str, n_ranks: int) -> None:
    sim = HangSimulator(LAYOUTS[n_ranks], HangScenario(kind, at_s=AT_S), seed=n_ranks + len(kind))
    (label,) = sim.labels
    got = first_alarm(sim, AT_S + 31.0)
    assert got is not None, f"no alarm within 30 s for {kind}"
    delay, verdict = got
    assert 0 < delay <= 30.0
    assert len(verdict.findings) == 1, [(f.cause, f.suspect) for f in verdict.findings]
    (f,) = verdict.findings
    assert (f.cause, f.suspect_kind, f.suspect) == (label.cause, label.suspect_kind, label.suspect)
    assert set(f.ranks) == set(label.ranks)
    suspects = 1 if f.suspect_kind == "host" else len(f.ranks)
    assert suspects <= 3
    assert f.kind == label.collective
    if label.group:
        assert f.group == label.group
    assert label.collective in f.summary
    (a,) = hang_anomalies(verdict)
    assert a.level == "hang" and a.cause == label.cause and a.gpu_hours_lost > 0
    assert decode(encode(a)) == a


@pytest.mark.parametrize("n_ranks", sorted(LAYOUTS))
def test_a_declared_long_checkpoint_never_alarms(n_ranks: int) -> None:
    sim = HangSimulator(
        LAYOUTS[n_ranks], HangScenario("declared_checkpoint", at_s=AT_S, pause_s=40.0), seed=3
    )
    assert sim.labels == ()
    assert first_alarm(sim, AT_S + 50.0) is None  # 40 s pause (4× the threshold), then steps resume


def test_an_undeclared_checkpoint_of_the_same_length_does_alarm() -> None:
    sim = HangSimulator(LAYOUTS[1024], HangScenario("declared_checkpoint", at_s=AT_S, pause_s=40.0), seed=3)
    state = HangState(sim.job)
    alarm = None
    for now, beats in sim.ticks(1.0, AT_S + 30.0, from_s=AT_S - 12.0):
        state.observe([replace(b, pause="", pause_until_ns=0) for b in beats])
        v = detect_hang(state, now)
        if v.hung:
            alarm = v
            break
    assert alarm is not None and alarm.findings[0].suspect_kind == "job"
    assert "checkpoint" in alarm.findings[0].where


def test_the_threshold_derives_from_the_job_step_time() -> None:
    slow = HangSimulator(LAYOUTS[1024], HangScenario("collective_hang", at_s=AT_S), seed=1, step_s=2.5)
    got = first_alarm(slow, AT_S + 31.0)
    assert got is not None
    delay, verdict = got
    assert verdict.step_s == pytest.approx(2.5, rel=0.1)
    assert verdict.threshold_s == pytest.approx(25.0, rel=0.1) and delay > 20  # 10 steps, not the floor
    floor = HangConfig(floor_s=20.0, step_factor=0.0)
    fast = HangSimulator(LAYOUTS[1024], HangScenario("collective_hang", at_s=AT_S), seed=1)
    got = first_alarm(fast, AT_S + 31.0, floor)
    assert got is not None and 20 < got[0] <= 30 and got[1].threshold_s == 20.0


def beat(
    rank: int, t_s: float, step: int, *, host: str = "h0", entered: int = 0, finished: int = 0
) -> Heartbeat:
    return Heartbeat(
        "j",
        0,
        rank,
        host,
        int(t_s * 1e9) + 10**18,
        step,
        ("world",),
        (entered,),
        (finished,),
        ("all_reduce",),
        (1024,),
        "train.py:main;torch/cuda/__init__.py:synchronize",
    )


def test_no_alarm_while_steps_complete_or_when_the_whole_job_went_silent() -> None:
    state = HangState("j")
    for t in range(0, 60, 5):
        state.observe([beat(r, t + 0.1 * r, t * 2) for r in range(4)])
        assert not detect_hang(state, int((t + 1) * 1e9) + 10**18).hung
    gone = detect_hang(state, int(200 * 1e9) + 10**18)  # everyone stopped: the job ended
    assert gone.gone and not gone.hung


def test_rank_in_a_collective_with_a_late_peer_waits_then_names_the_lost_rank() -> None:
    state = HangState("j")
    for t in range(0, 30, 5):
        state.observe([beat(r, t + 0.1 * r, t, entered=t, finished=t) for r in range(4)])
    for t in range(30, 60, 5):  # rank 3 dies at 30 s; the others wait in all-reduce #31
        state.observe([beat(r, t + 0.1 * r, 25, entered=31, finished=30) for r in range(3)])
        v = detect_hang(state, int((t + 1) * 1e9) + 10**18)
        if t + 1 - 25.3 < 15:  # its last heartbeat was at 25.3 s
            assert not v.hung
    assert v.hung and v.findings[0].cause == LOST_RANK and v.findings[0].ranks == (3,)
    assert v.findings[0].kind == "all_reduce" and v.findings[0].seq == 31


def test_anomaly_ids_are_stable_across_ticks() -> None:
    sim = HangSimulator(LAYOUTS[1024], HangScenario("collective_hang", at_s=AT_S), seed=5)
    state = HangState(sim.job)
    ids: list[set[str]] = []
    for now, beats in sim.ticks(1.0, AT_S + 25.0, from_s=AT_S - 12.0):
        state.observe(beats)
        v = detect_hang(state, now)
        if v.hung:
            ids.append({a.id for a in hang_anomalies(v)})
    assert len(ids) > 3 and all(x == ids[0] for x in ids)
    assert all(isinstance(a, Anomaly) and a.cause == HANG for a in hang_anomalies(v))


def test_stack_where_names_what_a_rank_is_doing() -> None:
    assert (
        stack_where("a;torch/utils/data/dataloader.py:__next__;multiprocessing/queues.py:get")
        == "waiting on a queue"
    )
    assert stack_where("a;torch/cuda/__init__.py:synchronize") == "in a CUDA sync"
    assert "lock" in stack_where("a;threading.py:acquire")
    assert stack_where("") == "somewhere unknown (no stack)"


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        HangConfig(floor_s=0)
    with pytest.raises(ValueError):
        HangConfig(max_suspects=0)
