"""Hangs and fail-stops: which rank, which collective, which group, doing what instead.

Metric first, decision second (HTA-style), over the latest heartbeat of every rank:

1. **Stall**: no rank completed a step for longer than a threshold derived from the job's
   own step time (``max(floor_s, step_factor * step_s)``, ``step_s`` measured from the
   heartbeats' ``last_step`` progress). A declared pause (heartbeat v2 ``pause`` /
   ``pause_until_ns``, e.g. a long checkpoint) moves the start of the stall clock to its
   declared end: no alarm while the job does what it said it would.
2. **Lost**: ranks whose heartbeats stopped for longer than ``max(lost_floor_s,
   lost_beats * heartbeat interval)`` (process down); all ranks of a host lost together
   are one suspect, the host. When most ranks went silent the job ended or telemetry is
   gone: no alarm.
3. **Wait-for graph** over the live ranks: per process group, the lowest collective some
   member is waiting in (``seq_finished + 1`` of a member with ``seq_entered >
   seq_finished``); members that have not entered it are *behind*. A rank behind in some
   group and waiting in none is a root (stuck outside collectives: data loading, a CUDA
   sync, a Python deadlock, which its current stack tells). Without roots, a group whose
   members all entered the collective and none finished is stuck (a send/recv deadlock, a
   broken communicator); without either, the whole job is the suspect.

Everything is a pure function of the heartbeats and ``now_ns`` (passed in, never read):
:class:`HangState` keeps the latest heartbeat per rank as numpy columns plus the job's
progress points (:mod:`._hang_state`, with the worker's admission of heartbeats,
:func:`observe_heartbeats`), :mod:`._wait_graph` builds the wait-for graph,
:func:`detect_hang` decides (this module), :func:`hang_anomalies` names it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from argus.schemas import Anomaly
from argus.schemas.causes import HANG, LOST_RANK

from ._finding import anomaly_id
from ._hang_state import ClockOffsets, HangState, batch_refusals, observe_heartbeats
from ._wait_graph import WaitGraph, behind_in, figures, stuck_groups, wait_graph, waiting_for_lost
from .cost import gpu_hours

__all__ = [
    "ClockOffsets",
    "HangConfig",
    "HangFinding",
    "HangState",
    "HangVerdict",
    "batch_refusals",
    "detect_hang",
    "hang_anomalies",
    "observe_heartbeats",
    "stack_where",
]


@dataclass(frozen=True)
class HangConfig:
    """Thresholds of the hang detector (seconds).

    The stall threshold is ``max(floor_s, step_factor * step_s)`` (``step_s``: the job's
    step time over its last ``progress_points`` progress points); a rank is lost after
    ``max(lost_floor_s, lost_beats * interval)`` without a heartbeat (``interval``: the
    median gap between a rank's last two heartbeats); while a live rank is late (no heartbeat
    for ``max(late_floor_s, late_beats * interval)``) the suspects are not named yet, since
    that rank is probably going silent (``pending``). More than ``gone_frac`` of the ranks
    lost means the job ended (no alarm). More than ``max_suspects`` roots are reported as
    one suspect (a host if they share one, else the set of ranks). A declared pause
    counts for at most ``max_pause_s`` past the heartbeat that declared it.
    """

    floor_s: float = 10.0
    step_factor: float = 10.0
    lost_floor_s: float = 10.0
    lost_beats: float = 3.0
    late_floor_s: float = 2.0
    late_beats: float = 1.5
    gone_frac: float = 0.5
    max_suspects: int = 3
    progress_points: int = 64
    max_pause_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.floor_s <= 0 or self.lost_floor_s <= 0 or self.step_factor < 0 or self.lost_beats <= 0:
            raise ValueError("HangConfig thresholds must be positive")
        if self.max_suspects < 1 or not 0 < self.gone_frac <= 1:
            raise ValueError("HangConfig.max_suspects >= 1 and 0 < gone_frac <= 1")


@dataclass(frozen=True)
class HangFinding:
    """One suspect of a hang.

    ``suspect_kind`` is ``rank``, ``host``, ``ranks`` (more roots than ``max_suspects``),
    ``group`` (a stuck collective: all members entered, none finished) or ``job``;
    ``group``/``kind``/``seq``/``nbytes`` name the collective the peers wait in (empty /
    -1 when none is known); ``where`` says what the suspect is doing instead (from its
    stack), ``stack`` is its current folded stack.
    """

    cause: str
    suspect_kind: str
    suspect: str
    ranks: tuple[int, ...]
    group: str = ""
    kind: str = ""
    seq: int = -1
    nbytes: int = 0
    waiting: int = 0
    where: str = ""
    stack: str = ""
    summary: str = ""
    evidence: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HangVerdict:
    """The decision at ``now_ns``: stalled or not, the thresholds used, the suspects.

    ``gone``: most ranks went silent (the job ended); ``pending``: ranks late with their
    heartbeat, the decision waits for them.
    """

    job: str
    run: int
    now_ns: int
    stalled_s: float
    threshold_s: float
    step_s: float
    lost_s: float
    onset_step: int
    ranks: int
    paused: str = ""
    gone: bool = False
    pending: int = 0
    findings: tuple[HangFinding, ...] = ()

    @property
    def hung(self) -> bool:
        """Whether the job is stalled past its threshold and someone is to blame."""
        return bool(self.findings)


_WHERE = (
    ("dataloader", "in data loading"),
    ("synchronize", "in a CUDA sync"),
    ("cuda", "in a CUDA call"),
    ("checkpoint", "writing a checkpoint"),
    ("torch.save", "writing a checkpoint"),
    ("threading.py:wait", "in a Python lock wait (deadlock?)"),
    ("acquire", "in a Python lock wait (deadlock?)"),
    ("queue", "waiting on a queue"),
    ("distributed_c10d.py", "in a collective"),
    ("gc:", "in garbage collection"),
    ("sleep", "sleeping"),
)


def stack_where(stack: str) -> str:
    """What a folded stack is doing, in words (by its innermost recognised frame)."""
    frames = [f for f in stack.split(";") if f]
    for frame in reversed(frames):
        low = frame.lower()
        for needle, words in _WHERE:
            if needle in low:
                return words
    return f"in {frames[-1]}" if frames else "somewhere unknown (no stack)"


def _leaf(stack: str, n: int = 2) -> str:
    return ";".join([f for f in stack.split(";") if f][-n:])


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def _finding(
    st: HangState,
    gr: WaitGraph,
    cause: str,
    kind: str,
    suspect: str,
    ranks: np.ndarray,
    gid: int,
    figs: dict[str, float],
    base: dict[str, float],
) -> HangFinding:
    """The finding of one suspect: the collective its peers wait in (group ``gid``, -1: none),
    what its stack says it does, in words (``summary``), its evidence (``base`` and ``figs``)."""
    ranks_t = tuple(int(x) for x in ranks[:64])
    pool = st.stack[st.seen].tolist() if kind == "job" else [st.stack[r] for r in ranks_t]
    stacks = [str(x) for x in pool if x]
    stack = Counter(stacks).most_common(1)[0][0] if stacks else ""
    gname = st.groups.names[gid] if gid >= 0 else ""
    ckind = st.kinds.names[int(gr.kind[gid])] if gid >= 0 and gr.kind[gid] >= 0 else ""
    seq = int(gr.low[gid]) if gid >= 0 else -1
    nbytes = int(gr.nbytes[gid]) if gid >= 0 else 0
    waiting = int(gr.waiters[gid]) if gid >= 0 else 0
    where = stack_where(stack)
    age = base.get("heartbeat_age_s", 0.0)
    coll = f"{ckind or 'collective'} #{seq} ({_size(nbytes)}) of group {gname}" if gid >= 0 else ""
    stall = f"no step for {base['stalled_s']:.0f} s (threshold {base['threshold_s']:.0f} s)"
    host = str(st.host[ranks_t[0]]) if ranks_t else ""
    if cause == LOST_RANK:
        who = f"host {suspect} (ranks {_list(ranks_t)})" if kind == "host" else f"rank {ranks_t[0]} ({host})"
        text = f"{who} lost: no heartbeat for {age:.0f} s; {stall}"
        text += f"; {waiting} peer(s) wait for it in {coll}" if coll else ""
        text += f"; last seen {where} ({_leaf(stack)})" if stack else ""
    elif kind == "group":
        text = (
            f"{coll}: all {len(ranks_t)} members entered it and none finished (a send/recv deadlock "
            f"or a broken communicator: ranks {_list(ranks_t)}); {stall}"
        )
    elif kind == "job":
        text = f"job stalled with no collective to blame: {stall}; most ranks are {where} ({_leaf(stack)})"
    else:
        who = (
            f"rank {ranks_t[0]} ({host})" if kind == "rank" else f"{kind} {suspect} (ranks {_list(ranks_t)})"
        )
        text = f"{who} never entered {coll} that {waiting} peer(s) wait in; {stall}; it is {where}"
        text += f" ({_leaf(stack)})" if stack else ""
    evidence = {**base, **figs}
    return HangFinding(
        cause, kind, suspect, ranks_t, gname, ckind, seq, nbytes, waiting, where, stack, text, evidence
    )


def _list(ranks: tuple[int, ...], n: int = 8) -> str:
    head = ", ".join(str(r) for r in ranks[:n])
    return head + (f", … ({len(ranks)} in all)" if len(ranks) > n else "")


def _by_host(st: HangState, rows: np.ndarray, seen: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """Rows grouped by host, whole hosts (≥ 2 ranks, all of its seen ranks) as one entry."""
    out: list[tuple[str, np.ndarray]] = []
    hosts = st.host[rows]
    for h in dict.fromkeys(hosts.tolist()):
        mine = rows[hosts == h]
        on_host = int(np.count_nonzero(seen & (st.host == h)))
        if h and len(mine) >= 2 and len(mine) == on_host:
            out.append((str(h), mine))
        else:
            out.extend(("", np.array([r])) for r in mine)
    return out


def detect_hang(state: HangState, now_ns: int, config: HangConfig | None = None) -> HangVerdict:
    """Decide whether the job hangs at ``now_ns`` and name its suspects (pure).

    Args:
        state: the job's latest heartbeats (:meth:`HangState.observe`).
        now_ns: the current time, ns since the epoch (the caller's clock).
        config: thresholds.

    Returns:
        A :class:`HangVerdict`; ``findings`` is empty unless the job stalled past its
        threshold and is not paused by a declaration or gone.

    Notes:
        Heartbeats are compared with ``now_ns`` across hosts: their times must be on the
        receiver's clock (the worker corrects each host's by the offset it learned from
        the stream, :class:`ClockOffsets`), or clock skew adds to (or takes from) the stall
        and the heartbeat age. Sequence numbers are compared only within a group, so
        groups need not advance together.
    """
    cfg = config or HangConfig()
    st = state
    v = _stall(st, now_ns, cfg)
    if not v.ranks or v.stalled_s <= v.threshold_s:
        return v
    lost = st.seen & ((now_ns - st.time_ns) > v.lost_s * 1e9)
    live = st.seen & ~lost
    if not live.any() or np.count_nonzero(lost) > cfg.gone_frac * v.ranks:
        return replace(v, gone=True)
    late = live & ((now_ns - st.time_ns) > max(cfg.late_floor_s, cfg.late_beats * st.interval_s()) * 1e9)
    if late.any():  # a rank going silent: wait until it is lost or heard from again
        return replace(v, pending=int(np.count_nonzero(late)))
    base = {
        "stalled_s": v.stalled_s,
        "threshold_s": v.threshold_s,
        "step_s": v.step_s,
        "ranks": float(v.ranks),
    }
    gr = wait_graph(st, live)
    findings = _lost(st, gr, lost, now_ns, v.lost_s, base) + _roots(st, gr, live, cfg, base)
    if not findings:  # nobody behind: a collective nobody finishes, or the whole job
        findings = _deadlocks(st, gr, cfg, base) or [
            _finding(st, gr, HANG, "job", "job", np.zeros(0, np.int64), -1, {}, base)
        ]
    return replace(v, findings=tuple(findings))


def _stall(st: HangState, now_ns: int, cfg: HangConfig) -> HangVerdict:
    """The metric: how long no rank completed a step (counted from the end of a declared
    pause when that is later), and the thresholds; no suspects yet."""
    n_seen = int(np.count_nonzero(st.seen))
    step_s = st.step_s()
    threshold = max(cfg.floor_s, cfg.step_factor * step_s)
    lost_s = max(cfg.lost_floor_s, cfg.lost_beats * st.interval_s())
    last, paused = _stall_start(st, cfg)
    stalled = max(0.0, (now_ns - last) / 1e9) if n_seen else 0.0
    return HangVerdict(
        st.job, st.run, now_ns, stalled, threshold, step_s, lost_s, st.max_step + 1, n_seen, paused
    )


def _stall_start(st: HangState, cfg: HangConfig) -> tuple[int, str]:
    """When the stall clock starts: the job's last progress, or the end of the latest
    declared pause (at most ``max_pause_s`` past its heartbeat) when later; and that pause."""
    last = st.progress[-1][0] if st.progress else st.first_ns
    declared = st.seen & (st.pause != "") & (st.pause_until > 0)
    declared &= st.pause_until <= st.time_ns + int(cfg.max_pause_s * 1e9)
    if declared.any():
        i = int(np.flatnonzero(declared)[np.argmax(st.pause_until[declared])])
        if st.pause_until[i] > last:
            return int(st.pause_until[i]), str(st.pause[i])
    return last, ""


def _lost(
    st: HangState, gr: WaitGraph, lost: np.ndarray, now_ns: int, lost_s: float, base: dict[str, float]
) -> list[HangFinding]:
    """A lost-rank finding per lost rank, or per host whose every rank was lost."""
    out = []
    for host, rows in _by_host(st, np.flatnonzero(lost), st.seen):
        gid, figs = waiting_for_lost(st, gr, np.isin(np.arange(st.n), rows))
        age = {"heartbeat_age_s": float(now_ns - st.time_ns[rows].max()) / 1e9, "lost_s": lost_s}
        kind, name = ("host", host) if host else ("rank", f"rank:{int(rows[0])}")
        out.append(_finding(st, gr, LOST_RANK, kind, name, rows, gid, figs, {**base, **age}))
    return out


def _roots(
    st: HangState, gr: WaitGraph, live: np.ndarray, cfg: HangConfig, base: dict[str, float]
) -> list[HangFinding]:
    """The live ranks behind in some group and waiting in none: a finding each, or one for
    all of them (their host if they share one) when more than ``max_suspects``."""
    roots = np.flatnonzero(gr.behind & ~gr.blocked & live)
    if len(roots) > cfg.max_suspects:
        hosts = set(st.host[roots].tolist())
        kind, name = ("host", str(hosts.pop())) if len(hosts) == 1 else ("ranks", f"{len(roots)} ranks")
        gid, figs = behind_in(gr, roots)
        return [_finding(st, gr, HANG, kind, name, roots, gid, figs, base)]
    out = []
    for r in roots:
        gid, figs = behind_in(gr, np.array([r]))
        out.append(_finding(st, gr, HANG, "rank", f"rank:{int(r)}", np.array([r]), gid, figs, base))
    return out


def _deadlocks(st: HangState, gr: WaitGraph, cfg: HangConfig, base: dict[str, float]) -> list[HangFinding]:
    """A finding per stuck group (all members entered, none finished), the smallest first."""
    out = []
    for gid in stuck_groups(gr, cfg.max_suspects):
        members = np.unique(gr.r[gr.g == gid])
        figs = {**figures(gr, gid), "deadlock": 1.0}
        out.append(_finding(st, gr, HANG, "group", st.groups.names[gid], members, int(gid), figs, base))
    return out


def hang_anomalies(verdict: HangVerdict) -> list[Anomaly]:
    """The verdict's findings as ``Anomaly`` records (level ``hang``).

    The id is deterministic (job, run, cause, suspect, the step that never completed), so
    re-deciding the same hang every tick gives the same ids: a consumer keeps each once.
    Cost: the stall so far (``step_ms_added``) on every rank of the job (``gpu_hours_lost``).
    """
    v = verdict
    out = []
    for f in v.findings:
        out.append(
            Anomaly(
                id=anomaly_id(v.job, v.run, f.cause, f.suspect, v.onset_step),
                job=v.job,
                run=v.run,
                start_step=v.onset_step,
                end_step=v.onset_step,
                level="hang",
                suspect_kind=f.suspect_kind,
                suspect=f.suspect,
                ranks=f.ranks,
                cause=f.cause,
                score=v.stalled_s / v.threshold_s,
                evidence={k: float(x) for k, x in f.evidence.items()},
                summary=f.summary,
                step_ms_added=v.stalled_s * 1e3,
                gpu_hours_lost=gpu_hours(v.stalled_s * 1e3, v.ranks),
                detected_ns=v.now_ns,
            )
        )
    return out
