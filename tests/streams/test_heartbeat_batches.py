"""The worker's heartbeat path (:func:`observe_heartbeats`): node batches and direct
heartbeats leave the hang state exactly as per-rank observation does, and claims that
would grow the state are refused per message."""

from __future__ import annotations

import random

import numpy as np

from argus.detectors import HangState
from argus.detectors.hang import observe_heartbeats
from argus.schemas import Heartbeat, HeartbeatBatch, decode, encode

T0 = 1_800_000_000_000_000_000


def random_beats(rng: random.Random, n: int) -> list[Heartbeat]:
    out = {}
    for _ in range(n):
        k = rng.randint(0, 3)
        b = Heartbeat(
            "j",
            0,
            rng.randint(0, 20),
            f"h{rng.randint(0, 2)}",
            T0 + rng.randint(0, 10**9),
            rng.randint(-1, 50),
            groups=tuple(f"g{rng.randint(0, 4)}" for _ in range(k)),
            seq_entered=tuple(rng.randint(-1, 9) for _ in range(k)),
            seq_finished=tuple(rng.randint(-1, 9) for _ in range(k)),
            kinds=tuple(rng.choice("xyz") for _ in range(k)),
            nbytes=tuple(rng.randint(0, 9) for _ in range(k)),
            stack=rng.choice(["a;b", "c"]),
            pause=rng.choice(["", "ckpt"]),
            pause_until_ns=rng.choice([0, T0]),
        )
        out.setdefault((b.rank, b.time_ns), b)  # no two beats of a rank at the same instant
    return list(out.values())


def names(interner_names: list[str], ids: np.ndarray) -> np.ndarray:
    return np.array([*interner_names, "-"], object)[ids]


def assert_same(a: HangState, b: HangState) -> None:
    for name in (
        "time_ns",
        "prev_ns",
        "last_step",
        "pause_until",
        "host",
        "stack",
        "pause",
        "ent",
        "fin",
        "nbytes",
    ):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(names(a.groups.names, a.gid), names(b.groups.names, b.gid))
    assert np.array_equal(names(a.kinds.names, a.kind), names(b.kinds.names, b.kind))
    assert (a.max_step, a.first_ns > 0) == (b.max_step, b.first_ns > 0)


def test_batches_and_singles_leave_the_state_as_per_rank_observation_does():
    rng = random.Random(7)
    for _ in range(200):
        per_rank, batched = HangState("j"), HangState("j")
        states = {("j", 0): batched}
        for _ in range(5):
            beats = random_beats(rng, rng.randint(1, 16))
            per_rank.observe(beats)
            # as the worker gets them: node batches (a rank once per batch) and single heartbeats
            records: list[tuple[Heartbeat | HeartbeatBatch, object]] = []
            rest = []
            for host in ("h0", "h1"):
                latest = {}
                for b in sorted((b for b in beats if b.host == host), key=lambda b: b.time_ns):
                    if b.rank in latest:
                        rest.append(latest[b.rank])
                    latest[b.rank] = b
                if latest:
                    records.append((decode(encode(HeartbeatBatch.from_beats(list(latest.values())))), host))
            records += [(b, None) for b in beats if b.host == "h2"] + [(b, None) for b in rest]
            taken, refused = observe_heartbeats(states, records)
            assert refused == [] and taken <= len(beats)
        assert_same(per_rank, batched)


def test_claims_beyond_the_job_are_refused_per_message_and_the_rest_taken():
    states: dict = {}
    node = HeartbeatBatch.from_beats(
        [
            Heartbeat(
                "j",
                0,
                r,
                "n0",
                T0,
                5,
                groups=("g",),
                seq_entered=(1,),
                seq_finished=(1,),
                kinds=("k",),
                nbytes=(8,),
            )
            for r in range(8)
        ]
    )
    absurd = HeartbeatBatch.from_beats([Heartbeat("j", 0, r, "n9", T0, 5) for r in (8, 900_000)])
    wide = Heartbeat(
        "j",
        0,
        9,
        "n1",
        T0,
        5,
        groups=tuple(f"g{i}" for i in range(65)),
        seq_entered=(0,) * 65,
        seq_finished=(0,) * 65,
        kinds=("k",) * 65,
        nbytes=(0,) * 65,
    )
    fine = Heartbeat("j", 0, 10, "n1", T0, 5)
    taken, refused = observe_heartbeats(
        states, [(node, "node"), (absurd, "absurd"), (wide, "wide"), (fine, "fine")]
    )
    assert taken == 9
    assert sorted((t, r) for t, r, _ in refused) == [("absurd", "absurd_rank"), ("wide", "too_many_groups")]
    state = states[("j", 0)]
    assert state.n < 1000 and state.width == 1 and int(state.seen.sum()) == 9


def test_the_least_recently_seen_jobs_are_dropped_beyond_the_bound():
    states: dict = {}
    for j in range(5):
        observe_heartbeats(states, [(Heartbeat(f"j{j}", 0, 0, "n", T0, 1), None)], max_jobs=3)
    assert list(states) == [("j2", 0), ("j3", 0), ("j4", 0)]
