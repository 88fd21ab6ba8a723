"""The rank agent: step lifecycle on the training thread, everything else on its own thread.

The training thread does as little as possible: hooks append timed spans, ``end_step``
moves the step's spans to a deque. The agent's thread (one, ``argus-agent``) wakes at the
stack-sampling rate (``stack_hz``, 10 by default: every wake-up costs CPU the training
process may need; where that CPU exceeds ``cpu_budget`` of one core, 0.1 % by default,
the rate drops towards ``min_stack_hz``, as a continuous profiler keeps to its budget) and

* samples the training thread's Python stack (a key of code-object ids; folded into
  strings only when published), counted per window of ``stack_window_s``; while the open
  step has run longer than ``slow_factor`` times the median of recent steps it samples at
  ``slow_stack_hz`` instead, into a window of that step alone;
* every ``publish_s`` (1 s), at the same wall-clock moments on every rank (so the parts of
  a step arrive together), reduces finished steps to exclusive ms per phase and collective
  kind (on a GPU only once every CUDA event was reached), publishes each as a 1-row
  ``StepBatch`` already on the wire (:class:`~argus.schemas.StepRowWriter`: the same bytes,
  a fifth of the cost), and wakes the sink, which sends them;
* publishes a ``StackSample`` per time window (``step`` = the step it began in) and one per
  slow step (its own samples), a ``Heartbeat`` every ``heartbeat_s`` (last step, per-group
  collective sequence numbers, current stack);
* drains the CUPTI collector, if one runs, into kernel sketches.

Publishing goes through a :class:`~producers.publisher.Publisher`-like object (``publish``);
nothing here raises into the training loop: errors are logged once and counted.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from argus.schemas import (
    HEARTBEATS,
    STACKS,
    STEPS,
    Heartbeat,
    Record,
    StackSample,
    StepRecord,
    StepRowWriter,
    ValidationError,
    job_key,
    rank_key,
    step_key,
)

from .._priority import yield_cpu_to_training
from ._hooks import Instrumentation
from ._layout import RankInfo
from ._spans import CpuClock, CudaClock, RawStep, SpanRecorder, reduce_step
from ._stacks import StackFolder, StackKey, StackWindow

__all__ = ["AgentConfig", "RankAgent", "Sink"]

log = logging.getLogger("argus.agent")


PACE_S = (0.5, 2.0)
"""When the agent's thread first compares its CPU use with ``cpu_budget``, then how often."""


def _until_next(period: float) -> float:
    """Seconds to the next multiple of ``period`` on the wall clock."""
    wall = time.time()
    return (math.floor(wall / period) + 1) * period - wall


def paced_interval(
    interval: float, cpu_s: float, wall_s: float, budget: float, lo: float, hi: float
) -> float:
    """The stack-sampling interval for the next window: ``interval`` times how far the
    thread's CPU use over the last one (``cpu_s`` in ``wall_s``) was from ``budget`` (a
    fraction of one core), at most 4x either way, within [lo, hi]. Its CPU is mostly a cost
    per wake-up, so the ratio alone brings it to the budget in one window."""
    if wall_s <= 0:
        return interval
    ratio = min(4.0, max(0.25, max(cpu_s, 0.0) / wall_s / budget))
    return min(hi, max(lo, interval * ratio))


class Sink(Protocol):
    """Where records go (the Publisher): step records come as their wire bytes
    (:func:`~argus.schemas.decode` reads them), the others as records. A sink that sends in
    the background may also have ``wake()``: the agent calls it after each of its rounds
    (and after a declared pause), so what the round made leaves now."""

    def publish(self, topic: str, key: bytes, record: Record | bytes) -> None: ...


