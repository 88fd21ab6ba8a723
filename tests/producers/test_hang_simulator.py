"""Hang scenarios of the simulator: heartbeats that validate, freeze, stop, and labels."""

from __future__ import annotations

import pytest

from argus.producers.simulator import HANG_LOST, HANG_SCENARIOS, HangScenario, HangSimulator, Layout
from argus.schemas import decode, encode

LAYOUT = Layout(dp=4, tp=8, pp=4)
S = 1e9


def test_every_scenario_labels_what_it_injects_and_heartbeats_validate() -> None:
    for kind in HANG_SCENARIOS:
        sim = HangSimulator(LAYOUT, HangScenario(kind, at_s=20.0), seed=2)
        beats = sim.beats(sim.start_ns, sim.start_ns + int(40 * S))
        assert beats == sorted(beats, key=lambda b: b.time_ns)
        for b in beats[:: max(1, len(beats) // 50)]:
            assert decode(encode(b)) == b
        if kind == "declared_checkpoint":
            assert sim.labels == ()
            continue
        (label,) = sim.labels
        assert label.cause == HANG_LOST[kind] and label.start_ns == sim.hang_ns
        assert 1 <= len(label.ranks) <= LAYOUT.gpus_per_host


def test_the_culprit_is_the_only_rank_behind_its_waiting_peers() -> None:
    sim = HangSimulator(LAYOUT, HangScenario("collective_hang", at_s=20.0, rank=37), seed=1)
    after = [b for b in sim.beats(sim.hang_ns, sim.hang_ns + int(5 * S))]
    assert {b.rank for b in after} == set(range(LAYOUT.n_ranks))
    group = sim.labels[0].group
    members = [b for b in after if group in b.groups]
    seq = {
        b.rank: (b.seq_entered[b.groups.index(group)], b.seq_finished[b.groups.index(group)]) for b in members
    }
    entered, finished = seq.pop(37)
    assert entered == finished  # never entered the all-reduce
    assert all(e == entered + 1 and f == finished for e, f in seq.values())  # the peers wait in it
    last = {b.rank: b.last_step for b in after}
    assert last[37] == sim.hang_step - 1 and max(last.values()) <= sim.hang_step  # no step after the hang


@pytest.mark.parametrize("kind", ["process_death", "host_silent"])
def test_lost_ranks_stop_sending(kind: str) -> None:
    sim = HangSimulator(LAYOUT, HangScenario(kind, at_s=20.0), seed=4)
    silent = set(sim.labels[0].ranks)
    before = {b.rank for b in sim.beats(sim.start_ns, sim.hang_ns)}
    after = {b.rank for b in sim.beats(sim.hang_ns, sim.hang_ns + int(30 * S))}
    assert silent <= before and not silent & after and len(after) == LAYOUT.n_ranks - len(silent)


def test_a_declared_checkpoint_says_until_when_then_steps_resume() -> None:
    sim = HangSimulator(LAYOUT, HangScenario("declared_checkpoint", at_s=20.0, pause_s=30.0), seed=1)
    during = sim.beats(sim.hang_ns, sim.hang_ns + int(25 * S))
    assert all(b.pause == "checkpoint" and b.pause_until_ns == sim.hang_ns + int(30 * S) for b in during)
    later = sim.beats(sim.hang_ns + int(40 * S), sim.hang_ns + int(45 * S))
    assert all(b.pause == "" and b.last_step > sim.hang_step for b in later)


def test_unknown_scenarios_and_a_deadlock_without_a_pipeline_are_refused() -> None:
    with pytest.raises(ValueError):
        HangScenario("meteor")
    with pytest.raises(ValueError):
        HangSimulator(Layout(dp=8, tp=8), HangScenario("p2p_deadlock"))
