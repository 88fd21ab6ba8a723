"""The two halves of the diagnosis, as the stream workers run them, equal the one-call facade."""

from __future__ import annotations

import dataclasses
import json

import pytest

from argus.detectors import (
    DiagnoserConfig,
    JobDiagnoser,
    JobState,
    StepFindings,
    apply_findings,
    check_shape,
    step_findings,
)
from argus.producers.simulator import COMPUTE_STRAGGLER, DATALOADER_STALL, ClusterSimulator, Fault, Layout
from argus.schemas import ValidationError, decode, encode


def test_split_stages_through_the_codec_match_the_facade() -> None:
    faults = [
        Fault(COMPUTE_STRAGGLER, first_step=12, steps=10, ranks=(37,)),
        Fault(DATALOADER_STALL, first_step=30, steps=1, ranks=(5,)),
    ]
    cfg = DiagnoserConfig()
    facade = JobDiagnoser("split", 0, cfg)
    state = JobState.new("split", 0, cfg)
    ids_facade, ids_split = [], []
    for s in ClusterSimulator(Layout(dp=8, tp=8, pp=2), seed=5, job="split", faults=faults).run(45):
        ids_facade += [(a.id, a.end_step) for a in facade.step(s.batch).anomalies]
        sf = decode(encode(step_findings(s.batch, cfg, missing=(3,))), expect=StepFindings)
        check_shape(sf)
        assert sf.summary.missing == (3,)
        state = JobState.from_dict(json.loads(json.dumps(state.to_dict())))  # as a changelog would
        ids_split += [(a.id, a.end_step) for a in apply_findings(state, sf, cfg).anomalies]
    assert ids_split == ids_facade
    assert len({i for i, _ in ids_split}) == 2


def test_a_residual_phase_these_detectors_do_not_have_is_refused() -> None:
    """Another build (or a hostile producer) may send phases past these detectors' own-work
    phases: refused before the temporal stage indexes them."""
    sf = next(
        step_findings(s.batch, DiagnoserConfig(change_points=True))
        for s in ClusterSimulator(Layout(dp=2, tp=2, pp=1), seed=1, job="p").run(1)
    )
    assert sf.residuals is not None
    bad = dataclasses.replace(sf, residuals=dataclasses.replace(sf.residuals, phase=sf.residuals.phase + 100))
    with pytest.raises(ValidationError, match="own-work phases"):
        check_shape(bad)
