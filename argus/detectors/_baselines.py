"""Baselines and when a fault pages (docs/architecture.md#baselines): the rules over an
:class:`~detectors._state.Episode` and its :class:`~detectors._state.JobState` that say
how many sightings confirm a fault, whether it is slow since the job's start (and where
that start is: the warm-up's end), whether it is the job's baseline (a static offset, a
speed group, a rank that stood out before) or a change from it, and its severity."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
from scipy.stats import theilslopes

from argus.schemas import StepFindings
from argus.schemas.causes import (
    CHECKPOINT_STALL,
    COMPUTE_STRAGGLER,
    MASKED_COMPUTE_STRAGGLER,
    ONE_OFF_CAUSES,
    PIPELINE_STAGE_IMBALANCE,
    SEQUENCE_LENGTH_IMBALANCE,
    UNKNOWN,
)

from ._config import DiagnoserConfig
from ._finding import Finding
from ._robust import MAD_TO_SIGMA
from ._state import _SILENT, Episode, JobState
from .cost import excess_ms
from .iteration import IterationVerdict

_WARN_CAUSES = frozenset({PIPELINE_STAGE_IMBALANCE, SEQUENCE_LENGTH_IMBALANCE})


def _sightings_needed(cfg: DiagnoserConfig, n_ranks: int, level: str = "cross_rank") -> int:
    """Sightings that make a sustained fault: ``min_steps``, twice that for a rank of a job
    under ``group_min_size`` ranks (a few ranks' spread is a poor yardstick for one step's
    noise)."""
    return cfg.min_steps * (2 if level != "iteration" and n_ranks < cfg.group_min_size else 1)


STREAKS = 64
"""Short rank and host episodes whose lengths say how long a job's noise runs in streaks."""

STREAK_KINDS = frozenset({"rank", "host"})
"""Suspects whose noise runs in streaks: a rank, and a host whose ranks work in step (a
tensor-parallel group on one host shares each shock of one of them)."""


def streak_length(state: JobState) -> int:
    """Sightings that the job's noise reaches in one run on a rank now and then: the 97th
    percentile of its last ``STREAKS`` short rank or host episodes that did not page, once there
    are a quarter of that (0 before). Strongly autocorrelated noise with heavy tails runs
    for ten steps or more on one rank or another every few steps of a large job; a fault
    outlasts that."""
    if len(state.streaks) < STREAKS // 4:
        return 0
    return int(np.percentile(state.streaks, 97))


def _confirmed(
    e: Episode, added: float, base_ms: float, cfg: DiagnoserConfig, n_ranks: int, streak: int = 0
) -> bool:
    """Sustained (past the job's noise streaks, ``streak`` sightings, for a rank or host), or a
    one-off stall that cost enough in one step (rank level, or a slow checkpoint): a few
    small pauses do not add up to a stall."""
    needed = _sightings_needed(cfg, n_ranks, e.level)
    if e.suspect_kind in STREAK_KINDS:
        needed = max(needed, streak + 1)
    if e.change_onset >= 0 or (e.hits >= 2 * needed and not _decaying(e.added_at)):
        return True
    if e.hits >= needed and not _fading(e, cfg):
        return True
    one_off = e.cause in ONE_OFF_CAUSES and (e.level != "iteration" or e.cause == CHECKPOINT_STALL)
    return one_off and added >= cfg.min_cost_frac * base_ms


def _fading(e: Episode, cfg: DiagnoserConfig) -> bool:
    """Whether an episode's sightings die away: its first is its largest and its last adds
    under ``fade_frac`` of it, or it is :func:`_decaying` (a fault holds its level, or
    grows; noise that runs in streaks decays)."""
    at = e.added_at
    return len(at) >= 3 and ((at[0] >= max(at) and at[-1] < cfg.fade_frac * at[0]) or _decaying(at))


