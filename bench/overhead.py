"""Always-on overhead of the rank agent on a real PyTorch training loop (CPU).

A small transformer trained in steps of ~45 ms, in rounds of interleaved blocks so drift
cancels: agent off, agent on (framework hooks, stack sampler at its default rate, step
records, stack samples and heartbeats every second published through a real ``Publisher``
whose broker is unreachable, so the spool path runs too), ``torch.profiler`` on (CPU
activities); then the same model wrapped in ``DistributedDataParallel`` (a one-rank gloo
group: the reducer, its buckets and the backend run, and the agent's timing of DDP's
all-reduce wait) without and with the agent: one module, a fresh DDP wrapper for each block.
Each block trains untimed before and after its timed steps for longer than the agent's and
the publisher's intervals (steady state: nothing deferred to the agent's close). Within a
round the two sides of each pair take turns going first. Prints median step time of each
and the overhead ratios with their spread over rounds (quartiles), the CPU the agent's and
the publisher's threads used per step (thread CPU clocks) and the machine's load; the last
line is JSON with ``overhead_pct``, ``overhead_ddp_pct``, ``profiler_overhead_pct`` (medians
of the paired rounds), their quartiles, ``step_ms`` and ``load_1m``. ``--components`` adds a
table of what each part of the agent costs, measured in isolation.

    python bench/overhead.py [--quick] [--components]
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import json
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def make_model(dim: int, layers: int) -> nn.Module:
    layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim, batch_first=True, dropout=0.0)
    return nn.Sequential(
        nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.Linear(dim, dim)
    )


def _train_step(net: nn.Module, optim: Any, batches: Iterator[Any], loader: Any) -> Iterator[Any]:
    """One training step on the next batch (the loader starts over when it runs out); returns
    the batches to take the next step from."""
    try:
        x, y = next(batches)
    except StopIteration:
        batches = iter(loader)
        x, y = next(batches)
    loss = nn.functional.mse_loss(net(x), y)
    optim.zero_grad(set_to_none=True)
    loss.backward()
    optim.step()
    return batches


def _low(v: list[float]) -> float:
    """Mean of the fastest quarter of a block's step times."""
    s = sorted(v)[: max(1, len(v) // 4)]
    return sum(s) / len(s)


def _quartiles(v: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return q[0], q[2]


def _cpu_ns(thread: threading.Thread | None) -> int:
    """CPU time a thread has used so far (its thread CPU clock)."""
    if thread is None or thread.ident is None or not thread.is_alive():
        return 0
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
    except (OSError, AttributeError):
        return 0


def main() -> None:
    faulthandler.enable()
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="timed steps per block (default 32)")
    ap.add_argument(
        "--stack-hz", type=float, default=None, help="stack sampling rate (0: off; default: the agent's)"
    )
    ap.add_argument("--components", action="store_true", help="also time the agent's parts in isolation")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    rounds = args.rounds or (16 if args.quick else 40)
    # 32 timed steps a block: a block's fastest quarter is then 8 steps, not 4 (a steadier
    # figure per round; the standard error of the medians is printed)
    per_block = args.steps or (12 if args.quick else 32)
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
    # One module under DDP for both sides: a fresh DistributedDataParallel wraps it for each
    # block (the agent's hook stays with the wrapper it was registered on). Two copies of
    # the model, one per side, differ by up to ~0.4 % in step time on their own (memory
    # layout), which is the size of what is measured.
    ddp_model = copy.deepcopy(model)
    opt_ddp = torch.optim.AdamW(ddp_model.parameters(), lr=1e-4)

    def ddp() -> nn.Module:
        """A fresh DDP over ``ddp_model``, past its first two steps (bucket rebuild)."""
        net = DistributedDataParallel(ddp_model)
        train(2, net=net, optim=opt_ddp)
        return net

    steps_run = [0]

    def train(
        n: int, *, profiler: bool = False, net: nn.Module = model, optim=opt, settle_s: float = 0.0
    ) -> list[float]:
        """Step times (ms) of ``n`` steps, after and before ``settle_s`` of untimed steps."""
        out = []
        it = iter(loader)
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profiler else None
        if prof is not None:
            prof.__enter__()
        for timed in (False, True, False) if settle_s else (True,):
            t_end = time.perf_counter() + settle_s
            while (len(out) < n) if timed else (time.perf_counter() < t_end):
                t0 = time.perf_counter()
                it = _train_step(net, optim, it, loader)
                if timed:
                    out.append((time.perf_counter() - t0) * 1e3)
                steps_run[0] += 1
                if prof is not None:
                    prof.step()
        if prof is not None:
            prof.__exit__(None, None, None)
        return out

    import argus
    from argus.producers.agent import AgentConfig, RankAgent, RankInfo
    from argus.producers.publisher import Publisher

    train(10)  # warm-up
    train(5, net=ddp(), optim=opt_ddp)
    spool = tempfile.mkdtemp(prefix="argus-overhead-")
    publisher = Publisher(  # as argus.attach builds it
        {"bootstrap.servers": "127.0.0.1:1"},
        spool_dir=spool,
        stall_s=0.5,
        wake_ms=argus.api.PUBLISHER_WAKE_MS,
        background=True,
    )
    info = RankInfo(job="overhead", run=0, rank=0, world=1, local_rank=0, host="bench")
    times: dict[str, list[float]] = {"off": [], "agent": [], "profiler": [], "ddp_off": [], "ddp_agent": []}
    ratios: dict[str, list[float]] = {"agent": [], "profiler": [], "ddp_agent": []}
    hz: dict[str, Any] = {} if args.stack_hz is None else {"stack_hz": args.stack_hz or 1.0}
    cfg = AgentConfig(**hz, stacks=args.stack_hz != 0, heartbeat_s=1.0, cupti=False)
    ddp_steps = 0
    # CPU ns of the agent's and the publisher's threads, and steps, while an agent ran
    cpu: dict[str, list[int]] = {"agent": [0, 0, 0], "ddp_agent": [0, 0, 0]}

    # The agent publishes finished steps every publish_s and wakes the publisher to send
    # them: each block trains untimed for longer than that before and after its timed steps,
    # so the timed steps see the agent in its steady state (the work for the steps before
    # them, none of it deferred to close()). Every side gets the same blocks.
    settle = cfg.publish_s + 0.1

    def with_agent(kind: str, net: nn.Module, optim: Any) -> list[float]:
        agent = RankAgent(publisher, info, cfg)
        agent.install(net, optim)
        a0, p0, s0 = _cpu_ns(agent._thread), _cpu_ns(publisher._thread), steps_run[0]
        out = train(per_block, net=net, optim=optim, settle_s=settle)[1:]
        a1, p1, s1 = _cpu_ns(agent._thread), _cpu_ns(publisher._thread), steps_run[0]
        agent.close()
        c = cpu[kind]
        c[0], c[1], c[2] = c[0] + a1 - a0, c[1] + p1 - p0, c[2] + s1 - s0
        return out

    for r in range(rounds):
        # each side goes first in every other round (a block's place in the round cancels)
        block: dict[str, list[float]] = {}
        for side in ("off", "agent") if r % 2 == 0 else ("agent", "off"):
            block[side] = (
                train(per_block, settle_s=settle)[1:] if side == "off" else with_agent("agent", model, opt)
            )
        block["profiler"] = train(per_block, profiler=True, settle_s=settle)[1:]
        for side in ("ddp_off", "ddp_agent") if r % 2 == 0 else ("ddp_agent", "ddp_off"):
            net = ddp()
            block[side] = (
                train(per_block, net=net, optim=opt_ddp, settle_s=settle)[1:]
                if side == "ddp_off"
                else with_agent("ddp_agent", net, opt_ddp)
            )
            del net
        ddp_steps += per_block - 1
        for k, v in block.items():
            times[k] += v
        # paired within the round (slow drift cancels); a block's fastest quartile, because
        # other load on the machine only ever adds time to a step
        for k in ratios:
            base = _low(block["ddp_off" if k.startswith("ddp") else "off"])
            ratios[k].append(_low(block[k]) / base - 1)
    stats = publisher.stats()
    publisher.shutdown(2)
    shutil.rmtree(spool, ignore_errors=True)
    _ = argus  # the public API wraps exactly this RankAgent
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = statistics.median(ratios["agent"]) * 100
    overhead_ddp = statistics.median(ratios["ddp_agent"]) * 100
    prof_overhead = statistics.median(ratios["profiler"]) * 100
    iqr = {k: tuple(round(x * 100, 3) for x in _quartiles(v)) for k, v in ratios.items()}
    # standard error of a median over rounds (1.2533 sd / sqrt(n) for near-normal rounds)
    se = {
        k: round(1.2533 * statistics.stdev(v) / len(v) ** 0.5 * 100, 3) if len(v) > 1 else 0.0
        for k, v in ratios.items()
    }
    print(f"{'mode':<10}{'steps':>7}{'median ms':>12}{'p90 ms':>10}{'overhead %':>12}")
    for k, v in times.items():
        p90 = sorted(v)[int(0.9 * len(v))]
        ov = (med[k] / med["ddp_off" if k.startswith("ddp") else "off"] - 1) * 100
        print(f"{k:<10}{len(v):>7}{med[k]:>12.2f}{p90:>10.2f}{ov:>12.2f}")
    print(
        f"overhead, median over {rounds} paired rounds of the fastest-quartile step time: agent {overhead:.2f} %, "
        f"agent on DDP {overhead_ddp:.2f} %, torch.profiler {prof_overhead:.2f} %"
    )
    print(
        "spread over rounds (quartiles, %): "
        + ", ".join(f"{k} {lo:.2f}..{hi:.2f}" for k, (lo, hi) in iqr.items())
    )
    print("standard error of each median (%): " + ", ".join(f"{k} {v:.2f}" for k, v in se.items()))
    print(f"DDP steps timed with the agent: {ddp_steps}")
    for k, (a, p, n) in cpu.items():
        print(
            f"CPU per step ({k}): agent thread {a / n / 1e3:.0f} us, publisher thread {p / n / 1e3:.0f} us "
            f"({(a + p) / n / 1e4 / med['off']:.2f} % of a step)"
        )
    load_after = os.getloadavg()[0]
    print(f"load average (1 min) {load_before:.2f} before, {load_after:.2f} after, {os.cpu_count()} CPUs")
    if args.components:
        components(info)
    dist.destroy_process_group()
    print(f"agent records: steps/stacks/heartbeats spooled={stats['spooled']} dropped={stats['dropped']}")
    print(
        json.dumps(
            {
                "overhead_pct": round(overhead, 3),
                "overhead_ddp_pct": round(overhead_ddp, 3),
                "profiler_overhead_pct": round(prof_overhead, 3),
                "overhead_iqr": iqr["agent"],
                "overhead_ddp_iqr": iqr["ddp_agent"],
                "profiler_overhead_iqr": iqr["profiler"],
                "overhead_se": se["agent"],
                "overhead_ddp_se": se["ddp_agent"],
                "step_ms": round(med["off"], 2),
                "ddp_step_ms": round(med["ddp_off"], 2),
                "load_1m": round(max(load_before, load_after), 2),
            }
        )
    )


def _per_call_us(fn: Any, n: int = 2000) -> float:
    fn()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1e3


def components(info: Any) -> None:
    """What each part of the agent costs, timed in isolation (no other load in the loop)."""
    from argus.producers.agent import AgentConfig, RankAgent, RawStep, StackFolder
    from argus.producers.agent._spans import CpuClock, reduce_step

    class Null:
        def publish(self, *_a: Any) -> None:
            pass

    tiny = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    topt = torch.optim.SGD(tiny.parameters(), lr=1e-4)
    x = torch.randn(4, 8)
    tloader = torch.utils.data.DataLoader([(x, x)] * 8, batch_size=None)

    def tiny_steps(n: int) -> float:
        it = iter(tloader)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            it = _train_step(tiny, topt, it, tloader)
        return (time.perf_counter_ns() - t0) / n / 1e3

    quiet = AgentConfig(stacks=False, heartbeat_s=1e6, stack_hz=1.0, cupti=False)
    off, on = [], []
    tiny_steps(200)
    for _ in range(7):
        off.append(tiny_steps(1000))
        agent = RankAgent(Null(), info, quiet)
        agent.install(tiny, topt)
        on.append(tiny_steps(1000))
        agent.close()
    hooks = statistics.median(on) - statistics.median(off)

    folder = StackFolder()
    me = threading.get_ident()
    spans = [[0, 1_000, 10_000_000, -1], [1, 11_000_000, 40_000_000, -1], [9, 20_000_000, 30_000_000, -1]]
    spans += [
        [9, 25_000_000, 35_000_000, -1],
        [2, 40_000_000, 49_000_000, -1],
        [6, 41_000_000, 41_500_000, 4],
    ]
    raw = RawStep(3, time.time_ns(), 0, 50_000_000, spans)
    agent = RankAgent(Null(), info, quiet)
    ms = reduce_step(raw, CpuClock())

    def wake(n: int = 200) -> float:
        lock = threading.Lock()
        lock.acquire()
        box: list[int] = []

        def run() -> None:
            c0 = _cpu_ns(threading.current_thread())
            for _ in range(n):
                lock.acquire(timeout=0.001)
            box.append(_cpu_ns(threading.current_thread()) - c0)

        t = threading.Thread(target=run)
        t.start()
        t.join()
        return box[0] / n / 1e3

    rows = [
        ("training-thread hooks, per step (tiny model: forward, backward, optimizer, loader, gc)", hooks),
        ("agent thread: one wake-up (sleep on a lock, GIL)", wake()),
        ("agent thread: one stack sample (key of code ids)", _per_call_us(lambda: folder.sample_key(me))),
        (
            "agent thread: reduce one step (6 spans, pure Python)",
            _per_call_us(lambda: reduce_step(raw, CpuClock())),
        ),
        (
            "agent thread: the step's message (1-row StepBatch on the wire, checked)",
            _per_call_us(lambda: agent.step_message(raw, ms)),
        ),
    ]
    print("component costs, timed in isolation (the same work costs 2-4x more on a loaded machine):")
    for name, us in rows:
        print(f"  {name:<92}{us:8.1f} us")


if __name__ == "__main__":
    main()
