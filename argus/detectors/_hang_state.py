"""What the hang detector remembers of a job run: the latest heartbeat of every rank, as
columns, and the job's progress points; and how a consumer batch of heartbeats gets in.

One path takes heartbeats in: rows of a :class:`~schemas.HeartbeatBatch`, one vectorized
pass (:meth:`HangState.observe_batch`). Single heartbeats become a batch first, in
:meth:`HangState.observe` (a caller's sequence of heartbeats) and in
:func:`observe_heartbeats` (the worker's consumer batch: node batches and direct
heartbeats of many jobs, each admitted by the same bounds, :func:`batch_refusals`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

import numpy as np

from argus.schemas import Heartbeat, HeartbeatBatch

__all__ = ["ClockOffsets", "HangState", "batch_refusals", "observe_heartbeats"]

Refusal = tuple[Any, str, str]
"""A refused record's token, the reason (``absurd_rank``, ``too_many_groups``), the detail."""


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
        """The ids of many names (one dict lookup each; new names interned in order)."""
        ids = list(map(self.ids.get, names))
        if None in ids:
            ids = [self(n) for n in names]
        return ids  # type: ignore[return-value]


_ROW_COLUMNS = (
    ("time_ns", "time_ns"),
    ("last_step", "last_step"),
    ("pause_until", "pause_until_ns"),
    ("host", "host"),
    ("stack", "stack"),
    ("pause", "pause"),
)
"""Per rank: the state's column, the batch's column it is taken from."""
_SLOT_COLUMNS = (("ent", "seq_entered"), ("fin", "seq_finished"), ("nbytes", "nbytes"))
"""Per rank and group slot, numbers: the state's column, the batch's."""

MIN_STACK_CHARS = 64
"""A rank's stack is never cut shorter than this (its innermost frames: what it is doing)."""


def keep_inner(stack: str, chars: int) -> str:
    """A folded stack cut to about its innermost ``chars`` characters, at a frame boundary
    (the innermost frames say what the rank is doing: :func:`detectors.hang.stack_where`)."""
    if len(stack) <= chars:
        return stack
    tail = stack[-chars:]
    cut = tail.find(";")
    return "…;" + (tail[cut + 1 :] if 0 <= cut < len(tail) - 1 else tail)


