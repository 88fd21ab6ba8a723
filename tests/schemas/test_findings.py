"""The step-findings topic's records (StepFindings, JobOrder): Avro like every record, with a
schema id, checked on decode (issue 21)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from argus.schemas import (
    SCHEMAS,
    Finding,
    JobOrder,
    RankResiduals,
    StepFindings,
    ValidationError,
    decode,
    encode,
    peek_schema_id,
)
from tests.records import WORKER_RECORDS

FINDINGS, ORDER = WORKER_RECORDS


def _fields(sf: StepFindings) -> dict:
    return {**sf.to_avro(), "job_median": list(sf.job_median)}


def test_step_findings_round_trip_through_the_codec() -> None:
    data = encode(FINDINGS)
    assert SCHEMAS[peek_schema_id(data)].name == "step_findings"
    back = decode(data, expect=StepFindings)
    assert _fields(back) == _fields(FINDINGS)
    assert back.findings == FINDINGS.findings and back.summary == FINDINGS.summary
    assert back.peers == {3: (1, 2, 4)} and back.findings[0].key == "compute_straggler|rank:3"


def test_job_order_round_trip_through_the_codec() -> None:
    data = encode(ORDER)
    assert SCHEMAS[peek_schema_id(data)].name == "job_order"
    assert decode(data) == ORDER


def test_the_inline_summary_is_the_step_summary_schema() -> None:
    """The findings carry the summary as a nested record: the same schema as the summaries topic's
    (one change to StepSummary is a new version of both)."""
    latest = max((i for i in SCHEMAS.values() if i.name == "step_summary"), key=lambda i: i.version)
    findings = max((i for i in SCHEMAS.values() if i.name == "step_findings"), key=lambda i: i.version)
    nested = next(f["type"] for f in findings.raw["fields"] if f["name"] == "summary")
    assert nested == latest.raw


RESIDUALS = RankResiduals(
    np.arange(4),
    RankResiduals.quantized(np.log([250.0, 251.0, 300.0, 249.0])),
    np.array([0, 0, 1, 0], np.int8),
    250.0,
    np.array(["node-0", "node-0", "node-1", "node-1"]),
    np.array([0, 0, 1, 1]),
    np.zeros(4, np.int64),
    replicas=False,
)


def test_the_ranks_own_work_travels_as_it_is_tested() -> None:
    """Log work as a median and float16 deviations (quantized before it is tested), the
    layout as runs; a findings record without it (the change points off) has none."""
    back = decode(encode(dataclasses.replace(FINDINGS, residuals=RESIDUALS)), expect=StepFindings)
    res = back.residuals
    assert (
        res is not None
        and np.array_equal(res.lw, RESIDUALS.lw)
        and np.array_equal(res.ranks, RESIDUALS.ranks)
    )
    assert list(res.hosts) == list(RESIDUALS.hosts) and list(res.dp) == [0, 0, 1, 1]
    assert list(res.phase) == [0, 0, 1, 0] and res.work_ms == 250.0 and not res.replicas
    assert np.max(np.abs(res.lw - np.log([250.0, 251.0, 300.0, 249.0]))) < 1e-3
    assert decode(encode(FINDINGS), expect=StepFindings).residuals is None


HOSTILE = {
    "residuals' log work NaN": dataclasses.replace(
        FINDINGS, residuals=dataclasses.replace(RESIDUALS, lw=np.array([np.nan, 1.0, 1.0, 1.0]))
    ),
    "residuals' rank absurd": dataclasses.replace(
        FINDINGS, residuals=dataclasses.replace(RESIDUALS, ranks=np.array([0, 1, 2, -5]))
    ),
    "job_median NaN": dataclasses.replace(FINDINGS, job_median=np.array([float("nan")] * 13)),
    "step_ms negative": dataclasses.replace(FINDINGS, step_ms=-1.0),
    "summary of another step": dataclasses.replace(FINDINGS, step=FINDINGS.step + 1),
    "summary out of range": dataclasses.replace(
        FINDINGS, summary=dataclasses.replace(FINDINGS.summary, tokens=-1)
    ),
    "finding level unknown": dataclasses.replace(
        FINDINGS, findings=(dataclasses.replace(FINDINGS.findings[0], level="nope"),)
    ),
    "finding rank absurd": dataclasses.replace(
        FINDINGS, findings=(dataclasses.replace(FINDINGS.findings[0], ranks=(1 << 20,)),)
    ),
    "finding evidence inf": dataclasses.replace(
        FINDINGS, findings=(dataclasses.replace(FINDINGS.findings[0], evidence={"x": float("inf")}),)
    ),
    "finding suspect huge": dataclasses.replace(
        FINDINGS, findings=(Finding("c", "cross_rank", "rank", "s" * 5000, (), 1.0, "x"),)
    ),
    "peers absurd": dataclasses.replace(FINDINGS, peers={3: (-1,)}),
    "order action unknown": JobOrder("job-a", 1, "drop_tables"),
    "order run -1": JobOrder("job-a", -1, "expire"),
}


@pytest.mark.parametrize("record", HOSTILE.values(), ids=list(HOSTILE))
def test_out_of_range_findings_and_orders_are_rejected_on_decode(record: object) -> None:
    data = encode(record, check=False)  # type: ignore[arg-type]  # what a hostile producer sends
    with pytest.raises(ValidationError):
        decode(data)


def test_residual_runs_that_do_not_cover_the_ranks_are_rejected_on_decode() -> None:
    raw = dataclasses.replace(FINDINGS, residuals=RESIDUALS).to_avro()
    raw["residuals"]["dp_runs"] = np.array([3, 3], "<i4").tobytes()  # 6 ranks' worth for 4
    with pytest.raises(ValueError, match="runs of dp"):
        StepFindings.from_avro(raw)
