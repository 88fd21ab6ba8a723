"""The temporal stage's persisted job state survives an upgrade (issue 34, item 13): what
one build wrote to the job-state table, the next restores, whatever fields were added or
removed between them, and the diagnosis goes on as if nothing happened."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from argus.detectors import DiagnoserConfig, JobState, apply_findings, step_findings
from argus.detectors.facade import STATE_VERSION
from argus.producers.simulator import ClusterSimulator
from argus.simulate import layout_for, parse_fault

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
