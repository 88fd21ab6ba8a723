"""The ``overhead`` part: blocks of steps with the agent (or torch.profiler) and without, in
paired rounds."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .model import ListSink, Size, build, new_agent, sync_device, train_step


def part_overhead(
    size: Size,
    device: str,
    side: str = "agent",
    rounds: int | None = None,
    budget_s: float = math.inf,
    **agent_cfg: Any,
) -> dict[str, Any]:
    """Paired blocks with and without ``side`` (the agent, or torch.profiler); rounds stop
    early once ``budget_s`` is spent (the line says how many ran), each round said on stderr."""
    import torch

    began = time.perf_counter()
    model, opt, data = build(size, device)
    for i in range(5):
        train_step(model, opt, data[i % len(data)])
    sync_device(device)
    it = iter(range(10**9))

    def block(on: bool) -> float:
        ctx: Any = contextlib.nullcontext()
        agent = None
        if on and side == "agent":
            agent = new_agent(ListSink(), **agent_cfg)
            agent.install(model, opt)
        elif on:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if device == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            ctx = torch.profiler.profile(activities=acts)
        with ctx:
            # untimed: the side settles, and the agent's first traced step (CUPTI on from its
            # begin to the begin of the step after the next) is behind it: a block of a
            # multiple of kernel_every steps then holds as many traced steps as the run does
            for _ in range(3):
                train_step(model, opt, data[next(it) % len(data)])
            sync_device(device)
            t0 = time.perf_counter()
            for _ in range(size.block):
                train_step(model, opt, data[next(it) % len(data)])
            sync_device(device)
            ms = (time.perf_counter() - t0) * 1e3 / size.block
        if agent is not None:
            time.sleep(0.05)
            th = agent._thread
            cpu = _thread_cpu_ms(th.native_id) if th is not None and th.native_id else math.nan
            agent.close()
            agent_cpu.append(round(cpu / (size.block + 1), 3))
            if agent.cupti is not None:
                toggles.append(agent.cupti.toggle_ns / 1e6)
        return ms

    agent_cpu: list[float] = []  # the agent's thread, CPU ms per step of a block
    toggles: list[float] = []  # ms a block spent turning CUPTI's device kinds on and off
    block(True)  # untimed: CUPTI's or the profiler's first start in this process costs seconds
    ratios, off, on = [], [], []
    absent: dict[str, str] = {}
    warm_s = time.perf_counter() - began
    for r in range(rounds or size.rounds):
        if r >= 2 and time.perf_counter() - began > budget_s:
            break
        t: dict[bool, list[float]] = {False: [], True: []}
        for o in ((False, True, True, False), (True, False, False, True))[r % 2]:
            t[o].append(block(o))
        ratios.append(statistics.mean(t[True]) / statistics.mean(t[False]) - 1)
        off += t[False]
        on += t[True]
        print(
            f"overhead {side} {agent_cfg}: round {r} off {t[False]} on {t[True]} ms/step"
            f" at {time.perf_counter() - began:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    if side == "agent":
        probe = new_agent(ListSink(), **agent_cfg)
        probe.install(model, opt)
        absent = dict(probe.absent)
        probe.close()
    med = statistics.median(ratios)
    # the median's standard error from the rounds' MAD (one stalled round must not swamp it)
    mad = statistics.median(abs(r - med) for r in ratios)
    se = 1.2533 * 1.4826 * mad / math.sqrt(len(ratios)) if len(ratios) > 1 else math.nan
    return {
        "side": side,
        **agent_cfg,
        "rounds": len(ratios),
        "block_steps": size.block,
        "setup_s": round(warm_s, 1),
        "step_ms_off": statistics.median(off),
        "step_ms_on": statistics.median(on),
        "overhead_pct": med * 100,
        "overhead_se_pct": se * 100,
        "absent_layers": absent,
        # every round's figures, so a wide error can be told from a real cost afterwards
        "round_pct": [round(x * 100, 3) for x in ratios],
        "block_ms_off": [round(x, 3) for x in off],
        "block_ms_on": [round(x, 3) for x in on],
        "agent_thread_cpu_ms_per_step": agent_cpu,
        "toggle_ms_per_block": [round(x, 3) for x in toggles],
    }


def _thread_cpu_ms(tid: int) -> float:
    """CPU milliseconds a thread of this process has used (Linux; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")
