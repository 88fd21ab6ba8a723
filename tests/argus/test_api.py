"""argus.attach / argus.step / detach and the callbacks' logic."""

from __future__ import annotations

import pytest

import argus
from argus.api import StepCallbacks
from argus.schemas import STEPS
from tests.helpers.sinks import ListSink


def test_step_and_pause_are_noops_until_attached():
    assert argus.api.attached() is None
    with argus.step(), argus.pause("checkpoint"):
        pass


def test_attach_step_detach(tmp_path):
    sink = ListSink()
    agent = argus.attach(
        sink=sink, job="api-test", home=str(tmp_path), rank=1, world=2, stack_hz=20, cupti=False
    )
    try:
        assert argus.attach() is agent  # once per process
        assert (agent.info.job, agent.info.rank, agent.info.world) == ("api-test", 1, 2)
        for _ in range(3):
            with argus.step(samples=4, tokens=64):
                pass
        cb = StepCallbacks()
        cb.batch_begin()
        cb.batch_end(tokens=1)
    finally:
        argus.detach()
    assert argus.api.attached() is None
    steps = [r for t, _k, r in sink.records if t == STEPS]
    assert [b.step for b in steps] == [0, 1, 2, 3]
    assert steps[0].records()[0].tokens == 64 and steps[3].records()[0].tokens == 1


def test_rank_0_says_once_that_it_attached(tmp_path, capsys):
    """One line on stderr from rank 0 (not from every rank), none when quiet."""
    for rank, quiet, lines in ((0, False, 1), (1, False, 0), (0, True, 0)):
        argus.attach(
            sink=ListSink(), job="banner", home=str(tmp_path), rank=rank, world=4, quiet=quiet, cupti=False
        )
        argus.detach()
        err = capsys.readouterr().err.splitlines()
        said = [line for line in err if line.startswith("argus: attached")]
        assert len(said) == lines, (rank, quiet, err)
        if said:
            assert "job 'banner' run" in said[0] and "(4 rank(s))" in said[0]
            assert "to ListSink" in said[0] and "ARGUS_QUIET=1" in said[0]


def test_bad_settings_raise_value_error():
    with pytest.raises(ValueError, match=r"unknown argus\.attach settings"):
        argus.attach(sink=ListSink(), no_such_setting=1)
    assert argus.api.attached() is None


def test_framework_callbacks_need_their_framework():
    for name, hint in (("ArgusLightningCallback", "lightning"), ("ArgusHFCallback", "transformers")):
        try:
            cls = getattr(argus.api, name)
        except ImportError as exc:
            assert hint in str(exc)
        else:
            assert issubclass(cls, StepCallbacks)
