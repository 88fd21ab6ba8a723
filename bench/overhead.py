"""Always-on overhead of the rank agent on a real PyTorch training loop (CPU).

A small transformer trained in steps of ~50 ms, plain and wrapped in
``DistributedDataParallel`` (a one-rank gloo group: the reducer, its buckets and the backend
run, and the agent's timing of DDP's all-reduce wait; one DDP wrapper for both sides). One
agent runs for the whole process (framework hooks, stack sampler at its default rate, step
records, stack samples and heartbeats every second published through a real ``Publisher``
whose broker is unreachable, so the spool path runs too) and is switched on or off before
every timed step, untimed: on, its hooks on the step's model and its thread free; off, no
hook, and the thread's work skipped. A round is four steps side by side, off/on/on/off or
its mirror, plain then DDP: the host's noise lasts seconds (a step's time correlates 0.66
with the next one's), so neighbouring steps cancel most of it, where blocks of steps a few
seconds apart differed by 5-17 % on this VM. ``torch.profiler`` is compared in blocks (off,
on, off) every few rounds: entering and leaving it costs too much to switch per step. The
rounds are split over several processes run one after another (``--processes``, default
4): a process's heap layout moves its step time by up to ~0.4 % for its whole life.

Prints the median step time of each side, the overhead ratios with their spread over rounds
(quartiles) and standard errors, each side's wait per step (wall minus the training
thread's CPU: the GIL, the scheduler), the CPU the agent's and the publisher's threads used
per agent step (thread CPU clocks), and the overhead measured part by part: the hooks' CPU
per step (a tiny model, thousands of steps) plus the training thread's extra wait. The last
line is JSON with ``overhead_pct``, ``overhead_ddp_pct``, ``profiler_overhead_pct``
(medians of the paired rounds), their quartiles and standard errors, ``hooks_us``,
``hooks_ddp_us``, ``direct_overhead_pct``, ``direct_overhead_ddp_pct``, ``step_ms``,
``processes``, ``noise_sd_pct`` and ``ddp_noise_sd_pct`` (the spread of a round's two off
steps against each other: the noise floor of the run) and ``load_1m``. ``--components``
adds a table of what each part of the agent costs, measured in isolation.

    python bench/overhead.py [--quick | --smoke] [--rounds N] [--processes K] [--components]

``--smoke`` (CI: does it still run?) runs every part at a tiny size: 4 rounds over 2
processes, profiler blocks of 2 steps, the hooks timed over 50 steps, the components too.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import faulthandler
import gc
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

# Kineto (torch.profiler) logs an ERROR line on a machine without a GPU; nothing is wrong
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

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
    ap.add_argument("--smoke", action="store_true", help="every part at a tiny size: runs, figures unchecked")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="timed steps per torch.profiler block (default 8)")
    ap.add_argument(
        "--processes",
        type=int,
        default=0,
        help="split the rounds over this many processes, one after another (default 4; quick 1)",
    )
    ap.add_argument(
        "--stack-hz", type=float, default=None, help="stack sampling rate (0: off; default: the agent's)"
    )
    ap.add_argument("--components", action="store_true", help="also time the agent's parts in isolation")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.processes, args.components = args.rounds or 4, args.steps or 2, 2, True
    rounds = args.rounds or (300 if args.quick else 2400)
    per_block = args.steps or 8  # torch.profiler's blocks
    if args.child:
        print(json.dumps(measure(rounds, per_block, args.stack_hz)))
        return
    load_before = os.getloadavg()[0]
    processes = max(1, min(rounds, args.processes or (1 if args.quick else 4)))
    if processes == 1:
        raws = [measure(rounds, per_block, args.stack_hz)]
    else:
        # A process's heap layout (where its tensors land) moves its step time by up to
        # ~0.4 % for its whole life, and an agent's allocations move that layout: rounds from
        # several processes average it out, as a fleet of ranks does.
        raws = []
        for i in range(processes):
            n = rounds // processes + (i < rounds % processes)
            cmd = [sys.executable, __file__, "--child", "--rounds", str(n), "--steps", str(per_block)]
            if args.stack_hz is not None:
                cmd += ["--stack-hz", str(args.stack_hz)]
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
            raws.append(json.loads(out.strip().splitlines()[-1]))
    hook_sizes = (1, 50) if args.smoke else (7, 1000)
    report(_merge(raws), rounds, processes, load_before, args.components, hook_sizes)


def _merge(raws: list[dict[str, Any]]) -> dict[str, Any]:
    """The raw figures of several processes' rounds as one."""
    out: dict[str, Any] = {}
    for key in ("times", "waits", "ratios", "noise"):
        out[key] = {k: [x for r in raws for x in r[key][k]] for k in raws[0][key]}
    out["cpu"] = {k: [sum(r["cpu"][k][i] for r in raws) for i in range(3)] for k in raws[0]["cpu"]}
    out["spooled"] = sum(r["spooled"] for r in raws)
    out["dropped"] = {k: sum(r["dropped"].get(k, 0) for r in raws) for r in raws for k in r["dropped"]}
    return out


