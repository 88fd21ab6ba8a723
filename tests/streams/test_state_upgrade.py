"""The temporal stage's persisted job state survives an upgrade (issue 34, item 13): what
one build wrote to the job-state table, the next restores, whatever fields were added or
removed between them, and the diagnosis goes on as if nothing happened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from argus.detectors import DiagnoserConfig, JobState, apply_findings, diagnose, step_findings
from argus.detectors.facade import STATE_VERSION
from argus.kafka_admin import end_offsets, read_records
from argus.producers.publisher import Publisher
from argus.producers.simulator import ClusterSimulator
from argus.schemas import ANOMALIES, STEP_SUMMARIES
from argus.simulate import layout_for, parse_fault, publish_simulation
from tests.figures import report
from tests.workers import fresh_group

REPO = Path(__file__).resolve().parents[2]

FAULTS = ["compute_straggler@12+20:40", "dataloader_stall@45:9", "compute_straggler@50+15:17"]


def _diagnosed(restore_at: int, rewrite: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, tuple]:
    """Anomalies (latest version per id) of a 64-rank job of 80 steps whose state goes
    through the table's JSON, rewritten by ``rewrite``, before step ``restore_at``."""
    cfg, layout = DiagnoserConfig(), layout_for(64)
    sim = ClusterSimulator(
        layout, seed=5, job="upgrade", faults=[parse_fault(f, layout) for f in FAULTS], checkpoint_every=0
    )
    state = JobState.new("upgrade", 0, cfg)
    found: dict[str, tuple] = {}
    for s in sim.run(80):
        if s.batch.step == restore_at:
            state = JobState.from_dict(json.loads(json.dumps(rewrite(state.to_dict()))))
        for a in apply_findings(state, step_findings(s.batch, cfg), cfg).anomalies:
            found[a.id] = (a.cause, a.suspect, a.start_step, a.end_step, round(a.gpu_hours_lost, 9))
    return found


def _previous_build(doc: dict[str, Any]) -> dict[str, Any]:
    """The state as a build before this one wrote it: unstamped, with a field since removed
    (``legacy_weight``, ignored now) and without one since added (``detail``, default)."""
    doc = dict(doc)
    assert doc.pop("version") == STATE_VERSION
    doc["legacy_weight"] = 0.5
    for table in ("episodes", "closed"):
        doc[table] = {
            k: {**{f: v for f, v in e.items() if f != "detail"}, "legacy_weight": 0.5}
            for k, e in doc[table].items()
        }
    return doc


def test_state_written_by_the_previous_build_is_restored_and_the_diagnosis_is_the_same() -> None:
    """Before: ``Episode(**v)`` raised on the field it did not know, so a rolling upgrade
    lost every open episode of every job (the worker could not read its own table)."""
    uninterrupted = _diagnosed(-1, lambda d: d)
    assert len(uninterrupted) >= 3
    for at in (20, 30, 55):  # with open episodes, between them, during the second straggler
        assert _diagnosed(at, _previous_build) == uninterrupted, at


def test_a_required_field_the_state_lacks_starts_blank_instead_of_raising() -> None:
    cfg = DiagnoserConfig()
    state = JobState.new("blank", 0, cfg)
    layout = layout_for(64)
    sim = ClusterSimulator(
        layout, seed=5, job="blank", faults=[parse_fault(FAULTS[0], layout)], checkpoint_every=0
    )
    for s in sim.run(25):
        apply_findings(state, step_findings(s.batch, cfg), cfg)
    doc = state.to_dict()
    assert doc["episodes"], "an open episode to restore"
    for e in doc["episodes"].values():
        del e["decided_by"]  # renamed or dropped by some other build
    del doc["iteration"]["ckpt_ref_ms"]
    restored = JobState.from_dict(doc)
    assert all(e.decided_by == "" for e in restored.episodes.values())
    assert set(restored.episodes) == set(state.episodes) and restored.last_step == state.last_step


PREVIOUS = os.environ.get("ARGUS_TEST_PREVIOUS_COMMIT", "2a04096^")
"""The build whose job state the upgraded worker restores: by default the last commit before
the state was versioned (it wrote unstamped state and read it with ``Episode(**v)``)."""


