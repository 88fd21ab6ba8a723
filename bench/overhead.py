"""Always-on overhead of the rank agent on a real PyTorch training loop (CPU).

A small transformer trained for a few hundred steps of >= 50 ms, in rounds of interleaved
blocks so drift cancels: agent off, agent on (framework hooks, stack sampler at 50 Hz, step
records, stack samples and heartbeats published through a real ``Publisher`` whose broker
is unreachable, so the spool path runs too), ``torch.profiler`` on (CPU activities); then
the same model wrapped in ``DistributedDataParallel`` (a one-rank gloo group: the reducer,
its buckets and the backend run, the agent's all-reduce hook and collective spans too)
without and with the agent. Two copies of the model keep DDP's own C++ reducer path for the
"off" blocks (the agent's hook stays on a DDP it has seen). Prints median step time of each
and the overhead ratios; the last line is JSON with ``overhead_pct``, ``overhead_ddp_pct``,
``profiler_overhead_pct`` and ``step_ms``.

    python bench/overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import socket
import statistics
import tempfile
import time

import torch
from torch import nn


def make_model(dim: int, layers: int) -> nn.Module:
    layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim, batch_first=True, dropout=0.0)
    return nn.Sequential(
        nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.Linear(dim, dim)
    )


def _low(v: list[float]) -> float:
    """Mean of the fastest quarter of a block's step times."""
    s = sorted(v)[: max(1, len(v) // 4)]
    return sum(s) / len(s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--stack-hz", type=float, default=50.0, help="stack sampling rate (0: off)")
    args = ap.parse_args()
    rounds = args.rounds or (16 if args.quick else 40)
    per_block = 9 if args.quick else 10
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dim, layers, batch, seq = 128, 2, 16, 80
    model = make_model(dim, layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = [(torch.randn(batch, seq, dim), torch.randn(batch, seq, dim)) for _ in range(8)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    ddp_off = DistributedDataParallel(copy.deepcopy(model))
    ddp_on = DistributedDataParallel(copy.deepcopy(model))
    opt_off = torch.optim.AdamW(ddp_off.parameters(), lr=1e-4)
    opt_on = torch.optim.AdamW(ddp_on.parameters(), lr=1e-4)

    def train(
        n: int, *, profiler: bool = False, agent_on: bool = False, net: nn.Module = model, optim=opt
    ) -> list[float]:
        out = []
        it = iter(loader)
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profiler else None
        if prof is not None:
            prof.__enter__()
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(loader)
                x, y = next(it)
            loss = nn.functional.mse_loss(net(x), y)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            out.append((time.perf_counter() - t0) * 1e3)
            if prof is not None:
                prof.step()
        if prof is not None:
            prof.__exit__(None, None, None)
        return out

    import argus
    from argus.producers.agent import AgentConfig, RankAgent, RankInfo
    from argus.producers.publisher import Publisher

    train(10)  # warm-up
    train(5, net=ddp_off, optim=opt_off)
    train(5, net=ddp_on, optim=opt_on)
    spool = tempfile.mkdtemp(prefix="argus-overhead-")
    publisher = Publisher({"bootstrap.servers": "127.0.0.1:1"}, spool_dir=spool, stall_s=0.5)
    info = RankInfo(job="overhead", run=0, rank=0, world=1, local_rank=0, host="bench")
    times: dict[str, list[float]] = {"off": [], "agent": [], "profiler": [], "ddp_off": [], "ddp_agent": []}
    ratios: dict[str, list[float]] = {"agent": [], "profiler": [], "ddp_agent": []}
    cfg = AgentConfig(stack_hz=args.stack_hz or 50.0, stacks=args.stack_hz > 0, heartbeat_s=1.0, cupti=False)
    ddp_steps = 0
    for _ in range(rounds):
        block = {"off": train(per_block)[1:]}
        agent = RankAgent(publisher, info, cfg)
        agent.install(model, opt)
        block["agent"] = train(per_block, agent_on=True)[1:]
        agent.close()
        block["profiler"] = train(per_block, profiler=True)[1:]
        block["ddp_off"] = train(per_block, net=ddp_off, optim=opt_off)[1:]
        agent = RankAgent(publisher, info, cfg)
        agent.install(ddp_on, opt_on)
        block["ddp_agent"] = train(per_block, agent_on=True, net=ddp_on, optim=opt_on)[1:]
        agent.close()
        ddp_steps += agent.step
        for k, v in block.items():
            times[k] += v
        # paired within the round (slow drift cancels); a block's fastest quartile, because
        # other load on the machine only ever adds time to a step
        for k in ratios:
            base = _low(block["ddp_off" if k.startswith("ddp") else "off"])
            ratios[k].append(_low(block[k]) / base - 1)
    stats = publisher.stats()
    publisher.shutdown(2)
    _ = argus  # the public API wraps exactly this RankAgent
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = statistics.median(ratios["agent"]) * 100
    overhead_ddp = statistics.median(ratios["ddp_agent"]) * 100
    prof_overhead = statistics.median(ratios["profiler"]) * 100
    print(f"{'mode':<10}{'steps':>7}{'median ms':>12}{'p90 ms':>10}{'overhead %':>12}")
    for k, v in times.items():
        p90 = sorted(v)[int(0.9 * len(v))]
        ov = (med[k] / med["ddp_off" if k.startswith("ddp") else "off"] - 1) * 100
        print(f"{k:<10}{len(v):>7}{med[k]:>12.2f}{p90:>10.2f}{ov:>12.2f}")
    print(
        f"overhead, median over {rounds} paired rounds of the fastest-quartile step time: agent {overhead:.2f} %, "
        f"agent on DDP {overhead_ddp:.2f} %, torch.profiler {prof_overhead:.2f} %"
    )
    print(f"DDP steps the agent recorded: {ddp_steps}")
    dist.destroy_process_group()
    print(f"agent records: steps/stacks/heartbeats spooled={stats['spooled']} dropped={stats['dropped']}")
    print(
        json.dumps(
            {
                "overhead_pct": round(overhead, 3),
                "overhead_ddp_pct": round(overhead_ddp, 3),
                "profiler_overhead_pct": round(prof_overhead, 3),
                "step_ms": round(med["off"], 2),
                "ddp_step_ms": round(med["ddp_off"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
