"""The Kineto importer on the real traces and on hand-made broken ones."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from argus.producers.kineto import KinetoImport, TraceError, TraceReader, collective_kind, phase_of
from argus.schemas import KernelNames, KernelSketch, StepBatch, encode
from argus.schemas.kernel_codec import decode_payload

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "kineto"  # real traces from HTA's test data (see NOTICE there)


def _import(path: Path, **kw: Any) -> tuple[list[Any], KinetoImport]:
    imp = KinetoImport(path, job=kw.pop("job", "test"), **kw)
    return list(imp.records()), imp


def _decode_chain(records: list[Any]) -> dict[int, Any]:
    out, prev = {}, None
    for r in records:
        if isinstance(r, KernelSketch):
            prev = decode_payload(r.payload, prev if r.base_step >= 0 else None)
            out[r.step] = prev
    return out


# --------------------------------------------------------------------------- real traces


def test_nccl_trace_steps_phases_collectives_and_time_base() -> None:
    path = DATA / "distributed_single_ranks" / "nccl_data.json.gz"
    records, imp = _import(path)
    for r in records:
        encode(r)  # every record passes the contract's validation
    batches = [r for r in records if isinstance(r, StepBatch)]
    assert [b.step for b in batches] == [4, 5, 6]
    assert imp.summary.rank == 0 and imp.summary.time_base == "baseTimeNanoseconds"
    b = batches[0]
    assert b["start_ns"][0] == 1711964646000000000 + round(4458676416788.066 * 1e3)
    assert 200 < b.step_ms[0] < 250
    # GPU compute of the phases (CPU-bound job: its CPU spans are ~100 ms each)
    assert imp.summary.gpu_phases == ("forward_ms", "backward_ms", "optimizer_ms")
    assert 10 < b["forward_ms"][0] < 15 and 20 < b["backward_ms"][0] < 30 and b["all_reduce_ms"][0] > 1
    names = [n for r in records if isinstance(r, KernelNames) for n in r.names]
    assert any(n.startswith("ncclKernel_AllReduce") and "[allreduce in=" in n for n in names)
    sketches = _decode_chain(records)
    assert sorted(sketches) == [4, 5, 6]
    total_calls = sum(int(s.count.sum()) for s in sketches.values())
    assert total_calls + imp.summary.kernels_outside_steps == imp.summary.kernels == 2700


def test_kernel_counts_per_step_match_a_reference_split() -> None:
    path = DATA / "distributed_single_ranks" / "rank0.json.gz"
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    runtime = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "cuda_runtime"}
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name", "").startswith("ProfilerStep#")
    )
    starts = np.array([s for s, _ in steps])
    kernels = [e for e in events if e.get("cat") == "kernel"]
    launch = np.array([runtime.get(e["args"]["correlation"], e["ts"]) for e in kernels])
    idx = np.searchsorted(starts, launch, side="right") - 1
    idx[(idx == len(steps) - 1) & (launch > steps[-1][1])] = -1
    records, imp = _import(path)
    sketches = _decode_chain(records)
    got = [int(sketches[s].count.sum()) for s in sorted(sketches)]
    assert got == [int(np.sum(idx == i)) for i in range(len(steps))]
    assert imp.summary.rank == 0 and imp.summary.time_base == "epoch ts"


def test_sampled_traces_take_rank_from_distributed_info_or_override() -> None:
    path = DATA / "trace_filter_2rank" / "sampled_rank-1.json.gz"
    records, imp = _import(path)
    assert imp.summary.rank == 1 and {r.rank for r in records if isinstance(r, KernelSketch)} == {1}
    records, imp = _import(path, rank=7)
    assert {int(r["rank"][0]) for r in records if isinstance(r, StepBatch)} == {7}


def test_two_rank_trace_shows_rank_1_computing_more_and_rank_0_waiting_more() -> None:
    """HTA's get_potential_stragglers names rank 1 on this trace (the masked straggler)."""
    per_rank = {}
    for r in (0, 1):
        records, _ = _import(DATA / "trace_filter_2rank" / f"sampled_rank-{r}.json.gz")
        batches = [b for b in records if isinstance(b, StepBatch)]
        assert [b.step for b in batches] == [551, 552]
        per_rank[r] = {
            "compute": [
                float(b["forward_ms"][0] + b["backward_ms"][0] + b["optimizer_ms"][0]) for b in batches
            ],
            "nccl": sum(float(b["p2p_ms"][0]) for b in batches),
            "step": [float(b.step_ms[0]) for b in batches],
        }
    for s in (0, 1):
        assert per_rank[1]["compute"][s] - per_rank[0]["compute"][s] > 25  # ~29 and ~32 ms
        assert abs(per_rank[1]["step"][s] - per_rank[0]["step"][s]) < 10  # equal step times: masked
    assert per_rank[0]["nccl"] - per_rank[1]["nccl"] > 15  # rank 0 waits 17 ms more over the two steps


