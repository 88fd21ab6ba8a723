"""Hostile bytes through the whole pipeline, per record type: decode → validate → the
worker's stage for the type (step assembly and the step's outputs; the temporal stage on
step findings and the summary it sends; the hang detector and its anomalies; the kernel
decoder) → the sink's row conversion (``to_arrow``, per record
and per consumer batch). Nothing may raise but the package's clear errors (issue 17).

Seeded numpy mutation, not hypothesis: 10,000 cases per record type in a few seconds.
Half the cases are byte-level mutations of valid messages (bit flips, interesting bytes,
insertions, deletions, truncations, splices), half are valid messages whose fields were set
to the values that broke the pipeline before (out of a column's range, NaN/inf, huge and
empty strings, absurd ranks and steps, long lists), encoded without checks, as a hostile
producer sends them. ``ARGUS_FUZZ_PIPELINE_CASES`` sets the count per type."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from argus.detectors import (
    DiagnoserConfig,
    HangState,
    JobState,
    apply_findings,
    check_shape,
    detect_hang,
    hang_anomalies,
    observe_heartbeats,
    step_findings,
)
from argus.producers.simulator import COMPUTE_STRAGGLER, ClusterSimulator, Fault, Layout
from argus.producers.sketch import kernel_stats
from argus.schemas import (
    Anomaly,
    DeadLetter,
    GpuSample,
    Heartbeat,
    JobOrder,
    KernelNames,
    KernelSketch,
    SchemaError,
    StackSample,
    StepBatch,
    StepFindings,
    StepSummary,
    ValidationError,
    decode,
    decode_many,
    encode,
    validate,
)
from argus.schemas.kernel_codec import encode_payload
from argus.sinks import TABLE_OF, to_arrow
from argus.sinks.kernels import KernelDecoder
from argus.streams import AssemblyConfig, StepAssembler
from argus.streams.outputs import bounded_anomaly, step_outputs
from tests.records import RECORDS, T0, WORKER_RECORDS, step_batch

CASES = int(os.environ.get("ARGUS_FUZZ_PIPELINE_CASES", "10000"))
I64 = 1 << 63
INTS = [-1, 0, 1, 7, 255, 1 << 15, (1 << 16) - 1, 1 << 16, 70_000, (1 << 20) - 1, 1 << 20, (1 << 31) - 1,
        -(1 << 31), (1 << 32) - 1, 10**12 - 1, 10**12, T0, 4_102_444_800 * 10**9, I64 - 1, -I64]  # fmt: skip
FLOATS = [float("nan"), float("inf"), -float("inf"), -0.0, -1.0, 0.0, 1e-300, 86_400_000.0, 1e30, 1.1e30, 3.5e38,
          1e308]  # fmt: skip
TEXTS = ["", "x" * 257, "y" * 4097, "z" * 70_000, "\n", "a\nb", "\x00", "é" * 300, "\ud7ff", "job-a"]


def _stats(seed: int) -> Any:
    rng = np.random.default_rng(seed)
    n = 300
    ids = rng.integers(0, 20, n).astype(np.int32)
    start = np.cumsum(rng.integers(1_000, 5_000, n)).astype(np.int64)
    end = start + rng.lognormal(9, 0.5, n).astype(np.int64)
    return kernel_stats(ids, start, end, rng.integers(0, 3, n).astype(np.int32))


_BASE_STATS = _stats(1)


def _straggler_findings() -> list[StepFindings]:
    """The cross-rank stage's findings of a job with a compute straggler (findings, peers)."""
    fault = Fault(COMPUTE_STRAGGLER, first_step=12, steps=10, ranks=(5,))
    sim = ClusterSimulator(Layout(dp=4, tp=4, pp=2), seed=3, job="job-a", faults=[fault])
    return [step_findings(s.batch, DiagnoserConfig()) for s in sim.run(16)][-3:]


SEEDS: dict[type, list[Any]] = {type(r): [r] for r in RECORDS + WORKER_RECORDS}
SEEDS[StepFindings] += _straggler_findings()
SEEDS[StepBatch] = [step_batch(8), step_batch(1, step=0), step_batch(64, step=10**6)]
SEEDS[KernelSketch] = [
    KernelSketch("job-a", 1, 5, 10, 1, -1, encode_payload(_BASE_STATS)),
    KernelSketch("job-a", 1, 5, 11, 1, 10, encode_payload(_stats(2), _BASE_STATS)),
]