@pytest.mark.kafka
@pytest.mark.slow
def test_an_upgrade_mid_job_finishes_it_with_the_same_anomalies(
    kafka_conf, worker_factory, tmp_path, unique
) -> None:
    """A worker of the previous build diagnoses the first half of a job and stops (a rolling
    upgrade); a worker of this build takes over the same group, restores the job's state
    from the changelog and finishes the job: the anomalies are those of the job diagnosed
    offline in one go, and every step is summarized once."""
    old = tmp_path / "previous"
    old.mkdir()
    archive = subprocess.run(
        ["git", "archive", PREVIOUS, "argus", "detectors", "producers", "schemas", "streams", "sinks"],
        cwd=REPO,
        capture_output=True,
    )
    if archive.returncode != 0:
        pytest.skip(f"no previous build to upgrade from ({PREVIOUS}): {archive.stderr.decode()[:200]}")
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    job, steps, half = f"upgrade-{unique}", 80, 40
    app = fresh_group(kafka_conf, f"u-{unique}")
    layout = layout_for(256)
    sim = ClusterSimulator(
        layout, seed=7, job=job, faults=[parse_fault(f, layout) for f in FAULTS], checkpoint_every=0
    )
    expected = {a.id: a for a in diagnose(s.batch for s in sim.run(steps))}
    assert len(expected) >= 3
    start = end_offsets(kafka_conf, [STEP_SUMMARIES, ANOMALIES])
    log = open(tmp_path / "previous.log", "w")  # noqa: SIM115 (closed below)
    previous = subprocess.Popen(  # the previous build's worker, run from its own tree
        [sys.executable, "-m", "argus.cli", "worker", "--app-id", app, "--loglevel", "info"],
        cwd=old,
        env={
            **os.environ,
            "PYTHONPATH": str(old),
            "ARGUS_HOME": str(tmp_path / "home-previous"),
            "ARGUS_KAFKA_BOOTSTRAP": kafka_conf["bootstrap.servers"],
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        publisher = Publisher(kafka_conf)
        sent: list[Any] = []
        publish_simulation(
            lambda topic, key, rec: sent.append((topic, key, rec)),
            job=job,
            layout=layout,
            steps=steps,
            faults=[parse_fault(f, layout) for f in FAULTS],
            seed=7,
        )
        first = [x for x in sent if getattr(x[2], "step", steps) < half]
        for topic, key, rec in first:
            publisher.publish(topic, key, rec)
        assert publisher.flush(30) == 0
        counts = _read(kafka_conf, start, job, lambda s, a: len(s) >= half, timeout=120)[0]
        assert len(counts) == half, sorted(counts)
        time.sleep(2)  # the state of the last step written to the changelog
        previous.terminate()  # SIGTERM: a rolling upgrade's stop
        previous.wait(60)
        assert "Traceback" not in (tmp_path / "previous.log").read_text()
    finally:
        if previous.poll() is None:
            previous.kill()
        log.close()
    upgraded = worker_factory(app, "--loglevel", "info")  # this build, the same group
    for topic, key, rec in sent[len(first) :]:
        publisher.publish(topic, key, rec)
    assert publisher.flush(30) == 0
    counts, found = _read(
        kafka_conf, start, job, lambda s, a: len(s) >= steps and set(a) >= set(expected), timeout=180
    )
    report(
        "upgrade_mid_job",
        sent=len(expected),
        received=len(set(found) & set(expected)),
        lost=len(set(expected) - set(found)),
        duplicated=len(set(found) - set(expected)),
        summaries_missing=steps - len(counts),
    )
    described = sorted((a.cause, a.suspect, a.start_step, a.end_step) for a in found.values())
    assert set(found) == set(expected), (
        described,
        sorted((a.cause, a.suspect, a.start_step) for a in expected.values()),
    )
    assert all(
        (found[i].start_step, found[i].end_step) == (a.start_step, a.end_step) for i, a in expected.items()
    )
    assert set(counts) == set(range(steps)) and all(n == 1 for n in counts.values()), counts
    upgraded.stop()
    assert f"job {job}: resumed from the table at step" in Path(upgraded.log.name).read_text()


def _read(kafka_conf, start, job: str, until, timeout: float) -> tuple[Counter[int], dict[str, Any]]:
    """Summaries per step and anomalies (latest version per id) of ``job`` read from ``start``."""
    counts: Counter[int] = Counter()
    found: dict[str, Any] = {}

    def take(topic: str, r: Any) -> None:
        if getattr(r, "job", None) != job:
            return
        if topic == ANOMALIES:
            found[r.id] = r
        elif topic == STEP_SUMMARIES:
            counts[r.step] += 1

    read_records(kafka_conf, start, take, until=lambda: until(counts, found), timeout=timeout)
    return counts, found
