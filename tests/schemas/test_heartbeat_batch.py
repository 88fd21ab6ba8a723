"""HeartbeatBatch: a node's heartbeats in one record; sizes follow the bytes, never a claim."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from argus.schemas import (
    Heartbeat,
    HeartbeatBatch,
    SchemaError,
    ValidationError,
    decode,
    decode_many,
    encode,
    validate,
)

T0 = 1_800_000_000_000_000_000


def beat(rank: int, groups: int = 2, **kw: object) -> Heartbeat:
    names = ("dp0", "tp3", "pp1")[:groups]
    return Heartbeat(
        "job",
        1,
        rank,
        f"node{rank // 8}",
        T0 + rank,
        41,
        groups=names,
        seq_entered=tuple(range(5, 5 + groups)),
        seq_finished=tuple(range(4, 4 + groups)),
        kinds=("all_reduce",) * groups,
        nbytes=(1 << 20,) * groups,
        stack="train.py:main;model.py:forward",
        **kw,  # type: ignore[arg-type]
    )


def test_a_node_batch_round_trips_and_gives_back_every_heartbeat():
    beats = [
        beat(r, groups=r % 3, pause="checkpoint" if r == 3 else "", pause_until_ns=T0 if r == 3 else 0)
        for r in range(8)
    ]
    batch = HeartbeatBatch.from_beats(beats)
    assert (len(batch), batch.width) == (8, 2)
    back = decode(encode(batch))
    assert isinstance(back, HeartbeatBatch) and back.beats() == beats


def test_a_batch_without_groups_round_trips():
    beats = [beat(r, groups=0) for r in range(3)]
    assert decode(encode(HeartbeatBatch.from_beats(beats))).beats() == beats


def _raw(batch: HeartbeatBatch, **changes: object) -> bytes:
    import io

    from fastavro import schemaless_writer

    from argus.schemas._codec import _HEADER, _LATEST

    info = _LATEST[HeartbeatBatch]
    buf = io.BytesIO()
    buf.write(_HEADER.pack(0, info.id))
    schemaless_writer(buf, info.schema, {**batch.to_avro(), **changes})
    return buf.getvalue()


@pytest.mark.parametrize(
    "changes",
    [
        {"rows": 1_000_000},  # a claim the columns do not back
        {"width": 50},
        {"rows": -1},
        {"rank": b"\x00" * 12},
        {"host": "a\nb"},  # fewer hosts than rows
        {"groups": "x"},
    ],
)
def test_columns_that_do_not_match_the_claimed_shape_are_refused(changes):
    batch = HeartbeatBatch.from_beats([beat(r) for r in range(4)])
    with pytest.raises(SchemaError):
        decode(_raw(batch, **changes))


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("rank", -1, "rank"),
        ("rank", 1 << 20, "rank"),
        ("time_ns", 5, "time_ns"),
        ("last_step", -2, "last_step"),
        ("ngroups", 3, "ngroups"),
        ("seq_entered", -2, "seq_entered"),
        ("nbytes", -1, "nbytes"),
    ],
)
def test_out_of_range_rows_are_refused(column, value, message):
    batch = HeartbeatBatch.from_beats([beat(r) for r in range(4)])
    cols = {k: v.copy() for k, v in batch.columns.items()}
    cols[column][2] = value
    with pytest.raises(ValidationError, match=message):
        validate(dataclasses.replace(batch, columns=cols))


def test_a_rank_twice_in_one_batch_and_overlong_text_are_refused():
    with pytest.raises(ValidationError, match="twice"):
        validate(HeartbeatBatch.from_beats([beat(1), beat(1)]))
    with pytest.raises(ValidationError, match="stack"):
        validate(HeartbeatBatch.from_beats([dataclasses.replace(beat(1), stack="x" * 70_000)]))
    with pytest.raises(ValidationError, match="groups"):
        validate(HeartbeatBatch.from_beats([dataclasses.replace(beat(1, groups=1), groups=("g" * 300,))]))


def test_decode_many_checks_batches_together_and_names_the_bad_one():
    good = [encode(HeartbeatBatch.from_beats([beat(r + 8 * n) for r in range(8)])) for n in range(5)]
    bad_batch = HeartbeatBatch.from_beats([beat(r) for r in range(8)])
    cols = {k: v.copy() for k, v in bad_batch.columns.items()}
    cols["last_step"][0] = -7
    bad = encode(dataclasses.replace(bad_batch, columns=cols), check=False)
    single = encode(beat(99))
    out = decode_many([*good[:2], bad, *good[2:], single, b"junk"])
    assert [type(x).__name__ for x in out] == ["HeartbeatBatch"] * 2 + ["ValidationError"] + [
        "HeartbeatBatch"
    ] * 3 + [
        "Heartbeat",
        "DecodeError",
    ]
    # the same rank in two batches of one consumer batch is fine (two heartbeat periods)
    assert all(isinstance(x, HeartbeatBatch) for x in decode_many([good[0], good[0]]))
    assert np.array_equal(out[0]["rank"], np.arange(8))


def test_decode_many_reads_batches_of_one_width_together_and_others_one_by_one():
    same = [HeartbeatBatch.from_beats([beat(r + 8 * n) for r in range(8)]) for n in range(3)]
    other = HeartbeatBatch.from_beats([beat(r, groups=3) for r in range(4)])
    for batches in (same, [*same, other]):
        out = decode_many([encode(b) for b in batches])
        assert [x.beats() for x in out] == [b.beats() for b in batches]
    # read together, the columns are views of one array per column
    out = decode_many([encode(b) for b in same])
    assert out[0]["rank"].base is not None and out[0]["rank"].base is out[1]["rank"].base