@contextlib.contextmanager
def _one_rank_group() -> Iterator[None]:
    """A one-rank gloo process group (DDP's reducer and backend run for real)."""
    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


PROFILER_EVERY = 8  # rounds (torch.profiler's figure is there to compare with, not the test)
_INFO = dict(job="overhead", run=0, rank=0, world=1, local_rank=0, host="bench")


def measure(rounds: int, per_block: int, stack_hz: float | None) -> dict[str, Any]:
    """``rounds`` paired rounds in this process: each side's step times and waits (ms), the
    rounds' overhead ratios, the agent's and the publisher's thread CPU (ns) and steps."""
    with _one_rank_group():
        return _measure(rounds, per_block, stack_hz)


def _measure(rounds: int, per_block: int, stack_hz: float | None) -> dict[str, Any]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dim, layers, batch, seq = 128, 2, 16, 80
    model = make_model(dim, layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = [(torch.randn(batch, seq, dim), torch.randn(batch, seq, dim)) for _ in range(8)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)

    from torch.nn.parallel import DistributedDataParallel

    # One DDP model for both sides (the agent's forward hooks on the wrapper are removed with
    # the agent; its DDP timing patches the class). Two copies of a model differ by up to
    # ~0.4 % in step time on their own (memory layout), the size of what is measured.
    ddp_model = DistributedDataParallel(copy.deepcopy(model))
    opt_ddp = torch.optim.AdamW(ddp_model.parameters(), lr=1e-4)

    def train(
        n: int, *, profiler: bool = False, net: nn.Module = model, optim: Any = opt
    ) -> tuple[list[float], list[float]]:
        """Wall and training-thread CPU times (ms) of ``n`` steps."""
        wall: list[float] = []
        cpu: list[float] = []
        it = iter(loader)
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profiler else None
        if prof is not None:
            prof.__enter__()
        for _ in range(n):
            t0, c0 = time.perf_counter(), time.thread_time()
            it = _train_step(net, optim, it, loader)
            cpu.append((time.thread_time() - c0) * 1e3)
            wall.append((time.perf_counter() - t0) * 1e3)
            if prof is not None:
                prof.step()
        if prof is not None:
            prof.__exit__(None, None, None)
            # The profiler leaves reference cycles (~80 objects holding its results): the
            # next block that allocates would collect them, ~10 ms of its steps.
            del prof
            gc.collect()
        return wall, cpu

    import argus
    from argus.producers.agent import AgentConfig, RankAgent, RankInfo
    from argus.producers.publisher import Publisher

    class Held(RankAgent):
        """The agent whose thread the bench can hold: while ``gate`` is taken, the thread's
        work (a stack sample, a heartbeat, a publishing round) is skipped, as if the agent
        were not there; taking the gate waits for the work in hand."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.gate = threading.Lock()

        def _sample_stack(self) -> None:
            if self.gate.acquire(blocking=False):
                try:
                    super()._sample_stack()
                finally:
                    self.gate.release()

        def tick(self, publish: bool = True) -> None:
            if not self.gate.acquire(blocking=False):
                self._last_heartbeat = time.monotonic()  # skipped too, not due at once again
                return
            try:
                super().tick(publish)
            finally:
                self.gate.release()

    train(10)  # warm-up
    train(10, net=ddp_model, optim=opt_ddp)
    spool = tempfile.mkdtemp(prefix="argus-overhead-")
    publisher = Publisher(  # as argus.attach builds it
        {"bootstrap.servers": "127.0.0.1:1"},
        spool_dir=spool,
        stall_s=0.5,
        wake_ms=argus.api.PUBLISHER_WAKE_MS,
        background=True,
    )
    info = RankInfo(**_INFO)
    sides = ("off", "agent", "profiler", "ddp_off", "ddp_agent")
    times: dict[str, list[float]] = {k: [] for k in sides}
    waits: dict[str, list[float]] = {k: [] for k in sides}  # wall - training-thread CPU, per step
    ratios: dict[str, list[float]] = {"agent": [], "profiler": [], "ddp_agent": []}
    # the run's own noise: a round's two off steps against each other
    noise: dict[str, list[float]] = {"off": [], "ddp_off": []}
    hz: dict[str, Any] = {} if stack_hz is None else {"stack_hz": stack_hz or 1.0}
    cfg = AgentConfig(**hz, stacks=stack_hz != 0, heartbeat_s=1.0, cupti=False)
    # CPU ns of the agent's and the publisher's threads, and steps, while an agent ran
    cpu: dict[str, list[int]] = {"agent": [0, 0, 0], "ddp_agent": [0, 0, 0]}

    # One agent for the process, switched before every timed step (untimed): on, its hooks
    # on the step's model and its thread free; off, no hook and the thread held. The host's
    # noise lasts seconds (a step's time correlates 0.66 with the next one's and still 0.25
    # with the 16th), so steps side by side cancel most of it: a round is four steps,
    # off/on/on/off or its mirror, and a ratio of their times. Before either kind of step the
    # switch does the same work (uninstall, install; and uninstall again for an off step).
    # The thread does per second of agent steps what it does per second of a real run: it
    # samples at its rate, and a publishing round that falls due while it is held is skipped,
    # so the next one carries its steps. Its wake-ups while held (~10 a second, a few us
    # each) fall on the off steps.
    agent = Held(publisher, info, cfg)
    agent.install()
    agent.gate.acquire()
    # the side whose step the thread is free for, and its and the publisher's clocks then
    free: list[tuple[str, int, int]] = []

    def switch(side: str, net: nn.Module, optim: Any) -> None:
        if free:
            agent.gate.acquire()  # once the work in hand is done
            was, a0, p0 = free.pop()
            c = cpu[was]
            c[0] += _cpu_ns(agent._thread) - a0
            c[1] += _cpu_ns(publisher._thread) - p0
        agent.hooks.uninstall()
        agent.install_hooks(net, optim)
        if not side.endswith("agent"):
            agent.hooks.uninstall()
            return
        agent._open = (time.time_ns(), time.perf_counter_ns())  # steps before are not its
        agent.recorder.take()
        cpu[side][2] += 1
        free.append((side, _cpu_ns(agent._thread), _cpu_ns(publisher._thread)))
        agent.gate.release()

    def step(side: str) -> float:
        net, optim = (ddp_model, opt_ddp) if side.startswith("ddp") else (model, opt)
        switch(side, net, optim)
        (wall,), (tcpu,) = train(1, net=net, optim=optim)
        times[side].append(wall)
        waits[side].append(wall - tcpu)
        return wall

    def block(side: str) -> float:
        """The mean time of ``per_block`` steps after an untimed one (the profiler's rounds)."""
        switch("off", model, opt)
        wall, tcpu = train(per_block + 1, profiler=side == "profiler")
        if side == "profiler":  # the off steps are the rounds' (their blocks only pair)
            times[side] += wall[1:]
            waits[side] += [w - c for w, c in zip(wall[1:], tcpu[1:], strict=True)]
        return statistics.mean(wall[1:])

    orders = (("off", "agent", "agent", "off"), ("agent", "off", "off", "agent"))
    for r in range(rounds):
        for kind in ("", "ddp_"):
            t: dict[str, list[float]] = {"off": [], "agent": []}
            for side in orders[r % 2]:
                t[side].append(step(kind + side))
            ratios[kind + "agent"].append(statistics.mean(t["agent"]) / statistics.mean(t["off"]) - 1)
            noise[kind + "off"].append(t["off"][0] / t["off"][1] - 1)
        if r % PROFILER_EVERY == 0:
            # torch.profiler in blocks (entering and leaving it costs ~100 ms): off, on, off
            off0, on, off1 = block("off"), block("profiler"), block("off")
            ratios["profiler"].append(on / ((off0 + off1) / 2) - 1)
    switch("off", model, opt)
    agent.close()
    stats = publisher.stats()
    publisher.shutdown(2)
    shutil.rmtree(spool, ignore_errors=True)
    _ = argus  # the public API wraps exactly this RankAgent
    return {
        "times": times,
        "waits": waits,
        "ratios": ratios,
        "noise": noise,
        "cpu": cpu,
        "spooled": stats["spooled"],
        "dropped": dict(stats["dropped"]),
    }


def report(
    raw: dict[str, Any],
    rounds: int,
    processes: int,
    load_before: float,
    with_components: bool,
    hook_sizes: tuple[int, int] = (7, 1000),
) -> None:
    """Print the table, the medians and the last-line JSON of the merged rounds."""
    times, waits, ratios, cpu = raw["times"], raw["waits"], raw["ratios"], raw["cpu"]
    from argus.producers.agent import RankInfo

    info = RankInfo(**_INFO)
    med = {k: statistics.median(v) for k, v in times.items()}
    wait_us = {k: statistics.mean(v) * 1e3 for k, v in waits.items()}
    overhead = statistics.median(ratios["agent"]) * 100
    overhead_ddp = statistics.median(ratios["ddp_agent"]) * 100
    prof_overhead = statistics.median(ratios["profiler"]) * 100
    iqr = {k: tuple(round(x * 100, 3) for x in _quartiles(v)) for k, v in ratios.items()}
    # standard error of a median over rounds (1.2533 sd / sqrt(n) for near-normal rounds)
    se = {
        k: round(1.2533 * statistics.stdev(v) / len(v) ** 0.5 * 100, 3) if len(v) > 1 else 0.0
        for k, v in ratios.items()
    }
    print(f"{'mode':<10}{'steps':>7}{'median ms':>12}{'p90 ms':>10}{'vs off %':>10}{'wait us':>10}")
    for k, v in times.items():
        p90 = sorted(v)[int(0.9 * len(v))]
        ov = (med[k] / med["ddp_off" if k.startswith("ddp") else "off"] - 1) * 100
        print(f"{k:<10}{len(v):>7}{med[k]:>12.2f}{p90:>10.2f}{ov:>10.2f}{wait_us[k]:>10.1f}")
    print(
        "(vs off: the medians of all steps, unpaired, a rough guide; the overhead is the paired"
        " figure below. wait: mean wall minus training-thread CPU per step: the GIL, the scheduler, gloo)"
    )
    print(
        f"OVERHEAD, the median over {rounds} paired rounds ({processes} process{'es' * (processes > 1)}) "
        f"of neighbouring steps: agent {overhead:.2f} %, "
        f"agent on DDP {overhead_ddp:.2f} %, torch.profiler {prof_overhead:.2f} %"
    )
    print(
        "spread over rounds (quartiles, %): "
        + ", ".join(f"{k} {lo:.2f}..{hi:.2f}" for k, (lo, hi) in iqr.items())
    )
    print("standard error of each median (%): " + ", ".join(f"{k} {v:.2f}" for k, v in se.items()))
    # The two off steps of a round differ by this much on this machine (a round's ratio,
    # two steps against two, has about 1/sqrt(2) of it): the noise floor of this run.
    noise_sd = {
        k: round(statistics.stdev(v) * 100, 2) if len(v) > 1 else 0.0 for k, v in raw["noise"].items()
    }
    print(
        f"noise: the two agent-off steps of one round differ by sd {noise_sd['off']:.2f} % "
        f"(DDP {noise_sd['ddp_off']:.2f} %), a paired round's ratio by about "
        f"{noise_sd['off'] / 2**0.5:.2f} % from noise alone"
    )
    print(f"DDP steps timed with the agent: {len(times['ddp_agent'])}")
    for k, (a, p, n) in cpu.items():
        print(
            f"CPU per step ({k}): agent thread {a / n / 1e3:.0f} us, publisher thread {p / n / 1e3:.0f} us "
            f"({(a + p) / n / 1e4 / med['off']:.2f} % of a step)"
        )
    with _one_rank_group():
        hooks = hook_costs(info, *hook_sizes)
        if with_components:
            components(info, hooks)
    # What the agent adds to the training thread, each part measured directly: its hooks'
    # CPU (timed over thousands of steps of a tiny model, where it is not lost in the noise)
    # plus the thread's extra wait (the agent's and the publisher's threads holding the GIL
    # or the CPU when it needs them); the other threads' own CPU runs on another core.
    direct = {
        k: (hooks[k] + max(0.0, wait_us[k] - wait_us[base])) / 1e3 / med[base] * 100
        for k, base in (("agent", "off"), ("ddp_agent", "ddp_off"))
    }
    print(
        f"training-thread hooks per step: {hooks['agent']:.1f} us plain, {hooks['ddp_agent']:.1f} us DDP; "
        f"extra wait per step: {wait_us['agent'] - wait_us['off']:.1f} us plain, "
        f"{wait_us['ddp_agent'] - wait_us['ddp_off']:.1f} us DDP; the two as a share of a step: "
        f"{direct['agent']:.3f} % plain, {direct['ddp_agent']:.3f} % DDP"
    )
    load_after = os.getloadavg()[0]
    print(f"load average (1 min) {load_before:.2f} before, {load_after:.2f} after, {os.cpu_count()} CPUs")
    print(f"agent records: steps/stacks/heartbeats spooled={raw['spooled']} dropped={raw['dropped']}")
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
                "hooks_us": round(hooks["agent"], 1),
                "hooks_ddp_us": round(hooks["ddp_agent"], 1),
                "direct_overhead_pct": round(direct["agent"], 3),
                "direct_overhead_ddp_pct": round(direct["ddp_agent"], 3),
                "step_ms": round(med["off"], 2),
                "ddp_step_ms": round(med["ddp_off"], 2),
                "processes": processes,
                "noise_sd_pct": noise_sd["off"],
                "ddp_noise_sd_pct": noise_sd["ddp_off"],
                "load_1m": round(max(load_before, load_after), 2),
            }
        )
    )


