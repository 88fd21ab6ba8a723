"""The cluster simulator: one synchronous training step of N ranks at a time, with faults.

The step model (per rank, ms): data-loader wait, host-to-device copies, forward, backward,
optimizer, GC, compile, checkpoint, then the collectives: tensor-parallel all-gather and
reduce-scatter, the pipeline's send/recv (with the 1F1B bubble, ``(pp-1)/(m+pp-1)`` of the
compute) and the data-parallel gradient all-reduce. The step is synchronous: it ends for
every rank when the slowest rank's work is done; each rank's wait for the slowest is
booked to the collective through which the wait reaches it (``p2p_ms`` when pp > 1, else
``all_gather_ms`` when tp > 1, else ``all_reduce_ms``). Phase timers are CUDA-event timed,
except for a masked straggler whose GPU slowness is seen by no phase timer (the CPU blocks
in a synchronize outside the timed phases): its step records show only that it waits least.
Noise is :mod:`._noise`'s: by default the realistic kind (heavy-tailed jitter, static
offsets, warm-up, unannotated evaluation and checkpoint steps, GC pauses), or ``CLEAN``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from argus.schemas import Heartbeat, KernelStats, StackSample, StepBatch

from ._faults import (
    CHECKPOINT_STALL,
    COMPUTE_STRAGGLER,
    DATALOADER_STALL,
    GC_PAUSE,
    HOST_CPU_CONTENTION,
    JIT_COMPILE_STALL,
    LINK_DEGRADATION,
    MASKED_COMPUTE_STRAGGLER,
    PIPELINE_BUBBLE,
    PIPELINE_STAGE_IMBALANCE,
    SEQUENCE_LENGTH_IMBALANCE,
    Fault,
    Label,
)
from ._kernels import column_factor, kernel_factors, kernel_stats
from ._layout import Layout
from ._noise import REALISTIC, Noise
from ._stacks import heartbeats, stack_sample

__all__ = ["ClusterSimulator", "PhaseTimes", "SimStep"]

START_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class PhaseTimes:
    """Nominal per-rank phase times of a healthy step, ms (collectives: transfer time only)."""

    forward: float = 110.0
    backward: float = 220.0
    optimizer: float = 15.0
    dataloader: float = 8.0
    h2d: float = 3.0
    all_gather: float = 12.0
    reduce_scatter: float = 12.0
    all_reduce: float = 35.0
    p2p: float = 6.0
    checkpoint: float = 2500.0
    compile_warmup: float = 3000.0
    tokens: int = 65_536


@dataclass
class SimStep:
    """One simulated step: the job's :class:`StepBatch` plus the hidden truth to derive
    kernel statistics, stack samples and heartbeats of any ranks from."""

    batch: StepBatch
    layout: Layout
    seed: int
    gpu_factor: np.ndarray  # per rank: GPU compute kernel duration factor (truth)
    collective_factor: np.ndarray  # per rank: all-reduce transfer factor (links)
    count_factor: np.ndarray  # per rank: compute kernel count factor (more layers)
    launch_factor: np.ndarray  # per rank: CPU launch gaps factor (host contention)
    hidden_ms: np.ndarray  # per rank: time no phase timer saw (masked straggler)
    active: tuple[Fault, ...] = field(default_factory=tuple)
    kernel_slow: dict[int, np.ndarray] = field(default_factory=dict)  # rank -> per-kernel factor
    gap_ms: np.ndarray | None = None  # per rank: compute-phase time the GPU idled (CPU-starved launches)

    @property
    def step(self) -> int:
        """The step number."""
        return self.batch.step

    def kernel_stats(self, ranks: Sequence[int]) -> dict[int, KernelStats]:
        """Synthetic kernel statistics (a realistic mix) of the given ranks in this step."""
        return {int(r): kernel_stats(self, int(r)) for r in ranks}

    def stacks(self, ranks: Sequence[int]) -> dict[int, StackSample]:
        """Folded stack samples (100 Hz) of the given ranks over this step."""
        return {int(r): stack_sample(self, int(r)) for r in ranks}

    def heartbeats(self, ranks: Sequence[int] | None = None) -> list[Heartbeat]:
        """Heartbeats at the end of this step (all ranks when ``ranks`` is None)."""
        return heartbeats(self, ranks)

    def host_batches(self) -> list[StepBatch]:
        """The step split into one batch per host (as node agents would send it)."""
        host = self.batch["rank"] // self.layout.gpus_per_host
        order = np.argsort(host, kind="stable")
        bounds = np.flatnonzero(np.diff(host[order])) + 1
        return [self.batch.take(idx) for idx in np.split(order, bounds)]


def _trunc(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(rng.standard_normal(n), -4.0, 4.0)


class ClusterSimulator:
    """A synthetic training job with faults and ground truth, deterministic from ``seed``.

    Args:
        layout: the parallel layout (up to 100,000+ ranks).
        seed: everything random derives from it (each step from ``(seed, step)``).
        job, run: the job id and run incarnation written into the records.
        faults: faults to inject; :attr:`labels` reports their ground truth.
        start_ns: wall clock of step 0 (ns since the epoch; not the machine's clock).
        warmup_steps: steps 0..warmup_steps-1 compile and run slower.
        checkpoint_every: steps ``k*checkpoint_every - 1`` write a checkpoint (0: never).
        microbatches: pipeline micro-batches per step (sets the 1F1B bubble).
        phases: nominal phase times.
        noise: what a healthy step adds (``REALISTIC`` by default, or ``CLEAN``).

    Notes:
        Steps must be generated in order for wall clocks to chain (``step(s)`` for any other
        ``s`` places it at a nominal time); every other value depends only on seed and step.
    """

    def __init__(
        self,
        layout: Layout,
        *,
        seed: int = 0,
        job: str = "sim",
        run: int = 0,
        faults: Sequence[Fault] = (),
        start_ns: int = START_NS,
        warmup_steps: int = 5,
        checkpoint_every: int = 50,
        microbatches: int = 16,
        phases: PhaseTimes | None = None,
        noise: Noise = REALISTIC,
    ) -> None:
        self.layout = layout
        self.seed = seed
        self.job = job
        self.run_id = run
        self.faults = tuple(self._resolve(f, checkpoint_every) for f in faults)
        self.start_ns = start_ns
        self.warmup_steps = warmup_steps
        self.checkpoint_every = checkpoint_every
        self.microbatches = microbatches
        self.p = phases or PhaseTimes()
        self.noise = noise
        n = layout.n_ranks
        c = layout.coords
        self._c = c
        static = np.random.default_rng([seed, 2**31 - 1])
        self._speed = 1.0 + noise.speed_spread * _trunc(static, n)
        self._speed *= 1.0 + noise.offset * (2.0 * static.random(n) - 1.0)
        skew = np.ones(layout.pp)
        if layout.pp > 1:
            skew[0], skew[-1] = 1.02, 1.04
        self._stage_skew = skew[c["pp"]]
        self._hosts = np.array([Layout.host_name(h) for h in range(layout.n_hosts)], dtype=object)[c["host"]]
        tag = hashlib.sha1(f"{job}/{seed}".encode()).hexdigest()[:8]
        self._uuids = np.array([f"GPU-{tag}-{r:06d}" for r in range(n)], dtype=object)
        self._next_step = 0
        self._clock = start_ns
        self._bubble = (layout.pp - 1) / (microbatches + layout.pp - 1) if layout.pp > 1 else 0.0

    def _jitter(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Heavy-tailed multiplicative jitter per rank (Student t), never below 0.5."""
        nz = self.noise
        return np.maximum(1.0 + nz.jitter * rng.standard_t(nz.jitter_df, n), 0.5)

    def _resolve(self, f: Fault, every: int) -> Fault:
        if f.kind in (COMPUTE_STRAGGLER, MASKED_COMPUTE_STRAGGLER) and f.host is not None and not f.ranks:
            return dataclasses.replace(f, ranks=self.layout.ranks_of_host(f.host))
        if f.kind != CHECKPOINT_STALL or every <= 0:
            return f
        k = -(-(f.first_step + 1) // every)  # the first checkpoint step >= first_step
        first = k * every - 1
        return Fault(f.kind, first, 1, f.ranks, f.host, f.stage, f.magnitude)

    def is_checkpoint(self, step: int) -> bool:
        """Whether ``step`` writes a checkpoint."""
        return self.checkpoint_every > 0 and (step + 1) % self.checkpoint_every == 0

    @property
    def labels(self) -> tuple[Label, ...]:
        """Ground truth: one label per injected fault (per culprit rank for rank faults)."""
        out: list[Label] = []
        lay = self.layout
        for f in self.faults:
            first = max(f.noticeable_from(), self.warmup_steps)
            last = f.last_step
            if last < first:
                continue
            if (
                f.kind in (COMPUTE_STRAGGLER, MASKED_COMPUTE_STRAGGLER, DATALOADER_STALL)
                and f.host is not None
            ):
                h = int(f.host)
                said = f.kernel or ("dataloader" if f.kind == DATALOADER_STALL else "")
                out.append(Label(f.kind, first, last, "host", Layout.host_name(h), f.ranks, said))
            elif f.kind == LINK_DEGRADATION:
                a, b = sorted(f.ranks, key=lambda r: (lay.host_of(r), r))
                ha, hb = Layout.host_name(lay.host_of(a)), Layout.host_name(lay.host_of(b))
                out.append(Label(f.kind, first, last, "link", f"{ha}<->{hb}", (a, b), "nccl:AllReduce"))
            elif f.kind == HOST_CPU_CONTENTION:
                h = int(f.host or 0)
                said = "dataloader" if f.magnitude > 0 else ""  # its data loaders starve
                out.append(
                    Label(f.kind, first, last, "host", Layout.host_name(h), lay.ranks_of_host(h), said)
                )
            elif f.kind == PIPELINE_STAGE_IMBALANCE:
                out.append(Label(f.kind, first, last, "stage", f"pp:{f.stage or 0}"))
            elif f.kind == SEQUENCE_LENGTH_IMBALANCE:
                out.append(Label(f.kind, first, last, "dp_group", "dp"))
            elif f.kind == PIPELINE_BUBBLE:
                out.append(Label(f.kind, first, last, "job", "pipeline"))
            else:
                out.extend(Label(f.kind, first, last, "rank", f"rank:{r}", (r,), f.kernel) for r in f.ranks)
        return tuple(out)

    def run(self, steps: int, start: int = 0) -> Iterator[SimStep]:
        """Steps ``start .. start + steps - 1`` in order."""
        for s in range(start, start + steps):
            yield self.step(s)

    def step(self, step: int) -> SimStep:
        """Generate one step of every rank."""
        rng = np.random.default_rng([self.seed, step])
        extra = np.random.default_rng([self.seed, step, 1])  # realistic noise only: CLEAN stays as it was
        d = self._nominal(step, rng, self._gpu_speed(step, extra))
        self._add_noise(d, step, extra)
        active = tuple(f for f in self.faults if f.active(step))
        for f in active:
            effect = _kernels_slower if f.kind == COMPUTE_STRAGGLER and f.kernel else _EFFECTS.get(f.kind)
            if effect is not None:
                effect(d, f, self._rows(f, rng), f.magnitude_at(step))
        period = self._synchronize(d, rng)
        start_ns, end_ns = self._wall_clock(step, period, rng)
        return SimStep(
            self._batch(step, d, start_ns, end_ns),
            self.layout,
            self.seed,
            d.gpu_f,
            d.coll_f,
            d.count_f,
            d.launch_f,
            d.hidden,
            active,
            d.kernel_slow,
            d.gap,
        )

    def _gpu_speed(self, step: int, extra: np.random.Generator) -> np.ndarray:
        """Per rank, how much slower than nominal its GPU computes this step: its static speed,
        its pipeline stage, the warm-up, and (realistic noise) the job's slow first steps and
        heavy-tailed jitter."""
        nz, n = self.noise, self.layout.n_ranks
        warm = 1.0 + 0.5 * np.exp(-step) if step < self.warmup_steps else 1.0
        gpu: np.ndarray = self._speed * self._stage_skew * warm
        if step < nz.warmup:
            gpu = gpu * extra.uniform(*nz.warmup_factor, n)
        if nz.jitter > 0:
            gpu = gpu * self._jitter(extra, n)
        return gpu

    def _nominal(self, step: int, rng: np.random.Generator, gpu: np.ndarray) -> _Draft:
        """Every rank's phases of a healthy step (ms), with the per-phase noise of a clean
        simulation; collectives only where the layout has them."""
        lay, p, n = self.layout, self.p, self.layout.n_ranks
        sd = self.noise.phase_sd

        def noisy(base: float | np.ndarray) -> np.ndarray:
            return base * (1.0 + sd * _trunc(rng, n))

        fwd = noisy(p.forward) * gpu
        bwd = noisy(p.backward) * gpu
        opt = noisy(p.optimizer) * gpu
        dl = noisy(p.dataloader)
        h2d = noisy(p.h2d)
        tp_on = lay.tp * lay.cp > 1
        ag = noisy(p.all_gather) if tp_on else np.zeros(n)
        rs = noisy(p.reduce_scatter) if tp_on else np.zeros(n)
        ar = noisy(p.all_reduce) if lay.dp > 1 else np.zeros(n)
        p2p = noisy(p.p2p) if lay.pp > 1 else np.zeros(n)
        gc = np.where(rng.random(n) < 0.01, 2.0, 0.0) * (1.0 + 0.5 * rng.random(n))
        compile_ = noisy(p.compile_warmup) * np.exp(-2.0 * step) if step < self.warmup_steps else np.zeros(n)
        ckpt = noisy(p.checkpoint) if self.is_checkpoint(step) else np.zeros(n)
        tokens = p.tokens * (1.0 + 0.25 * sd * _trunc(rng, n))
        return _Draft(
            fwd, bwd, opt, dl, h2d, ag, rs, ar, p2p, gc, compile_, ckpt, tokens, np.zeros(n),
            self.is_checkpoint(step),
        )  # fmt: skip

    def _add_noise(self, d: _Draft, step: int, extra: np.random.Generator) -> None:
        """What realistic noise adds to a healthy step: heavy-tailed jitter of every
        collective's transfer, GC pauses, unannotated evaluation and checkpoint steps."""
        nz, n = self.noise, self.layout.n_ranks
        if nz.jitter > 0:
            for col in (d.ag, d.rs, d.ar, d.p2p):
                col *= self._jitter(extra, n)
        if nz.gc_rate > 0:
            d.gc = d.gc + np.where(extra.random(n) < nz.gc_rate, nz.gc_ms, 0.0)
        if nz.is_eval(step):
            d.fwd = d.fwd + (nz.eval_factor - 1.0) * (d.fwd + d.bwd + d.opt)
        if nz.is_ckpt(step):
            d.hidden += nz.ckpt_ms * self._jitter(extra, n)

    def _rows(self, f: Fault, rng: np.random.Generator) -> np.ndarray:
        """The ranks a fault acts on: a pipeline stage, the heaviest data-parallel replica of
        this step (drawn now), a host, or its ranks."""
        c = self._c
        if f.kind == PIPELINE_STAGE_IMBALANCE:
            return np.asarray(c["pp"] == (f.stage or 0))
        if f.kind == SEQUENCE_LENGTH_IMBALANCE:
            return np.asarray(c["dp"] == int(rng.integers(0, self.layout.dp)))
        if f.kind == HOST_CPU_CONTENTION:
            return np.asarray(c["host"] == (f.host or 0))
        return np.asarray(f.ranks, dtype=np.int64)

    def _synchronize(self, d: _Draft, rng: np.random.Generator) -> float:
        """End the step for every rank when the slowest rank's work is done: the pipeline's
        bubble (1F1B, grown by a bubble fault) added to the send/recv time, each rank's wait
        for the slowest booked to the collective it reaches it through; the step's period (ms)."""
        lay, n = self.layout, self.layout.n_ranks
        if lay.pp > 1:
            stage_compute = np.median((d.fwd + d.bwd).reshape(lay.pp, -1), axis=1)
            jitter = 1.0 + 0.5 * self.noise.phase_sd * _trunc(rng, n)
            d.p2p = d.p2p + self._bubble * d.bubble * stage_compute.max() * jitter
        busy = d.dl + d.h2d + d.fwd + d.bwd + d.opt + d.gc + d.compile_ + d.ckpt + d.ag + d.rs + d.ar + d.p2p
        busy = busy + d.hidden
        period = float(busy.max()) + 0.3
        wait = period - busy
        if lay.pp > 1:
            d.p2p = d.p2p + wait
        elif lay.tp * lay.cp > 1:
            d.ag = d.ag + wait
        else:
            d.ar = d.ar + wait
        return period

    def _wall_clock(
        self, step: int, period: float, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's start and end (ns): steps chain (one out of order starts at a nominal
        time), each rank starting up to 0.2 ms after the step's start."""
        p = self.p
        if step != self._next_step:
            self._clock = self.start_ns + step * int((p.forward + p.backward + p.optimizer) * 1.6e6)
        offsets = (rng.random(self.layout.n_ranks) * 2e5).astype(np.int64)
        start_ns = self._clock + offsets
        end_ns = start_ns + int(period * 1e6)
        self._clock = int(end_ns.max()) + 100_000
        self._next_step = step + 1
        return start_ns, end_ns

    def _batch(self, step: int, d: _Draft, start_ns: np.ndarray, end_ns: np.ndarray) -> StepBatch:
        """The step's records of every rank."""
        n, c = self.layout.n_ranks, self._c
        cols = StepBatch.empty_columns(n)
        cols.update(
            rank=c["rank"],
            host=self._hosts,
            gpu_uuid=self._uuids,
            dp=c["dp"],
            tp=c["tp"],
            pp=c["pp"],
            ep=c["ep"],
            cp=c["cp"],
            start_ns=start_ns,
            end_ns=end_ns,
            forward_ms=d.fwd,
            backward_ms=d.bwd,
            optimizer_ms=d.opt,
            dataloader_ms=d.dl,
            h2d_ms=d.h2d,
            gc_ms=d.gc,
            compile_ms=d.compile_,
            checkpoint_ms=d.ckpt,
            all_reduce_ms=d.ar,
            all_gather_ms=d.ag,
            reduce_scatter_ms=d.rs,
            p2p_ms=d.p2p,
            samples=np.full(n, 16, dtype=np.int64),
            tokens=d.tokens.astype(np.int64),
        )
        return StepBatch(self.job, self.run_id, step, cols)


@dataclass
class _Draft:
    """One step being generated: every rank's phase times (ms), as noise and faults change
    them, and the hidden truth the faults leave (see :class:`SimStep`)."""

    fwd: np.ndarray
    bwd: np.ndarray
    opt: np.ndarray
    dl: np.ndarray
    h2d: np.ndarray
    ag: np.ndarray
    rs: np.ndarray
    ar: np.ndarray
    p2p: np.ndarray
    gc: np.ndarray
    compile_: np.ndarray
    ckpt: np.ndarray
    tokens: np.ndarray
    hidden: np.ndarray
    checkpoint: bool  # the step writes a checkpoint
    bubble: float = 1.0  # the pipeline bubble's factor
    gpu_f: np.ndarray = field(init=False)
    coll_f: np.ndarray = field(init=False)
    count_f: np.ndarray = field(init=False)
    launch_f: np.ndarray = field(init=False)
    gap: np.ndarray = field(init=False)
    kernel_slow: dict[int, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.fwd)
        ones = np.ones(n)
        self.gpu_f, self.coll_f, self.count_f, self.launch_f = (
            ones.copy(),
            ones.copy(),
            ones.copy(),
            ones.copy(),
        )
        self.gap = np.zeros(n)


# What each fault does to the step's ranks ``r`` (indices or a mask) at magnitude ``m``
# (0: the kind's default).


def _kernels_slower(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    """Some kernels only slower (a throttled GEMM): their phases by their share."""
    kf = kernel_factors(f.kernel, m or 1.3)
    d.fwd[r] *= column_factor(kf, "forward_ms")
    d.bwd[r] *= column_factor(kf, "backward_ms")
    d.opt[r] *= column_factor(kf, "optimizer_ms")
    for rank in r.tolist():
        d.kernel_slow[rank] = d.kernel_slow.get(rank, np.ones(len(kf))) * kf


def _gpu_slower(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    fac = m or 1.4
    d.fwd[r] *= fac
    d.bwd[r] *= fac
    d.opt[r] *= fac
    d.gpu_f[r] *= fac


def _gpu_slower_unseen(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    """A masked straggler: the GPU's extra time outside every phase timer."""
    fac = m or 1.4
    d.hidden[r] += (d.fwd[r] + d.bwd[r] + d.opt[r]) * (fac - 1.0)
    d.gpu_f[r] *= fac


def _link_slower(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    fac = m or 3.0
    d.ar[r] *= fac
    d.coll_f[r] *= fac


def _bubble_larger(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    d.bubble *= m or 2.0


def _stage_heavier(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    """More layers on one pipeline stage: more kernels, as fast each."""
    fac = m or 1.4
    d.fwd[r] *= fac
    d.bwd[r] *= fac
    d.count_f[r] *= fac


def _sequences_longer(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    """One data-parallel replica's batch of longer sequences: more tokens, superlinear compute."""
    ratio = m or 1.6
    d.tokens[r] *= ratio
    d.fwd[r] *= ratio**1.1
    d.bwd[r] *= ratio**1.1
    d.gpu_f[r] *= ratio**0.1
    d.count_f[r] *= ratio


def _host_contended(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    """A host's CPUs starved: data loaders and copies slow, kernels launched late (as fast)."""
    d.dl[r] = d.dl[r] * 5.0 + m
    d.h2d[r] *= 4.0
    before = d.fwd[r] + d.bwd[r] + d.opt[r]
    d.fwd[r] *= 1.15
    d.bwd[r] *= 1.05
    d.opt[r] *= 1.2
    d.gap[r] += d.fwd[r] + d.bwd[r] + d.opt[r] - before  # launches late, kernels as fast
    d.launch_f[r] *= 5.0


def _compile_stall(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    d.compile_[r] += m or 1500.0


def _dataloader_stall(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    d.dl[r] += m or 800.0


def _gc_pause(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    d.gc[r] += m or 400.0


def _checkpoint_slower(d: _Draft, f: Fault, r: np.ndarray, m: float) -> None:
    if d.checkpoint:
        d.ckpt[r] *= m or 4.0


_EFFECTS: dict[str, Callable[[_Draft, Fault, np.ndarray, float], None]] = {
    COMPUTE_STRAGGLER: _gpu_slower,
    MASKED_COMPUTE_STRAGGLER: _gpu_slower_unseen,
    LINK_DEGRADATION: _link_slower,
    PIPELINE_BUBBLE: _bubble_larger,
    PIPELINE_STAGE_IMBALANCE: _stage_heavier,
    SEQUENCE_LENGTH_IMBALANCE: _sequences_longer,
    HOST_CPU_CONTENTION: _host_contended,
    JIT_COMPILE_STALL: _compile_stall,
    DATALOADER_STALL: _dataloader_stall,
    GC_PAUSE: _gc_pause,
    CHECKPOINT_STALL: _checkpoint_slower,
}