def test_compute_phases_without_kernels_keep_their_cpu_span(tmp_path: Path) -> None:
    trace = _trace(steps=2)
    steps = [e for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")]
    for st in steps:  # an optimizer span after the last launch: no kernel runs in it
        trace["traceEvents"].append(
            _event("X", "user_annotation", "Optimizer.step#SGD.step", st["ts"] + 8_500, 400)
        )
    records, imp = _import(_write(tmp_path / "t.json", trace))
    assert imp.summary.gpu_phases == ("forward_ms",)
    assert all(abs(b["optimizer_ms"][0] - 0.4) < 1e-9 for b in records if isinstance(b, StepBatch))


# --------------------------------------------------------------------------- hand-made traces


def _event(ph: str, cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": ph, "cat": cat, "name": name, "pid": 0, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _trace(
    steps: int = 3, kernels_per_step: int = 20, base_us: float | None = None, **top: Any
) -> dict[str, Any]:
    t0 = base_us if base_us is not None else time.time() * 1e6 - 10e6
    ev: list[dict[str, Any]] = []
    corr = 0
    for s in range(steps):
        start = t0 + s * 10_000
        ev.append(_event("X", "user_annotation", f"ProfilerStep#{s}", start, 9_000))
        ev.append(_event("X", "user_annotation", "## forward ##", start + 100, 3_000))
        for k in range(kernels_per_step):
            corr += 1
            ts = start + 200 + k * (8_000 / kernels_per_step)
            ev.append(_event("X", "cuda_runtime", "cudaLaunchKernel", ts, 5, correlation=corr))
            name = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)" if k % 5 == 0 else "gemm}, {weird"
            ev.append(_event("X", "kernel", name, ts + 50, 100 + k, stream=7, correlation=corr))
        ev.append({"ph": "s", "id": corr, "cat": "ac2g", "name": "ac2g", "ts": start})
        ev.append(_event("X", "mystery_kind", "who knows", start, 1))
    out: dict[str, Any] = {"schemaVersion": 1, "distributedInfo": {"rank": 2}, "traceEvents": ev}
    out.update(top)
    return out


def _write(path: Path, obj: Any, *, gz: bool = False, indent: int | None = None) -> Path:
    text = json.dumps(obj, indent=indent)
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_hand_made_trace_with_odd_names_and_unknown_kinds(tmp_path: Path, gz: bool) -> None:
    path = _write(tmp_path / ("t.json.gz" if gz else "t.json"), _trace(), gz=gz, indent=2)
    records, imp = _import(path)
    batches = [r for r in records if isinstance(r, StepBatch)]
    assert [b.step for b in batches] == [0, 1, 2]
    assert imp.summary.time_base == "epoch ts"
    # the GPU compute launched in ## forward ## (kernels 1-4, 6, 7; 0 and 5 are NCCL), not its 3 ms CPU span
    gpu_forward = sum(100 + k for k in (1, 2, 3, 4, 6, 7)) / 1e3
    assert all(abs(b["forward_ms"][0] - gpu_forward) < 1e-9 for b in batches)
    assert all(
        abs(b["all_gather_ms"][0] - sum(100 + k for k in range(0, 20, 5)) / 1e3) < 1e-9 for b in batches
    )
    sketches = _decode_chain(records)
    assert all(int(s.count.sum()) == 20 for s in sketches.values())
    names = {n for r in records if isinstance(r, KernelNames) for n in r.names}
    assert names == {"ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", "gemm}, {weird"}


def test_kernels_written_out_of_time_order_land_in_their_launch_step(tmp_path: Path) -> None:
    trace = _trace(steps=4, kernels_per_step=50)
    ev = trace["traceEvents"]
    kernels = [e for e in ev if e["cat"] == "kernel"]
    others = [e for e in ev if e["cat"] != "kernel"]
    trace["traceEvents"] = others + kernels[100:] + kernels[:100]  # steps 0-1 after steps 2-3
    records, imp = _import(_write(tmp_path / "shuffled.json", trace))
    assert imp.summary.kernels_outside_steps == 0
    assert [int(s.count.sum()) for s in _decode_chain(records).values()] == [50, 50, 50, 50]


def test_relative_timestamps_use_base_time_at_the_end(tmp_path: Path) -> None:
    base = 1_700_000_000_000_000_000
    path = _write(tmp_path / "rel.json", _trace(base_us=5_000.0, baseTimeNanoseconds=base))
    records, imp = _import(path)
    first = next(r for r in records if isinstance(r, StepBatch))
    assert first["start_ns"][0] == base + 5_000_000 and imp.summary.time_base == "baseTimeNanoseconds"


def test_bare_array_form(tmp_path: Path) -> None:
    trace = _trace()
    path = _write(tmp_path / "bare.json", trace["traceEvents"])
    records, _ = _import(path, rank=0)
    assert sum(isinstance(r, StepBatch) for r in records) == 3


def _broken(tmp_path: Path) -> dict[str, Path]:
    good = json.dumps(_trace())
    cases = {
        "empty": b"",
        "not_json": b"hello, world",
        "no_events": b'{"schemaVersion": 1}',
        "truncated": good[: len(good) // 2].encode(),
        "garbage_inside": (good[: len(good) // 2] + "{{{]]]" + good[len(good) // 2 :]).encode(),
        "no_steps": json.dumps({"traceEvents": [_event("X", "kernel", "k", 1.0, 1.0)]}).encode(),
        "no_rank": json.dumps({"traceEvents": _trace()["traceEvents"]}).encode(),
        "wrong_types": json.dumps({"traceEvents": [{"ph": 1, "ts": "x"}, 3, "s"]}).encode(),
    }
    out = {name: tmp_path / f"{name}.json" for name in cases}
    for name, data in cases.items():
        out[name].write_bytes(data)
    gz = gzip.compress(good.encode())
    out["truncated_gz"] = tmp_path / "t.json.gz"
    out["truncated_gz"].write_bytes(gz[: len(gz) // 2])
    out["missing"] = tmp_path / "nope.json"
    return out


def test_broken_traces_raise_trace_error_naming_the_file(tmp_path: Path) -> None:
    for name, path in _broken(tmp_path).items():
        with pytest.raises(TraceError) as info:
            _import(path)
        assert str(path) in str(info.value), name


_DEEP = 50_000  # far past Python's recursion limit


@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [' + "[" * _DEEP + "]" * _DEEP + "]}",  # an event
        '{"a": ' + "[" * _DEEP + "]" * _DEEP + ', "traceEvents": []}',  # a key before the events
        '{"traceEvents": [{"ph": "X"}], "z": ' + "[" * _DEEP + "]" * _DEEP + "}",  # a key after them
        '{"traceEvents": [{"ph": "X", "args": ' + '{"a": ' * _DEEP + "1" + "}" * _DEEP + "}]}",  # args
        "[" + "[" * _DEEP + "]" * _DEEP + "]",  # the bare-array form
    ],
    ids=["event", "head", "tail", "args", "bare"],
)
def test_deeply_nested_json_is_a_trace_error_not_a_recursion_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(TraceError, match="nested too deeply") as info:
        _import(path, rank=0)
    assert str(path) in str(info.value)


def test_reader_keeps_top_level_keys_around_the_events(tmp_path: Path) -> None:
    path = _write(tmp_path / "meta.json", _trace(traceName="x", baseTimeNanoseconds=5), indent=1)
    reader = TraceReader(path)
    n = sum(1 for _ in reader.events())
    assert n == len(_trace()["traceEvents"])
    assert reader.meta["distributedInfo"] == {"rank": 2} and reader.meta["baseTimeNanoseconds"] == 5


def test_collective_kinds_and_phases() -> None:
    assert collective_kind("ncclDevKernel_AllGather_RING_LL(x)") == "all_gather_ms"
    assert collective_kind("ncclKernel_AllReduce_RING_LL_Sum_float(x)") == "all_reduce_ms"
    assert collective_kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(x)") == "reduce_scatter_ms"
    assert collective_kind("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(x)") == "p2p_ms"
    assert collective_kind("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(x)", "all_to_all") == "all_to_all_ms"
    assert collective_kind("ncclDevKernel_Broadcast_RING_LL(x)") == "broadcast_ms"
    assert collective_kind("void gemm<float>(x)") == ""
    assert phase_of("## forward ##") == "forward_ms" and phase_of("## backward ##") == "backward_ms"
    assert phase_of("Optimizer.step#SGD.step") == "optimizer_ms"
    assert phase_of("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__") == "dataloader_ms"


# --------------------------------------------------------------------------- the command


def _cli(args: list[str], data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ARGUS_HOME=str(data_dir), COLUMNS="300")
    code = "from argus.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_imports_locally_and_fails_cleanly(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.json", _trace())
    trace_b = _trace()
    trace_b["distributedInfo"] = {"rank": 3}
    b = _write(tmp_path / "b.json.gz", trace_b, gz=True)
    store = tmp_path / "store"
    done = _cli(["import-trace", "--local", "--job", "cli-test", str(a), str(b)], store)
    assert done.returncode == 0, done.stderr
    assert "6 rank-steps" in done.stdout
    q = _cli(
        [
            "sql",
            "-f",
            "json",
            "SELECT (SELECT count() FROM steps WHERE job = 'cli-test') AS s, "
            "(SELECT count() FROM kernel_sketches WHERE job = 'cli-test') AS k, "
            "(SELECT count() FROM kernel_names WHERE job = 'cli-test') AS n",
        ],
        store,
    )
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout) == [{"s": 6, "k": 6, "n": 4}]
    broken = _broken(tmp_path)["truncated"]
    bad = _cli(["import-trace", "--local", str(broken)], store)
    assert bad.returncode == 2
    assert str(broken) in bad.stderr.replace("\n", "") and "Traceback" not in bad.stderr
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": [' + "[" * _DEEP + "]" * _DEEP + "]}")
    bad = _cli(["import-trace", "--local", "--rank", "0", str(deep)], store)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "nested too deeply" in bad.stderr.replace("\n", " ")
