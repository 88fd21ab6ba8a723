"""A small data-parallel transformer trained with DistributedDataParallel (gloo) and the agent.

One process per rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set by a
launcher, or :func:`launch` to start them all here). DDP averages the gradients in
backward (its bucketed all-reduce, timed by the agent as ``all_reduce_ms``);
``--slow-rank`` makes one rank's forward pass slower by ``--slow-ms`` from step
``--slow-from`` on (a compute straggler: its peers wait for it in DDP's all-reduce);
``--hang-rank R --hang-step S`` makes rank R block forever on a lock before step S's
backward, hence before its all-reduce (a hang: its peers wait in the all-reduce until they
are killed)::

    python -m argus.examples.train_ddp --world 4 --steps 40 --slow-rank 2 --job demo-1
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

__all__ = ["launch", "main", "train"]


def _model(dim: int, layers: int):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=2 * dim, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(dim, 1)
            self.delay_s = 0.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.delay_s:
                time.sleep(self.delay_s)  # the straggler: slower compute in forward
            out: torch.Tensor = self.head(self.encoder(x)).mean(dim=(1, 2))
            return out

    return Tiny()


def train(
    *,
    steps: int,
    job: str,
    slow_rank: int = -1,
    slow_ms: float = 60.0,
    slow_from: int = 0,
    base_ms: float = 20.0,
    dim: int = 32,
    layers: int = 1,
    batch: int = 8,
    seq: int = 16,
    bootstrap: str | None = None,
    home: str | None = None,
    stack_hz: float = 50.0,
    hang_rank: int = -1,
    hang_step: int = -1,
) -> dict[str, object]:
    """Train for ``steps`` steps in this process (one rank) with the agent attached."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    import argus

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = _model(dim, layers)
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    overrides: dict[str, object] = {"job": job, "stack_hz": stack_hz, "heartbeat_s": 1.0}
    if bootstrap:
        overrides["kafka_bootstrap"] = bootstrap
    if home:
        overrides["home"] = home
    argus.attach(model, opt, **overrides)
    data = TensorDataset(torch.randn(batch * steps, seq, dim), torch.randn(batch * steps))
    loader = DataLoader(data, batch_size=batch)
    for step, (x, y) in enumerate(loader):
        slowed = rank == slow_rank and step >= slow_from
        net.delay_s = (base_ms + (slow_ms if slowed else 0.0)) / 1000
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=False)
        if rank == hang_rank and step == hang_step:
            _block_forever()  # the hang: its peers wait in DDP's all-reduce in their backward
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()  # ends the step (automatic mode)
    dist.barrier()
    stats = argus.detach(timeout=30)
    dist.destroy_process_group()
    return stats


def _block_forever() -> None:
    """A Python deadlock: wait on a lock nobody releases (until the process is killed)."""
    import threading

    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    world: int, args: Sequence[str], *, timeout: float = 300.0, env: dict[str, str] | None = None
) -> list[int]:
    """Run ``world`` ranks of this script as subprocesses; return their exit codes."""
    port = _free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ if env is None else env)
        e.update(
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(r),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        e.setdefault("OMP_NUM_THREADS", "1")
        procs.append(subprocess.Popen([sys.executable, "-m", "argus.examples.train_ddp", *args], env=e))
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: one rank (under a launcher) or ``--world N`` ranks started here."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=0, help="start this many ranks here (0: be one rank)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--job", default=f"example-{int(time.time())}")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-ms", type=float, default=60.0)
    ap.add_argument("--slow-from", type=int, default=0, help="the slow rank is slowed from this step on")
    ap.add_argument("--base-ms", type=float, default=20.0)
    ap.add_argument("--hang-rank", type=int, default=-1, help="this rank blocks before an all-reduce")
    ap.add_argument("--hang-step", type=int, default=-1, help="... at this step (never returns)")
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--home", default=None)
    a = ap.parse_args(argv)
    if a.world:
        rest = [x for x in (argv if argv is not None else sys.argv[1:])]
        i = rest.index("--world")
        del rest[i : i + 2]
        codes = launch(a.world, rest)
        return max(codes)
    stats = train(
        steps=a.steps,
        job=a.job,
        slow_rank=a.slow_rank,
        slow_ms=a.slow_ms,
        slow_from=a.slow_from,
        base_ms=a.base_ms,
        bootstrap=a.bootstrap,
        home=a.home,
        hang_rank=a.hang_rank,
        hang_step=a.hang_step,
    )
    print(f"rank {os.environ.get('RANK')}: {stats}", file=sys.stderr)
    dropped = stats.get("dropped") if isinstance(stats, dict) else None
    return 1 if dropped else 0


if __name__ == "__main__":
    sys.exit(main())