@dataclass(frozen=True)
class AgentConfig:
    """What the agent collects and how often."""

    stack_hz: float = 10.0
    cpu_budget: float = 0.001
    min_stack_hz: float = 1.0
    slow_stack_hz: float = 50.0
    slow_factor: float = 1.5
    stack_window_s: float = 10.0
    heartbeat_s: float = 5.0
    publish_s: float = 1.0
    stacks: bool = True
    collectives: bool = True
    dataloader: bool = True
    backward: bool = True
    gc: bool = True
    compile: bool = True
    h2d: bool = True
    cupti: bool = True
    cupti_tagging: str = "marker"  # or "runtime": see CuptiCollector (docs/agent.md, On a GPU)
    kernel_every: int = 16  # CUPTI traces one step in this many (the same steps on every rank)
    cuda_events: bool = True
    max_pending_steps: int = 1024

    def __post_init__(self) -> None:
        rates = {
            "stack_hz": self.stack_hz,
            "slow_stack_hz": self.slow_stack_hz,
            "min_stack_hz": self.min_stack_hz,
        }
        for name, value in {**rates, "cpu_budget": self.cpu_budget, "slow_factor": self.slow_factor}.items():
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"{name} must be a number, not {value!r}")
        for name, hz in rates.items():
            if not 0 < hz <= 1000:
                raise ValueError(f"{name} must be in (0, 1000] Hz, not {hz!r}")
        if self.min_stack_hz > self.stack_hz:
            raise ValueError(
                f"min_stack_hz ({self.min_stack_hz!r}) must not exceed stack_hz ({self.stack_hz!r})"
            )
        if not 0 < self.cpu_budget <= 1:
            raise ValueError(f"cpu_budget is a fraction of one core in (0, 1], not {self.cpu_budget!r}")
        if not self.slow_factor > 1:
            raise ValueError(f"slow_factor must be > 1, not {self.slow_factor!r}")
        if not (self.heartbeat_s > 0 and self.stack_window_s > 0 and self.publish_s >= 0):
            raise ValueError("heartbeat_s and stack_window_s must be positive, publish_s not negative")
        if (
            not isinstance(self.kernel_every, int)
            or isinstance(self.kernel_every, bool)
            or self.kernel_every < 1
        ):
            raise ValueError(f"kernel_every must be a whole number of steps >= 1, not {self.kernel_every!r}")
        if self.cupti_tagging not in ("runtime", "marker"):
            raise ValueError(f"cupti_tagging must be 'runtime' or 'marker', not {self.cupti_tagging!r}")


