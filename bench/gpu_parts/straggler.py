"""The ``straggler`` part: two processes on the one GPU, rank 1 slowed by a busy-wait kernel;
the records of both agents through the one engine with the kernel level must name rank 1
with kernel evidence."""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from argus.schemas import KernelNames, KernelSketch

from .model import ListSink, Size, build, new_agent, sync_device, train_step

GPU_PY = Path(__file__).resolve().parents[1] / "gpu.py"
"""The driver, which runs each straggler rank in a process of its own (``--rank-of-straggler``)."""


@contextlib.contextmanager
def _mps(device: str) -> Iterator[dict[str, str] | None]:
    """CUDA MPS for the straggler's two processes where the machine has it (its environment),
    else None. Without MPS the GPU time-slices the two processes' contexts, so one rank's
    busy-wait kernel stalls its peer's kernels too and the two ranks slow together (seen on
    an H100: the slowed rank was not named); under MPS the one-block spin kernel holds one SM
    and the peer runs beside it, as on a machine with a GPU per rank."""

    ctl = shutil.which("nvidia-cuda-mps-control")
    if device != "cuda" or ctl is None:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="argus-mps-")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=folder, CUDA_MPS_LOG_DIRECTORY=folder)
    if subprocess.run([ctl, "-d"], env=env, capture_output=True, timeout=20).returncode != 0:
        yield None
        return
    try:
        yield {"CUDA_MPS_PIPE_DIRECTORY": folder, "CUDA_MPS_LOG_DIRECTORY": folder}
    finally:
        subprocess.run([ctl], input=b"quit\n", env=env, capture_output=True, timeout=20)


def part_straggler(size: Size, device: str, out: Path) -> dict[str, Any]:
    """Two processes on the one GPU (under MPS where it runs), rank 1 slowed by a busy-wait
    kernel; the engine with the kernel level must name rank 1 with kernel evidence."""
    with _mps(device) as mps:
        res = _straggler(size, device, mps, out)
    if mps is not None and "error" in res:  # the MPS server refused the clients: time-sliced
        return {"mps": False, "mps_error": res["error"], **_straggler(size, device, None, out)}
    return {"mps": mps is not None, **res}