def _value(rng: np.random.Generator, current: Any) -> Any:
    """A hostile value of the same shape as ``current``."""
    if isinstance(current, bool):
        return current
    if isinstance(current, int):
        return INTS[rng.integers(len(INTS))] if rng.random() < 0.8 else int(rng.integers(-(2**40), 2**40))
    if isinstance(current, float):
        return FLOATS[rng.integers(len(FLOATS))] if rng.random() < 0.8 else float(rng.normal() * 1e6)
    if isinstance(current, str):
        return TEXTS[rng.integers(len(TEXTS))]
    if isinstance(current, bytes):
        return bytes(rng.integers(0, 256, int(rng.integers(0, 64)), dtype=np.uint8))
    if dataclasses.is_dataclass(current):
        return _mutate_fields(rng, current)
    if isinstance(current, np.ndarray):
        out = current.astype(float)  # a copy
        if len(out):
            out[rng.integers(len(out))] = _value(rng, 0.0)
        return out if rng.random() < 0.8 else out[: int(rng.integers(len(out) + 1))]
    if isinstance(current, tuple) and current and dataclasses.is_dataclass(current[0]):
        i = int(rng.integers(len(current)))
        return (*current[:i], _mutate_fields(rng, current[i]), *current[i + 1 :])
    if isinstance(current, tuple):
        n = int(rng.choice([0, 1, 3, 70_000])) if rng.random() < 0.3 else max(len(current), 1)
        if current and isinstance(current[0], str):
            return tuple(TEXTS[i % len(TEXTS)] for i in rng.integers(0, len(TEXTS), min(n, 50)))
        return tuple(int(INTS[i]) for i in rng.integers(0, len(INTS), n)) if n < 100 else tuple(range(n))
    if isinstance(current, dict) and current and isinstance(next(iter(current)), int):
        return {_value(rng, 0): _value(rng, next(iter(current.values())))}  # peers: rank -> ranks
    if isinstance(current, dict):
        return {TEXTS[rng.integers(len(TEXTS))]: FLOATS[rng.integers(len(FLOATS))]}
    return current


def _mutate_fields(rng: np.random.Generator, record: Any) -> Any:
    """``record`` with one to three fields (nested records' too) set to hostile values."""
    if isinstance(record, StepBatch):
        cols = {k: v.copy() for k, v in record.columns.items()}
        job, run, step = record.job, record.run, record.step
        for _ in range(int(rng.integers(1, 4))):
            what = rng.integers(0, 4)
            if what == 0:
                job, run, step = _value(rng, job), _value(rng, run), _value(rng, step)
            else:
                name = list(cols)[rng.integers(len(cols))]
                i = int(rng.integers(len(cols[name])))
                col = cols[name]
                if col.dtype == object:
                    col[i] = _value(rng, "")
                elif col.dtype.kind == "f":
                    col[i] = _value(rng, 0.0)
                else:
                    col[i] = int(np.clip(_value(rng, 0), -I64, I64 - 1))
        return StepBatch(job, run, step, cols)
    fields = [f.name for f in dataclasses.fields(record)]
    changes = {}
    for name in rng.choice(fields, size=int(rng.integers(1, 4))):
        changes[str(name)] = _value(rng, getattr(record, str(name)))
    return dataclasses.replace(record, **changes)


def _mutate_bytes(rng: np.random.Generator, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        op = rng.integers(0, 6)
        i = int(rng.integers(0, max(len(buf), 1)))
        if op == 0 and buf:
            buf[i] ^= 1 << int(rng.integers(8))
        elif op == 1 and buf:
            buf[i] = int(rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF]))
        elif op == 2:
            buf[i:i] = bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
        elif op == 3 and buf:
            del buf[i : i + int(rng.integers(1, 9))]
        elif op == 4:
            del buf[i:]
        else:
            j = int(rng.integers(0, max(len(buf), 1)))
            buf[i:i] = buf[j : j + int(rng.integers(1, 33))]
    return bytes(buf)


def cases(kind: type, n: int, seed: int) -> Iterator[bytes]:
    """``n`` hostile messages built from valid messages of ``kind``."""
    rng = np.random.default_rng(seed)
    seeds = SEEDS[kind]
    valid = [encode(r) for r in seeds]
    made = 0
    while made < n:
        base = seeds[rng.integers(len(seeds))]
        if made % 2:
            yield _mutate_bytes(rng, valid[rng.integers(len(valid))])
            made += 1
            continue
        try:
            yield encode(_mutate_fields(rng, base), check=False)
        except Exception:  # a value Avro's type cannot carry: the producer could not send it
            yield _mutate_bytes(rng, valid[rng.integers(len(valid))])
        made += 1


