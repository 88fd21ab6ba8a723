"""Folded stack samples (py-spy format) and heartbeats of simulated ranks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from argus.schemas import Heartbeat, StackSample

if TYPE_CHECKING:
    from ._cluster import SimStep

__all__ = ["STACKS", "heartbeats", "stack_sample"]

_ROOT = "train.py:<module>;train.py:main;train.py:train_step"
STACKS: dict[str, str] = {
    "forward_ms": f"{_ROOT};torch/nn/modules/module.py:_call_impl;model.py:GPT.forward;model.py:Block.forward",
    "backward_ms": f"{_ROOT};torch/_tensor.py:backward;torch/autograd/graph.py:_engine_run_backward",
    "optimizer_ms": f"{_ROOT};torch/optim/adamw.py:step;torch/optim/adamw.py:_multi_tensor_adamw",
    "dataloader_ms": f"{_ROOT};torch/utils/data/dataloader.py:__next__;torch/utils/data/dataloader.py:_next_data;multiprocessing/queues.py:get",
    "h2d_ms": f"{_ROOT};torch/utils/data/_utils/pin_memory.py:pin_memory;torch/cuda/__init__.py:_lazy_init",
    "gc_ms": f"{_ROOT};torch/_tensor.py:backward;gc:collect",
    "compile_ms": f"{_ROOT};torch/_dynamo/eval_frame.py:_fn;torch/_inductor/compile_fx.py:compile_fx;triton/compiler/compiler.py:compile",
    "checkpoint_ms": f"{_ROOT};torch/distributed/checkpoint/state_dict_saver.py:save;torch/distributed/checkpoint/filesystem.py:write_data",
    "collective": f"{_ROOT};torch/distributed/distributed_c10d.py:all_reduce;torch/cuda/streams.py:synchronize",
    "hidden": f"{_ROOT};torch/cuda/__init__.py:synchronize",
}
_COLLECTIVES = ("all_reduce_ms", "all_gather_ms", "reduce_scatter_ms", "p2p_ms")


def _row(sim: SimStep, rank: int) -> int:
    ranks = sim.batch["rank"]
    return rank if rank < len(ranks) and ranks[rank] == rank else int(np.flatnonzero(ranks == rank)[0])


def stack_sample(sim: SimStep, rank: int, hz: float = 100.0) -> StackSample:
    """The folded stacks of ``rank`` over the step, sampled at ``hz`` (counts = ms × hz / 1000)."""
    b, i = sim.batch, _row(sim, rank)
    ms = {col: float(b[col][i]) for col in STACKS if col in b.columns}
    ms["collective"] = float(sum(b[c][i] for c in _COLLECTIVES))
    ms["hidden"] = float(sim.hidden_ms[i])
    stacks, counts = [], []
    for col, stack in STACKS.items():
        n = round(ms.get(col, 0.0) * hz / 1000.0)
        if n > 0:
            stacks.append(stack)
            counts.append(n)
    return StackSample(
        b.job, b.run, rank, b.step, int(b["start_ns"][i]), int(b["end_ns"][i]), tuple(stacks), tuple(counts)
    )


def heartbeats(sim: SimStep, ranks: Sequence[int] | None = None) -> list[Heartbeat]:
    """Per-rank heartbeats after the step: every collective entered has finished.

    Groups are named ``tp:<pp>.<dp>``, ``dp:<pp>.<tp>`` and ``pp:<dp>.<tp>``; sequence
    numbers count the group's collectives since step 0.
    """
    b = sim.batch
    lay = sim.layout
    rows = np.arange(len(b)) if ranks is None else np.array([_row(sim, int(r)) for r in ranks], np.int64)
    calls = {"tp": 128, "dp": 8, "pp": 32}
    kinds = ("all_gather", "all_reduce", "send_recv")
    out: list[Heartbeat] = []
    for i in rows.tolist():
        pp, dp, tp = int(b["pp"][i]), int(b["dp"][i]), int(b["tp"][i])
        groups = (f"tp:{pp}.{dp}", f"dp:{pp}.{tp}", f"pp:{dp}.{tp}")
        seqs = tuple((b.step + 1) * calls[g] for g in ("tp", "dp", "pp"))
        enabled = (lay.tp > 1, lay.dp > 1, lay.pp > 1)
        keep = [j for j in range(3) if enabled[j]]
        out.append(
            Heartbeat(
                b.job,
                b.run,
                int(b["rank"][i]),
                str(b["host"][i]),
                int(b["end_ns"][i]),
                b.step,
                tuple(groups[j] for j in keep),
                tuple(seqs[j] for j in keep),
                tuple(seqs[j] for j in keep),
                tuple(kinds[j] for j in keep),
                tuple(1 << 26 for _ in keep),
                STACKS["dataloader_ms"],
            )
        )
    return out