def _decaying(at: Sequence[float]) -> bool:
    """Whether the last (up to eight) sightings fall one after the other (none more than
    2 % above the one before) and by a tenth in all: one shock of autocorrelated noise
    dying away step by step (to 0.8 of the step before with an autocorrelation of 0.8,
    0.95 with 0.95), which a sustained fault does not do for long; or whether the last
    (up to ``_DECAY_SEEN``) die away from a peak among their first three, with the next
    shocks' noise on them: from the peak on, the trend falls by a fifth of it."""
    recent = at[-8:]
    if len(recent) < 3:
        return False
    if all(b <= 1.02 * a for a, b in pairwise(recent)) and recent[-1] < 0.9 * recent[0]:
        return True
    # (a fault holds its level or grows: a ramp, a sawtooth's rise; heavy-tailed noise of
    # strong autocorrelation stacks a second shock on the first's decay, its peak the
    # second or third sighting, and fell 620 -> 147 over 28 steps, not one after the other)
    y = np.asarray(at[-_DECAY_SEEN:], dtype=float)
    y = y[int(np.argmax(y[:3])) :]
    if len(y) < 3 or y[0] < y.max():
        return False
    slope = float(theilslopes(y).slope)
    return bool(slope * (len(y) - 1) <= -0.2 * y[0])


_DECAY_SEEN = 16
"""Sightings :func:`_decaying` follows a decay over."""


def _severity(e: Episode, cfg: DiagnoserConfig, page_hits: int, step_ms: float = 0.0, streak: int = 0) -> str:
    """page: an incident a person should act on now, seen in ``page_hits`` steps, or adding
    ``page_cost_frac`` of a ``step_ms`` step per sighting once confirmed, or a change
    point's (neither for a rank or host of a job whose noise runs ``streak`` sightings,
    longer than a confirmation takes: its large shocks run that long too, and a rank's own
    change opened on them in a few steps and paged, six times in one quiet job); warn: worth a look, never a
    page (a straggler since the start, a one-off stall, a layout or workload imbalance), or
    not yet one (a small fault seen in fewer steps: noise that runs in streaks confirms a
    few steps and ends). Nor while it fades (:func:`_fading`): one shock of strongly
    autocorrelated noise (a rank 1.21x, then 1.17x, 1.14x, ... back in ten steps) opened a
    change and paged at once on a quiet small job; a change's fault pages once seen in
    ``_HELD`` steps that did not fade, a fault holds its level."""
    if e.persistent or e.cause in _WARN_CAUSES or e.hits < 1 or _fading(e, cfg):
        return "warn"
    streaky = e.suspect_kind in STREAK_KINDS and streak >= cfg.min_steps
    costly = (
        not streaky
        and step_ms > 0
        and e.hits >= cfg.min_steps
        and e.added_ms_sum / e.hits >= cfg.page_cost_frac * step_ms
    )
    changed = e.change_onset >= 0 and not streaky and len(e.added_at) >= _HELD
    # (a change's steps before it was first sighted are its evidence building, not a fault
    # seen: a weak one's onset is where its sum began, tens of steps before it opened, and
    # a quiet job's rank paged on two sightings "seen in 85 steps")
    seen = min(e.hits, len(e.added_at)) if e.change_onset >= 0 else e.hits
    return "page" if seen >= page_hits or costly or changed else "warn"


_HELD = 8
"""Sightings after which a change point's fault that did not fade pages (:func:`_severity`)."""


def _page_hits(cfg: DiagnoserConfig, n_ranks: int, level: str, streak: int = 0) -> int:
    """Sightings that make a confirmed fault a page: ``page_after`` times those that confirm
    it (for a rank or host, at least one more than the job's noise streaks)."""
    return math.ceil(cfg.page_after * max(_sightings_needed(cfg, n_ranks, level), streak + 1))