class _Null:
    """A sink that drops everything."""

    def publish(self, *_a: Any) -> None:
        pass


def hook_costs(info: Any, reps: int = 7, steps: int = 1000) -> dict[str, float]:
    """CPU (us) the agent's hooks add to one training step, plain and under DDP: a tiny model
    (the same hooks fire per step whatever its size), ``steps`` steps with and without an
    agent whose thread never wakes, median of ``reps`` interleaved pairs."""
    from torch.nn.parallel import DistributedDataParallel

    from argus.producers.agent import AgentConfig, RankAgent

    torch.manual_seed(0)
    tiny = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    x = torch.randn(4, 8)
    tloader = torch.utils.data.DataLoader([(x, x)] * 8, batch_size=None)
    nets = {"agent": tiny, "ddp_agent": DistributedDataParallel(copy.deepcopy(tiny))}
    quiet = AgentConfig(stacks=False, heartbeat_s=1e6, publish_s=1e6, cupti=False)
    out: dict[str, float] = {}
    for kind, net in nets.items():
        topt = torch.optim.SGD(net.parameters(), lr=1e-4)

        def cpu_per_step(n: int, net: nn.Module = net, topt: Any = topt) -> float:
            it = iter(tloader)
            c0 = time.thread_time_ns()
            for _ in range(n):
                it = _train_step(net, topt, it, tloader)
            return (time.thread_time_ns() - c0) / n / 1e3

        cpu_per_step(200)
        diffs = []
        for _ in range(reps):
            off = cpu_per_step(steps)
            agent = RankAgent(_Null(), info, quiet)
            agent.install(net, topt)
            on = cpu_per_step(steps)
            agent.close()
            diffs.append(on - off)
        out[kind] = statistics.median(diffs)
    return out


