"""Which episode a finding is a sighting of: the open episode of its ranks (same cause
family; a host or link episode before a rank's own), a group's ranks given back to the
confirmed episodes they already have, and a new group episode taking over its ranks' open
ones."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from argus.schemas.causes import COMPUTE_STRAGGLER, MASKED_COMPUTE_STRAGGLER

from ._config import DiagnoserConfig
from ._finding import Finding
from ._state import _SILENT, Episode, JobState
from .common_cause import CHANGE_FIGURE, ONSET_SPREAD, OPENED, began_together

_GROUP_KINDS = ("host", "link", "ranks")


def _family(cause: str) -> str:
    """Causes that are one fault seen two ways (a straggler whose time the timers see on
    some steps and not on others) share a family."""
    return COMPUTE_STRAGGLER if cause == MASKED_COMPUTE_STRAGGLER else cause


def _group_index(state: JobState) -> dict[tuple[str, int], str]:
    """(cause family, rank) -> key of the open episode the rank belongs to (a host or link
    episode before a rank's own). Ranks of a group across hosts belong to it once it is
    confirmed: before, they are whichever ranks a step flagged, and noise that moves about
    a large group would add up to one sustained fault. The same for a host before it is
    confirmed: a blip of one of its ranks is no sighting of the host. Ranks whose own
    changes began together are theirs from the first (each rank's own evidence, not a
    step's flags: four workers slowed together were two anomalies sharing one). A
    baseline's ranks stay its own (a speed group's slower replica): four hosts slowed
    together, some of their ranks of that replica, were sighted by those ranks' baseline
    for the 136 steps the job had left once the fault ended."""
    out: dict[tuple[str, int], str] = {}
    for k, e in sorted(
        state.episodes.items(), key=lambda kv: (kv[1].reported == _SILENT, kv[1].suspect_kind in _GROUP_KINDS)
    ):
        if k.endswith("|change"):  # a change from a baseline: its own test's sightings only
            continue
        if e.suspect_kind not in ("ranks", "host") or e.emitted or e.decided_by == CHANGE_FIGURE:
            out.update({(_family(e.cause), r): k for r in e.ranks})
    return out


def _route(f: Finding, groups: Mapping[tuple[str, int], str]) -> str:
    """The episode a finding adds to: the open episode of its ranks (same cause family),
    else its own."""
    if f.decided_by == CHANGE_FIGURE:  # a change of ranks that already have an episode adds to it
        members = set(f.ranks)  # whatever the step's classifier named it: it saw the phases
        return next((k for (_, r), k in groups.items() if r in members), f.key)
    if f.suspect_kind in ("rank", "link", "host"):
        for r in f.ranks:
            key = groups.get((_family(f.cause), r))
            if key is not None and (f.suspect_kind != "host" or key.endswith(f"|{f.suspect}")):
                return key
    return f.key


def _confirmed_open(state: JobState, f: Finding, groups: Mapping[tuple[str, int], str]) -> bool:
    """Whether ``f`` is a sighting of an open, confirmed episode (on a step every rank is slow,
    a straggler that still stands out among them is still that fault: its window goes on)."""
    e = state.episodes.get(_route(f, groups))
    return e is not None and e.emitted


def _absorb(state: JobState, key: str, group: Episode) -> None:
    """A new host or link episode takes over the open, unconfirmed episodes of its ranks
    (same cause family): the fault's onset is the earliest sighting of any of them."""
    fam = _family(group.cause)
    members = set(group.ranks)
    for k, e in list(state.episodes.items()):
        if k == key or e.emitted or _family(e.cause) != fam or not set(e.ranks) <= members:
            continue
        if e.suspect_kind not in ("rank", "link"):
            continue
        state.episodes.pop(k)
        group.onset = min(group.onset, e.onset)
        group.hits = max(group.hits, e.hits)
        group.persistent = group.persistent or e.persistent


def _split(
    f: Finding, groups: Mapping[tuple[str, int], str], state: JobState, cfg: DiagnoserConfig
) -> list[Finding]:
    """A host or multi-rank finding whose ranks already have confirmed episodes of their
    own (another fault, found earlier) gives those ranks back to them; what is left stays a
    group when large enough, else becomes per-rank findings. A change of ranks that began
    with one's confirmed change (:func:`grown_from`) is not split: it is that fault, grown."""
    if f.suspect_kind not in ("host", "ranks") or grown_from(state, f, groups, cfg) is not None:
        return [f]
    fam = _family(f.cause)
    taken = []
    for r in f.ranks:
        k = groups.get((fam, r))
        if k is not None and k != f.key and (state.episodes[k].emitted or state.episodes[k].persistent):
            taken.append(r)
    if not taken:
        return [f]
    rest = [r for r in f.ranks if r not in taken]
    out = [_as_rank(f, r) for r in taken]
    if len(rest) >= cfg.host_min_ranks or (rest and f.key in state.episodes):
        out.append(dataclasses.replace(f, ranks=tuple(rest)))
    else:
        out.extend(_as_rank(f, r) for r in rest)
    return out


def grows(e: Episode, f: Finding, cfg: DiagnoserConfig) -> bool:
    """Whether change finding ``f`` is episode ``e``'s fault, seen whole or from another
    side: at least half of ``e``'s ranks among its own, its change begun within
    ``cp_onset_within`` steps of ``e``'s onset (or as :func:`common_cause.began_together` says) (the first member's change opened a few
    steps before the others'; a member's change on noisy samples closes for a step and
    opens again, and the group is seen without it: four workers slowed together were two
    anomalies, ``ranks:5-6,9`` and ``rank:2``)."""
    onset = f.evidence.get("change_onset")
    shared = len(set(e.ranks) & set(f.ranks))
    return (
        f.decided_by == CHANGE_FIGURE
        and onset is not None
        and shared > 0
        and 2 * shared >= len(e.ranks)
        and bool(
            began_together(
                cfg,
                onset,
                f.evidence.get(ONSET_SPREAD, 0.0),
                f.evidence.get(OPENED, -1.0),
                e.onset,
                e.evidence.get(ONSET_SPREAD, 0.0),
                e.evidence.get(OPENED, -1.0),
            )
        )
    )


def grown_from(
    state: JobState, f: Finding, groups: Mapping[tuple[str, int], str], cfg: DiagnoserConfig
) -> str | None:
    """The key of the confirmed episode of one of a change finding's ranks that ``f``
    :func:`grows` (None if there is none)."""
    if f.decided_by != CHANGE_FIGURE or len(f.ranks) < 2:
        return None
    for r in f.ranks:
        k = groups.get((_family(f.cause), r))
        e = state.episodes.get(k) if k is not None else None
        if e is not None and e.emitted and grows(e, f, cfg):
            return k
    return None


def _as_rank(f: Finding, r: int) -> Finding:
    return dataclasses.replace(f, suspect_kind="rank", suspect=f"rank:{r}", ranks=(r,))


def group_change(e: Episode) -> bool:
    """Whether an episode is the change of several ranks together (one cause)."""
    return e.change_onset >= 0 and len(e.ranks) > 1


def remembered(e: Episode, cfg: DiagnoserConfig) -> int:
    """Steps a closed episode is remembered: ``recur_within``; a baseline (silent) or the
    change of a group as long as it lasted, if longer: a slower rank or speed group goes
    unflagged while other ranks slow down (a fault of a few, a shared stretch), and is
    still the baseline when they are back; a group flapping slowly is still that group."""
    if e.reported == _SILENT or group_change(e):
        return max(cfg.recur_within, e.last_seen - e.onset + 1)
    return cfg.recur_within
