"""`argus fleet` (real processes, a real chDB store): the bad host of a small fleet named with
its evidence, TSV when piped, JSON on request, the lost GPU-hours by day and cause, and bad
arguments refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

ARGUS = [sys.executable, "-m", "argus.cli"]
T0 = 1_950_000_000 * 10**9 - (1_950_000_000 * 10**9) % (86_400 * 10**9)  # a day's start in 2031

_FILL = """
import json, sys
from argus.sinks import ChdbStore, migrate
from tests.helpers.fleet import small_fleet

s = ChdbStore(sys.argv[1])
migrate(s)
f = small_fleet(s, "cli", int(sys.argv[2]), n_hosts=60, n_jobs=40, bad_jobs=8)
print(json.dumps({"bad": f.bad, "ids": f.bad_ids, "unlucky": f.unlucky, "end": f.end_ns, "jobs": f.jobs,
                  "hosted": sum(1 for e in f.exposure_s.values() if e > 0)}))
s.close()
"""


def run(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ARGUS_HOME": str(home)}
    env.pop("COLUMNS", None)
    return subprocess.run([*ARGUS, *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    home = tmp_path_factory.mktemp("fleet")
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _FILL, str(home / "clickhouse"), str(T0)],
        capture_output=True, text=True, timeout=300, cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return home, json.loads(out.stdout.strip().splitlines()[-1])


def _window(info: dict[str, object]) -> list[str]:
    until = datetime.fromtimestamp(int(info["end"]) / 1e9, UTC)  # type: ignore[call-overload]
    return ["--since", datetime.fromtimestamp(T0 / 1e9, UTC).isoformat(), "--until", until.isoformat()]


def test_piped_it_names_the_bad_host_alone_as_tsv_with_its_evidence(
    fleet: tuple[Path, dict[str, object]],
) -> None:
    home, info = fleet
    out = run(["fleet", *_window(info)], home)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    names = header.split("\t")
    assert names[:4] == ["host", "confidence", "rate_x_fleet_min", "jobs"]
    assert len(rows) == 1  # the unlucky host and its link peer are not named
    row = dict(zip(names, rows[0].split("\t"), strict=True))
    assert row["host"] == info["bad"]
    assert int(row["jobs"]) == 7 and float(row["confidence"]) > 0.999
    assert float(row["rate_x_fleet_min"]) >= 2.0
    assert "compute_straggler" in row["causes"] and f"GPU-{info['bad']}-3" in row["gpus"]
    assert int(row["xid_samples"]) == 1 and int(row["throttled_samples"]) == 2


def test_json_holds_suspects_ids_and_lost_gpu_hours_by_day(fleet: tuple[Path, dict[str, object]]) -> None:
    home, info = fleet
    out = run(["fleet", "-f", "json", *_window(info)], home)
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    (node,) = view["suspects"]
    assert node["host"] == info["bad"]
    assert sorted(node["anomaly_ids"]) == sorted(info["ids"])  # type: ignore[arg-type]
    assert node["jobs_list"] == info["jobs"][:7]  # type: ignore[index]
    assert node["causes"] == {"compute_straggler": 7}
    lost = {x["cause"]: x["anomalies"] for x in view["lost_by_day"]}
    assert lost == {
        "compute_straggler": 7,
        "link_degradation": 1,
        "pipeline_stage_imbalance": 1,
        "gc_pause": 1,
    }
    assert view["fleet_rate_per_gpu_hour"] > 0 and view["nodes"] == info["hosted"]


def test_cause_filters_both_the_suspects_and_the_lost_hours(fleet: tuple[Path, dict[str, object]]) -> None:
    home, info = fleet
    out = run(["fleet", "-f", "json", "--cause", "link_degradation", *_window(info)], home)
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["suspects"] == [] and view["cause"] == "link_degradation"
    assert [x["cause"] for x in view["lost_by_day"]] == ["link_degradation"]
    lost = run(["fleet", "--lost", *_window(info)], home)
    assert lost.stdout.splitlines()[0] == "day\tcause\tanomalies\tgpu_hours_lost"
    assert len(lost.stdout.splitlines()) == 5


def test_the_terminal_table_reads_with_the_host_and_its_window(fleet: tuple[Path, dict[str, object]]) -> None:
    home, info = fleet
    out = run(["fleet", "-f", "table", *_window(info)], home)
    assert out.returncode == 0, out.stderr
    assert "suspect nodes" in out.stdout and str(info["bad"]) in out.stdout
    assert f"{info['hosted']} nodes" in out.stdout and "GPU-hours lost" in out.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cause", "pipeline_stage_imbalance"], "never implicates a node"),
        (["--since", "yesterday"], "--since wants a span"),
        (["--since", "0d"], "positive span"),
        (["--since", "2031-01-02", "--until", "2031-01-01"], "must be before"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    out = run(["fleet", *args], tmp_path)
    assert out.returncode == 2
    assert says in out.stderr and "Traceback" not in out.stderr


def test_record_stores_the_suspects_for_the_dashboard_and_the_alert(
    fleet: tuple[Path, dict[str, object]],
) -> None:
    home, info = fleet
    out = run(["fleet", "--record", *_window(info)], home)
    assert out.returncode == 0, out.stderr
    stored = run(
        [
            "sql",
            "SELECT host, jobs, causes['compute_straggler'], length(anomaly_ids), time FROM node_suspects",
        ],
        home,
    )
    assert stored.returncode == 0, stored.stderr
    (row,) = [r.split("\t") for r in stored.stdout.splitlines()[1:]]
    until = datetime.fromtimestamp(int(info["end"]) / 1e9, UTC)  # type: ignore[call-overload]
    assert row == [str(info["bad"]), "7", "7", "7", f"{until:%Y-%m-%d %H:%M:%S}"]
    refused = run(["fleet", "--record", "--cause", "link_degradation", *_window(info)], home)
    assert refused.returncode == 2 and "drop --cause" in refused.stderr