def _per_call_us(fn: Any, n: int = 2000) -> float:
    fn()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1e3


def components(info: Any, hooks: dict[str, float]) -> None:
    """What each part of the agent costs, timed in isolation (no other load in the loop);
    ``hooks`` from :func:`hook_costs`."""
    from argus.producers.agent import AgentConfig, RankAgent, RawStep, StackFolder
    from argus.producers.agent._spans import CpuClock, reduce_step

    quiet = AgentConfig(stacks=False, heartbeat_s=1e6, stack_hz=1.0, cupti=False)
    folder = StackFolder()
    me = threading.get_ident()
    spans = [[0, 1_000, 10_000_000, -1], [1, 11_000_000, 40_000_000, -1], [9, 20_000_000, 30_000_000, -1]]
    spans += [
        [9, 25_000_000, 35_000_000, -1],
        [2, 40_000_000, 49_000_000, -1],
        [6, 41_000_000, 41_500_000, 4],
    ]
    raw = RawStep(3, time.time_ns(), 0, 50_000_000, spans)
    agent = RankAgent(_Null(), info, quiet)
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
        (
            "training-thread hooks, per step (tiny model: forward, backward, optimizer, loader, gc)",
            hooks["agent"],
        ),
        ("the same under DDP (its forward and backward timed too)", hooks["ddp_agent"]),
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