class Pipeline:
    """The worker's stage and the sink's conversion for each accepted record."""

    def __init__(self) -> None:
        self.assembler = StepAssembler(AssemblyConfig(quiet_s=0.0, max_open=64, max_jobs=256))
        self.hang: dict[tuple[str, int], HangState] = {}
        self.jobs: dict[tuple[str, int], JobState] = {}
        self.kernels = KernelDecoder()
        self.cfg = DiagnoserConfig()
        self.now = 0.0
        self.accepted = 0
        self.outputs = 0

    def feed(self, record: Any) -> None:
        validate(record)  # whatever decodes is in range
        self.accepted += 1
        if type(record) in TABLE_OF:
            table, data = to_arrow([record])
            assert isinstance(data, pa.Table) and data.num_rows >= 0, table
        if isinstance(record, StepBatch):
            self.now += 0.01
            done = self.assembler.add(record, None, self.now) + self.assembler.due(self.now + 100.0)
            for step in done:
                if step.reason in ("late", "far_future", "absurd_rank"):
                    continue
                try:
                    _, findings = step_outputs(step, self.cfg)
                except ValidationError:
                    continue  # output too large: the worker dead-letters the step's parts
                self.temporal(decode(findings))  # what the cross-rank stage sent, read by the temporal one
                self.outputs += 1
        elif isinstance(record, StepFindings):
            self.temporal(record)
        elif isinstance(record, Heartbeat):
            observe_heartbeats(self.hang, [(record, None)])
            state = self.hang.get((record.job, record.run))
            if state is None:
                return
            for anomaly in hang_anomalies(detect_hang(state, record.time_ns + 3_600 * 10**9)):
                decode(encode(bounded_anomaly(anomaly)))
                self.outputs += 1
        elif isinstance(record, KernelNames):
            self.kernels.names(record)
        elif isinstance(record, KernelSketch):
            self.kernels.decode(record)
        elif isinstance(record, Anomaly):
            decode(encode(bounded_anomaly(record)))

    def temporal(self, sf: StepFindings) -> None:
        """The temporal stage on one step's findings (in order per job, as the worker's reorderer
        lets them through): the job's state updated, the summary and the anomalies sent."""
        try:
            check_shape(sf)
        except ValidationError:
            return  # findings these detectors cannot read: dead-lettered
        state = self.jobs.setdefault((sf.job, sf.run), JobState.new(sf.job, sf.run, self.cfg))
        # each case as the job's next step (most cases are of a few steps: they would be duplicates)
        result = apply_findings(
            state, dataclasses.replace(sf, step=max(sf.step, state.last_step + 1)), self.cfg
        )
        decode(encode(sf.summary, check=False))  # as the worker sends it: checked with the findings
        for anomaly in result.anomalies:
            decode(encode(bounded_anomaly(anomaly)))
        self.outputs += 1


TYPES = [
    StepBatch,
    KernelSketch,
    KernelNames,
    StackSample,
    GpuSample,
    Heartbeat,
    StepSummary,
    Anomaly,
    DeadLetter,
    StepFindings,
    JobOrder,
]


@pytest.mark.parametrize("kind", TYPES, ids=lambda k: k.__name__)
def test_hostile_bytes_through_decode_worker_and_sink_rows(kind: type) -> None:
    pipeline = Pipeline()
    messages = list(cases(kind, CASES, seed=TYPES.index(kind) + 17))
    rejected = 0
    for data in messages:
        try:
            record = decode(data)
        except SchemaError:
            rejected += 1
            continue
        pipeline.feed(record)
    # The consumer-batch paths: decode_many (one vectorized check of the StepBatches) and one
    # to_arrow per type over the whole batch, as the sink inserts it.
    for chunk in range(0, len(messages), 500):
        got = decode_many(messages[chunk : chunk + 500])
        good = [r for r in got if not isinstance(r, SchemaError)]
        for r in good:
            validate(r)
        by_type: dict[type, list[Any]] = {}
        for r in good:
            by_type.setdefault(type(r), []).append(r)
        for t, records in by_type.items():
            if t in TABLE_OF:
                to_arrow(records)
    list(pipeline.assembler.drain())
    assert len(messages) == CASES and pipeline.accepted + rejected == CASES
    assert pipeline.accepted > CASES // 20, f"only {pipeline.accepted} of {CASES} {kind.__name__} decoded"
    print(f"{kind.__name__}: {CASES} cases, {pipeline.accepted} accepted, {pipeline.outputs} outputs")


def test_the_fuzzer_reaches_the_values_that_broke_the_pipeline() -> None:
    """The field mutations include the issue's poison values, so the fuzz covers them."""
    seen: set[Any] = set()
    rng = np.random.default_rng(0)
    for _ in range(2000):
        seen.add(_value(rng, 0))
    assert {70_000, -1, (1 << 20) - 1, 10**12 - 1} <= seen
