"""The diagnosis's state of one job run: its open and lately closed :class:`Episode` s and
the :class:`JobState` that holds them, small plain data between steps, written and read
field-tolerantly across versions (:data:`STATE_VERSION`, :data:`EPISODE_RENAMES`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ._config import DiagnoserConfig
from .changepoint import ChangeState
from .iteration import IterationState


@dataclass
class Episode:
    """One open suspect across steps (plain values only)."""

    cause: str
    level: str
    suspect_kind: str
    suspect: str
    ranks: list[int]
    onset: int
    last_seen: int
    hits: int
    emitted: bool
    score: float
    decided_by: str
    evidence: dict[str, float]
    added_ms_sum: float
    gpu_hours: float
    detected_ns: int = 0
    persistent: bool = False
    severity: str = "page"
    idle: int = 0
    reported: int = -1
    hits_at: list[int] = field(default_factory=list)
    added_at: list[float] = field(default_factory=list)  # step time added, last LEVEL_SIGHTINGS
    share_at: list[float] = field(default_factory=list)  # and its share of each step
    peers: list[int] = field(default_factory=list)
    deepen_left: int = 0
    detail: str = ""
    change_onset: int = -1
    prior_rate: float = 0.0
    stood_out: float = 0.0  # steps its ranks stood out between the job's settling and its opening
    named: str = ""  # the suspect its anomaly was first sent as (its id's), when it grew since
    hosts: list[str] = field(default_factory=list)  # its ranks' named hosts, as sighted


LEVEL_SIGHTINGS = 32
"""Sightings whose step time added (``added_at``, ``share_at``) give an episode's level: a
baseline's level is their median, and a median of few of a noisy rank's sightings moves
by a good part of its spread (a change from it is then the rank's own noise)."""

TRANSIENTS_KEPT = 8
"""Transients of a suspect whose steps the state keeps (``JobState.transient_at``)."""

_SILENT = 10**15
"""``reported`` of a persistent episode: never sent."""


STATE_VERSION = 2
"""The version :meth:`JobState.to_dict` writes (1: before it was written; 2: stamped,
read field-tolerantly). Raise it when a field's meaning changes; rename through
:data:`EPISODE_RENAMES`."""


EPISODE_RENAMES: Mapping[str, str] = {}
"""An Episode field's former name -> its name now (read from an older build's state)."""


_BLANK = {"str": "", "int": 0, "float": 0.0, "bool": False}


def _episode(data: Mapping[str, Any]) -> Episode:
    """An Episode from any version's dict: renamed fields under their new names, unknown
    ones ignored, missing ones as their defaults (blank when they have none)."""
    fields = {f.name: f for f in dataclasses.fields(Episode)}
    values = {EPISODE_RENAMES.get(k, k): v for k, v in data.items()}
    kw: dict[str, Any] = {k: v for k, v in values.items() if k in fields}
    for name, f in fields.items():
        if name not in kw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kind = str(f.type)
            kw[name] = _BLANK[kind] if kind in _BLANK else ({} if kind.startswith("dict") else [])
    return Episode(**kw)


@dataclass
class JobState:
    """Everything the diagnosis keeps about one job run between steps (a few KB).

    ``iteration``: the step-time baseline; ``episodes``: open suspects by
    ``cause|suspect``; ``last_step``: the last step diagnosed; ``first_step``: the first
    step past the warm-up; ``transients``: per suspect, the sightings that never became
    an anomaly (one-step blips), at most ``max_open`` suspects, ``transient_at`` the first
    and last step of each suspect's last ``TRANSIENTS_KEPT`` of them and ``transient_kinds``
    each suspect's kind (a host is named by its name alone); ``closed``: anomalies closed
    lately, which the same fault confirmed again continues (:func:`_recurring`);
    ``global_run``: how many steps in a row every rank has been far slower than usual;
    ``fast_run``: how many steps in a row the job has been far faster than ``fast_ref``, its
    baseline's step time when that run began (a warm-up ending: :func:`_settle`);
    ``settled``: the warm-up's end was found (it ends once); ``flagged``: per rank, the
    steps since ``first_step`` (of ``flag_steps``, global ones left out) it was flagged or
    weakly flagged in: how often it stood out before an episode of it opened; ``blips``:
    per episode key, the steps its last short unconfirmed episodes began (a rhythm in them is
    a fault of every k-th step), at most ``max_open`` keys; ``streaks``: the sightings of the
    last rank episodes that closed within a few steps of their start, confirmed or not (how
    long this job's noise runs in streaks).
    """

    job: str
    run: int
    iteration: IterationState = field(default_factory=IterationState)
    episodes: dict[str, Episode] = field(default_factory=dict)
    last_step: int = -1
    first_step: int = -1
    transients: dict[str, int] = field(default_factory=dict)
    transient_at: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    transient_kinds: dict[str, str] = field(default_factory=dict)
    closed: dict[str, Episode] = field(default_factory=dict)
    steps: int = 0
    last_end_ns: int = 0
    n_ranks: int = 0
    global_run: int = 0
    fast_run: int = 0
    fast_ref: float = 0.0
    settled: bool = False
    changes: ChangeState = field(default_factory=ChangeState)
    flagged: dict[int, int] = field(default_factory=dict)
    flag_steps: int = 0
    blips: dict[str, list[int]] = field(default_factory=dict)
    streaks: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, job: str, run: int, config: DiagnoserConfig | None = None) -> JobState:
        """The state of a job run before its first step."""
        cfg = config or DiagnoserConfig()
        return cls(job, run, IterationState(window=np.zeros(cfg.iter_window)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (for a changelog-backed table), stamped with
        :data:`STATE_VERSION`."""
        it = self.iteration
        return {
            "version": STATE_VERSION,
            "job": self.job,
            "run": self.run,
            "last_step": self.last_step,
            "iteration": {
                "window": it.window.tolist(),
                "n": it.n,
                "ref": it.ref.tolist(),
                "ckpt_ref_ms": it.ckpt_ref_ms,
                "work_ref_ms": it.work_ref_ms,
            },
            "episodes": {k: asdict(e) for k, e in self.episodes.items()},
            "first_step": self.first_step,
            "steps": self.steps,
            "last_end_ns": self.last_end_ns,
            "n_ranks": self.n_ranks,
            "global_run": self.global_run,
            "fast_run": self.fast_run,
            "fast_ref": self.fast_ref,
            "settled": self.settled,
            "transients": dict(self.transients),
            "transient_at": {k: [list(w) for w in v] for k, v in self.transient_at.items()},
            "transient_kinds": dict(self.transient_kinds),
            "closed": {k: asdict(e) for k, e in self.closed.items()},
            "changes": self.changes.to_dict(),
            "flagged": {str(r): n for r, n in self.flagged.items()},
            "flag_steps": self.flag_steps,
            "blips": {k: list(v) for k, v in self.blips.items()},
            "streaks": list(self.streaks),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobState:
        """Inverse of :meth:`to_dict`, for any version's dict (a rolling upgrade restores
        what the previous build wrote, a rollback what the next wrote): fields it does not
        know are ignored, fields it lacks start as a new job's (:func:`_episode`)."""
        it = data.get("iteration", {})
        blank = IterationState()
        return cls(
            job=data["job"],
            run=int(data["run"]),
            iteration=IterationState(
                np.asarray(it.get("window", blank.window), float),
                int(it.get("n", 0)),
                np.asarray(it.get("ref", blank.ref), float),
                float(it.get("ckpt_ref_ms", 0.0)),
                float(it.get("work_ref_ms", 0.0)),
            ),
            episodes={k: _episode(v) for k, v in data.get("episodes", {}).items()},
            last_step=int(data.get("last_step", -1)),
            first_step=int(data.get("first_step", -1)),
            steps=int(data.get("steps", 0)),
            last_end_ns=int(data.get("last_end_ns", 0)),
            n_ranks=int(data.get("n_ranks", 0)),
            global_run=int(data.get("global_run", 0)),
            fast_run=int(data.get("fast_run", 0)),
            fast_ref=float(data.get("fast_ref", 0.0)),
            settled=bool(data.get("settled", False)),
            transients={str(k): int(v) for k, v in data.get("transients", {}).items()},
            transient_at={
                str(k): [(int(a), int(b)) for a, b in v] for k, v in data.get("transient_at", {}).items()
            },
            transient_kinds={str(k): str(v) for k, v in data.get("transient_kinds", {}).items()},
            closed={k: _episode(v) for k, v in data.get("closed", {}).items()},
            changes=ChangeState.from_dict(data.get("changes")),
            flagged={int(r): int(n) for r, n in data.get("flagged", {}).items()},
            flag_steps=int(data.get("flag_steps", 0)),
            blips={str(k): [int(x) for x in v] for k, v in data.get("blips", {}).items()},
            streaks=[int(x) for x in data.get("streaks", [])],
        )