def _settle(state: JobState, verdict: IterationVerdict, cfg: DiagnoserConfig) -> bool:
    """Whether the job's warm-up ended, ``min_steps`` steps ago: early in its life, nothing
    confirmed yet, its steps have been ``global_ratio`` times faster than its baseline was
    when they began, ``min_steps`` steps in a row; from there "slow since the start" counts.
    A noisy job's short steps dip that far for a step or two: taken for the end of a warm-up,
    a fault that began just after a dip would be called "since the start" and never page.
    The reference stays the baseline before the run (the baseline itself soon follows the
    faster steps). A warm-up ends once: a job whose steps alternate between two speeds has
    such runs all its life."""
    early = (
        not state.settled
        and 0 < state.steps <= cfg.persistent_settle_steps
        and verdict.base_ms > 0
        and not any(e.emitted and e.reported != _SILENT for e in state.episodes.values())
    )
    ref = state.fast_ref if state.fast_run else verdict.base_ms
    if early and verdict.step_ms * cfg.global_ratio <= ref:
        state.fast_run, state.fast_ref = state.fast_run + 1, ref
    else:
        state.fast_run = 0
    return state.fast_run == cfg.min_steps


def _persistent(e: Episode, state: JobState, cfg: DiagnoserConfig) -> bool:
    """Slow since the job's start (decided when confirmed): first seen before the job
    settled after its warm-up, or with at most ``persistent_within`` steps since then in
    which its ranks did not stand out (flagged or weakly): a rank a little slower all
    along crosses the line in most steps, not all, and its first sighting can come a few
    steps in."""
    if e.level != "cross_rank" or e.cause in ONE_OFF_CAUSES or state.first_step < 0:
        return False
    return e.onset - state.first_step - e.stood_out <= cfg.persistent_within


_BEYOND_FRAC = 0.1
"""How much more of a step a baseline's rank or group must add to be a change from it."""


_BASELINE_KINDS = frozenset({"rank", "host", "ranks"})


_BASELINE_CAUSES = frozenset({COMPUTE_STRAGGLER, MASKED_COMPUTE_STRAGGLER, UNKNOWN})
"""What a slower machine or a speed group looks like: a layout's imbalance (a slow stage,
uneven sequence lengths) or a link since the start is still reported (a warning)."""


def slow_with_it(state: JobState, e: Episode, cfg: DiagnoserConfig) -> int:
    """Other suspects of ``e``'s cause slow since about the job's start (a speed group's
    members): seen again, not one blip of the warm-up."""
    return sum(
        1
        for o in state.episodes.values()
        if o is not e
        and o.cause == e.cause
        and o.hits >= 2
        and o.onset - state.first_step <= cfg.persistent_within
    )


def _static(state: JobState, e: Episode, sf: StepFindings, cfg: DiagnoserConfig) -> bool:
    """Whether a fault seen from about the job's start is its baseline: since the start
    (:func:`_persistent`) and one of a speed group (two more suspects slow since the start,
    or ranks named together, three or more),
    or, in a job of fewer than ``small_job`` ranks, a static offset (it adds at most
    ``baseline_max_frac`` of a step) first seen within twice the sightings a confirmation
    takes, its own past not having seen it begin (noise hides a small offset among few
    peers now and then; among many, a rank as slow so early is a degraded GPU the kernel
    level and the fleet view want). One rank far slower from the start alone is still
    reported, as a warning."""
    early = 0 <= e.onset - state.first_step <= 2 * _sightings_needed(cfg, state.n_ranks, e.level)
    modest = e.hits > 0 and e.added_ms_sum / e.hits <= cfg.baseline_max_frac * sf.step_ms
    if early and modest and state.n_ranks < cfg.small_job and not _own_change(state, e):
        return True
    since_start = slow_with_it(state, e, cfg)
    # ranks named together are suspects of their own (a log without hosts names a speed
    # group of 200 ranks as one: a warning "since the start" on three quiet jobs)
    together = len(e.ranks) - 1 if e.suspect_kind == "ranks" else 0
    return e.persistent and since_start + together >= 2