def _straggler(size: Size, device: str, mps: dict[str, str] | None, out: Path) -> dict[str, Any]:
    steps = size.straggler_steps
    slow = (steps // 3, steps // 3 + steps // 3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the ranks' records stay beside gpu.jsonl: an anomaly's window can be checked afterwards
    files = [out / f"straggler-rank{r}.pkl" for r in range(2)]
    env = dict(
        os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1", **(mps or {})
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(GPU_PY),
                "--rank-of-straggler",
                str(r),
                "--steps",
                str(steps),
                "--to",
                str(f),
                *(["--cpu"] * (device != "cuda")),
            ],
            env=env,
        )
        for r, f in enumerate(files)
    ]
    try:
        codes = [p.wait(timeout=150) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return {"error": "rank processes did not finish in 150 s"}
    if codes != [0, 0]:
        return {"error": f"rank processes exited {codes}"}
    recs = [pickle.loads(f.read_bytes()) for f in files]
    anomalies = replay(recs, "gpu-straggler")
    named = [
        a
        for a in anomalies
        if 1 in a.ranks
        and 0 not in a.ranks
        and a.start_step < slow[1]
        and a.end_step >= slow[0]  # the slowed stretch, not a blip before it
        and any(k.startswith(("kernel:", "kernel_family:")) for k in a.evidence)  # a slow kernel named
    ]
    return {
        "steps": steps,
        "slowed_steps": list(slow),
        "gpu_straggler_named": bool(named),
        "anomalies": [
            {
                "cause": a.cause,
                "level": a.level,
                "suspect": a.suspect,
                "ranks": list(a.ranks),
                "window": [a.start_step, a.end_step],
                "evidence": list(a.evidence)[:12],
                "summary": a.summary[:200],
            }
            for a in anomalies
        ],
    }


def straggler_rank(rank: int, steps: int, to: Path, device: str) -> None:
    """One rank of the straggler part (run in its own process)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    small = Size(2048, 256, 4, 4, 256, 8, 0, 0, 0, steps, 0)
    if device != "cuda":
        small = Size(512, 32, 1, 2, 16, 2, 0, 0, 0, steps, 0)
    model, opt, data = build(small, device)
    # Data parallel by hand: the gradients' mean over gloo each step (DDP's bucketed gloo
    # all-reduce of CUDA tensors stalled on a first run; the peer's wait is the same).
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))

    def mean_grads() -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat[: sum(g.numel() for g in grads)] = torch.cat([g.flatten().float().cpu() for g in grads])
        dist.all_reduce(flat)
        flat.div_(2)

    lo, hi = steps // 3, 2 * (steps // 3)
    sink = ListSink()
    agent = new_agent(sink, rank=rank, world=2, cupti_tagging=os.environ.get("ARGUS_GPU_TAGGING", "marker"))
    agent.install(model, opt)
    for s in range(steps):
        # ~250 ms vs ~10 us at ~2 GHz: about the step (a 60 ms spin on a 250 ms step came out as
        # a 35 ms longer collective wait on the peer, under the step's own noise)
        cycles = int(500e6) if rank == 1 and lo <= s < hi else 20_000
        train_step(model, opt, data[s % len(data)], slow=cycles, before_step=mean_grads)
        if s % 10 == 0:
            print(f"straggler rank {rank}: step {s}", file=sys.stderr, flush=True)
    sync_device(device)
    time.sleep(1.5)
    agent.close()
    dist.destroy_process_group()
    to.write_bytes(pickle.dumps(sink.items))


def replay(ranks: Sequence[list[tuple[str, Any]]], job: str) -> list[Any]:
    """The agents' records through the one engine with the kernel level, step by step as the
    stream worker sees them: each step's kernel evidence kept before the step is diagnosed."""
    from argus.detectors import DiagnoserConfig, JobDiagnoser, JobState, apply_findings, step_findings
    from argus.schemas import STEPS, StackSample, StepBatch, decode

    EvidenceHistory = _evidence_history()

    rows: dict[int, list[Any]] = defaultdict(list)
    evidence: dict[int, list[Any]] = defaultdict(list)
    names: list[Any] = []
    for items in ranks:
        for topic, rec in items:
            if topic == STEPS:
                b = decode(rec)
                rows[int(b.step)].extend(r for r in b.records())
            elif isinstance(rec, KernelNames):
                names.append(rec)
            elif isinstance(rec, KernelSketch | StackSample):
                evidence[rec.step].append(rec)
    cfg = DiagnoserConfig()
    hist = EvidenceHistory()
    for n in names:
        hist.add(_renamed(n, job))
    state = JobState.new(job, 0, cfg)
    final: dict[str, Any] = {}
    for s in sorted(rows):
        if len(rows[s]) < len(ranks):
            continue
        for rec in evidence.get(s, []):
            hist.add(_renamed(rec, job))
        batch = StepBatch.from_records(sorted((_renamed(r, job) for r in rows[s]), key=lambda r: r.rank))
        res = apply_findings(state, step_findings(batch, cfg), cfg, deepen=hist.deepener(job, 0, cfg))
        final.update((a.id, a) for a in res.anomalies)
    final.update((a.id, a) for a in JobDiagnoser(job, 0, cfg, state).flush(hist.deepener(job, 0, cfg)))
    return sorted(final.values(), key=lambda a: (a.start_step, a.cause))


def _evidence_history() -> Any:
    """The stream worker's kernel-evidence store. Its module needs no Faust, but its package
    imports the Faust app, and the GPU machine has no Faust: load the module alone there."""
    try:
        from argus.streams.deepening import EvidenceHistory
    except ImportError:
        import types

        pkg = types.ModuleType("argus.streams")
        pkg.__path__ = [str(Path(__file__).resolve().parents[2] / "argus" / "streams")]
        sys.modules["argus.streams"] = pkg
        from argus.streams.deepening import EvidenceHistory
    return EvidenceHistory


def _renamed(rec: Any, job: str) -> Any:
    from dataclasses import replace

    return replace(rec, job=job)
