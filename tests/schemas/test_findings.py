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


HOSTILE = {
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