def _own_change(state: JobState, e: Episode) -> bool:
    """Whether the own past of ``e``'s ranks saw it begin: a change found, or open on one of
    them (a trace's rank slowed at its 20th step of 40 is no offset it always had)."""
    return e.change_onset >= 0 or any(map(state.changes.changed, e.ranks))


def is_baseline(state: JobState, e: Episode, sf: StepFindings, cfg: DiagnoserConfig) -> bool:
    """Whether a newly confirmed fault is the job's baseline (silent): a rank or group's
    static offset or speed group (:func:`_static`, :func:`_flickered`), or links slow since
    the start three or more at once, the waits a speed group makes its peers do (a job with
    ranks 3.9x slower on 46 % of them raised 23 links "since the start"). One link slow
    since the start alone is still reported (a warning): a link degraded from the start."""
    if e.suspect_kind in _BASELINE_KINDS and e.cause in _BASELINE_CAUSES:
        return _static(state, e, sf, cfg) or _flickered(e, sf, cfg)
    return e.suspect_kind == "link" and e.persistent and slow_with_it(state, e, cfg) >= 2


def _beyond_baseline(base: Episode, f: Finding, sf: StepFindings, change: Episode | None = None) -> bool:
    """Whether a finding of a rank or group that is slow from the job's start (its baseline,
    silent, or a warning "since the start") says it is now slower than that: it adds a
    tenth of a step more than the baseline adds, in milliseconds and as a share of the step
    both (:func:`_level`): a slower rank's excess grows with the job's step when every rank
    slows, its share does not; its share grows when other ranks speed the job up, its
    milliseconds do not. An open ``change`` goes on down to halfway between the two levels,
    never under half that margin: a small change holds through its own noise, and a rank's
    usual noise does not carry on a change that one hiccup opened."""
    if not (base.persistent or base.reported == _SILENT) or base.hits <= 0 or sf.step_ms <= 0:
        return False
    added = excess_ms(f.step_ms_added)
    ms, frac = _level(base, sf.step_ms)
    by_ms = by_frac = _BEYOND_FRAC
    if change is not None and change.hits > 0:
        c_ms, c_frac = _level(change, sf.step_ms)
        by_ms = min(max((c_ms - ms) / (2 * sf.step_ms), _BEYOND_FRAC / 2), _BEYOND_FRAC)
        by_frac = min(max((c_frac - frac) / 2, _BEYOND_FRAC / 2), _BEYOND_FRAC)
    return added >= ms + by_ms * sf.step_ms and added / sf.step_ms >= frac + by_frac


def _splits_noise(state: JobState, key: str, change: Episode, step_ms: float) -> bool:
    """Whether a change from a baseline is the baseline's own noise cut in two: the level
    of its sightings (:func:`_level`) stands above the baseline's by less than twice the
    baseline's spread (at least half of, at most, the tenth of a step a change must add),
    or (a rank) it was sighted as the baseline at least a quarter as often as as the change
    while the change's last sightings came (a change point's test is its own). A rank that
    changed is seen as the change nearly every time, at its new level; a rank whose usual
    spread reaches past the threshold now and then is seen as both, and the change's
    sightings are only its high ones."""
    base = state.episodes.get(key.removesuffix("|change")) if key.endswith("|change") else None
    if base is None or change.change_onset >= 0 or not change.hits_at or base.hits <= 0 or step_ms <= 0:
        return False
    if not _beyond_level(base, change, step_ms, _spread(base.added_at, step_ms), _spread(base.share_at)):
        return True
    if change.suspect_kind != "rank":  # a group's baseline is sighted by its other ranks too
        return False
    since = max(change.onset, change.hits_at[0])
    return 4 * sum(1 for s in base.hits_at if s >= since) >= len(change.hits_at)


