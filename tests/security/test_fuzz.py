"""Hostile input, property-based: every decoder, the Kineto importer and the CSV reader
either return something valid or raise their package's clear error.

CI runs 1,000 cases per property; ``bench/reliability.py`` runs them with
ARGUS_FUZZ_EXAMPLES=10000 (10,000 cases each). The fuzzers that take every record type
from bytes through decode, validation, the worker's stages and the sink's row conversion
(10,000 cases per type in every run) are in ``test_pipeline_fuzz.py``."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tracemalloc
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argus.csvlogs import diagnose_log
from argus.producers.csvlogs import CsvError, read_series
from argus.producers.kineto import KinetoImport, TraceError
from argus.producers.sketch import kernel_stats
from argus.schemas import SCHEMAS, KernelStats, SchemaError, StepBatch, decode, encode, validate
from argus.schemas.kernel_codec import decode_payload, encode_payload
from tests.records import RECORDS, WORKER_RECORDS, step_batch

EXAMPLES = int(os.environ.get("ARGUS_FUZZ_EXAMPLES", "1000"))
MANY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
VALID = [encode(r) for r in RECORDS + WORKER_RECORDS] + [encode(step_batch(16))]


def _decodes_cleanly(data: bytes) -> None:
    try:
        record = decode(data)
    except SchemaError:
        return
    validate(record)  # whatever decodes is in range


@MANY
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    _decodes_cleanly(data)


@MANY
@given(st.sampled_from(sorted(SCHEMAS)), st.binary(max_size=400))
def test_known_schema_ids_with_random_bodies(schema_id: int, body: bytes) -> None:
    _decodes_cleanly(bytes([0]) + schema_id.to_bytes(4, "big") + body)


@MANY
@given(st.sampled_from(VALID), st.data())
def test_mutated_valid_messages(message: bytes, data: st.DataObject) -> None:
    buf = bytearray(message)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        i = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "insert":
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and buf:
            del buf[i]
        elif op == "truncate":
            del buf[i:]
    _decodes_cleanly(bytes(buf))


def _stats() -> KernelStats:
    rng = np.random.default_rng(1)
    n = 2000
    ids = rng.integers(0, 40, n).astype(np.int32)
    start = np.cumsum(rng.integers(1_000, 5_000, n)).astype(np.int64)
    end = start + rng.lognormal(9, 0.5, n).astype(np.int64)
    return kernel_stats(ids, start, end, rng.integers(0, 3, n).astype(np.int32))


BASE = _stats()
PAYLOADS = [encode_payload(BASE), encode_payload(_stats(), BASE)]


@MANY
@given(st.sampled_from(PAYLOADS), st.data(), st.booleans())
def test_kernel_payloads_mutated_or_random(payload: bytes, data: st.DataObject, random: bool) -> None:
    if random:
        blob = bytes([1, data.draw(st.integers(0, 3))]) + data.draw(st.binary(max_size=300))
    else:
        buf = bytearray(payload)
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] ^= 1 << data.draw(st.integers(0, 7))
        blob = bytes(buf[: data.draw(st.integers(0, len(buf)))])
    try:
        stats = decode_payload(blob, BASE)
    except SchemaError:
        return
    assert np.all(stats.count >= 0) and len(stats.ids) == len(stats.count)


_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True), st.text(max_size=20)
)
_event = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["X", "i", "M", "f", "s", "B", "E", "?"]),
        "cat": st.sampled_from(
            ["kernel", "cpu_op", "user_annotation", "cuda_runtime", "gpu_memcpy", "ac2g", "x"]
        ),
        "name": st.one_of(
            st.sampled_from(
                [
                    "ProfilerStep#1",
                    "ProfilerStep#2",
                    "ncclDevKernel_AllReduce",
                    "aten::mm",
                    "cudaLaunchKernel",
                    "sgemm",
                ]
            ),
            st.text(max_size=12),
        ),
        "ts": _scalar,
        "dur": _scalar,
        "pid": _scalar,
        "tid": _scalar,
        "args": st.dictionaries(
            st.sampled_from(["stream", "correlation", "device", "External id"]), _scalar, max_size=3
        ),
    },
)
_trace = st.fixed_dictionaries(
    {"traceEvents": st.lists(_event, max_size=25)},
    optional={
        "distributedInfo": st.dictionaries(st.sampled_from(["rank", "world_size"]), _scalar, max_size=2),
        "baseTimeNanoseconds": _scalar,
    },
)


@MANY
@given(st.one_of(_trace.map(lambda d: json.dumps(d).encode()), st.binary(max_size=200)))
def test_kineto_importer_never_crashes(tmp_path_factory, content: bytes) -> None:
    path = tmp_path_factory.getbasetemp() / "fuzz-trace.json"
    path.write_bytes(content)
    try:
        records = list(KinetoImport(path, job="fuzz", rank=0).records())
    except TraceError as exc:
        assert str(path) in str(exc)
        return
    for r in records:
        validate(r)


_cell = st.one_of(st.text(alphabet="0123456789.-e+naifNI", max_size=8), st.just(""), st.text(max_size=6))


@MANY
@given(st.lists(st.tuples(_cell, _cell, _cell, _cell), max_size=30), st.booleans())
def test_csv_reader_and_series_diagnosis(
    tmp_path_factory, rows: list[tuple[str, ...]], header_ok: bool
) -> None:
    path: Path = tmp_path_factory.getbasetemp() / "fuzz.csv"
    head = "rank,step,step_ms,other" if header_ok else "rank,when,value"
    path.write_text(head + "\n" + "\n".join(",".join(r) for r in rows) + "\n")
    try:
        rank, t, value = (rows := read_series(path, "rank", "step", "step_ms")).rank, rows.t, rows.value
    except CsvError as exc:
        assert str(path) in str(exc)
        return
    assert np.isfinite(t).all() and np.isfinite(value).all() and (rank >= 0).all()
    for found in diagnose_log(rank, t, value, by_time=False, metric="step_ms").anomalies:
        assert math.isfinite(found.score)


def test_memory_stays_flat_under_a_flood_of_garbage() -> None:
    rng = np.random.default_rng(3)
    blobs = [
        bytes([0, 0, 0, 0, int(rng.integers(1, 12))]) + rng.bytes(int(rng.integers(0, 300)))
        for _ in range(2000)
    ]

    def flood() -> None:
        for b in blobs:
            with contextlib.suppress(SchemaError):
                decode(b)

    flood()  # warm caches
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(25):  # 50,000 hostile messages
        flood()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert after - before < 1 << 20, f"grew {after - before} bytes"


def test_absurd_claims_are_rejected() -> None:
    b = step_batch(4)
    cols = dict(b.columns)
    cols["rank"] = np.array([0, 1, 2, 10_000_000])
    far = dict(b.columns)
    far["end_ns"] = far["start_ns"] + 10**9 * 86_400 * 365 * 200  # steps 200 years long
    for columns in (cols, far):
        data = encode(StepBatch(b.job, b.run, b.step, columns), check=False)
        try:
            decode(data)
        except SchemaError as exc:
            assert "rank" in str(exc) or "2100" in str(exc) or "day" in str(exc)
        else:
            raise AssertionError("an absurd record was accepted")
