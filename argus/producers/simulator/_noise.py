"""The noise of real jobs, as the simulator adds it to every step.

Real step times are not a Gaussian around a constant: they have heavy tails, per-GPU
static offsets, a slow warm-up, evaluation and checkpoint steps nobody annotated, and
garbage-collector pauses. :data:`REALISTIC` has all of them (the default); :data:`CLEAN`
is the simulator's original light-tailed noise, kept for the clean suite.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLEAN", "REALISTIC", "Noise"]


@dataclass(frozen=True)
class Noise:
    """What the simulator adds to a healthy step.

    Args:
        phase_sd: light-tailed per rank and phase noise (truncated normal, relative sd).
        speed_spread: static per-GPU speed spread (truncated normal, relative sd).
        jitter: scale of the heavy-tailed per rank-step jitter of compute and of every
            collective's transfer time (Student t with ``jitter_df`` degrees of freedom).
        offset: static per-rank offsets, uniform in ``±offset``.
        warmup: the first ``warmup`` steps are ``warmup_factor`` times slower on every
            rank (a factor drawn per rank and step), unannotated.
        eval_every, eval_factor: every ``eval_every`` steps an evaluation step runs
            ``eval_factor`` times as long on every rank, booked to the forward pass.
        ckpt_every, ckpt_ms: every ``ckpt_every`` steps an unannotated checkpoint adds
            about ``ckpt_ms`` of wall time on every rank that no phase timer sees.
        gc_rate, gc_ms: a fraction ``gc_rate`` of rank-steps pauses ``gc_ms`` in the GC.
    """

    phase_sd: float = 0.005
    speed_spread: float = 0.0
    jitter: float = 0.01
    jitter_df: float = 3.0
    offset: float = 0.01
    warmup: int = 10
    warmup_factor: tuple[float, float] = (2.0, 3.0)
    eval_every: int = 500
    eval_factor: float = 5.0
    ckpt_every: int = 1000
    ckpt_ms: float = 10_000.0
    gc_rate: float = 0.001
    gc_ms: float = 50.0

    def is_eval(self, step: int) -> bool:
        """Whether ``step`` is an (unannotated) evaluation step."""
        return self.eval_every > 0 and step % self.eval_every == self.eval_every - 1

    def is_ckpt(self, step: int) -> bool:
        """Whether ``step`` writes an unannotated checkpoint."""
        return self.ckpt_every > 0 and step > 0 and step % self.ckpt_every == 0


REALISTIC = Noise()
"""Heavy tails, static offsets, warm-up, evaluation, checkpoints and GC pauses."""

CLEAN = Noise(
    phase_sd=0.02,
    speed_spread=0.01,
    jitter=0.0,
    offset=0.0,
    warmup=0,
    eval_every=0,
    ckpt_every=0,
    gc_rate=0.0,
)
"""The simulator's original noise: a truncated normal per rank and phase and a static
per-GPU speed spread, nothing else."""