class HangState:
    """The latest heartbeat of every rank of one job run, as columns; progress points.

    ``observe`` / ``observe_batch`` are the only mutations; ranks are row indices (grown on
    demand). Per rank: ``time_ns`` / ``prev_ns`` (its last two heartbeats), ``last_step``,
    ``host``, ``stack``, the declared ``pause`` / ``pause_until``; per rank and group slot:
    group id ``gid`` (-1: none), sequence numbers ``ent`` / ``fin``, the last collective's
    ``kind`` id and ``nbytes``.
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

    def __init__(
        self,
        job: str,
        run: int = 0,
        *,
        progress_points: int = 64,
        max_stack_bytes: int = 8 * 2**20,
        stack_chars: int = 4096,
    ) -> None:
        self.job = job
        self.run = run
        self.max_stack_bytes = max_stack_bytes
        self.stack_chars = stack_chars
        """Each rank's stack is cut to this (its innermost frames); lowered while the job's
        stacks together exceed ``max_stack_bytes`` (:meth:`shrink_stacks`)."""
        self.stack_bytes = 0  # the characters of every rank's stack
        self.groups = _Interner()
        self.kinds = _Interner()
        self.n = 0
        self.width = 0
        self._alloc(0, 0)
        self.max_step = -1
        self.first_ns = 0
        self.progress: deque[tuple[int, int]] = deque(maxlen=max(progress_points, 2))

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

    def _grow(self, top: int, width: int) -> None:
        """Room for rank ``top`` (doubling) and ``width`` group slots."""
        if top >= self.n or width > self.width:
            self._alloc(max(self.n, top + 1, 2 * self.n if top >= self.n else 0), max(self.width, width))

    @property
    def seen(self) -> np.ndarray:
        """Rows (ranks) that sent at least one heartbeat."""
        seen: np.ndarray = self.time_ns > 0
        return seen

    def observe(self, beats: Iterable[Heartbeat]) -> int:
        """Take heartbeats (any order; older than a rank's latest are ignored; of another job
        run ignored); return how many ranks they updated.

        They are a sequence in time, as if taken one by one: every heartbeat that raises the
        job's highest step is a progress point, and of a rank's heartbeats at one instant the
        first counts (a later one is no newer). Otherwise the rules of :meth:`observe_batch`.
        """
        mine = [b for b in beats if b.job == self.job and b.run == self.run]
        return self._take(HeartbeatBatch.from_beats(mine), sequence=True) if mine else 0

    def observe_batch(self, batch: HeartbeatBatch) -> int:
        """Take a batch of heartbeats of this job run in one vectorized pass (rows in any
        order, a rank's latest kept, the last of equal times; older than a rank's latest are
        ignored); return how many rows were taken. The batch is one instant: its highest step
        is one progress point. A batch of another job run is ignored."""
        if batch.job != self.job or batch.run != self.run or not len(batch):
            return 0
        return self._take(batch, sequence=False)

    def _take(self, batch: HeartbeatBatch, *, sequence: bool) -> int:
        t = batch["time_ns"]
        self._progress(t, batch["last_step"], every=sequence)
        pick = _latest_rows(batch["rank"], t, sequence=sequence)
        rows = batch["rank"][pick]
        self._grow(int(rows.max()), int(batch["ngroups"][pick].max()))
        fresh = t[pick] > self.time_ns[rows]
        if not fresh.all():
            pick, rows = pick[fresh], rows[fresh]
        if len(rows):
            self._write(batch, pick, rows)
        return len(rows)

    def _progress(self, t: np.ndarray, steps: np.ndarray, *, every: bool) -> None:
        """The job's first heartbeat time, its highest step, and progress points: each row
        that raises the highest step (``every``), else the first row with the highest."""
        if not self.first_ns:
            heard = np.flatnonzero(t)
            self.first_ns = int(t[heard[0]]) if len(heard) else 0
        before = np.empty(len(steps), np.int64)  # the highest step before each row
        before[0] = self.max_step
        np.maximum(np.maximum.accumulate(steps)[:-1], self.max_step, out=before[1:])
        raised = np.flatnonzero(steps > before)
        for i in (raised if every else raised[-1:]).tolist():
            self.max_step = int(steps[i])
            self.progress.append((int(t[i]), self.max_step))

    def _write(self, batch: HeartbeatBatch, pick: np.ndarray, rows: np.ndarray) -> None:
        """Rows ``pick`` of the batch become the latest heartbeats of ranks ``rows``; group
        and kind names are interned in the order of ``pick``."""
        self.prev_ns[rows] = self.time_ns[rows]
        before = sum(map(len, self.stack[rows].tolist()))
        for mine, theirs in _ROW_COLUMNS:
            getattr(self, mine)[rows] = batch[theirs][pick]
        stacks = self.stack[rows].tolist()
        if max(map(len, stacks)) > self.stack_chars:
            self.stack[rows] = stacks = [keep_inner(x, self.stack_chars) for x in stacks]
        self.stack_bytes += sum(map(len, stacks)) - before
        if self.stack_bytes > self.max_stack_bytes:
            self.shrink_stacks(self.max_stack_bytes)
        k = batch["ngroups"][pick]
        width = int(k.max())  # the batch's padding beyond is not kept
        used = np.arange(width) < k[:, None]  # the slots a row's groups fill
        for mine, theirs, interner in (("gid", "groups", self.groups), ("kind", "kinds", self.kinds)):
            ids = np.full((len(rows), self.width), -1, np.int64)
            ids[:, :width][used] = interner.many(batch[theirs][pick, :width][used].tolist())
            getattr(self, mine)[rows] = ids
        for mine, theirs in _SLOT_COLUMNS:
            vals = np.zeros((len(rows), self.width), np.int64)
            vals[:, :width] = np.where(used, batch[theirs][pick, :width], 0)
            getattr(self, mine)[rows] = vals

    def shrink_stacks(self, budget: int) -> None:
        """Cut every rank's stack (to its innermost frames) so that together they take about
        ``budget`` characters at most (never below :data:`MIN_STACK_CHARS` a rank): a stack is
        a sender's claim, 102,400 claimed ranks of 2 KB each took a worker 435 MB."""
        ranks = max(1, int(np.count_nonzero(self.seen)))
        self.stack_chars = min(self.stack_chars, max(MIN_STACK_CHARS, budget // ranks))
        long = np.flatnonzero(np.fromiter(map(len, self.stack.tolist()), np.int64, self.n) > self.stack_chars)
        if len(long):
            self.stack[long] = [keep_inner(x, self.stack_chars) for x in self.stack[long].tolist()]
        self.stack_bytes = sum(map(len, self.stack.tolist()))

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


def _latest_rows(rank: np.ndarray, t: np.ndarray, *, sequence: bool) -> np.ndarray:
    """The row of each rank's latest heartbeat. Of a batch: of equal times the last row,
    ranks in rank order; of a sequence: of equal times the first row, ranks in the order
    they first appear."""
    n = len(rank)
    if n == 1:
        return np.zeros(1, np.int64)
    if not sequence:
        return _last_per_rank(rank, t)
    pick = n - 1 - _last_per_rank(rank[::-1], t[::-1])  # rank order, the first of equal times
    first_seen = np.unique(rank, return_index=True)[1]  # rank order too
    return pick[np.argsort(first_seen)]


def _last_per_rank(rank: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per rank (in rank order), the row with its highest time, the last of equal ones."""
    order = np.lexsort((t, rank))
    last = np.ones(len(order), bool)
    last[:-1] = rank[order[1:]] != rank[order[:-1]]
    return order[last]


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
    ranks = joined["rank"]
    here = len(np.unique(ranks))
    return _refusals(state, ranks, joined["ngroups"], lengths, here, rank_slack, max_groups)


def _refusals(
    state: HangState,
    ranks: np.ndarray,
    ngroups: np.ndarray,
    lengths: Sequence[int],
    here: int,
    rank_slack: int,
    max_groups: int,
) -> list[tuple[int, str, str]]:
    """:func:`batch_refusals` of records of ``lengths`` rows (their ``ranks`` and
    ``ngroups`` one after the other), ``here`` ranks in the consumer batch."""
    seen = int(np.count_nonzero(state.seen))
    bound = 2 * max(seen, here) + rank_slack
    if not len(ranks) or (int(ranks.max()) < bound and int(ngroups.max()) <= max_groups):
        return []
    starts = np.cumsum([0, *lengths[:-1]])
    tops = np.maximum.reduceat(ranks, starts)
    widest = np.maximum.reduceat(ngroups, starts)
    out = []
    for i in np.flatnonzero((tops >= bound) | (widest > max_groups)).tolist():
        if tops[i] >= bound:
            out.append((i, "absurd_rank", f"rank {tops[i]}: the job showed {seen} ranks"))
        else:
            out.append((i, "too_many_groups", f"{widest[i]} groups, limit {max_groups}"))
    return out


class ClockOffsets:
    """Per sending host, how far its clock is from the receiver's, learned from the stream:
    the smallest ``arrival - sent`` of its heartbeats over the last one to two ``window_s``
    (the offset plus the quickest delivery; a backlog only delays, so the minimum is the
    freshest). A heartbeat's times plus its host's offset are on the receiver's clock, so
    a host whose clock runs 60 s behind is not lost and one 1 h ahead does not look alive
    forever. Rows without a host name are learned per rank. At most ``max_hosts`` hosts
    are kept (the least recently heard forgotten): a host name is a sender's claim.
    """

    def __init__(self, window_s: float = 60.0, max_hosts: int = 65_536) -> None:
        self.window_ns = int(window_s * 1e9)
        self.max_hosts = max_hosts
        self._est: dict[str, tuple[int, int, int]] = {}  # host -> (min now, min before, window start)

    def __len__(self) -> int:
        return len(self._est)

    def offset_ns(self, host: str, delay_ns: int, arrival_ns: int) -> int:
        """Learn one host's smallest ``arrival - sent`` of a batch; its offset now."""
        cur, prev, since = self._est.pop(host, (delay_ns, delay_ns, arrival_ns))
        if arrival_ns - since > self.window_ns:
            cur, prev, since = delay_ns, cur, arrival_ns
        cur = min(cur, delay_ns)
        self._est[host] = (cur, prev, since)  # re-inserted last: least recently heard first
        while len(self._est) > self.max_hosts:
            del self._est[next(iter(self._est))]
        return min(cur, prev)

    def correct(self, batch: HeartbeatBatch, arrival_ns: int) -> HeartbeatBatch:
        """The batch with its times (``time_ns``, ``pause_until_ns``) on the receiver's
        clock, every host's offset learned from its rows first (one pass per host)."""
        if not len(batch):
            return batch
        hosts = batch["host"]
        keys = np.where(hosts != "", hosts, "\0rank " + batch["rank"].astype(str).astype(object))
        names, inverse = np.unique(keys, return_inverse=True)
        delay = arrival_ns - batch["time_ns"]
        smallest = np.full(len(names), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(smallest, inverse, delay)
        offsets = np.array(
            [self.offset_ns(str(h), int(d), arrival_ns) for h, d in zip(names, smallest, strict=True)],
            np.int64,
        )
        shift = offsets[inverse]
        cols = dict(batch.columns)
        cols["time_ns"] = batch["time_ns"] + shift
        until = batch["pause_until_ns"]
        cols["pause_until_ns"] = np.where(until > 0, until + shift, 0)
        return HeartbeatBatch(batch.job, batch.run, cols)


def observe_heartbeats(
    states: MutableMapping[tuple[str, int], HangState],
    records: Sequence[tuple[Heartbeat | HeartbeatBatch, Any]],
    *,
    rank_slack: int = 1024,
    max_groups: int = 64,
    progress_points: int = 64,
    max_jobs: int = 16_384,
    clocks: ClockOffsets | None = None,
    arrival_ns: int = 0,
    max_stack_bytes: int = 8 * 2**20,
) -> tuple[int, list[Refusal]]:
    """Feed a consumer batch of heartbeats and heartbeat batches (each with its token) to
    the job states, one vectorized pass per job: the job's single heartbeats become one
    batch, concatenated with its node batches. Returns the heartbeats taken and the refused
    records' tokens with a reason (``absurd_rank``, ``too_many_groups``: see
    :func:`batch_refusals`). ``states`` is ordered least recently seen first and kept to
    ``max_jobs`` jobs (the least recently seen dropped). With ``clocks``, the heartbeats'
    times are put on the receiver's clock first (``arrival_ns``: when the batch came;
    :class:`ClockOffsets`). A new job's state keeps its stacks to ``max_stack_bytes``."""
    taken, refused = 0, list[Refusal]()
    for key, (batches, singles) in _by_job(records).items():
        state = states.pop(key, None)  # re-inserted last: least recently seen first
        if state is None:
            state = HangState(*key, progress_points=progress_points, max_stack_bytes=max_stack_bytes)
        states[key] = state
        joined = _admit_batches(state, batches, refused, rank_slack, max_groups)
        joined = _admit_singles(state, singles, joined, refused, rank_slack, max_groups)
        if joined is not None:
            if clocks is not None:
                joined = clocks.correct(joined, arrival_ns)
            taken += state.observe_batch(joined)
    while len(states) > max_jobs:
        del states[next(iter(states))]
    return taken, refused


def _by_job(
    records: Sequence[tuple[Heartbeat | HeartbeatBatch, Any]],
) -> dict[tuple[str, int], tuple[list[tuple[HeartbeatBatch, Any]], list[tuple[Heartbeat, Any]]]]:
    """Per job run (in the order first seen): its node batches and its single heartbeats."""
    by_job: dict[tuple[str, int], tuple[list[tuple[HeartbeatBatch, Any]], list[tuple[Heartbeat, Any]]]] = {}
    for record, token in records:
        key = (record.job, record.run)
        of_job = by_job.get(key)
        if of_job is None:
            of_job = by_job[key] = ([], [])
        batches, singles = of_job
        if isinstance(record, HeartbeatBatch):
            batches.append((record, token))
        else:
            singles.append((record, token))
    return by_job


def _admit_batches(
    state: HangState,
    batches: list[tuple[HeartbeatBatch, Any]],
    refused: list[Refusal],
    rank_slack: int,
    max_groups: int,
) -> HeartbeatBatch | None:
    """A job's node batches in one, those :func:`batch_refusals` refuses left out (and
    added to ``refused``); None without any."""
    if not batches:
        return None
    parts = [b for b, _ in batches]
    joined = HeartbeatBatch.concat(parts)
    bad = batch_refusals(state, joined, [len(p) for p in parts], rank_slack, max_groups)
    if not bad:
        return joined
    parts = _refuse(batches, bad, refused)
    return HeartbeatBatch.concat(parts) if parts else None


def _admit_singles(
    state: HangState,
    singles: list[tuple[Heartbeat, Any]],
    joined: HeartbeatBatch | None,
    refused: list[Refusal],
    rank_slack: int,
    max_groups: int,
) -> HeartbeatBatch | None:
    """``joined`` (a job's admitted node batches) with its single heartbeats added as rows,
    each admitted as a batch of one row (the ranks here: theirs and ``joined``'s)."""
    if not singles:
        return joined
    ranks = np.array([b.rank for b, _ in singles], np.int64)
    ngroups = np.array([len(b.groups) for b, _ in singles], np.int64)
    here = len(np.unique(ranks if joined is None else np.concatenate([ranks, joined["rank"]])))
    bad = _refusals(state, ranks, ngroups, [1] * len(singles), here, rank_slack, max_groups)
    beats = _refuse(singles, bad, refused) if bad else [b for b, _ in singles]
    if not beats:
        return joined
    ones = HeartbeatBatch.from_beats(beats)
    return HeartbeatBatch.concat([joined, ones]) if joined is not None else ones


def _refuse(
    records: list[tuple[Any, Any]], bad: list[tuple[int, str, str]], refused: list[Refusal]
) -> list[Any]:
    """The records not refused by ``bad`` (index, reason, detail); the refused ones' tokens
    with reason and detail go to ``refused``."""
    refused.extend((records[i][1], reason, detail) for i, reason, detail in bad)
    drop = {i for i, _, _ in bad}
    return [r for i, (r, _) in enumerate(records) if i not in drop]
