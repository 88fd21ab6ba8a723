"""``argus import-trace --local`` diagnoses what it imports: the anomalies land in the store
and ``argus report`` shows them (one engine, three entry points)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TWO_RANK = REPO / "tests" / "data" / "kineto" / "trace_filter_2rank"


def _cli(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ARGUS_HOME=str(home), COLUMNS="300")
    return subprocess.run(
        [sys.executable, "-c", "from argus.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=home.parent,
    )


def _anomalies(home: Path, job: str) -> list[dict[str, Any]]:
    q = _cli(
        [
            "sql",
            "-f",
            "json",
            "SELECT cause, suspect_kind, suspect, ranks, start_step, end_step, severity, evidence "
            f"FROM anomalies FINAL WHERE job = '{job}' ORDER BY start_step",
        ],
        home,
    )
    assert q.returncode == 0, q.stderr
    return list(json.loads(q.stdout))


def _ev(ph: str, cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": ph, "cat": cat, "name": name, "pid": 0, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _rank_trace(rank: int, *, steps: int, slow_rank: int, slow_from: int, t0: float) -> dict[str, Any]:
    """A synchronous data-parallel rank: 100 ms steps; forward launches 10 GPU kernels of
    2 ms (4 ms on ``slow_rank`` from step ``slow_from``), backward one all-reduce that
    waits for the slowest rank, so every rank's step takes as long."""
    ev: list[dict[str, Any]] = []
    corr = 0
    for s in range(steps):
        start = t0 + s * 100_000
        slow = rank == slow_rank and s >= slow_from
        ev.append(_ev("X", "user_annotation", f"ProfilerStep#{s}", start, 95_000))
        ev.append(_ev("X", "user_annotation", "## forward ##", start, 45_000))
        ev.append(_ev("X", "user_annotation", "## backward ##", start + 45_000, 45_000))
        gpu = start + 10
        for k in range(10):
            corr += 1
            ev.append(_ev("X", "cuda_runtime", "cudaLaunchKernel", start + k * 100, 5, correlation=corr))
            dur = 4_000 if slow else 2_000
            ev.append(_ev("X", "kernel", "void gemm_kernel<float>()", gpu, dur, stream=7, correlation=corr))
            gpu += dur
        corr += 1
        ev.append(_ev("X", "cuda_runtime", "cudaLaunchKernel", start + 45_100, 5, correlation=corr))
        wait = 10_000 if slow else (30_000 if s >= slow_from else 10_000)
        name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"
        ev.append(_ev("X", "kernel", name, start + 45_200, wait + 5_000, stream=20, correlation=corr))
    return {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 8}, "traceEvents": ev}


def test_import_local_stores_the_engines_anomalies_and_report_shows_them(tmp_path: Path) -> None:
    folder = tmp_path / "job-slow-gpu"
    folder.mkdir()
    t0 = (time.time() - 3_600) * 1e6  # an hour ago: inside any retention
    files = []
    for r in range(8):
        path = folder / f"rank-{r}.json"
        path.write_text(json.dumps(_rank_trace(r, steps=40, slow_rank=3, slow_from=20, t0=t0)))
        files.append(str(path))
    home = tmp_path / "home"
    done = _cli(["import-trace", "--local", "--job", "slow-gpu", *files], home)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "320 rank-steps" in out and "diagnosis:" in out, out
    found = _anomalies(home, "slow-gpu")
    assert found, out
    assert any(3 in a["ranks"] for a in found), found
    for a in found:  # nothing but rank 3 is named
        assert a["ranks"] == [3], found
        assert a["cause"] in ("compute_straggler", "masked_compute_straggler"), found
    report = _cli(["report", "--job", "slow-gpu", "-o", str(tmp_path / "r.html")], home)
    assert report.returncode == 0, report.stderr
    assert f"{len(found)} anomal{'y' if len(found) == 1 else 'ies'};" in report.stdout, report.stdout


def test_import_to_kafka_says_who_diagnoses(tmp_path: Path, kafka_conf: dict[str, Any]) -> None:
    """Without --local the steps go to argus.steps and the stream worker diagnoses them."""
    files = [str(p) for p in sorted(TWO_RANK.glob("*.json.gz"))]
    done = _cli(["import-trace", "--job", f"kafka-2rank-{os.getpid()}", *files], tmp_path / "home")
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "4 rank-steps" in out and "the stream worker" in out and "argus.steps" in out, out


def test_two_rank_trace_names_rank_1_as_masked_straggler_like_hta(tmp_path: Path) -> None:
    """HTA's get_potential_stragglers names rank 1: it computes ~30 ms more per step and
    rank 0 waits in NCCL meanwhile, so both step times are equal. The trace is from 2023:
    its rows are kept because retention counts from arrival (migration 006)."""
    home = tmp_path / "home"
    files = [str(p) for p in sorted(TWO_RANK.glob("*.json.gz"))]
    done = _cli(["import-trace", "--local", "--job", "two-rank", *files], home)
    assert done.returncode == 0, done.stderr
    found = _anomalies(home, "two-rank")
    named = [a for a in found if a["ranks"] == [1] or a["suspect"] in ("1", "rank 1")]
    assert named, (found, done.stdout)
    assert not [a for a in found if 0 in a["ranks"]], found
    a = named[0]
    assert a["cause"] in ("masked_compute_straggler", "compute_straggler"), a
    evidence = dict(a["evidence"]) if not isinstance(a["evidence"], dict) else a["evidence"]
    assert evidence["compute_ms_excess"] > 25, evidence  # rank 1's GPU computes 29-32 ms more per step
    assert "peers_wait_ms" in evidence, evidence  # what its peer waited meanwhile
    when = _cli(["sql", "-f", "json", "SELECT toYear(time) AS y FROM anomalies WHERE job = 'two-rank'"], home)
    assert json.loads(when.stdout) == [{"y": 2023}]  # stamped with the trace's time, not 1970
    report = _cli(["report", "--job", "two-rank", "-o", str(tmp_path / "r.html")], home)
    assert report.returncode == 0, report.stderr
    assert "1 anomaly;" in report.stdout and "rank 1 (compute_straggler)" in report.stdout, report.stdout
