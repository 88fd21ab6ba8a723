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
progress points, :func:`detect_hang` decides, :func:`hang_anomalies` names it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.schemas import Anomaly, Heartbeat, HeartbeatBatch
from argus.schemas.causes import HANG, LOST_RANK

from ._finding import anomaly_id
from .cost import gpu_hours

__all__ = [
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

_NONE = np.iinfo(np.int64).max


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


class _Interner:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def __call__(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i

    def many(self, names: list[str]) -> list[int]:
        """The ids of many names (one dict lookup each; new names interned)."""
        ids = list(map(self.ids.get, names))
        if None in ids:
            ids = [self(n) for n in names]
        return ids  # type: ignore[return-value]


class HangState:
    """The latest heartbeat of every rank of one job run, as columns; progress points.

    ``observe`` is the only mutation; ranks are row indices (grown on demand). Per rank:
    ``time_ns`` / ``prev_ns`` (its last two heartbeats), ``last_step``, ``host``, ``stack``,
    the declared ``pause`` / ``pause_until``; per rank and group slot: group id ``gid``
    (-1: none), sequence numbers ``ent`` / ``fin``, the last collective's ``kind`` id and
    ``nbytes``.
    """

    time_ns: np.ndarray
    prev_ns: np.ndarray
    last_step: np.ndarray
    pause_until: np.ndarray
    host: np.ndarray
    stack: np.ndarray
    pause: np.ndarray
    gid: np.ndarray
    ent: np.ndarray
    fin: np.ndarray
    kind: np.ndarray
    nbytes: np.ndarray

    def __init__(self, job: str, run: int = 0, *, progress_points: int = 64) -> None:
        self.job = job
        self.run = run
        self.groups = _Interner()
        self.kinds = _Interner()
        self.n = 0
        self.width = 0
        self._alloc(0, 0)
        self.max_step = -1
        self.first_ns = 0
        self.progress: deque[tuple[int, int]] = deque(maxlen=max(progress_points, 2))
        self._cache: dict[tuple[int, tuple[str, ...]], tuple[int, ...]] = {}

    def _alloc(self, n: int, width: int) -> None:
        old = self.__dict__.get("time_ns")
        cols = {
            "time_ns": np.zeros(n, np.int64),
            "prev_ns": np.zeros(n, np.int64),
            "last_step": np.full(n, -1, np.int64),
            "pause_until": np.zeros(n, np.int64),
            "host": np.full(n, "", object),
            "stack": np.full(n, "", object),
            "pause": np.full(n, "", object),
        }
        mats = {
            "gid": np.full((n, width), -1, np.int64),
            "ent": np.zeros((n, width), np.int64),
            "fin": np.zeros((n, width), np.int64),
            "kind": np.full((n, width), -1, np.int64),
            "nbytes": np.zeros((n, width), np.int64),
        }
        if old is not None:
            for k, v in cols.items():
                v[: self.n] = getattr(self, k)
            for k, m in mats.items():
                m[: self.n, : self.width] = getattr(self, k)
        self.__dict__.update(cols)
        self.__dict__.update(mats)
        self.n, self.width = n, width

    @property
    def seen(self) -> np.ndarray:
        """Rows (ranks) that sent at least one heartbeat."""
        seen: np.ndarray = self.time_ns > 0
        return seen

    def observe(self, beats: Iterable[Heartbeat]) -> int:
        """Take heartbeats (any order; older than a rank's latest are ignored); return how many."""
        latest: dict[int, Heartbeat] = {}
        for b in beats:
            if b.job != self.job or b.run != self.run:
                continue
            cur = latest.get(b.rank)
            if cur is None or b.time_ns > cur.time_ns:
                latest[b.rank] = b
            if not self.first_ns:
                self.first_ns = b.time_ns
            if b.last_step > self.max_step:
                self.max_step = b.last_step
                self.progress.append((b.time_ns, b.last_step))
        if not latest:
            return 0
        width = max(len(b.groups) for b in latest.values())
        top = max(latest)
        if top >= self.n or width > self.width:
            self._alloc(max(self.n, top + 1, 2 * self.n if top >= self.n else 0), max(self.width, width))
        fresh = [b for b in latest.values() if b.time_ns > self.time_ns[b.rank]]
        rows = np.array([b.rank for b in fresh], np.int64)
        if not len(rows):
            return 0
        w = self.width
        self.prev_ns[rows] = self.time_ns[rows]
        self.time_ns[rows] = [b.time_ns for b in fresh]
        self.last_step[rows] = [b.last_step for b in fresh]
        self.pause_until[rows] = [b.pause_until_ns for b in fresh]
        for name in ("host", "stack", "pause"):
            col = np.empty(len(fresh), object)
            col[:] = [getattr(b, name) for b in fresh]
            getattr(self, name)[rows] = col

        def pad(values: list[tuple[int, ...]], fill: int) -> np.ndarray:
            return np.array([v + (fill,) * (w - len(v)) for v in values], np.int64).reshape(len(values), w)

        self.gid[rows] = pad([self._ids(self.groups, b.groups) for b in fresh], -1)
        self.kind[rows] = pad([self._ids(self.kinds, b.kinds) for b in fresh], -1)
        self.ent[rows] = pad([b.seq_entered for b in fresh], 0)
        self.fin[rows] = pad([b.seq_finished for b in fresh], 0)
        self.nbytes[rows] = pad([b.nbytes for b in fresh], 0)
        return len(fresh)

    def observe_batch(self, batch: HeartbeatBatch) -> int:
        """Take a batch of heartbeats of this job run in one vectorized pass (rows in any
        order, a rank's latest kept; older than a rank's latest are ignored, as in
        :meth:`observe`); return how many rows were taken. A batch of another job run is
        ignored."""
        if batch.job != self.job or batch.run != self.run or not len(batch):
            return 0
        rank, t = batch["rank"], batch["time_ns"]
        if len(rank) > 1:  # the latest row of each rank
            order = np.lexsort((t, rank))
            last = np.ones(len(order), bool)
            last[:-1] = rank[order[1:]] != rank[order[:-1]]
            pick = order[last]
        else:
            pick = np.zeros(1, np.int64)
        steps = batch["last_step"]
        top_row = int(np.argmax(steps))
        if not self.first_ns:
            self.first_ns = int(t[0])
        if int(steps[top_row]) > self.max_step:
            self.max_step = int(steps[top_row])
            self.progress.append((int(t[top_row]), self.max_step))
        top, width = int(rank.max()), int(batch["ngroups"].max())  # padding beyond is not kept
        if top >= self.n or width > self.width:
            self._alloc(max(self.n, top + 1, 2 * self.n if top >= self.n else 0), max(self.width, width))
        rows = rank[pick]
        fresh = t[pick] > self.time_ns[rows]
        if not fresh.all():
            pick, rows = pick[fresh], rows[fresh]
        if not len(rows):
            return 0
        self.prev_ns[rows] = self.time_ns[rows]
        self.time_ns[rows] = t[pick]
        self.last_step[rows] = steps[pick]
        self.pause_until[rows] = batch["pause_until_ns"][pick]
        for name in ("host", "stack", "pause"):
            getattr(self, name)[rows] = batch[name][pick]
        if self.width:
            k = batch["ngroups"][pick]
            used = np.arange(width) < k[:, None]  # the slots a row's groups fill
            for mat, names, interner in (("gid", "groups", self.groups), ("kind", "kinds", self.kinds)):
                ids = np.full((len(rows), self.width), -1, np.int64)
                if width:
                    text = batch[names][pick, :width]
                    ids[:, :width][used] = interner.many(text[used].tolist())
                getattr(self, mat)[rows] = ids
            for mat in ("ent", "fin", "nbytes"):
                vals = np.zeros((len(rows), self.width), np.int64)
                if width:
                    vals[:, :width] = np.where(used, batch[_SLOT_COLUMN[mat]][pick, :width], 0)
                getattr(self, mat)[rows] = vals
        return len(rows)

    def _ids(self, interner: _Interner, names: tuple[str, ...]) -> tuple[int, ...]:
        key = (id(interner), names)
        ids = self._cache.get(key)
        if ids is None:
            ids = self._cache[key] = tuple(interner(x) for x in names)
        return ids

    def step_s(self) -> float:
        """The job's step time: the median over its progress points of time per step (0 before two)."""
        if len(self.progress) < 2:
            return 0.0
        pts = np.array(self.progress, np.float64)
        per_step = np.diff(pts[:, 0]) / 1e9 / np.maximum(np.diff(pts[:, 1]), 1)
        return float(np.median(per_step))  # robust to one late or early progress point

    def interval_s(self) -> float:
        """The median gap between the last two heartbeats of a rank (0 before any)."""
        both = (self.prev_ns > 0) & (self.time_ns > 0)
        if not both.any():
            return 0.0
        return float(np.median(self.time_ns[both] - self.prev_ns[both])) / 1e9


_SLOT_COLUMN = {"ent": "seq_entered", "fin": "seq_finished", "nbytes": "nbytes"}


def batch_refusals(
    state: HangState,
    joined: HeartbeatBatch,
    lengths: Sequence[int],
    rank_slack: int = 1024,
    max_groups: int = 64,
) -> list[tuple[int, str, str]]:
    """Which batches of one job a hang state must refuse, as (index, reason, detail), given
    their rows ``joined`` in one batch and each one's number of rows: the state is as many
    rows as the largest rank and as wide as the most groups, so a batch claiming a rank
    beyond ``2 × max(ranks seen, ranks here) + rank_slack`` (``absurd_rank``) or more than
    ``max_groups`` groups (``too_many_groups``) would make it grow with a claim (pure; the
    same bounds as the worker's per-heartbeat admission)."""
    seen = int(np.count_nonzero(state.seen))
    ranks = joined["rank"]
    bound = 2 * max(seen, len(np.unique(ranks))) + rank_slack
    if not len(ranks) or (int(ranks.max()) < bound and int(joined["ngroups"].max()) <= max_groups):
        return []
    starts = np.cumsum([0, *lengths[:-1]])
    tops = np.maximum.reduceat(ranks, starts)
    widest = np.maximum.reduceat(joined["ngroups"], starts)
    out = []
    for i in np.flatnonzero((tops >= bound) | (widest > max_groups)).tolist():
        if tops[i] >= bound:
            out.append((i, "absurd_rank", f"rank {tops[i]}: the job showed {seen} ranks"))
        else:
            out.append((i, "too_many_groups", f"{widest[i]} groups, limit {max_groups}"))
    return out


def observe_heartbeats(
    states: MutableMapping[tuple[str, int], HangState],
    records: Sequence[tuple[Heartbeat | HeartbeatBatch, Any]],
    *,
    rank_slack: int = 1024,
    max_groups: int = 64,
    progress_points: int = 64,
    max_jobs: int = 16_384,
) -> tuple[int, list[tuple[Any, str, str]]]:
    """Feed a consumer batch of heartbeats and heartbeat batches (each with its token) to
    the job states, one vectorized pass per job: the job's single heartbeats become one
    batch, concatenated with its node batches. Returns the heartbeats taken and the refused
    records' tokens with a reason (``absurd_rank``, ``too_many_groups``: see
    :func:`batch_refusals`). ``states`` is ordered least recently seen first and kept to
    ``max_jobs`` jobs (the least recently seen dropped)."""
    by_job: dict[tuple[str, int], list[tuple[HeartbeatBatch, Any]]] = {}
    singles: dict[tuple[str, int], list[tuple[Heartbeat, Any]]] = {}
    for record, token in records:
        key = (record.job, record.run)
        if isinstance(record, HeartbeatBatch):
            by_job.setdefault(key, []).append((record, token))
        else:
            singles.setdefault(key, []).append((record, token))
            by_job.setdefault(key, [])
    taken, refused = 0, list[tuple[Any, str, str]]()
    for key, batches in by_job.items():
        state = states.pop(key, None)  # re-inserted last: least recently seen first
        if state is None:
            state = HangState(*key, progress_points=progress_points)
        states[key] = state
        parts = [b for b, _ in batches]
        joined = HeartbeatBatch.concat(parts) if parts else None
        bad = batch_refusals(state, joined, [len(p) for p in parts], rank_slack, max_groups) if joined else []
        refused.extend((batches[i][1], reason, detail) for i, reason, detail in bad)
        if bad:
            drop = {i for i, _, _ in bad}
            parts = [p for i, p in enumerate(parts) if i not in drop]
            joined = HeartbeatBatch.concat(parts) if parts else None
        if key in singles:
            ok, rejected = _admit_singles(state, singles[key], parts, rank_slack, max_groups)
            refused.extend(rejected)
            if ok:
                ones = HeartbeatBatch.from_beats(ok)
                joined = HeartbeatBatch.concat([joined, ones]) if joined else ones
        if joined is not None:
            taken += state.observe_batch(joined)
    while len(states) > max_jobs:
        del states[next(iter(states))]
    return taken, refused


def _admit_singles(
    state: HangState,
    beats: list[tuple[Heartbeat, Any]],
    parts: list[HeartbeatBatch],
    rank_slack: int,
    max_groups: int,
) -> tuple[list[Heartbeat], list[tuple[Any, str, str]]]:
    seen = int(np.count_nonzero(state.seen))
    ranks = {b.rank for b, _ in beats}.union(*(b["rank"].tolist() for b in parts))
    bound = 2 * max(seen, len(ranks)) + rank_slack
    ok: list[Heartbeat] = []
    refused: list[tuple[Any, str, str]] = []
    for beat, token in beats:
        if beat.rank >= bound:
            refused.append((token, "absurd_rank", f"rank {beat.rank}: the job showed {seen} ranks"))
        elif len(beat.groups) > max_groups:
            refused.append((token, "too_many_groups", f"{len(beat.groups)} groups, limit {max_groups}"))
        else:
            ok.append(beat)
    return ok, refused


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


@dataclass(frozen=True)
class _Graph:
    """Per-group wait state of the live ranks (arrays indexed by group id or rank)."""

    low: np.ndarray  # per group: lowest seq a member waits in (_NONE: nobody waits)
    waiters: np.ndarray  # per group: members waiting in it
    wait_step: np.ndarray  # per group: the lowest last_step of its waiters (waited longest)
    behind_n: np.ndarray  # per group: live members that have not entered it
    size: np.ndarray  # per group: members seen
    kind: np.ndarray  # per group: kind id of that collective (-1 unknown)
    nbytes: np.ndarray  # per group: its size
    blocked: np.ndarray  # per rank: waiting in some collective
    behind: np.ndarray  # per rank: behind in some group
    r: np.ndarray  # entries: rank
    g: np.ndarray  # entries: group
    is_behind: np.ndarray  # entries: this rank is behind in this group


def _graph(st: HangState, live: np.ndarray) -> _Graph:
    ng = len(st.groups.names)
    valid = (st.gid >= 0) & live[:, None]
    r = np.nonzero(valid)[0]
    g, ent, fin = st.gid[valid], st.ent[valid], st.fin[valid]
    kind, nb = st.kind[valid], st.nbytes[valid]
    inflight = ent > fin
    low = np.full(ng, _NONE, np.int64)
    np.minimum.at(low, g[inflight], fin[inflight] + 1)
    waiting = inflight & (fin + 1 == low[g])
    is_behind = (low[g] != _NONE) & (ent < low[g])
    wait_step = np.full(ng, _NONE, np.int64)
    np.minimum.at(wait_step, g[waiting], st.last_step[r[waiting]])
    gkind = np.full(ng, -1, np.int64)
    gbytes = np.zeros(ng, np.int64)
    exact = waiting & (ent == low[g])  # its last entered collective is the one waited in
    for sel in (waiting, exact):
        gkind[g[sel]] = kind[sel]
        gbytes[g[sel]] = nb[sel]
    all_g = st.gid[st.gid >= 0]
    blocked = np.zeros(st.n, bool)
    blocked[r[inflight]] = True
    behind = np.zeros(st.n, bool)
    behind[r[is_behind]] = True
    return _Graph(
        low,
        np.bincount(g[waiting], minlength=ng),
        wait_step,
        np.bincount(g[is_behind], minlength=ng),
        np.bincount(all_g, minlength=ng),
        gkind,
        gbytes,
        blocked,
        behind,
        r,
        g,
        is_behind,
    )


def _pick(gr: _Graph, groups: np.ndarray) -> tuple[int, dict[str, float]]:
    """Of candidate groups, the one waited in longest (its waiters' lowest last step),
    then the one with most waiters; with its figures."""
    if not len(groups):
        return -1, {}
    order = np.lexsort((-gr.waiters[groups], gr.wait_step[groups]))
    best = int(groups[order[0]])
    return best, {
        "seq": float(gr.low[best]),
        "nbytes": float(gr.nbytes[best]),
        "waiting_ranks": float(gr.waiters[best]),
        "group_size": float(gr.size[best]),
    }


def _collective(gr: _Graph, ranks: np.ndarray) -> tuple[int, dict[str, float]]:
    """The collective the given (live) ranks have not entered while peers wait in it."""
    sel = gr.is_behind & np.isin(gr.r, ranks) if len(gr.r) else np.zeros(0, bool)
    return _pick(gr, np.unique(gr.g[sel]))


def _lost_peers(st: HangState, gr: _Graph, lost: np.ndarray) -> tuple[int, dict[str, float]]:
    """For lost ranks (stale sequence numbers): the collective live peers wait for them in."""
    rows = np.flatnonzero(lost)
    gids = st.gid[rows]
    low = gr.low[np.maximum(gids, 0)]
    ok = (gids >= 0) & (low != _NONE) & (st.ent[rows] <= low)
    return _pick(gr, np.unique(gids[ok]))


def _finding(
    st: HangState,
    gr: _Graph,
    cause: str,
    kind: str,
    suspect: str,
    ranks: np.ndarray,
    gid: int,
    figures: dict[str, float],
    base: dict[str, float],
) -> HangFinding:
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
    evidence = {**base, **figures}
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
        Heartbeats are compared with ``now_ns`` across hosts: clock skew adds to (or takes
        from) the stall and the heartbeat age. Sequence numbers are compared only within a
        group, so groups need not advance together.
    """
    cfg = config or HangConfig()
    st = state
    seen = st.seen
    n_seen = int(np.count_nonzero(seen))
    step_s = st.step_s()
    threshold = max(cfg.floor_s, cfg.step_factor * step_s)
    lost_s = max(cfg.lost_floor_s, cfg.lost_beats * st.interval_s())
    last = st.progress[-1][0] if st.progress else st.first_ns
    declared = seen & (st.pause != "") & (st.pause_until > 0)
    declared &= st.pause_until <= st.time_ns + int(cfg.max_pause_s * 1e9)
    paused = ""
    if declared.any():
        i = int(np.flatnonzero(declared)[np.argmax(st.pause_until[declared])])
        if st.pause_until[i] > last:
            last, paused = int(st.pause_until[i]), str(st.pause[i])
    stalled = max(0.0, (now_ns - last) / 1e9) if n_seen else 0.0
    verdict = HangVerdict(
        st.job, st.run, now_ns, stalled, threshold, step_s, lost_s, st.max_step + 1, n_seen, paused
    )
    if not n_seen or stalled <= threshold:
        return verdict
    lost = seen & ((now_ns - st.time_ns) > lost_s * 1e9)
    live = seen & ~lost
    if not live.any() or np.count_nonzero(lost) > cfg.gone_frac * n_seen:
        return HangVerdict(**{**verdict.__dict__, "gone": True})
    late = live & ((now_ns - st.time_ns) > max(cfg.late_floor_s, cfg.late_beats * st.interval_s()) * 1e9)
    if late.any():  # a rank going silent: wait until it is lost or heard from again
        return HangVerdict(**{**verdict.__dict__, "pending": int(np.count_nonzero(late))})
    base = {"stalled_s": stalled, "threshold_s": threshold, "step_s": step_s, "ranks": float(n_seen)}
    gr = _graph(st, live)
    findings: list[HangFinding] = []
    for host, rows in _by_host(st, np.flatnonzero(lost), seen):
        gid, figs = _lost_peers(st, gr, np.isin(np.arange(st.n), rows))
        age = {"heartbeat_age_s": float(now_ns - st.time_ns[rows].max()) / 1e9, "lost_s": lost_s}
        kind, name = ("host", host) if host else ("rank", f"rank:{int(rows[0])}")
        findings.append(_finding(st, gr, LOST_RANK, kind, name, rows, gid, figs, {**base, **age}))
    roots = np.flatnonzero(gr.behind & ~gr.blocked & live)
    if len(roots) and len(roots) <= cfg.max_suspects:
        for r in roots:
            gid, figs = _collective(gr, np.array([r]))
            findings.append(_finding(st, gr, HANG, "rank", f"rank:{int(r)}", np.array([r]), gid, figs, base))
    elif len(roots):
        hosts = set(st.host[roots].tolist())
        kind, name = ("host", str(hosts.pop())) if len(hosts) == 1 else ("ranks", f"{len(roots)} ranks")
        gid, figs = _collective(gr, roots)
        findings.append(_finding(st, gr, HANG, kind, name, roots, gid, figs, base))
    elif not findings:
        stuck = np.flatnonzero((gr.waiters > 0) & (gr.behind_n == 0))
        for gid in stuck[np.argsort(gr.size[stuck], kind="stable")][: cfg.max_suspects]:
            members = np.unique(gr.r[gr.g == gid])
            figs = {
                "seq": float(gr.low[gid]),
                "nbytes": float(gr.nbytes[gid]),
                "waiting_ranks": float(gr.waiters[gid]),
                "group_size": float(gr.size[gid]),
                "deadlock": 1.0,
            }
            findings.append(
                _finding(st, gr, HANG, "group", st.groups.names[gid], members, int(gid), figs, base)
            )
        if not findings:
            findings.append(_finding(st, gr, HANG, "job", "job", np.zeros(0, np.int64), -1, {}, base))
    return HangVerdict(**{**verdict.__dict__, "findings": tuple(findings)})


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
