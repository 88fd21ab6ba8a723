"""Moved to :mod:`argus.producers.simulator.scoring` (the fault matcher lives beside the
simulator that injects the faults). This name stays only while ``bench/diagnosis.py``, which
another change holds, still imports it; new code imports the new module."""

from __future__ import annotations

from argus.producers.simulator.scoring import *  # noqa: F403
from argus.producers.simulator.scoring import __all__ as __all__
