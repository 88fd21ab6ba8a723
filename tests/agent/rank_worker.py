"""One gloo rank of the agent's distributed tests (started by :func:`launch`, one process per rank).

Trains a small MLP wrapped in ``DistributedDataParallel`` (``ddp``), sharded with FSDP2
``fully_shard`` (``fsdp``), averaged by hand with ``torch.distributed`` calls, half of them
``async_op=True`` (``direct``), or with functional collectives (``funcol``: all-reduces
waited for by ``.wait()`` or on first use, and an all-gather), with ``argus.attach``
collecting step records into a list.
``--profile-from`` runs ``torch.profiler`` over the steps from there on: the union of its
``c10d::*`` and ``gloo:*`` events is the collective time the profiler saw. Each rank writes its step
records and that figure to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.helpers.net import free_port
from tests.helpers.sinks import ListSink

REPO = Path(__file__).resolve().parents[2]


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


BACKWARD = "rank_worker.backward"
"""The profiler's name for each step's ``loss.backward()`` (a ``record_function``)."""


def profiled_collective_ms(prof: Any) -> dict[str, float]:
    """Milliseconds during which a collective ran, by the profiler's events: the caller's
    ``c10d::*`` operators (enqueue, and on gloo the reduce-scatter's copy) and the backend's
    ``gloo:*`` execution, in all (``"all"``) and per event name; and ``"backward_wait"``:
    the time each ``backward()`` went on after its last autograd node had been evaluated
    (DDP's reducer waiting for its buckets' all-reduces and writing the gradients back), and
    ``"backward_wait_in_collectives"``: the part of it during which a collective ran."""
    spans: dict[str, list[tuple[float, float]]] = {"all": []}
    windows: list[list[float]] = []  # per backward(): start, end, end of its last node
    nodes: list[float] = []
    for e in prof.events():
        span = (e.time_range.start / 1000, e.time_range.end / 1000)
        if e.name.startswith(("gloo:", "c10d::")):
            spans["all"].append(span)
            spans.setdefault(e.name, []).append(span)
        elif e.name == BACKWARD:
            windows.append([*span, span[0]])
        elif e.name.startswith("autograd::engine::evaluate_function"):
            nodes.append(span[1])
    for w in windows:
        w[2] = max((t for t in nodes if w[0] <= t <= w[1]), default=w[1])
    out = {name: union_ms(s) for name, s in spans.items()}
    out["backward_wait"] = sum(w[1] - w[2] for w in windows)
    clipped = [(max(s, w[2]), min(e, w[1])) for s, e in spans["all"] for w in windows]
    out["backward_wait_in_collectives"] = union_ms([(s, e) for s, e in clipped if s < e])
    return out


def run(a: argparse.Namespace) -> None:
    """Train one rank and write its records."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import argus
    from argus.schemas import StepBatch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(a.dim, a.dim) for _ in range(4)])
            self.delay_s = 0.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.delay_s:
                time.sleep(self.delay_s)
            out: torch.Tensor = self.layers(x)
            return out

    net = Net()
    model: Any = net
    if a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(net)
        if a.builtin_hook:  # torch's own C++ hook: the reducer's path, not Python's
            model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    elif a.mode == "fsdp":  # on a 1-D mesh whose dim name says data parallel (sharded)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        shard_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
        for layer in net.layers:
            fully_shard(layer, mesh=shard_mesh)
        fully_shard(net, mesh=shard_mesh)
    mesh = None
    if a.mesh:  # handed to attach: its dim names give the layout
        from torch.distributed.device_mesh import init_device_mesh

        names = tuple(a.mesh.split(","))
        shape = (world // 2, 2) if len(names) == 2 else (world,)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sink = ListSink()
    extra: dict[str, Any] = {"mesh": mesh} if mesh is not None else {}
    agent = argus.attach(model, opt, sink=sink, job=a.job, heartbeat_s=1.0, **extra)
    x = torch.randn(a.batch, a.dim)
    ref: Any = None
    grad_diff = 0.0
    if a.check_grads:  # each rank its own batch; a twin DDP with torch's C++ all-reduce hook
        import copy

        from torch.nn.parallel import DistributedDataParallel

        x = torch.randn(a.batch, a.dim, generator=torch.Generator().manual_seed(rank + 1))
        ref = DistributedDataParallel(copy.deepcopy(net))
        ref._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    prof: Any = None
    for step in range(a.steps):
        if step == a.profile_from:
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
        until = a.slow_until if a.slow_until >= 0 else a.steps
        slowed = rank == a.slow_rank and a.slow_from <= step < until
        extra = a.slow_ms / 1000 if slowed else 0.0
        net.delay_s = a.base_ms / 1000 + (extra if a.slow_in == "forward" else 0.0)
        with argus.step(samples=a.batch):
            if a.slow_in == "loop" and extra:
                time.sleep(extra)  # the user's own code between steps' phases: no timer sees it
            loss = model(x).square().mean()
            with torch.profiler.record_function(BACKWARD):
                loss.backward()
            if a.mode == "direct":
                works = []
                for i, p in enumerate(model.parameters()):
                    if i % 2:
                        works.append(dist.all_reduce(p.grad, async_op=True))
                    else:
                        dist.all_reduce(p.grad)
                for w in works:
                    w.wait()
                for p in model.parameters():
                    p.grad /= world
            elif a.mode == "funcol":  # functional collectives: waited explicitly, or on first use
                import torch.distributed._functional_collectives as funcol

                for i, p in enumerate(model.parameters()):
                    out = funcol.all_reduce(p.grad, "sum", dist.group.WORLD)
                    p.grad = out.wait() / world if i % 2 else out / world
                gathered = funcol.all_gather_tensor(loss.detach().reshape(1), 0, dist.group.WORLD)
                assert gathered.wait().numel() == world
            if ref is not None:
                ref(x).square().mean().backward()
                for p, q in zip(model.parameters(), ref.parameters(), strict=True):
                    grad_diff = max(grad_diff, float((p.grad - q.grad).abs().max()))
                ref.zero_grad()
            opt.step()
            opt.zero_grad()
        if ref is not None:
            with torch.no_grad():
                for p, q in zip(model.parameters(), ref.parameters(), strict=True):
                    q.copy_(p)
    prof_ms: dict[str, float] = {"all": 0.0}
    if prof is not None:
        prof.__exit__(None, None, None)
        prof_ms = profiled_collective_ms(prof)
    dist.barrier()
    notes = dict(agent.absent, **agent.hooks.notes)
    info = dataclasses.asdict(agent.info)
    argus.detach()
    rows = [dataclasses.asdict(r) for b in sink.of(StepBatch) for r in b.records()]
    out = {
        "rank": rank,
        "records": rows,
        "profiler_ms": prof_ms,
        "notes": notes,
        "info": info,
        "grad_diff": grad_diff,
    }
    Path(a.out, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def launch(world: int, args: Sequence[str], out: Path, *, timeout: float = 240.0) -> list[dict[str, Any]]:
    """Run ``world`` ranks of this worker; return each rank's output (raises if one failed)."""
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        env.update(
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(r),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        cmd = [sys.executable, "-m", "tests.agent.rank_worker", *args, "--out", str(out)]
        procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        if p.returncode:
            errors.append(err[-3000:])
    if errors:
        raise AssertionError("a rank failed:\n" + "\n".join(errors))
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of one rank."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["ddp", "fsdp", "direct", "funcol"], default="ddp")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--base-ms", type=float, default=0.0)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-ms", type=float, default=60.0)
    ap.add_argument("--slow-from", type=int, default=0, help="the first step slowed")
    ap.add_argument("--slow-until", type=int, default=-1, help="the first step no longer slowed (-1: none)")
    ap.add_argument(
        "--slow-in", choices=["forward", "loop"], default="forward", help="where the slowed rank sleeps"
    )
    ap.add_argument("--profile-from", type=int, default=-1)
    ap.add_argument("--mesh", default="", help="dim names of a mesh handed to attach: dp,tp")
    ap.add_argument("--job", default="agent-test")
    ap.add_argument("--check-grads", action="store_true", help="ddp: compare gradients with a C++-hook twin")
    ap.add_argument("--builtin-hook", action="store_true", help="ddp: register torch's C++ ALLREDUCE hook")
    ap.add_argument("--out", required=True)
    run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
