"""`argus report` on a simulated job stored as the sink stores it (chDB, the dashboards' SQL)."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from argus.sinks.grafana.queries import REPORT
from argus.sinks.report import UnknownJobError, build_report, collect, render
from argus.sinks.report._html import _phase_rows

from ..sinks.test_grafana import STRAGGLER, load_job

ARGUS = [sys.executable, "-m", "argus.cli"]
# The classic hostile id plus a suffix: the session store is shared and others query the bare one.
HOSTILE = f"x'; DROP TABLE steps; -- {os.getpid()}"


class _Page(HTMLParser):
    """Collects visible text, tags and anything that would reach the network."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.tags: list[str] = []
        self.remote: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href") and value and not value.startswith("data:"):
                self.remote.append(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


@pytest.fixture(scope="module")
def slow_job(store: Any) -> tuple[str, str]:
    job = f"rep-slow-{os.getpid()}-{datetime.now(UTC).timestamp():.0f}"
    load_job(store, job, fault=True, start=datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=8))
    return job, build_report(store, job)


def test_report_names_the_suspect_its_class_and_cost(store: Any, slow_job: tuple[str, str]) -> None:
    job, html = slow_job
    data = collect(store, job)
    assert [s.rank for s in data.suspects] == [STRAGGLER]
    top = data.anomalies.dicts()[0]
    assert top["cause"] == "compute_straggler" and top["gpu_hours_lost"] > 0
    text = " ".join(parse(html).text)
    assert f"Rank {STRAGGLER}: compute_straggler" in text
    assert f"{top['gpu_hours_lost']:.3g}" in text and f"{top['step_ms_added']:.4g} ms" in text
    assert "compute_ms_z=" in text  # the evidence
    assert data.slow_ranks.dicts()[0]["rank"] == STRAGGLER
    # the phase chart: the typical rank, the suspect, and only ranks busier than the median
    labels = [label for label, _ in _phase_rows(data)]
    assert labels[1] == f"rank {STRAGGLER} (suspect)", labels
    z = {int(r["rank"]): float(r["z"]) for r in data.slow_ranks.dicts()}
    assert all(z[int(label.split()[1])] > 0 for label in labels[2:]), (labels, z)


def test_report_has_every_plot_and_no_network(slow_job: tuple[str, str]) -> None:
    _, html = slow_job
    page = parse(html)
    assert page.remote == [] and "script" not in page.tags
    assert html.count("<svg") >= 6  # step time, heatmap, phases, cost, kernel shift, flame graph
    assert html.count("data:image/png;base64,") >= 2  # heatmap and its colour bar
    assert "kernel#4" in html and "triton/compiler/compiler.py:compile" in html  # kernels, stacks


def test_heatmap_marks_the_straggler_as_its_brightest_row(store: Any, slow_job: tuple[str, str]) -> None:
    data = collect(store, slow_job[0])
    hm = data.heatmap.dicts()
    late = [r for r in hm if r["step_group"] >= 30]
    by_rank: dict[int, list[float]] = {}
    for r in late:
        by_rank.setdefault(r["rank_group"], []).append(r["busy_ms"])
    assert max(by_rank, key=lambda k: min(by_rank[k])) == STRAGGLER
    assert len({r["rank_group"] for r in hm}) == 64 and len({r["step_group"] for r in hm}) == 60


def test_a_hostile_job_id_round_trips_and_is_escaped(store: Any) -> None:
    load_job(
        store, HOSTILE, fault=True, start=datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=8)
    )
    before = store.query_rows("SELECT count() FROM steps")[0][0]
    html = build_report(store, HOSTILE)
    assert store.query_rows("EXISTS TABLE steps") == [(1,)]
    assert store.query_rows("SELECT count() FROM steps")[0][0] == before
    assert HOSTILE in " ".join(parse(html).text)  # the id as it is, once unescaped
    assert HOSTILE not in html and "x&#x27;; DROP TABLE steps; --" in html
    assert collect(store, HOSTILE).summary["ranks"] == 64


def test_markup_in_data_is_escaped(store: Any, slow_job: tuple[str, str]) -> None:
    data = collect(store, slow_job[0])
    evil = "<img src=x onerror=alert(1)>"
    html = render(type(data)(**{**data.__dict__, "job": evil}))
    assert evil not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_unknown_job_lists_known_jobs(store: Any, slow_job: tuple[str, str]) -> None:
    with pytest.raises(UnknownJobError) as err:
        collect(store, "no-such-job")
    # the most recently active jobs, at most ten (the store is shared with other tests' jobs)
    known = err.value.known
    assert 0 < len(known) <= 10 and "no-such-job" in str(err.value) and known[0] in str(err.value)
    assert slow_job[0] in known or len(known) == 10


def test_report_queries_expand_and_name_their_columns() -> None:
    assert {p.key for p in REPORT} == {
        "busy_by_step",
        "phases_by_rank",
        "suspect_ranks",
        "kernel_shift",
        "flagged_steps",
        "anomaly_windows",
    }
    for p in REPORT:
        assert "${job:percentencode}" in p.sql and "$__timeFilter(" in p.sql


def run(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ARGUS_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([*ARGUS, *args], capture_output=True, text=True, env=env, timeout=120)


def test_cli_writes_a_report_and_fails_cleanly(tmp_path: Path) -> None:
    insert = (
        "INSERT INTO steps (job, run, step, rank, host, time, step_ms, forward_ms) VALUES "
        "('tiny', 0, 1, 0, 'h0', now64(3), 100, 40), ('tiny', 0, 1, 1, 'h0', now64(3), 100, 41)"
    )
    assert run(["sql", "--write", insert], tmp_path).returncode == 0
    out = tmp_path / "tiny.html"
    ok = run(["report", "--job", "tiny", "-o", str(out)], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "wrote" in ok.stdout and "Argus report — job tiny" in out.read_text()
    missing = run(["report", "--job", "nope"], tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    lines = [ln for ln in missing.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and re.search(r"no job 'nope'.*known jobs: 'tiny'", lines[0])
    lock = tmp_path / "clickhouse" / "argus.lock"
    with lock.open("a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked = run(["report", "--job", "tiny", "-o", str(out)], tmp_path)
    assert locked.returncode == 3 and "in use" in locked.stderr


def test_transients_are_sightings_outside_the_ranks_anomalies() -> None:
    from argus.sinks.report._data import Table, transients

    flagged = Table(
        ("rank", "flagged", "steps"), ((3, 5, [10, 11, 12, 40, 41]), (7, 1, [20]), (9, 2, [30, 31]))
    )
    windows = Table(("id", "ranks", "first", "last"), (("a", [3], 10, 12), ("b", [9, 10], 25, 35)))
    assert transients(flagged, windows) == ((3, 2), (7, 1))


def test_report_states_the_jobs_own_time_range_beside_the_queried_one(
    store: Any, slow_job: tuple[str, str]
) -> None:
    job, html = slow_job
    data = collect(store, job)
    assert data.steps_span is not None
    first, last = data.steps_span
    # the queries end when the report was made (rows are stamped on arrival), not later
    assert data.start == first - timedelta(minutes=1) and data.end == max(data.generated, last)
    assert data.end.microsecond == 0  # the queries' time filter reads whole seconds
    # the fixture's job began 8 minutes ago; its steps, not the queries' slack, head the page
    assert first.strftime("%Y-%m-%d %H:%M") in html
    text = " ".join(parse(html).text)
    assert re.search(r"steps from \S+ \S+ to \S+ \S+ UTC \(queried", text), text[:400]
