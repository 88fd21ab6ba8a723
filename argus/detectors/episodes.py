"""The life of an episode, one suspect across steps, mutated in place in the job's state.

- open and sight: :func:`sightings` folds a step's findings into their episodes
  (:func:`_episode_of` opens one when new; :func:`_sight` counts a sighting);
- confirm: :func:`_confirm` makes a sustained (or costly one-off) episode an anomaly, or
  the job's silent baseline, or the continuation of the same fault closed lately
  (:func:`_recurring`, :func:`_continue`);
- escalate: :func:`_escalate` sends a confirmed warning again as a page;
- close: :func:`unsighted` waits (:func:`_patience`, :func:`_near`) or closes
  (:func:`_close`) the episodes a step did not sight; :func:`forget_stale` bounds them;
  :func:`flush` closes them all at the job's end;
- report: :func:`_anomaly` is an episode's record, :func:`refresh` the current version of
  each confirmed one; :func:`_deepen` / :func:`deepen_late` give the kernel level its tries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from argus.schemas import Anomaly, StepFindings
from argus.schemas.causes import ONE_OFF_CAUSES

from ._baselines import (
    _BASELINE_CAUSES,
    STREAK_KINDS,
    STREAKS,
    _beyond_baseline,
    _beyond_level,
    _confirmed,
    _page_hits,
    _persistent,
    _prior_rate,
    _severity,
    _sightings_needed,
    _splits_noise,
    is_baseline,
    slow_with_it,
    streak_length,
)
from ._config import DiagnoserConfig
from ._cross_stage import _DEEP_KINDS
from ._finding import Finding, anomaly_id
from ._job_level import own_past_silent
from ._routing import (
    _GROUP_KINDS,
    _absorb,
    _family,
    _group_index,
    _route,
    _split,
    group_change,
    grown_from,
    grows,
    remembered,
)
from ._state import _SILENT, LEVEL_SIGHTINGS, TRANSIENTS_KEPT, Episode, JobState
from .changepoint import RankResiduals, shared_rhythm
from .common_cause import (
    CHANGE_FIGURE,
    ONSET_SPREAD,
    OPENED,
    began_together,
    named_hosts,
    ranks_label,
    smallest_group,
)
from .cost import excess_ms, gpu_hours, step_ms_added
from .deepen import Deepening
from .iteration import IterationVerdict

Deepen = Callable[[Sequence[int], Sequence[int], int], Deepening | None]
"""Given a confirmed anomaly's suspect ranks, healthy peers of their group and its onset
step, what their kernels and stacks say from that step on (:func:`detectors.deepen.deepen_ranks`
over the caller's data), or None when there is no such data yet."""


def _anomaly(state: JobState, e: Episode) -> Anomaly:
    _absorb_transients(state, e)
    steps = max(e.hits, 1)
    ev = dict(e.evidence)
    ev["steps_seen"] = float(e.hits)
    if "period_steps" not in ev and (k := _beat(e.hits_at)):
        ev["period_steps"] = float(k)
    if e.persistent:
        ev["persistent"] = 1.0
    since = " since the job's start" if e.persistent else ""
    suspect = _shown(e)
    summary = (
        f"{e.cause} at {suspect}{since}: decided by {e.decided_by}="
        f"{ev.get(e.decided_by, float('nan')):.4g}, seen in {e.hits} step(s)"
    )
    if ev.get("period_steps"):
        summary += f"; slow every {ev['period_steps']:.0f} steps"
    if e.detail:
        summary += f"; {e.detail}"
    return Anomaly(
        id=anomaly_id(state.job, state.run, e.cause, e.named or e.suspect, e.onset),
        job=state.job,
        run=state.run,
        start_step=e.onset,
        end_step=e.last_seen,
        level=e.level,
        suspect_kind=e.suspect_kind,
        suspect=suspect,
        ranks=tuple(e.ranks),
        cause=e.cause,
        score=float(min(max(e.score, 0.0), 1e9)),
        evidence=ev,
        summary=summary[:4096],
        step_ms_added=e.added_ms_sum / steps,
        gpu_hours_lost=e.gpu_hours,
        detected_ns=e.detected_ns,
        severity=e.severity,
    )


def _beat(at: Sequence[int]) -> int:
    """The period of sightings that came every k-th step (3 to ``_MAX_PERIOD``, within a
    step, as :func:`_rhythm` takes them), over the last eight an episode keeps: a fault slow
    every k-th step confirmed as it came, without a rhythm of blips or change points to name
    its period (a job of more ranks than they test). 0 when they did not."""
    if len(at) < _RHYTHM + 2:
        return 0
    gaps = np.diff(at)
    if gaps.min() < 3 or gaps.max() - gaps.min() > 1 or gaps.max() > _MAX_PERIOD:
        return 0
    return int(np.median(gaps))


def sightings(
    state: JobState,
    sf: StepFindings,
    findings: Sequence[Finding],
    verdict: IterationVerdict,
    cfg: DiagnoserConfig,
    deepen: Deepen | None,
) -> tuple[list[Anomaly], set[str]]:
    """Each finding a sighting of its episode (opened when new; group findings first, so
    that their ranks' findings add to them): the anomalies it confirms or updates, and the
    keys of the episodes sighted."""
    base_ms = verdict.base_ms if verdict.base_ms > 0 else sf.step_ms
    out: list[Anomaly] = []
    groups = _group_index(state)
    seen: set[str] = set()
    was = {k for k, e in state.episodes.items() if e.emitted}
    opened = {int(r) for r in state.changes.open_ranks()} if cfg.change_points else None
    routed = [g for f in findings for g in _split(f, groups, state, cfg)]
    for f in sorted(routed, key=_sighting_order):
        key, e = _episode_of(state, f, groups, sf, cfg)
        if f.suspect_kind == "ranks" and e.hits and 2 * len(set(f.ranks) & set(e.ranks)) < len(f.ranks):
            continue  # other ranks of the group than before: noise moving about, not one fault
        if key in seen:  # a second finding of the same episode in this step
            e.ranks = sorted(set(e.ranks) | set(_members(e, f, opened)))[: cfg.max_listed]
            if f.decided_by == CHANGE_FIGURE:
                _sight_change(e, f, step_ms_added(f.step_ms_added, sf.step_ms), sf)
                if not e.emitted and (a := _confirm(state, key, e, sf, cfg, deepen)) is not None:
                    out.append(a)
            continue
        if _faint(e, f, sf, cfg):
            continue
        seen.add(key)
        added = _sight(e, f, sf, cfg, opened)
        if f.decided_by == CHANGE_FIGURE:
            _sight_change(e, f, added, sf)
        if not e.emitted and (
            (
                _confirmed(e, added, base_ms, cfg, sf.n_ranks, streak_length(state))
                and not _splits_noise(state, key, e, sf.step_ms)
            )
            or _rhythm(state, key, e, sf)
        ):
            if (a := _confirm(state, key, e, sf, cfg, deepen)) is not None:
                out.append(a)
        elif (a := _escalate(state, e, sf, cfg)) is not None:
            out.append(a)
        elif e.emitted and sf.step - e.reported >= cfg.update_every:  # a live window and cost
            e.reported = sf.step
            out.append(_anomaly(state, e))
    return _together(state, out, was, sf, cfg), seen


def _together(
    state: JobState, out: list[Anomaly], was: set[str], sf: StepFindings, cfg: DiagnoserConfig
) -> list[Anomaly]:
    """Ranks' episodes confirmed in step ``sf`` that are one cause with an open confirmed
    one of theirs, or with each other (:func:`_same_cause`), join the first one sent, which
    takes the name of all their ranks (keeping its id): the smallest group of the layout
    that holds them, else their ranks. A log without hosts saw 32 ranks of four hosts slow
    on every fourth step as 31 anomalies of one rank and one of the ranks: they stood out
    in the same steps from the same step on."""
    new = [k for k, e in state.episodes.items() if k not in was and e.emitted and _joinable(e)]
    if not new:
        return out
    step, res = sf.step, sf.residuals
    heads = [k for k, e in state.episodes.items() if k in was and e.emitted and _joinable(e)]
    joined: dict[str, list[str]] = {}
    for k in sorted(new, key=lambda k: state.episodes[k].onset):
        e = state.episodes[k]
        head = next((h for h in [*heads, *joined] if _same_cause(state.episodes[h], e, res, cfg)), None)
        if head is None:
            joined[k] = []
        else:
            joined.setdefault(head, []).append(k)
    gone: set[str] = set()
    sent: list[Anomaly] = []
    for head, members in joined.items():
        if not members:
            continue
        h = state.episodes[head]
        eps = [state.episodes[k] for k in [head, *members]]
        whole = sorted({r for o in eps for r in o.ranks})
        # (without a layout group, the name of one that held them all already: hosts:a,b,c)
        widest = max(eps, key=lambda o: len(o.ranks))
        held = (widest.suspect_kind, widest.suspect) if set(widest.ranks) >= set(whole) else None
        gone.add(anomaly_id(state.job, state.run, h.cause, h.named or h.suspect, h.onset))
        for k in members:
            m = state.episodes.pop(k)
            gone.add(anomaly_id(state.job, state.run, m.cause, m.named or m.suspect, m.onset))
            if head not in was:  # (a sent anomaly keeps its window's start: its id)
                h.onset = min(h.onset, m.onset)
            h.hits = max(h.hits, m.hits)
            h.hosts = sorted(set(h.hosts) | set(m.hosts))[:_HOSTS_KEPT]
        if head in was and not h.named:
            h.named = h.suspect
        group = _layout_name(eps, whole, res, cfg)
        if held is not None and held[1] == "ranks":  # (a job of one group's ranks: named by them)
            held = None
        kind, name = group or held or ("ranks", "ranks:" + ranks_label(whole))
        h.suspect_kind, h.suspect, h.ranks = kind, name, whole[: cfg.max_listed]
        h.reported = step
        sent.append(_anomaly(state, h))
    if not sent:
        return out
    return [a for a in out if a.id not in gone] + sent


def _joinable(e: Episode) -> bool:
    """A rank's, ranks' or host's sent episode (not silent: a baseline)."""
    return e.suspect_kind in ("rank", "ranks", "host") and e.reported != _SILENT


def _same_cause(a: Episode, b: Episode, res: RankResiduals | None, cfg: DiagnoserConfig) -> bool:
    """Whether two episodes are one cause (:func:`_together`): of one family, sighted in
    the same steps with sizes within ``cp_size_ratio``, and begun within ``cp_onset_within``
    steps, or, neither slow since the start and one a group already, all their ranks in one
    host or replica of the layout, whenever they began (a ramp over the three hosts of a
    replica crossed the thresholds rank by rank over 30 steps: eight anomalies)."""
    if _family(a.cause) != _family(b.cause):
        return False
    # (within a step: a time-sampled log's workers fall in neighbouring windows)
    shared = len({s + d for s in a.hits_at for d in (-1, 0, 1)} & set(b.hits_at))
    if 2 * shared < min(len(a.hits_at), len(b.hits_at)) or a.hits <= 0 or b.hits <= 0:
        return False
    near = _began_together(cfg, a.onset, a.evidence, b.onset, b.evidence)
    # (hosts slow since the start stay each its own warning: a layout's degraded hosts)
    steady = "host" in (a.suspect_kind, b.suspect_kind) and (a.persistent or b.persistent)
    if near and not steady and _alike(a.added_ms_sum / a.hits, b.added_ms_sum / b.hits, cfg):
        return True
    # one's ranks among the other's, begun together: one fault seen whole and in part (three
    # hosts slowed together were their anomaly and two of the hosts' own)
    ra, rb = set(a.ranks), set(b.ranks)
    if near and (ra <= rb or rb <= ra) and _alike(_lately(a), _lately(b), cfg):
        return True
    if a.persistent or b.persistent or res is None:
        return False
    # (what they add lately, the lower median, within twice the ratio's: a ramp's first
    # ranks were seen small, its last ones large, a rank confirmed at its first sightings
    # of it at a third of the others' level; a z-score's first sighting after its wait held
    # 3x its level)
    if not _alike(_lately(a), _lately(b), cfg, cfg.cp_size_ratio**2):
        return False
    group = _layout_group([a, b], sorted(ra | rb), res, cfg)
    if group is None or (group[0] != "host" and not _one_replica(sorted(ra | rb), res)):
        return False
    # (two single ranks of one host, or one a group already: two ranks' noise of one stage
    # of 128 ranks paged so)
    return group[0] == "host" or max(len(ra), len(rb)) >= 2


def _began_together(
    cfg: DiagnoserConfig, onset_a: float, ev_a: Mapping[str, float], onset_b: float, ev_b: Mapping[str, float]
) -> bool:
    """:func:`common_cause.began_together` of two changes' onsets and evidence (a finding's
    or an episode's: the spread of its onset, the step it opened in; none said, its onset
    alone)."""
    return bool(
        began_together(
            cfg,
            onset_a,
            ev_a.get(ONSET_SPREAD, 0.0),
            ev_a.get(OPENED, -1.0),
            onset_b,
            ev_b.get(ONSET_SPREAD, 0.0),
            ev_b.get(OPENED, -1.0),
        )
    )


def _one_replica(ranks: list[int], res: RankResiduals) -> bool:
    """Whether the ``ranks`` this step holds are of one data-parallel replica of the layout."""
    rows = np.isin(res.ranks, ranks)
    return res.replicas and rows.sum() >= 2 and len(np.unique(res.dp[rows])) == 1


def _layout_group(
    eps: list[Episode], whole: list[int], res: RankResiduals | None, cfg: DiagnoserConfig
) -> tuple[str, str] | None:
    """The smallest group of the layout holding the ``whole`` ranks of episodes ``eps``
    (:func:`common_cause.smallest_group`); where some of them are not in this step (a
    time-sampled log's window holds a rank's sample or not), their one host when the
    episodes' sighted hosts are one."""
    if res is None:
        return None
    group = smallest_group(whole, res, cfg.group_column)
    if np.isin(whole, res.ranks).all():
        return group
    hosts = {h for e in eps for h in e.hosts}
    if len(hosts) == 1 and all(e.hosts for e in eps):
        return "host", hosts.pop()
    return group


def _layout_name(
    eps: list[Episode], whole: list[int], res: RankResiduals | None, cfg: DiagnoserConfig
) -> tuple[str, str] | None:
    """:func:`_layout_group` where the layout names one (a host, a replica, the hosts), None
    where only their ranks would (``ranks:…``)."""
    group = _layout_group(eps, whole, res, cfg)
    return None if group is None or group[1].startswith("ranks:") else group


_HOSTS_KEPT = 8
"""Named hosts an episode keeps of its ranks (:func:`_layout_group`)."""
_LATELY = 4
"""Sightings whose lower median is what an episode adds lately (:func:`_same_cause`)."""


def _lately(e: Episode) -> float:
    at = sorted(e.added_at[-_LATELY:])
    return at[(len(at) - 1) // 2] if at else 0.0


def _alike(x: float, y: float, cfg: DiagnoserConfig, ratio: float = 0.0) -> bool:
    lo, hi = sorted((x, y))
    return lo > 0 and hi <= (ratio or cfg.cp_size_ratio) * lo


def _episode_of(
    state: JobState, f: Finding, groups: dict[tuple[str, int], str], sf: StepFindings, cfg: DiagnoserConfig
) -> tuple[str, Episode]:
    """The episode a finding is a sighting of, opened at ``step`` when there is none (a new
    host or link episode takes over its ranks' open ones, and their later findings)."""
    key = grown_from(state, f, groups, cfg) or _route(f, groups)
    if f.decided_by == CHANGE_FIGURE and key not in state.episodes:  # a host or link not confirmed yet
        members = set(f.ranks)
        key = next(
            (
                k
                for k, o in state.episodes.items()
                if o.suspect_kind in _GROUP_KINDS and members & set(o.ranks)
            ),
            key,
        )
    old = state.episodes.get(key)
    change = (
        old is not None
        and old.persistent
        and (
            f.decided_by == CHANGE_FIGURE
            # hysteresis: an open change goes on down to halfway between the two levels
            or (
                # with them on, a change from a baseline is theirs (a link's is not a rank's)
                (sf.residuals is None or f.suspect_kind == "link")
                and _beyond_baseline(old, f, sf, state.episodes.get(f"{f.key}|change"))
            )
        )
    )
    if old is not None and change:  # a change from a baseline: its sightings, until it ends
        key = _change_key(state, f, cfg)
        old.idle = 0
    e = state.episodes.get(key)
    if e is None:
        e = state.episodes[key] = _open(f, sf.step)
        if not change:  # a baseline's ranks stood out before: that was the baseline
            e.prior_rate = _prior_rate(state, f.ranks, cfg)
            e.stood_out = sum(state.flagged.get(r, 0) for r in f.ranks) / max(len(f.ranks), 1)
        if f.suspect_kind in _GROUP_KINDS:
            _absorb(state, key, e)
            if f.suspect_kind not in ("ranks", "host"):
                groups.update({(_family(f.cause), r): key for r in f.ranks})
    elif f.decided_by == CHANGE_FIGURE:
        _grow(e, f, sf.residuals, cfg)
    return key, e


def _change_key(state: JobState, f: Finding, cfg: DiagnoserConfig) -> str:
    """The episode of a change from a baseline: the open change of some of the same ranks
    that began with it (its first member's change opened a few steps before the others', or
    a group's change they joined, :func:`_together`, whenever they began), else the
    finding's own."""
    onset = f.evidence.get("change_onset")
    if f.decided_by == CHANGE_FIGURE and onset is not None:
        members = set(f.ranks)
        for k, o in state.episodes.items():
            joined = o.emitted and o.suspect_kind in ("ranks", "host") and o.change_onset >= 0
            if (
                (k.endswith("|change") or joined)
                and members & set(o.ranks)
                and (
                    _began_together(cfg, onset, f.evidence, o.onset, o.evidence)
                    or (joined and members <= set(o.ranks))
                )
            ):
                return k
    return f"{f.key}|change"


def _grow(e: Episode, f: Finding, res: RankResiduals | None, cfg: DiagnoserConfig) -> None:
    """A change of more ranks that began with an episode's is that fault seen whole
    (:func:`grows`): the episode takes its ranks and its name, or where each saw only some
    of them, the smallest group of the layout holding them all (:func:`_layout_group`; a
    host's first five ranks and its last three were ``ranks:16-23``), else their ranks (its
    anomaly keeps the id it was first sent with)."""
    if not grows(e, f, cfg):
        return
    whole = sorted(set(e.ranks) | set(f.ranks))
    if set(whole) == set(f.ranks):  # its name (a host, a replica) holds them all
        kind, name = f.suspect_kind, f.suspect
    elif len(whole) > len(e.ranks) or e.suspect_kind == "ranks":  # (a sighting added ranks)
        group = _layout_name([e], whole, res, cfg)
        kind, name = group or ("ranks", "ranks:" + ranks_label(whole))
    else:  # a host seen without some of its ranks is still the host
        return
    if name == e.suspect:  # (a host named by two of its ranks, seen whole now)
        e.ranks = whole[: cfg.max_listed]
        return
    if e.emitted and not e.named:
        e.named = e.suspect
    e.suspect_kind, e.suspect, e.ranks = kind, name, whole[: cfg.max_listed]


def _open(f: Finding, step: int) -> Episode:
    return Episode(
        f.cause, f.level, f.suspect_kind, f.suspect, list(f.ranks), step, step, 0, False,
        f.score, f.decided_by, dict(f.evidence), 0.0, 0.0,
    )  # fmt: skip


def _sight(e: Episode, f: Finding, sf: StepFindings, cfg: DiagnoserConfig, opened: set[int] | None) -> float:
    """One sighting of an episode in step ``sf``: its window, sightings, cost, and (when this
    one scores as high, or it is not confirmed yet) its evidence and ranks; the step time
    it added. ``opened``: the ranks whose own change is open (None without change points)."""
    added = step_ms_added(f.step_ms_added, sf.step_ms)
    # (its level and shape: what it adds uncut, a cost at most the step, a shock of 3x dying
    # away was a level held at one step added, a fault, twelve times in a quiet job)
    excess = excess_ms(f.step_ms_added)
    e.last_seen = sf.step
    e.idle = 0
    e.hits_at = [*e.hits_at[-7:], sf.step]
    e.added_at = [*e.added_at[1 - LEVEL_SIGHTINGS :], round(excess, 3)]
    e.share_at = [
        *e.share_at[1 - LEVEL_SIGHTINGS :],
        round(excess / sf.step_ms, 5) if sf.step_ms > 0 else 0.0,
    ]
    e.hits += 1
    e.added_ms_sum += added
    e.gpu_hours += gpu_hours(added, sf.n_ranks)
    if f.score >= e.score or not e.emitted:
        e.score = max(e.score, f.score)
        e.evidence.update(f.evidence)
        e.ranks = sorted(set(e.ranks) | set(_members(e, f, opened)))[: cfg.max_listed]
    if f.ranks and f.ranks[0] in sf.peers:
        e.peers = list(sf.peers[f.ranks[0]])
    if sf.residuals is not None and len(e.hosts) < _HOSTS_KEPT:
        e.hosts = sorted(set(e.hosts) | named_hosts(f.ranks, sf.residuals))[:_HOSTS_KEPT]
    return added


def _sighting_order(f: Finding) -> tuple[bool, bool]:
    """Group findings first, so that their ranks' findings add to them; of an episode's
    findings in one step its change's first: what the step adds is the change's figure,
    against the ranks' own past, not a z-score's against its peers (a host's worker slower
    all along made its host's fault that much larger)."""
    return f.suspect_kind not in _GROUP_KINDS, f.decided_by != CHANGE_FIGURE


def _members(e: Episode, f: Finding, opened: set[int] | None) -> list[int]:
    """The ranks a sighting adds to its episode: a confirmed group grows by its ranks' own
    changes, not by the ranks a step flagged with it (a healthy rank's spike while its group
    was slow was named; a healthy worker of a drifting host was named beside the slowed
    four); without change points a host's or link's flagged ranks are its own."""
    if not e.emitted or f.decided_by == CHANGE_FIGURE or e.suspect_kind not in _GROUP_KINDS:
        return list(f.ranks)
    if opened is not None:
        return [r for r in f.ranks if r in opened]
    return [] if e.suspect_kind == "ranks" else list(f.ranks)


def _sight_change(e: Episode, f: Finding, added: float, sf: StepFindings) -> None:
    """A change point sighted: the episode's fault began at the change's onset, and was
    there on every step since (the evidence of a change is their sum); a rank slow every
    k-th step was there on every k-th step since (its sightings are its slow steps, what
    it adds their excess, as a z-score's sightings of it are)."""
    onset = int(f.evidence.get("change_onset", sf.step))
    k = int(f.evidence.get("period_steps", 0))
    if k:  # slow every k-th step: said in its summary
        e.evidence["period_steps"] = float(k)
    e.change_onset = onset if e.change_onset < 0 else min(e.change_onset, onset)
    steps = (sf.step - e.change_onset) // max(k, 1) + 1
    if not e.emitted and steps > e.hits:
        more = steps - e.hits
        e.hits = steps
        e.added_ms_sum += more * added
        e.gpu_hours += more * gpu_hours(added, sf.n_ranks)


def _faint(e: Episode, f: Finding, sf: StepFindings, cfg: DiagnoserConfig) -> bool:
    """Whether a finding is too faint to be more of a confirmed fault: it adds less than
    ``faint_frac`` of what the fault added per sighting (the noise of a busy host flagging
    the same rank after the fault ended would otherwise carry its window on)."""
    if not e.emitted or e.hits < cfg.min_steps or e.added_ms_sum <= 0:
        return False
    return step_ms_added(f.step_ms_added, sf.step_ms) < cfg.faint_frac * e.added_ms_sum / e.hits


def _confirm(
    state: JobState, key: str, e: Episode, sf: StepFindings, cfg: DiagnoserConfig, deepen: Deepen | None
) -> Anomaly | None:
    """A newly confirmed episode's anomaly: the same fault back continues the anomaly that
    closed lately; else its onset, persistence and severity are decided now, and the kernel
    level has its first try. A rank or group slow from the job's first step past its
    warm-up is its baseline (a static offset, a persistent speed group): the episode stays,
    silent, so its sightings make no other; a change from it is the change points' (None).
    One first seen a step or two later is a straggler since the start: a warning."""
    old = _recurring(state, key, e, cfg)
    if old is not None and old.reported == _SILENT:  # a baseline hidden for a while, back
        if not _beyond_level(old, e, sf.step_ms):
            state.episodes[key] = _continue(old, e, cfg)
            return None
        old = None  # back slower than it was: a change, sent as a fault of its own
    if old is not None:  # the same fault back: its anomaly goes on
        e = state.episodes[key] = _continue(old, e, cfg)
        e.reported = sf.step
        return _anomaly(state, e)
    # since the start from its first sighting: a log's missing samples leave gaps there
    e.persistent = _persistent(e, state, cfg)
    if _own_past_learning(state, e, sf, cfg):
        return None
    e.emitted = True
    e.onset = min(_onset(e), e.change_onset) if e.change_onset >= 0 else _onset(e)
    if is_baseline(state, e, sf, cfg):  # silent; a change from it opens its own episode (_episode_of)
        e.reported = _SILENT
        return None
    streak = streak_length(state) if e.suspect_kind in STREAK_KINDS else 0
    n_ranks = max(state.n_ranks, sf.n_ranks)
    e.severity = _severity(e, cfg, _page_hits(cfg, n_ranks, e.level, streak), sf.step_ms, streak)
    if e.severity == "page" and _page_withheld(state, e, cfg):
        e.severity = "warn"
    _drop_before_onset(e)
    e.detected_ns = sf.end_ns
    e.reported = sf.step
    if deepen is not None and e.suspect_kind in _DEEP_KINDS:
        e.deepen_left = cfg.deepen_steps + 1
        _deepen(e, deepen)
    return _anomaly(state, e)


def _own_past_learning(state: JobState, e: Episode, sf: StepFindings, cfg: DiagnoserConfig) -> bool:
    """Whether a small job's ranks slow together since the start wait for their own past:
    their change points are still learning their baselines, and once learned they tell a
    speed group (silent: its findings stop, :func:`_job_level.with_changes`) from a change.
    Sent at once, two workers 3x slower than their peers from the start were a warning
    "since the start" until their baselines were learned. One rank far slower from the
    start alone is still a warning at once (a 3-rank DDP job's rank slowed 60 ms)."""
    if not (cfg.change_points and e.persistent and sf.n_ranks < cfg.small_job):
        return False
    if e.suspect_kind not in ("rank", "ranks") or e.cause not in _BASELINE_CAUSES:
        return False
    if len(e.ranks) < 2 and not slow_with_it(state, e, cfg):  # alone: no speed group
        return False
    ch = state.changes
    return any(not 0 <= r < ch.n_ranks or ch.n[0, r] < cfg.cp_learn for r in e.ranks)


def _onset(e: Episode) -> int:
    """Where a confirmed fault began: its first sighting, less leading ones a wider gap
    apart than its sightings since (a blip just before the fault is not its start; a
    flapping rank's regular gaps are kept)."""
    at = [a for a in e.hits_at if a >= e.onset]
    if len(at) < 3 or at[0] != e.onset:
        return e.onset
    gaps = np.diff(at)
    typical = float(np.median(gaps[1:]))
    i = 0
    while i < len(gaps) - 1 and gaps[i] > typical:
        i += 1
    return int(at[i])


def _drop_before_onset(e: Episode) -> None:
    """The sightings before a confirmed episode's onset (blips that were not the fault yet)
    leave its count, and their share of its cost with them (severity is decided on all)."""
    before = sum(1 for a in e.hits_at if a < e.onset)
    if before and e.hits > before:
        keep = (e.hits - before) / e.hits
        e.hits -= before
        e.added_ms_sum *= keep
        e.gpu_hours *= keep


def _escalate(state: JobState, e: Episode, sf: StepFindings, cfg: DiagnoserConfig) -> Anomaly | None:
    """A confirmed warning that has now been seen long enough to page: sent again at once as
    a page (a page never turns back into a warning)."""
    if e.severity == "page" or e.reported == _SILENT or not e.emitted:
        return None
    streak = streak_length(state) if e.suspect_kind in STREAK_KINDS else 0
    if _severity(e, cfg, _page_hits(cfg, state.n_ranks, e.level, streak), sf.step_ms, streak) != "page":
        return None
    if _page_withheld(state, e, cfg):
        return None
    e.severity, e.reported = "page", sf.step
    return _anomaly(state, e)


def _page_withheld(state: JobState, e: Episode, cfg: DiagnoserConfig) -> bool:
    """Whether a fault that would page stays a warning: a rank's (or ranks'), found by its
    peers, with no second witness (where change points follow each rank, its own past shows no change:
    heavy-tailed noise near a unit root runs a rank far from its peers for a few steps now
    and then, and each run paged; a fault's own change opens within a few steps and the
    warning becomes a page). In a small job, its own past leads: no page either while it
    is still learning (a worker 1.19x slower than its peers all along, crossing their line
    in half the steps, was first seen seven steps past the warm-up and paged)."""
    if e.change_onset >= 0:
        return False
    small = cfg.change_points and max(state.n_ranks, len(e.ranks)) < cfg.small_job
    return own_past_silent(state.changes, e, cfg, kinds=("rank", "ranks"), learning=small)


def _recurring(state: JobState, key: str, e: Episode, cfg: DiagnoserConfig) -> Episode | None:
    """The anomaly of ``key`` that closed lately, if ``e`` (just confirmed) is that fault
    back: a flapping rank, a job-wide change that wavers about its threshold. It came within
    ``recur_within`` steps and within twice the last stretch. Forgets what closed too long
    ago."""
    for k, was in list(state.closed.items()):
        if e.onset - was.last_seen > remembered(was, cfg):
            del state.closed[k]
    if key not in state.closed and group_change(e):  # a group back with some of its ranks
        key = next((k for k, was in state.closed.items() if group_change(was) and _most(e, was)), key)
    old = state.closed.get(key)
    if old is None or e.onset - old.last_seen > 2 * (old.last_seen - old.onset + 1):
        return None
    return state.closed.pop(key)


def _most(e: Episode, was: Episode) -> bool:
    """Whether most of ``e``'s ranks are ``was``'s (a flapping group's ranks do not all
    open their changes again each time)."""
    return 2 * len(set(e.ranks) & set(was.ranks)) > len(e.ranks)


def _continue(old: Episode, e: Episode, cfg: DiagnoserConfig) -> Episode:
    """``old`` (an anomaly closed lately) taking in ``e``, the same fault back: one anomaly,
    its id and onset kept, its window, sightings and cost grown (by the steps past the old
    window only: a change sighted counts the steps since its onset, which it may share)."""
    share = min(e.hits, max(e.last_seen - old.last_seen, 0)) / max(e.hits, 1)
    old.last_seen, old.idle = e.last_seen, 0
    old.hits += round(share * e.hits)
    old.hits_at = [*old.hits_at, *e.hits_at][-8:]
    old.added_at = [*old.added_at, *e.added_at][-LEVEL_SIGHTINGS:]
    old.share_at = [*old.share_at, *e.share_at][-LEVEL_SIGHTINGS:]
    old.added_ms_sum += share * e.added_ms_sum
    old.gpu_hours += share * e.gpu_hours
    if e.score >= old.score:
        old.score = e.score
        old.evidence.update(e.evidence)
    old.ranks = sorted(set(old.ranks) | set(e.ranks))[: cfg.max_listed]
    return old


def _deepen(e: Episode, deepen: Deepen) -> bool:
    """One try at the kernel level for a confirmed episode: True when its kernels or stacks
    explained it now (its level becomes ``kernel``; no more tries), else one try fewer; no
    data yet (its sketches late, or not collected) costs no try."""
    found = deepen(e.ranks[:3], e.peers, e.onset)
    if found is None:
        return False
    e.deepen_left -= 1
    e.evidence.update(found.evidence)
    if not found.explained:
        return False
    e.level, e.detail, e.deepen_left = "kernel", found.summary, 0
    return True


def deepen_late(state: JobState, step: int, deepen: Deepen) -> list[Anomaly]:
    """Another try at the kernel level for confirmed episodes it has not explained yet and
    not reported this step: the anomalies it explained now."""
    out = []
    for e in state.episodes.values():
        if e.emitted and e.deepen_left > 0 and e.reported != step and _deepen(e, deepen):
            e.reported = step
            out.append(_anomaly(state, e))
    return out


def unsighted(
    state: JobState, seen: set[str], weak: set[int], verdict: IterationVerdict, cfg: DiagnoserConfig
) -> list[Anomaly]:
    """Episodes not sighted this step wait one step more, or close: a confirmed one still near
    its threshold stays open (hysteresis: its window ends at its last clear sighting); one
    past its patience closes (its final anomaly, or a transient); one of a rank slow every
    k-th step stays open while its spikes keep their rhythm. The anomalies closed."""
    out = []
    changing = {int(r) for r in np.flatnonzero(state.changes.period[0] >= 0)}
    for key, e in list(state.episodes.items()):
        if key in seen:
            continue
        if e.emitted and (_near(e, weak, verdict, cfg) or (e.change_onset >= 0 and changing & set(e.ranks))):
            e.idle = 0
            continue
        e.idle += 1
        if e.idle > _patience(e, cfg):
            state.episodes.pop(key)
            out += _close(state, key, e, cfg)
    return out


def _near(e: Episode, weak: set[int], verdict: IterationVerdict, cfg: DiagnoserConfig) -> bool:
    """Whether a confirmed episode not sighted this step is still near its threshold: half
    of its ranks weakly flagged, or for a job-level one the step time half as far out."""
    if e.cause in ONE_OFF_CAUSES:
        return False
    if e.level == "iteration":
        return verdict.near(cfg.weak_frac)
    return bool(weak) and 2 * sum(r in weak for r in e.ranks) >= len(e.ranks) > 0


def _patience(e: Episode, cfg: DiagnoserConfig) -> int:
    """Steps without a sighting before an episode closes: longer for a straggler since the
    start, and for a confirmed fault seen every few steps (a flapping rank) twice its
    typical gap."""
    if e.persistent:
        return cfg.persistent_close_after
    if e.emitted and "period_steps" in e.evidence:  # slow every k-th step: until a beat is missed
        return int(e.evidence["period_steps"]) + cfg.close_after
    if not e.emitted or e.hits < 2:
        return cfg.close_after
    gap = (e.last_seen - e.onset) / (e.hits - 1)
    return int(min(max(cfg.close_after, np.ceil(2.0 * gap)), 4 * cfg.close_after))


_SHORT = 20
"""Steps from its first sighting to its last within which a closed episode is a streak."""
_RHYTHM = 4
"""Short unconfirmed episodes of one key, evenly apart, that the next one makes a fault of
every k-th step."""
_MAX_PERIOD = 64


def _rhythm(state: JobState, key: str, e: Episode, sf: StepFindings) -> bool:
    """Whether a new episode's first sighting keeps the rhythm of the last ``_RHYTHM`` short
    ones of its key (gaps of at least three steps, at most ``_MAX_PERIOD``, within a step of
    each other): a rank or group slow on every k-th step, each a blip that alone is a
    transient. If so the episode takes them in: its onset the first, its sightings theirs,
    its period in the evidence (one anomaly over the whole span). The whole job slow on
    every k-th step is its schedule (an evaluation, a checkpoint every so many steps): its
    blips stay transients, counted, no anomaly (a warning on four quiet jobs' logs)."""
    if e.hits != 1 or e.cause in ONE_OFF_CAUSES or e.level == "iteration":
        return False  # the whole job slow every k-th step is its schedule: transients
    at = [*state.blips.get(key, [])[-_RHYTHM:], sf.step]
    if len(at) <= _RHYTHM:
        return False
    gaps = np.diff(at)
    if gaps.min() < 3 or gaps.max() > _MAX_PERIOD or gaps.max() - gaps.min() > 1:
        return False
    own = e.ranks[0] if e.suspect_kind == "rank" and e.ranks else -1
    if shared_rhythm(state.changes, int(np.median(gaps)), own):  # the schedule, clocks drifting
        return False
    e.onset, e.hits, e.hits_at = at[0], len(at), at
    e.added_ms_sum *= len(at)
    e.gpu_hours *= len(at)
    e.added_at, e.share_at = e.added_at * len(at), e.share_at * len(at)
    e.evidence["period_steps"] = float(np.median(gaps))
    state.blips.pop(key, None)
    return True


def _close(state: JobState, key: str, e: Episode, cfg: DiagnoserConfig) -> list[Anomaly]:
    """A closed episode: its final anomaly, kept a while to be continued if the same fault
    comes back (a one-off or persistent one aside); an unconfirmed one counts as a transient
    (and a short one's start is kept, :func:`_rhythm`)."""
    # a short run of a rank's noise, not a short fault: a page was decided one
    short = e.last_seen - e.onset < _SHORT and not (e.emitted and e.severity == "page")
    if e.suspect_kind in STREAK_KINDS and short:
        state.streaks = [*state.streaks[-(STREAKS - 1) :], e.hits]
    if not e.emitted:
        _count_transient(state, e, cfg)
        if e.hits <= 2:
            if key not in state.blips and len(state.blips) >= cfg.max_open:  # the stalest goes
                del state.blips[min(state.blips, key=lambda k: state.blips[k][-1])]
            state.blips[key] = [*state.blips.get(key, [])[-_RHYTHM:], e.onset]
        return []
    if e.reported == _SILENT:  # remembered: the baseline back is the baseline
        state.closed[key] = e
        _cap_closed(state, cfg)
        return []
    if e.cause not in ONE_OFF_CAUSES and not e.persistent:
        state.closed[key] = e
        _cap_closed(state, cfg)
    return [_anomaly(state, e)]


def _cap_closed(state: JobState, cfg: DiagnoserConfig) -> None:
    """At most ``max_open`` closed episodes remembered: the one seen longest ago goes."""
    if len(state.closed) > cfg.max_open:
        del state.closed[min(state.closed, key=lambda k: state.closed[k].last_seen)]


def _shown(e: Episode) -> str:
    """The suspect an episode is shown as: ranks of a job of one group flagged together by
    their ranks (``ranks:4-6,8``; its id keeps ``ranks``)."""
    return "ranks:" + ranks_label(sorted(e.ranks)) if e.suspect == "ranks" and e.ranks else e.suspect


def _count_transient(state: JobState, e: Episode, cfg: DiagnoserConfig) -> None:
    """An unconfirmed episode closed: one more transient of its suspect (as shown: a blip of
    several ranks names them), its steps kept."""
    name = _shown(e)
    if name in state.transients or len(state.transients) < cfg.max_open:
        state.transients[name] = state.transients.get(name, 0) + 1
        at = state.transient_at.get(name, [])
        state.transient_at[name] = [*at[1 - TRANSIENTS_KEPT :], (e.onset, e.last_seen)]
        state.transient_kinds[name] = e.suspect_kind


def _absorb_transients(state: JobState, e: Episode) -> None:
    """The blips of an anomaly's suspect, or of one of its ranks, inside its window were
    its fault (an onset dated back to where a change began covers blips counted before
    it was confirmed): they leave the transients ("never an anomaly")."""
    names = {_shown(e), *(f"rank:{r}" for r in e.ranks)}
    for name in names & state.transients.keys():
        at = state.transient_at.get(name, [])
        keep = [w for w in at if not (e.onset <= w[0] and w[1] <= e.last_seen)]
        if len(keep) == len(at):
            continue
        left = state.transients[name] - (len(at) - len(keep))
        if left > 0:
            state.transients[name], state.transient_at[name] = left, keep
        else:
            for held in (state.transients, state.transient_at, state.transient_kinds):
                held.pop(name, None)


def forget_stale(state: JobState, cfg: DiagnoserConfig) -> None:
    """At most ``max_open`` episodes: the unconfirmed ones seen longest ago go."""
    if len(state.episodes) > cfg.max_open:
        stale = sorted((e.last_seen, k) for k, e in state.episodes.items() if not e.emitted)
        for _, k in stale[: len(state.episodes) - cfg.max_open]:
            state.episodes.pop(k)


def refresh(state: JobState, deepen: Deepen | None = None) -> list[Anomaly]:
    """The current version of every confirmed anomaly whose window grew since it was last
    sent: for a job that stopped sending steps (it ended, or hangs), so that its anomalies'
    windows and costs are right without waiting for steps that will not come. ``deepen``
    gives the kernel level another try at every confirmed episode it has not explained yet
    (its sketches came after the job's last step); one it explains now is in the list too,
    ``level="kernel"``. Updates ``state`` (what was sent)."""
    out = []
    for e in state.episodes.values():
        if not e.emitted:
            continue
        explained = deepen is not None and e.level != "kernel" and e.deepen_left > 0 and _deepen(e, deepen)
        if e.reported < e.last_seen or explained:
            e.reported = e.last_seen
            out.append(_anomaly(state, e))
    return out


def flush(state: JobState, cfg: DiagnoserConfig, deepen: Deepen | None = None) -> list[Anomaly]:
    """Close every open episode (the end of the job): the final version of each confirmed
    one (:meth:`detectors.JobDiagnoser.flush`)."""
    st = state
    out = []
    for e in st.episodes.values():
        need = _sightings_needed(cfg, st.n_ranks, e.level)
        if not e.emitted and 0 < st.steps < need and e.hits >= st.steps:
            e.emitted, e.severity, e.detected_ns = True, _severity(e, cfg, st.steps), st.last_end_ns
        if e.emitted and deepen is not None and e.level != "kernel" and e.suspect_kind in _DEEP_KINDS:
            _deepen(e, deepen)
        if e.emitted and e.reported != _SILENT:
            out.append(_anomaly(st, e))
    st.episodes.clear()
    return out