def _spread(values: Sequence[float], per: float = 1.0) -> float:
    """Twice a robust standard deviation of a baseline's sightings (1.4826 MAD) over
    ``per`` (a step, for milliseconds), within half and the whole of ``_BEYOND_FRAC``; the
    whole before eight sightings."""
    if len(values) < 8:
        return _BEYOND_FRAC
    v = np.asarray(values)
    sd = MAD_TO_SIGMA * float(np.median(np.abs(v - np.median(v)))) / per
    return min(max(2 * sd, _BEYOND_FRAC / 2), _BEYOND_FRAC)


def _beyond_level(
    base: Episode, e: Episode, step_ms: float, by_ms: float = _BEYOND_FRAC, by_frac: float = _BEYOND_FRAC
) -> bool:
    """Whether the sightings of ``e`` stand above ``base``'s level (:func:`_level`) by
    ``by_ms`` of a step in milliseconds and ``by_frac`` as a share of the step both (a
    tenth by default)."""
    if base.hits <= 0 or e.hits <= 0 or step_ms <= 0:
        return False
    (b_ms, b_frac), (e_ms, e_frac) = _level(base, step_ms), _level(e, step_ms)
    return e_ms >= b_ms + by_ms * step_ms and e_frac >= b_frac + by_frac


def _level(base: Episode, step_ms: float) -> tuple[float, float]:
    """What a baseline adds per step, in milliseconds and as a share of the step: the
    medians of its last sightings' (a step whose reference moved, e.g. a log window some
    ranks did not report in, is one of them); before those were kept, its mean per sighting
    (over ``step_ms``)."""
    if base.added_at and base.share_at:
        return float(np.median(base.added_at)), float(np.median(base.share_at))
    mean = base.added_ms_sum / base.hits
    return mean, mean / step_ms


def count_flags(state: JobState, sf: StepFindings, findings: Sequence[Finding], cfg: DiagnoserConfig) -> None:
    """Each rank flagged (or weakly) this step, counted from the job's first settled step,
    but not while it is part of an anomaly."""
    if state.first_step < 0 or sf.step < state.first_step:
        return
    state.flag_steps += 1
    ranks = {int(r) for r in sf.weak}
    ranks.update(r for f in findings if f.level == "cross_rank" for r in f.ranks)
    # a fault's own sightings are not its rank's baseline (a flapping rank would become one)
    ranks.difference_update(
        r
        for e in (*state.episodes.values(), *state.closed.values())
        if e.emitted and e.reported != _SILENT
        for r in e.ranks
    )
    for r in ranks:
        if r in state.flagged or len(state.flagged) < cfg.max_tracked:
            state.flagged[r] = state.flagged.get(r, 0) + 1


def _prior_rate(state: JobState, ranks: Sequence[int], cfg: DiagnoserConfig) -> float:
    """How often ``ranks`` stood out (flagged or weakly) before now, on average (0 before
    ``min_steps`` counted steps)."""
    if state.flag_steps < cfg.min_steps or not ranks:
        return 0.0
    return sum(state.flagged.get(r, 0) for r in ranks) / (len(ranks) * state.flag_steps)


def _flickered(e: Episode, sf: StepFindings, cfg: DiagnoserConfig) -> bool:
    """Whether a confirmed fault is its ranks' baseline seen again: they stood out in
    ``baseline_rate`` of the steps before it opened (:func:`_prior_rate`), and it adds at
    most ``flicker_max_frac`` of a step (a rank that stood out now and then was never that
    much slower: a slowdown of half a step or more is news). Not where its own past shows
    a change (its own baseline holds the times it stood out: a change from it is news, and
    in a synchronous job the step it measures against has grown with the fault: a rank of
    16 slowed 2.2x added 0.35 of that step and was silent for 267 steps)."""
    if e.prior_rate < cfg.baseline_rate or e.hits <= 0 or e.change_onset >= 0:
        return False
    return e.added_ms_sum / e.hits <= cfg.flicker_max_frac * sf.step_ms
