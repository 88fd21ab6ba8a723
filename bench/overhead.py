"""Always-on overhead of the rank agent on a real PyTorch training loop (CPU).

A small transformer trained for a few hundred steps of >= 50 ms, in rounds of three
interleaved blocks so drift cancels: agent off, agent on (framework hooks, stack sampler at
50 Hz, step records, stack samples and heartbeats published through a real ``Publisher``
whose broker is unreachable, so the spool path runs too), and ``torch.profiler`` on (CPU
activities). Prints median step time of each and the overhead ratios; the last line is
JSON with ``overhead_pct``, ``profiler_overhead_pct`` and ``step_ms``.

    python bench/overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import json
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

    def train(n: int, *, profiler: bool = False, agent_on: bool = False) -> list[float]:
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
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
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
    spool = tempfile.mkdtemp(prefix="argus-overhead-")
    publisher = Publisher({"bootstrap.servers": "127.0.0.1:1"}, spool_dir=spool, stall_s=0.5)
    info = RankInfo(job="overhead", run=0, rank=0, world=1, local_rank=0, host="bench")
    times: dict[str, list[float]] = {"off": [], "agent": [], "profiler": []}
    ratios: dict[str, list[float]] = {"agent": [], "profiler": []}
    for _ in range(rounds):
        block = {"off": train(per_block)[1:]}
        agent = RankAgent(
            publisher,
            info,
            AgentConfig(
                stack_hz=args.stack_hz or 50.0, stacks=args.stack_hz > 0, heartbeat_s=1.0, cupti=False
            ),
        )
        agent.install(model, opt)
        block["agent"] = train(per_block, agent_on=True)[1:]
        agent.close()
        block["profiler"] = train(per_block, profiler=True)[1:]
        for k, v in block.items():
            times[k] += v
        # paired within the round (slow drift cancels); a block's fastest quartile, because
        # other load on the machine only ever adds time to a step
        base = _low(block["off"])
        for k in ratios:
            ratios[k].append(_low(block[k]) / base - 1)
    stats = publisher.stats()
    publisher.shutdown(2)
    _ = argus  # the public API wraps exactly this RankAgent
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = statistics.median(ratios["agent"]) * 100
    prof_overhead = statistics.median(ratios["profiler"]) * 100
    print(f"{'mode':<10}{'steps':>7}{'median ms':>12}{'p90 ms':>10}{'overhead %':>12}")
    for k, v in times.items():
        p90 = sorted(v)[int(0.9 * len(v))]
        ov = (med[k] / med["off"] - 1) * 100
        print(f"{k:<10}{len(v):>7}{med[k]:>12.2f}{p90:>10.2f}{ov:>12.2f}")
    print(
        f"overhead, median over {rounds} paired rounds of the fastest-quartile step time: agent {overhead:.2f} %, torch.profiler {prof_overhead:.2f} %"
    )
    print(f"agent records: steps/stacks/heartbeats spooled={stats['spooled']} dropped={stats['dropped']}")
    print(
        json.dumps(
            {
                "overhead_pct": round(overhead, 3),
                "profiler_overhead_pct": round(prof_overhead, 3),
                "step_ms": round(med["off"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
