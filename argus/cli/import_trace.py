"""``argus import-trace``: PyTorch profiler (Kineto) traces → the pipeline, like a live rank.

The imported steps are diagnosed by the one engine (``detectors.JobDiagnoser``,
docs/architecture.md#engine): with ``--local`` here, over whole steps (every imported
rank) in step order, and the anomalies go into the embedded store's ``anomalies`` table as
the sink writes them; to Kafka, the stream worker diagnoses what arrives on ``argus.steps``
(the same engine) and publishes to ``argus.anomalies``, which the sink stores.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import ExitStack
from itertools import islice
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from ._app import app, console, exit_on_error, fail, n_anomalies, settings

__all__ = ["StepParts", "collect_imports", "diagnose_steps", "iter_imports"]

_BIG = 32 << 20  # show a progress bar past this many bytes of input


def _default_job(path: Path) -> str:
    return path.resolve().parent.name or "kineto"


def _import_one(
    path: str, job: str, run: int, rank: int | None, progress: Callable[[int], None] | None = None
) -> tuple[list[Any], Any]:
    """Every record of one trace file and the import summary (runs in a worker process too)."""
    from argus.producers.kineto import KinetoImport

    imp = KinetoImport(path, job=job, run=run, rank=rank, progress=progress)
    return list(imp.records()), imp.summary


def iter_imports(
    paths: Sequence[str],
    *,
    job: str,
    run: int = 0,
    rank: int | None = None,
    workers: int = 1,
    started: Callable[[], object] | None = None,
) -> Iterator[tuple[list[Any], Any]]:
    """Import trace files (in ``workers`` processes), yielding each file's records and
    summary in the order of ``paths``.

    Memory stays flat in the number of files: each file is streamed a chunk at a time
    (:class:`producers.kineto.TraceReader`), at most ``2 × workers`` files are in flight,
    and a file's records are the caller's to consume before the next ones are taken.
    ``started`` is called once the work is under way (after the worker processes are
    forked, while they parse). Raises ``producers.kineto.TraceError`` for the first bad file.
    """
    total = sum(os.path.getsize(p) for p in paths)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True, disable=total < _BIG) as bar:
        task = bar.add_task("importing", total=total)
        if workers <= 1 or len(paths) == 1:
            if started is not None:
                started()
            done = 0
            for p in paths:
                size = os.path.getsize(p)

                def advance(n: int, offset: int = done) -> None:
                    bar.update(task, completed=offset + n)

                yield _import_one(p, job, run, rank, advance)
                done += size
                bar.update(task, completed=done)
            return
        with ProcessPoolExecutor(max_workers=workers) as pool:
            window: deque[tuple[str, Future[tuple[list[Any], Any]]]] = deque()
            todo = iter(paths)
            for p in islice(todo, 2 * workers):
                window.append((p, pool.submit(_import_one, p, job, run, rank)))
            if started is not None:
                try:
                    started()
                except BaseException:  # e.g. the store is locked: do not parse the rest first
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
            try:
                while window:
                    p, fut = window.popleft()
                    result = fut.result()
                    nxt = next(todo, None)
                    if nxt is not None:
                        window.append((nxt, pool.submit(_import_one, nxt, job, run, rank)))
                    bar.advance(task, os.path.getsize(p))
                    yield result
            finally:
                for _, fut in window:
                    fut.cancel()


def collect_imports(imports: Iterable[tuple[list[Any], Any]]) -> tuple[list[Any], list[Any]]:
    """All records and the summaries of :func:`iter_imports` (``collect_imports(iter_imports(paths,
    job=...))``), kept in memory: for a few files; iterate :func:`iter_imports` to stream them."""
    records: list[Any] = []
    summaries: list[Any] = []
    for recs, summary in imports:
        records.extend(recs)
        summaries.append(summary)
    return records, summaries


class StepParts:
    """The step records of many ranks, kept compact until diagnosis: per step, the parts
    are concatenated every ``every`` parts (a 1-row StepBatch costs far more than its row)."""

    def __init__(self, every: int = 64) -> None:
        self.every = every
        self._parts: dict[int, list[Any]] = defaultdict(list)

    def add(self, batch: Any) -> None:
        """Keep one StepBatch."""
        from argus.schemas import StepBatch

        parts = self._parts[batch.step]
        parts.append(batch)
        if len(parts) > self.every:
            self._parts[batch.step] = [StepBatch.concat(parts)]

    def steps(self) -> list[Any]:
        """Whole steps (every rank of a step in one batch), in step order."""
        from argus.schemas import StepBatch

        return [StepBatch.concat(self._parts[s]) for s in sorted(self._parts)]


class _LocalStore:
    """The embedded store, opened (and migrated) by :meth:`open` once the traces are being
    parsed in the worker processes: loading the engine takes a second or two that then
    overlaps the parsing instead of following it."""

    def __init__(self, stack: ExitStack) -> None:
        self._stack = stack
        self._store: Any = None

    def open(self) -> Any:
        from ._store import command_store

        if self._store is None:
            self._store = self._stack.enter_context(command_store())
        return self._store


def _store_local(records: list[Any], store: Any) -> int:
    from argus.sinks import to_arrow

    by_type: dict[type, list[Any]] = defaultdict(list)
    for r in records:
        by_type[type(r)].append(r)
    for recs in by_type.values():
        table, rows = to_arrow(recs)
        store.insert_arrow(table, rows)
    return len(records)


class _Buffered:
    """Records on their way to a destination, flushed every ``limit`` records (one insert or
    publish round per many files, never all files' records at once)."""

    def __init__(self, flush: Callable[[list[Any]], int], limit: int = 50_000) -> None:
        self._flush = flush
        self.limit = limit
        self.pending: list[Any] = []
        self.count = 0

    def add(self, records: Sequence[Any]) -> None:
        """Take records; flush when the buffer is full."""
        self.pending.extend(records)
        if len(self.pending) >= self.limit:
            self.flush()

    def flush(self) -> None:
        """Send what is buffered."""
        if self.pending:
            self.count += self._flush(self.pending)
            self.pending = []


def diagnose_steps(steps: Sequence[Any], *, job: str, run: int = 0) -> list[Any]:
    """The final anomalies of the one engine (:func:`argus.detectors.diagnose`) over whole
    steps (every rank of a step in one batch, as the worker's assembler joins them; see
    :class:`StepParts`), in step order. An anomaly the engine confirms only when the record
    ends (``flush``) carries no detection time; it gets the end of its last step, so it is
    stored at the time the trace describes."""
    from argus.detectors import diagnose

    ends = {b.step: int(b["end_ns"].max()) for b in steps}
    out = []
    for a in diagnose(steps, job=job, run=run):
        if not a.detected_ns:  # confirmed only at the end of the record: stamp it with its last step
            a = dataclasses.replace(a, detected_ns=ends.get(a.end_step, max(ends.values())))
        out.append(a)
    return out


def _describe(anomaly: Any) -> str:
    window = (
        f"step {anomaly.start_step}"
        if anomaly.start_step == anomaly.end_step
        else f"steps {anomaly.start_step}-{anomaly.end_step}"
    )
    return f"  {anomaly.severity:4} {anomaly.cause} · {anomaly.suspect_kind} {anomaly.suspect} · {window}"


def _publisher() -> Any:
    from argus.producers.publisher import Publisher

    with exit_on_error():
        return Publisher(settings().kafka_client_config(), block_when_full=True)


def _publish(records: list[Any], publisher: Any) -> int:
    from argus.schemas import KERNELS, STEPS, KernelNames, KernelSketch, StepBatch, rank_key, step_key

    for r in records:
        if isinstance(r, StepBatch):
            publisher.publish(STEPS, step_key(r.job, r.step), r)
        elif isinstance(r, KernelSketch | KernelNames):
            publisher.publish(KERNELS, rank_key(r.job, r.rank), r)
    return len(records)


def _drain(publisher: Any) -> None:
    with exit_on_error():
        publisher.drain(60)


@app.command("import-trace")
def import_trace(
    paths: list[Path] = typer.Argument(..., help="PyTorch profiler traces (.json or .json.gz), one per rank"),
    rank: int | None = typer.Option(None, "--rank", help="rank of a single file without distributedInfo"),
    job: str | None = typer.Option(None, "--job", help="job id (default: the folder name of the first file)"),
    run: int = typer.Option(0, "--run", help="run incarnation"),
    local: bool = typer.Option(False, "--local", help="write into the embedded store instead of Kafka"),
    workers: int = typer.Option(min(2, os.cpu_count() or 1), "--workers", "-j", help="parallel processes"),
) -> None:
    """Import Kineto traces: step records and kernel sketches, exactly as live ranks publish them."""
    if rank is not None and len(paths) != 1:
        fail("--rank applies to a single file; multi-file imports take each rank from distributedInfo")
    for p in paths:
        if not p.is_file():
            fail(f"{p}: no such file")
    job_id = job or _default_job(paths[0])
    anomalies: list[Any] = []
    with ExitStack() as stack:
        store = _LocalStore(stack) if local else None
        if store is not None:
            out = _Buffered(lambda recs: _store_local(recs, store.open()))
        else:
            publisher = _publisher()
            out = _Buffered(lambda recs: _publish(recs, publisher))
        parts = StepParts() if store is not None else None
        started = store.open if store is not None else None
        summaries = _read_traces(paths, job_id, run, rank, workers, out, parts, started)
        if parts is not None:
            anomalies = diagnose_steps(parts.steps(), job=job_id, run=run)
            out.add(anomalies)
        out.flush()
        if store is None:
            _drain(publisher)
        count = out.count - len(anomalies)
    _say_imported(len(paths), job_id, summaries, count, local)
    _say_diagnosed(job_id, anomalies, local)


def _read_traces(
    paths: list[Path],
    job: str,
    run: int,
    rank: int | None,
    workers: int,
    out: _Buffered,
    parts: StepParts | None,
    started: Callable[[], object] | None,
) -> list[Any]:
    """Every file's records to ``out`` (and its step records to ``parts``, when given), one
    file at a time; the files' import summaries. Two files of one rank, or a bad file, are
    a clean error."""
    from argus.schemas import StepBatch

    summaries: list[Any] = []
    seen: set[int] = set()
    with exit_on_error():  # a bad file (TraceError): exit 2
        for records, summary in iter_imports(
            [str(p) for p in paths], job=job, run=run, rank=rank, workers=workers, started=started
        ):
            if summary.rank in seen:
                fail(f"two files claim rank {summary.rank}; import them separately with --rank")
            seen.add(summary.rank)
            summaries.append(summary)
            out.add(records)
            if parts is not None:
                for r in records:
                    if isinstance(r, StepBatch):
                        parts.add(r)
            del records
    return summaries


def _say_imported(files: int, job: str, summaries: list[Any], count: int, local: bool) -> None:
    steps = sum(s.steps for s in summaries)
    kernels = sum(s.kernels for s in summaries)
    where = "the embedded store" if local else "Kafka (argus.steps, argus.kernels)"
    console.print(
        f"imported {files} file(s) of job {job}: {steps} rank-steps, {kernels} kernels, "
        f"{count} records → {where}",
        highlight=False,
    )


def _say_diagnosed(job: str, anomalies: list[Any], local: bool) -> None:
    if not local:
        console.print(
            "diagnosis: the stream worker (`argus worker`) diagnoses these steps as they arrive on "
            "argus.steps and publishes its anomalies to argus.anomalies; once `argus sink` has "
            f"stored them, `argus report --job {job}` shows them",
            highlight=False,
        )
        return
    console.print(
        f"diagnosis: {n_anomalies(len(anomalies))} → the embedded store"
        + (f"; `argus report --job {job}` shows them" if anomalies else ""),
        highlight=False,
    )
    for a in anomalies:
        console.print(_describe(a), highlight=False, markup=False)
