"""``argus import-trace``: PyTorch profiler (Kineto) traces → the pipeline, like a live rank.

The imported steps are diagnosed by the one engine (``detectors.JobDiagnoser``, DESIGN.md
"One engine, three entry points"): with ``--local`` here, over whole steps (every imported
rank) in step order, and the anomalies go into the embedded store's ``anomalies`` table as
the sink writes them; to Kafka, the stream worker diagnoses what arrives on ``argus.steps``
(the same engine) and publishes to ``argus.anomalies``, which the sink stores.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from ._app import EXIT_UNAVAILABLE, app, console, fail, settings

__all__ = ["diagnose_records", "import_files"]

_BIG = 32 << 20  # show a progress bar past this many bytes of input


def _default_job(path: Path) -> str:
    return path.resolve().parent.name or "kineto"


def _import_one(path: str, job: str, run: int, rank: int | None) -> tuple[list[Any], Any]:
    """Every record of one trace file and the import summary (runs in a worker process too)."""
    from argus.producers.kineto import KinetoImport

    imp = KinetoImport(path, job=job, run=run, rank=rank)
    return list(imp.records()), imp.summary


def import_files(
    paths: Sequence[str],
    *,
    job: str,
    run: int = 0,
    rank: int | None = None,
    workers: int = 1,
    started: Callable[[], object] | None = None,
) -> tuple[list[Any], list[Any]]:
    """Import trace files (in ``workers`` processes); returns all records and the summaries.

    ``started`` is called once the work is under way (after the worker processes are
    forked, while they parse). Raises ``producers.kineto.TraceError`` for the first
    bad file.
    """
    total = sum(os.path.getsize(p) for p in paths)
    records: list[Any] = []
    summaries: list[Any] = []
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True, disable=total < _BIG) as bar:
        task = bar.add_task("importing", total=total)
        if workers <= 1 or len(paths) == 1:
            from argus.producers.kineto import KinetoImport

            if started is not None:
                started()
            done = 0
            for p in paths:
                size = os.path.getsize(p)

                def advance(n: int, offset: int = done) -> None:
                    bar.update(task, completed=offset + n)

                imp = KinetoImport(p, job=job, run=run, rank=rank, progress=advance)
                records.extend(imp.records())
                summaries.append(imp.summary)
                done += size
                bar.update(task, completed=done)
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(_import_one, p, job, run, rank) for p in paths]
                if started is not None:
                    try:
                        started()
                    except BaseException:  # e.g. the store is locked: do not parse the rest first
                        pool.shutdown(wait=False, cancel_futures=True)
                        raise
                for p, fut in zip(paths, futures, strict=True):
                    recs, summary = fut.result()
                    records.extend(recs)
                    summaries.append(summary)
                    bar.advance(task, os.path.getsize(p))
    return records, summaries


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


def diagnose_records(records: Sequence[Any], *, job: str, run: int = 0) -> list[Any]:
    """The final anomalies of the one engine over the step records among ``records``.

    The per-rank StepBatches are joined into whole steps (every rank of a step in one
    batch, as the stream worker's assembler does) and fed in step order to
    :func:`argus.detectors.diagnose`; kernel sketches and names are not read. An anomaly
    the engine confirms only when the record ends (``flush``) carries no detection time;
    it gets the end of its last step, so it is stored at the time the trace describes.
    """
    from argus.detectors import diagnose
    from argus.schemas import StepBatch

    parts: dict[int, list[StepBatch]] = defaultdict(list)
    for r in records:
        if isinstance(r, StepBatch):
            parts[r.step].append(r)
    steps = [StepBatch.concat(parts[s]) for s in sorted(parts)]
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


def _publish(records: list[Any]) -> int:
    from argus.producers.publisher import Publisher, PublishError
    from argus.schemas import KERNELS, STEPS, KernelNames, KernelSketch, StepBatch, rank_key, step_key

    try:
        publisher = Publisher(settings().kafka_client_config(), block_when_full=True)
    except PublishError as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    for r in records:
        if isinstance(r, StepBatch):
            publisher.publish(STEPS, step_key(r.job, r.step), r)
        elif isinstance(r, KernelSketch | KernelNames):
            publisher.publish(KERNELS, rank_key(r.job, r.rank), r)
    try:
        publisher.drain(60)
    except PublishError as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    return len(records)


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
    from argus.producers.kineto import TraceError

    if rank is not None and len(paths) != 1:
        fail("--rank applies to a single file; multi-file imports take each rank from distributedInfo")
    for p in paths:
        if not p.is_file():
            fail(f"{p}: no such file")
    job_id = job or _default_job(paths[0])
    with ExitStack() as stack:
        store = _LocalStore(stack) if local else None
        try:
            records, summaries = import_files(
                [str(p) for p in paths],
                job=job_id,
                run=run,
                rank=rank,
                workers=workers,
                started=store.open if store is not None else None,
            )
        except TraceError as exc:
            fail(str(exc))
        ranks = [s.rank for s in summaries]
        if len(set(ranks)) != len(ranks):
            fail(f"two files claim the same rank ({sorted(ranks)}); import them separately with --rank")
        anomalies = diagnose_records(records, job=job_id, run=run) if store is not None else []
        if store is not None:
            count = _store_local([*records, *anomalies], store.open()) - len(anomalies)
        else:
            count = _publish(records)
    steps = sum(s.steps for s in summaries)
    kernels = sum(s.kernels for s in summaries)
    where = "the embedded store" if local else "Kafka (argus.steps, argus.kernels)"
    console.print(
        f"imported {len(paths)} file(s) of job {job_id}: {steps} rank-steps, {kernels} kernels, "
        f"{count} records → {where}",
        highlight=False,
    )
    if store is None:
        console.print(
            "diagnosis: the stream worker (`argus worker`) diagnoses these steps as they arrive on "
            "argus.steps and publishes its anomalies to argus.anomalies; once `argus sink` has "
            f"stored them, `argus report --job {job_id}` shows them",
            highlight=False,
        )
        return
    console.print(
        f"diagnosis: {len(anomalies)} anomal{'y' if len(anomalies) == 1 else 'ies'} → the embedded store"
        + (f"; `argus report --job {job_id}` shows them" if anomalies else ""),
        highlight=False,
    )
    for a in anomalies:
        console.print(_describe(a), highlight=False, markup=False)
