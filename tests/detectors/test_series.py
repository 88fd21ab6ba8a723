"""Diagnosis from logs: detectors.diagnose_series and the real ``argus diagnose`` command."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from argus.cli import app
from argus.detectors import COMPUTE_STRAGGLER, UNKNOWN, diagnose_series


def write_log(path: Path, *, seed: int = 0, value_col: str = "step_ms") -> Path:
    """16 ranks sampled every 8..12 s; rank 15 starts late, rank 3 stops early; rank 7 is
    50 % slower between t=80 and t=120; the whole job slows between t=150 and t=175."""
    rng = np.random.default_rng(seed)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["ts", "rank", "host", value_col, "step"])
        for r in range(16):
            t = float(rng.uniform(0, 5)) + (30 if r == 15 else 0)
            end = 200 - (40 if r == 3 else 0)
            k = 0
            while t < end:
                v = 100 * (1 + 0.02 * rng.standard_normal())
                if r == 7 and 80 <= t < 120:
                    v *= 1.5
                if 150 <= t < 175:
                    v *= 1.3
                w.writerow([f"{t:.3f}", r, f"node-{r // 8}", f"{v:.3f}", k])
                t += float(rng.uniform(8, 12))
                k += 1
    return path


def test_series_finds_the_rank_window_and_the_job_window() -> None:
    rows = list(csv.DictReader(write_log(_tmp()).open()))
    rank = np.array([int(r["rank"]) for r in rows])
    t = np.array([float(r["ts"]) for r in rows])
    v = np.array([float(r["step_ms"]) for r in rows])
    found = diagnose_series(rank, t, v, by_time=True, metric="forward_ms")
    ranks = [a for a in found if a.rank is not None]
    assert [a.rank for a in ranks] == [7]
    assert 70 <= ranks[0].start <= 90 and 100 <= ranks[0].end <= 125 and ranks[0].cause == COMPUTE_STRAGGLER
    job = [a for a in found if a.rank is None]
    assert len(job) == 1 and 140 <= job[0].start <= 160 and job[0].cause == UNKNOWN


def _tmp() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp()) / "log.csv"


def test_throughput_direction() -> None:
    rank = np.repeat(np.arange(8), 20)
    step = np.tile(np.arange(20), 8)
    v = 1000.0 + np.random.default_rng(1).normal(0, 5, 160)
    v[(rank == 2) & (step >= 10)] = 600.0
    found = diagnose_series(rank, step, v, by_time=False, higher_is_better=True)
    assert [(a.rank, a.start, a.end) for a in found] == [(2, 10.0, 19.0)]
    assert diagnose_series(rank, step, v, by_time=False) == []


def test_cli_json_and_table(tmp_path: Path) -> None:
    log = write_log(tmp_path / "steps.csv")
    runner = CliRunner()
    res = runner.invoke(
        app,
        [
            "diagnose",
            "--steps-csv",
            str(log),
            "--rank-col",
            "rank",
            "--time-col",
            "ts",
            "--value-col",
            "step_ms",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"rank", "start", "end", "class", "score"} <= set(out[0])
    assert [o["rank"] for o in out if o["rank"] is not None] == [7]
    res = runner.invoke(
        app, ["diagnose", "--steps-csv", str(log), "--step-col", "step", "--value-col", "step_ms"]
    )
    assert res.exit_code == 0 and "7" in res.stdout and "anomal" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--time-col", "nope", "--value-col", "step_ms"], "missing column"),
        (["--value-col", "step_ms"], "exactly one of"),
        (["--time-col", "ts", "--value-col", "host"], "not a number"),
    ],
)
def test_cli_bad_input_is_one_clean_line(tmp_path: Path, args: list[str], message: str) -> None:
    log = write_log(tmp_path / "steps.csv")
    res = CliRunner().invoke(app, ["diagnose", "--steps-csv", str(log), *args])
    text = " ".join(res.output.split())  # rich wraps long lines
    assert res.exit_code == 2 and message in text and "Traceback" not in text


def test_cli_missing_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["diagnose", "--steps-csv", str(tmp_path / "no.csv"), "--step-col", "s", "--value-col", "v"]
    )
    assert res.exit_code == 2 and "cannot read" in res.output
