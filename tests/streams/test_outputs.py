"""What the worker sends is bounded whatever its input claims (issue 17, items 1 and 2)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from argus.detectors import DiagnoserConfig, HangState, detect_hang, hang_anomalies
from argus.producers.simulator import HangScenario, HangSimulator, Layout
from argus.schemas import LIMITS, ValidationError, decode, encode
from argus.streams import CompleteStep
from argus.streams.outputs import bounded_anomaly, step_outputs
from tests.records import step_batch

LONG_FRAME = "train.py:step;" + "model.py:" + "f" * 5000


def test_a_hang_anomaly_quoting_a_long_frame_is_cut_to_the_limit_and_encodes() -> None:
    """A heartbeat whose innermost frame is 5,000 characters made a hang summary of 10,128:
    encode() raised in the worker's detect_hangs timer, on every restart."""
    sim = HangSimulator(
        Layout(dp=2, tp=4, pp=1), HangScenario("collective_hang", at_s=20.0, rank=5), job="long"
    )
    state = HangState(sim.job)
    found = []
    for now, beats in sim.ticks(1.0, 60.0, from_s=0.0):
        state.observe([replace(b, stack=LONG_FRAME) for b in beats])
        found = hang_anomalies(detect_hang(state, now))
        if found:
            break
    assert found, "no hang named"
    raw = found[0]
    assert len(raw.summary) > LIMITS["max_name_len"]
    with pytest.raises(ValidationError):
        encode(raw)  # what killed the timer
    cut = bounded_anomaly(raw)
    back = decode(encode(cut))
    assert len(back.summary) == LIMITS["max_name_len"] and back.summary.endswith("…")
    assert back.summary[:200] == raw.summary[:200] and (back.id, back.ranks) == (raw.id, raw.ranks)


def test_bounded_anomaly_cuts_every_field_validation_checks() -> None:
    from tests.records import RECORDS

    a = next(r for r in RECORDS if type(r).__name__ == "Anomaly")
    wild = replace(
        a,
        suspect="s" * 1000,
        ranks=tuple(range(1000)) + tuple(range(2000, 3000)),
        evidence={"k" * 1000: 1.0, "inf": float("inf")},
        summary="x" * 10_000,
    )
    back = decode(encode(bounded_anomaly(wild)))
    assert len(back.suspect) == 256 and len(back.ranks) == 1024 and list(back.evidence) == ["k" * 255 + "…"]


def test_a_step_whose_outputs_exceed_the_message_limit_raises_instead_of_sending() -> None:
    batch = step_batch(64)
    missing = tuple(range(64, 64 + 60_000))
    done = CompleteStep(batch, missing, (), "timeout")
    sf, findings = step_outputs(done, DiagnoserConfig())  # 60,000 missing ranks fit
    assert len(findings) < 900_000 and sf.summary.missing == missing
    assert decode(findings).summary.missing == missing  # the summary travels in the findings
    with pytest.raises(ValidationError, match="limit 1000"):
        step_outputs(done, DiagnoserConfig(), max_bytes=1000)
    assert np.all(batch["rank"] < 64)


def test_heartbeats_claiming_absurd_ranks_or_groups_do_not_grow_the_hang_state() -> None:
    """A heartbeat of rank 1,048,575 with 60,000 groups sized the job's hang state to
    1,048,576 × 60,000 (the worker died of memory, again on every restart)."""
    from tests.records import RECORDS

    beat = next(r for r in RECORDS if type(r).__name__ == "Heartbeat")
    state = HangState(beat.job, beat.run)
    fine = [(replace(beat, rank=r), f"ok{r}") for r in range(8)]
    absurd = (replace(beat, rank=(1 << 20) - 1), "absurd")
    wide = (replace(beat, rank=3, groups=("g",) * 60_000, seq_entered=(0,) * 60_000,
                    seq_finished=(0,) * 60_000, kinds=("k",) * 60_000, nbytes=(0,) * 60_000), "wide")  # fmt: skip
    from argus.detectors import observe_heartbeats

    states = {(beat.job, beat.run): state}
    taken, rejected = observe_heartbeats(states, [*fine, absurd, wide])
    assert [(t, r) for t, r, _ in rejected] == [("absurd", "absurd_rank"), ("wide", "too_many_groups")]
    assert taken == 8 and state.n < 64 and state.width == 1