class RankAgent:
    """One per training process; see the module docstring."""

    def __init__(self, sink: Sink, info: RankInfo, config: AgentConfig | None = None) -> None:
        self.sink = sink
        self.info = info
        self.config = config or AgentConfig()
        self.thread_id = threading.get_ident()
        self.clock: CpuClock | CudaClock = CpuClock()
        self.gpu = False
        if self.config.cuda_events:
            try:
                import torch

                if torch.cuda.is_available():
                    self.clock, self.gpu = CudaClock(), True
            except ImportError:
                pass
        self.recorder = SpanRecorder(self.clock, self.thread_id)
        self.hooks = Instrumentation(self.recorder, on_optimizer_step=self._auto_step)
        self.explicit = False  # True once ``step()`` is used: the optimizer no longer ends steps
        self.step = 0
        self._open: tuple[int, int] | None = None  # (wall ns, perf ns) of the open step
        self._finished: deque[RawStep] = deque()
        self.dropped_steps = 0
        self.invalid_steps = 0
        self.errors = 0
        self.cupti: Any = None
        self.absent: dict[str, str] = {}
        self._folder = StackFolder()
        self._window = StackWindow(0, time.time_ns())
        self._slow: StackWindow | None = None  # samples of the open step while it overruns
        self._durations: deque[int] = deque(maxlen=32)  # ns of recent steps
        self._slow_after_ns = 0  # an open step is slow after this long (0: not known yet)
        self._last_key: StackKey | None = None
        self._rows: StepRowWriter | None = None  # see step_message
        self._pause: tuple[str, int] = ("", 0)  # what the job declared it does instead of steps, until
        self._stop = threading.Event()
        self._sleep = threading.Lock()  # held while the thread runs; released to wake it at close
        self._sleep.acquire()
        self._thread: threading.Thread | None = None
        self._last_heartbeat = 0.0
        self.forked = False  # True in the child of a fork (see reset_after_fork)
        self.stack_interval_s = 1.0 / self.config.stack_hz  # paced by cpu_budget (see _run)

    # -- set-up ------------------------------------------------------------------------
    def install(self, model: Any = None, optimizer: Any = None) -> None:
        """Hook torch (what the config enables and this machine has) and start the thread."""
        self.install_hooks(model, optimizer)
        if self.config.cupti:
            self._start_cupti()
        self._open = (time.time_ns(), time.perf_counter_ns())
        self._thread = threading.Thread(target=self._run, name="argus-agent", daemon=True)
        self._thread.start()

    def install_hooks(self, model: Any = None, optimizer: Any = None) -> None:
        """The torch hooks alone (``hooks.uninstall()`` undoes them); a layer that cannot be
        hooked here is noted in ``absent``."""
        c = self.config
        steps: list[tuple[bool, str, Any]] = [
            (model is not None, "forward", lambda: self.hooks.install_model(model)),
            (optimizer is not None, "optimizer", lambda: self.hooks.install_optimizer(optimizer)),
            (c.backward, "backward", self.hooks.install_backward),
            (c.dataloader, "dataloader", self.hooks.install_dataloader),
            (c.collectives, "collectives", self.hooks.install_collectives),
            (c.gc, "gc", self.hooks.install_gc),
            (c.compile, "compile", self.hooks.install_compile),
            (c.h2d, "h2d", self.hooks.install_h2d),
        ]
        for wanted, name, install in steps:
            if not wanted:
                continue
            try:
                if install() is False:
                    self.absent[name] = "not available here"
            except Exception as exc:  # torch missing or changed: that layer steps aside
                self.absent[name] = f"{type(exc).__name__}: {exc}"
                log.warning("argus: %s hooks unavailable: %s", name, exc)

    def _start_cupti(self) -> None:
        from ..collectors.cupti import CuptiCollector, cupti_available, cupti_version_mismatch

        ok, reason = cupti_available()
        if not ok:
            self.absent["cupti"] = reason
            log.info("argus: GPU kernel tracing absent: %s", reason)
            return
        mismatch = cupti_version_mismatch()
        if mismatch:
            self.absent["cupti"] = mismatch
            log.warning("argus: %s", mismatch)
            return
        try:
            self.cupti = CuptiCollector(
                self.info.job,
                self.info.run,
                self.info.rank,
                tagging=self.config.cupti_tagging,
                marker=_stream_query,
                every=self.config.kernel_every,
            )
            self.cupti.start()
        except Exception as exc:
            self.cupti = None
            self.absent["cupti"] = f"CUPTI failed to start: {exc}"
            log.warning("argus: GPU kernel tracing absent: %s", exc)

    # -- the step, on the training thread ----------------------------------------------
    def begin_step(self) -> None:
        """Open a step now (closing nothing); called by ``argus.step()``."""
        if self.forked:
            return
        self.explicit = True
        self._open = (time.time_ns(), time.perf_counter_ns())
        self.recorder.take()  # spans between steps are not part of any step
        if self.cupti is not None:
            self.cupti.begin_step(self.step)

    def end_step(self, samples: int = 0, tokens: int = 0) -> None:
        """Close the open step and hand it to the agent's thread."""
        opened = self._open
        if opened is None:
            return
        end = time.perf_counter_ns()
        raw = RawStep(self.step, opened[0], opened[1], end, self.recorder.take(), samples, tokens)
        if len(self._finished) >= self.config.max_pending_steps:
            self.dropped_steps += 1
        else:
            self._finished.append(raw)
        if self.cupti is not None:
            self.cupti.end_step(self.step)
        self.step += 1
        self._open = None

    def _auto_step(self) -> None:
        """Optimizer post-hook: in automatic mode a step ends here and the next one begins."""
        if self.explicit:
            return
        self.end_step()
        self._open = (time.time_ns(), time.perf_counter_ns())
        if self.cupti is not None:
            self.cupti.begin_step(self.step)

    # -- the agent's thread ------------------------------------------------------------
    def _run(self) -> None:
        yield_cpu_to_training()
        c = self.config
        burst_ratio = c.stack_hz / c.slow_stack_hz  # a slow step's interval to the base one
        paced = started = round_at = time.perf_counter()
        nxt = paced if c.stacks else math.inf  # the next stack sample
        cpu = time.thread_time()
        while not self._stop.is_set():
            now = time.perf_counter()
            sample, publish = now >= nxt, now >= round_at
            try:
                if sample:
                    self._sample_stack()
                self.tick(publish)
            except Exception:
                self.errors += 1
                if self.errors <= 3:
                    log.exception("argus agent error (continuing)")
            now = time.perf_counter()
            if now - paced >= PACE_S[paced > started]:
                used = time.thread_time()
                self.stack_interval_s = paced_interval(
                    self.stack_interval_s,
                    used - cpu,
                    now - paced,
                    c.cpu_budget,
                    1 / c.stack_hz,
                    1 / c.min_stack_hz,
                )
                paced, cpu = now, used
            if sample:
                base = self.stack_interval_s
                nxt = max(nxt + (base * burst_ratio if self._overdue() else base), now)
            if publish:
                round_at = now + (_until_next(c.publish_s) if c.publish_s > 0 else self.stack_interval_s)
            beat_at = now + self._last_heartbeat + c.heartbeat_s - time.monotonic()
            wake_at = min(nxt, round_at, beat_at)
            if self._sleep.acquire(timeout=max(wake_at - time.perf_counter(), 0.0)):
                break  # released by close(): stop now

    def _overdue(self) -> bool:
        """Whether the open step has run longer than ``slow_factor`` x the recent median."""
        opened, limit = self._open, self._slow_after_ns
        return bool(limit and opened is not None and time.perf_counter_ns() - opened[1] > limit)

    def tick(self, publish: bool = True) -> None:
        """A heartbeat if one is due; with ``publish``, a publishing round: the finished steps
        (and kernel sketches), then a wake-up of the sink.

        The agent's thread publishes every ``publish_s`` at the same wall-clock moments on
        every rank (multiples of ``publish_s``: the parts of a step reach a node relay and the
        workers together, not up to a round apart), apart from its stack samples: a round
        touches far more code and data than a sample, and on a busy host that costs several
        times what it does in isolation.
        """
        now = time.monotonic()
        if now - self._last_heartbeat >= self.config.heartbeat_s:
            self._last_heartbeat = now
            self._send_heartbeat()
        if publish:
            self._publish_steps()
            if self.config.compile and not self.hooks.compile_hooked:
                self.hooks.install_compile()
            if self.cupti is not None:
                self._publish_kernels()
            self._wake_sink()  # the round's records (and stack windows since) leave now

    def _sample_stack(self) -> None:
        key = self._folder.sample_key(self.thread_id)
        if key is None:
            return
        self._last_key = key
        step, now = self.step, time.time_ns()
        slow = self._slow
        if slow is not None and slow.step != step:  # the slow step ended: its own record
            self._emit_window(slow, now)
            self._slow = slow = None
        if self._overdue():
            if slow is None:
                self._slow = slow = StackWindow(step, now)
            slow.add(key)
            return
        w = self._window
        if now - w.start_ns > self.config.stack_window_s * 1e9:
            self._emit_window(w, now)
            self._window = w = StackWindow(step, now)
        w.add(key)

    def _emit_window(self, w: StackWindow, end_ns: int) -> None:
        if not w.counts:
            return
        folded: dict[str, int] = {}
        for key, n in w.counts.items():  # two keys may fold alike (a code object reloaded)
            s = self._folder.folded(key) if isinstance(key, tuple) else str(key)
            folded[s] = folded.get(s, 0) + n
        pairs = sorted(folded.items(), key=lambda kv: -kv[1])
        i = self.info
        rec = StackSample(
            i.job,
            i.run,
            i.rank,
            w.step,
            w.start_ns,
            end_ns,
            tuple(p[0] for p in pairs),
            tuple(p[1] for p in pairs),
        )
        self.sink.publish(STACKS, rank_key(i.job, i.rank), rec)

    @property
    def last_stack(self) -> str:
        """The training thread's folded stack at the last sample ("" before any)."""
        key = self._last_key
        return "" if key is None else self._folder.folded(key)

    def _publish_steps(self) -> None:
        while self._finished:
            raw = self._finished[0]
            ms = reduce_step(raw, self.clock)
            if ms is None:  # GPU events not reached yet: later
                return
            self._finished.popleft()
            self._note_duration(raw.end_mono - raw.start_mono)
            try:
                message = self.step_message(raw, ms)
            except ValidationError as exc:  # e.g. a host name over the limit: every step
                self.invalid_steps += 1
                if self.invalid_steps <= 3:
                    log.warning("argus: step %d not sent: %s", raw.step, exc)
                continue
            self.sink.publish(STEPS, step_key(self.info.job, raw.step), message)

    def _note_duration(self, ns: int) -> None:
        """Keep the slow-step threshold: ``slow_factor`` x the median of recent steps."""
        d = self._durations
        d.append(ns)
        if len(d) >= 4:
            self._slow_after_ns = int(sorted(d)[len(d) // 2] * self.config.slow_factor)

    def step_message(self, raw: RawStep, ms: np.ndarray) -> bytes:
        """The wire bytes of a reduced step: a 1-row StepBatch, written directly by the rank's
        :class:`~argus.schemas.StepRowWriter` (building a StepBatch and encoding it costs
        five times as much, per step, on the training host).

        Raises :class:`~argus.schemas.ValidationError` for a step out of the contract's range.
        """
        if self._rows is None:
            i = self.info
            self._rows = StepRowWriter(
                StepRecord(i.job, i.run, 0, i.rank, i.host, i.gpu_uuid, i.dp, i.tp, i.pp, i.ep, i.cp)
            )
        end = raw.start_ns + (raw.end_mono - raw.start_mono)
        return self._rows.write(raw.step, raw.start_ns, end, ms, raw.samples, raw.tokens)

    def _publish_kernels(self, final: bool = False) -> None:
        i = self.info
        for rec in self.cupti.drain(self.step, final=final):
            self.sink.publish(rec_topic(rec), rank_key(i.job, i.rank), rec)

    def declare_pause(self, reason: str, seconds: float) -> None:
        """Say this rank will complete no step for up to ``seconds`` on purpose (a checkpoint,
        an evaluation): the hang detector does not page for it. Sent at once in a heartbeat."""
        until = time.time_ns() + int(max(0.0, seconds) * 1e9)
        self._pause = (reason.replace("\n", " ")[:64] or "pause", until)
        self._send_heartbeat(at_once=True)

    def end_pause(self) -> None:
        """The declared pause is over (sent at once, so a hang after it is named on time)."""
        if self._pause[1]:
            self._pause = ("", 0)
            self._send_heartbeat(at_once=True)

    def _send_heartbeat(self, at_once: bool = False) -> None:
        self.sink.publish(HEARTBEATS, job_key(self.info.job), self.heartbeat())
        if at_once:
            self._wake_sink()

    def _wake_sink(self) -> None:
        """Have a sink that sends in the background (``wake()``) send what it holds now."""
        wake = getattr(self.sink, "wake", None)  # after a fork: the discarding sink has none
        if wake is not None:
            try:
                wake()
            except Exception:
                log.debug("argus: waking the sink failed", exc_info=True)

    def heartbeat(self) -> Heartbeat:
        """Where this rank is now."""
        i = self.info
        reason, until = self._pause
        names = sorted(self.hooks.groups)
        gs = [self.hooks.groups[n] for n in names]
        return Heartbeat(
            job=i.job,
            run=i.run,
            rank=i.rank,
            host=i.host,
            time_ns=time.time_ns(),
            last_step=self.step - 1,
            groups=tuple(names),
            seq_entered=tuple(g.entered for g in gs),
            seq_finished=tuple(g.finished for g in gs),
            kinds=tuple(g.kind for g in gs),
            nbytes=tuple(g.nbytes for g in gs),
            stack=self.last_stack[-4096:],
            pause=reason,
            pause_until_ns=until,
        )

    # -- fork ---------------------------------------------------------------------------
    def reset_after_fork(self) -> None:
        """In the child of a fork: undo the hooks, drop every inherited span, step and stack,
        forget the publisher and CUPTI; the child records nothing with this agent."""
        self.hooks.uninstall()
        self._stop.set()
        self._thread = None
        self.recorder.spans = []
        self.recorder.take()
        self._finished.clear()
        self._open = None
        self.cupti = None
        self._window = StackWindow(self.step, time.time_ns())
        self._slow = None
        self.sink = _Discard()
        self.forked = True

    # -- shutdown ----------------------------------------------------------------------
    def _wake(self) -> None:
        """Wake the agent's thread from its sleep (it then sees the stop flag)."""
        with contextlib.suppress(RuntimeError):  # already released
            self._sleep.release()

    def close(self, timeout: float = 5.0) -> None:
        """Undo the hooks, stop the thread, publish what is finished (not the open step)."""
        self.hooks.uninstall()
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout)
        deadline = time.monotonic() + timeout
        while self._finished and time.monotonic() < deadline:
            self._publish_steps()
            if self._finished:
                time.sleep(0.01)
        if self.cupti is not None:
            try:
                self.cupti.stop()
                self._publish_kernels(final=True)
            except Exception:
                log.warning("argus: stopping CUPTI failed", exc_info=True)
        now = time.time_ns()
        if self._slow is not None:
            self._emit_window(self._slow, now)
            self._slow = None
        self._emit_window(self._window, now)
        self._window = StackWindow(self.step, now)
        self._send_heartbeat(at_once=True)


class _Discard:
    """The sink of an agent inherited through fork: drops everything."""

    def publish(self, topic: str, key: bytes, record: Record | bytes) -> None:
        """Drop the record."""


def _stream_query() -> None:
    """One cheap runtime-API call (``cudaStreamQuery``): CUPTI's marker of a step's begin."""
    import torch

    torch.cuda.current_stream().query()


def rec_topic(_rec: Record) -> str:
    """Topic of a kernel record (sketches and names share the kernels topic)."""
    from argus.schemas import KERNELS

    return KERNELS
