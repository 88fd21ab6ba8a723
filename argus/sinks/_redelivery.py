"""Rows the store holds already are not inserted again: the materialized rollups count what
is inserted, so a step row that Kafka redelivers (a batch re-cut after a lost group
membership) or a producer resends must land once. Keys are ``step << 20 | rank`` within a
job run; the insert tokens cover the rest (:mod:`argus.sinks.kafka_sink`)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from argus.schemas import StepBatch, StepSummary

from ._errors import QueryError
from ._retrying import RetryingStore

__all__ = ["ROLLUP_KEYS", "fresh_rows", "kept_records", "row_keys", "stored_keys"]

log = logging.getLogger("argus.sink")

ROLLUP_KEYS: dict[type, tuple[str, str]] = {
    StepBatch: ("steps", "bitOr(bitShiftLeft(step, 20), rank)"),
    StepSummary: ("step_summaries", "bitShiftLeft(step, 20)"),
}
"""The records the rollups count (materialized views of steps, a step's one summary):
their table, and the SQL of their key within a job run, as :func:`row_keys` computes it."""


def row_keys(record: StepBatch | StepSummary) -> np.ndarray:
    """A record's rows' keys within its job run: ``step << 20 | rank`` (a rank < 2**20, a
    step < 10**12 < 2**43: one uint64); a summary is rank 0 of its step."""
    if isinstance(record, StepSummary):
        return np.array([record.step << 20], np.uint64)
    ranks = np.asarray(record["rank"]).astype(np.uint64)
    return (np.uint64(record.step) << np.uint64(20)) | ranks


def stored_keys(db: RetryingStore, table: str, job: str, run: int, lo: int, hi: int) -> np.ndarray | None:
    """The keys of a job run's rows of ``table`` stored with steps in ``lo..hi``; None if the
    store rejects the query (then nothing is dropped: a row counted twice is better than a
    row lost)."""
    key_sql = next(sql for t, sql in ROLLUP_KEYS.values() if t == table)
    sql = (
        f"SELECT {key_sql} AS k FROM {table} WHERE job = {{j:String}} AND run = {{r:UInt32}} "
        "AND step BETWEEN {lo:UInt64} AND {hi:UInt64}"
    )
    params = {"j": job, "r": run, "lo": lo, "hi": hi}
    try:
        result = db.call(f"read the keys of {table}", lambda store: store.query_arrow(sql, params))
    except QueryError as exc:
        log.error("cannot read the stored keys of %s (%s): redelivered rows may count twice", table, exc)
        return None
    if not result.num_rows:
        return np.zeros(0, np.uint64)
    keys: np.ndarray = result.column("k").to_numpy().astype(np.uint64)
    return keys


def fresh_rows(records: Sequence[Any], db: RetryingStore) -> list[np.ndarray]:
    """Per record (all of one type of :data:`ROLLUP_KEYS`), the mask of its rows to insert:
    neither in the store already nor held by an earlier record of ``records`` (a partial
    StepBatch is cut in a batch)."""
    table = ROLLUP_KEYS[type(records[0])][0]
    keys = [row_keys(r) for r in records]
    keep = [np.ones(len(k), bool) for k in keys]
    by_run: dict[tuple[str, int], list[int]] = {}
    for j, r in enumerate(records):
        by_run.setdefault((r.job, r.run), []).append(j)
    for (job, run), members in by_run.items():
        joined = np.concatenate([keys[j] for j in members])
        steps = [records[j].step for j in members]
        if len(set(steps)) == len(steps):  # most often: keys unique already (a rank once per step)
            fresh = np.ones(len(joined), bool)
        else:
            fresh = np.zeros(len(joined), bool)
            fresh[np.unique(joined, return_index=True)[1]] = True  # the first of each key
        stored = stored_keys(db, table, job, run, min(steps), max(steps))
        if stored is not None and len(stored):
            fresh &= ~np.isin(joined, stored)
        for j, part in zip(
            members, np.split(fresh, np.cumsum([len(keys[j]) for j in members])[:-1]), strict=True
        ):
            keep[j] = part
    return keep


def kept_records(
    records: Sequence[Any], keep: Sequence[np.ndarray], token: str
) -> tuple[list[tuple[int, Any]], str]:
    """The records with rows left (position in ``records``, the record cut to its kept rows)
    and the insert token named after the rows kept (a replay keeps the same rows, or none
    once this insert landed)."""
    left = []
    digest = hashlib.blake2b(digest_size=8)
    for j, (r, k) in enumerate(zip(records, keep, strict=True)):
        if not k.any():
            continue
        kept = r if k.all() else r.take(np.flatnonzero(k))
        left.append((j, kept))
        digest.update(np.ascontiguousarray(row_keys(kept)).tobytes())
    return left, f"{token}/new-{digest.hexdigest()}"
