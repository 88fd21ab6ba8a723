"""Thresholds of the diagnosis, in one frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from argus.schemas import LIMITS

__all__ = ["DiagnoserConfig"]


@dataclass(frozen=True)
class DiagnoserConfig:
    """Thresholds and windows of the progressive diagnosis (defaults tuned on the realistic
    noise suite of ``bench/diagnosis.py``).

    Cross-rank: a rank is flagged on a metric when its robust z-score within its group
    (``group_column``, the pp stage by default) is at least ``z_pos`` and its excess over the
    group's centre at least ``max(min_excess_ms, min_excess_frac * busy)`` (busy: the
    typical rank's compute + data-loader + copy time, which one rank's stall does not
    inflate); it "waits least" when its collective z-score is at most ``-z_neg`` and its
    deficit at least ``neg_min_frac * busy`` and the least excess (in a group of two, scored
    against the longer wait of the two). A rank at ``weak_frac`` of a threshold is
    weakly flagged (at most ``max_weak`` per step). Ranks of one host slow for one cause
    are one finding from ``host_min_ranks`` on; ranks of one group across hosts from
    ``group_min_frac`` of the group on, in groups of ``group_min_size`` ranks or more.

    Iteration level: the job's step without the wait for its slowest rank is anomalous when
    it exceeds the median of the last ``iter_window`` clean steps by ``iter_z`` robust sigmas
    and their 95th percentile by ``iter_rel`` of the median (after ``iter_min_steps`` clean
    steps; a share of slow steps on every rank, e.g. long sequences, is the job's normal);
    a job-wide change that lasted ``iter_adopt_steps`` becomes the baseline; a checkpoint
    ``checkpoint_ratio`` times the last one is a stall. Steps where the typical rank works
    ``global_ratio`` times its reference or more (evaluation, checkpoint, warm-up) are no
    sightings for ranks. No alarm before ``warmup_steps``.

    Temporal: an episode becomes an anomaly when seen in ``min_steps`` steps (twice that for
    a rank of a job under ``group_min_size`` ranks), or for a one-off stall once it cost
    ``min_cost_frac`` of a step in one step (the one-off floor: the step at least twice its
    usual length; a shorter blip is a transient, counted, never an anomaly; a one-off is
    never a page); it is sent again every ``update_every`` steps
    while open, and closes after ``close_after`` steps without a sighting (a weakly flagged
    rank keeps a confirmed one open; ``persistent_close_after`` for a straggler seen within
    ``persistent_within`` steps of the job's settling: past ``warmup_steps``, or where it
    became ``global_ratio`` times faster for ``min_steps`` steps in a row, once, within
    its first ``persistent_settle_steps`` steps). A sighting of a confirmed fault that adds less than
    ``faint_frac`` of what its sightings added on average is no sighting of it (noise on the
    same rank after the fault ended). An episode fading as it would be confirmed (its
    last sighting adds under ``fade_frac`` of its first, largest one: a shock of
    autocorrelated noise dying away) waits until it has been seen twice the sightings a
    confirmation takes. A fault confirmed again within ``recur_within`` steps of its anomaly's end (and
    within twice its last stretch) continues that anomaly (a flapping rank is one anomaly).
    At most ``max_open`` unconfirmed episodes; an anomaly lists at most ``max_listed`` ranks.

    Kernel level (for confirmed rank, link and host suspects only): a suspect's kernels
    and stacks against those of ``kernel_peers`` healthy peers of its group. A kernel
    whose per-call duration is ``kernel_degraded_ratio`` times the peers' and adds
    ``kernel_min_excess`` of the suspect's kernel time, or a frame the suspect samples
    ``stack_min_delta`` (share of samples) more than its peers, makes the anomaly
    ``level="kernel"``; while no such evidence is found, the anomaly is deepened again on
    each step it stays open: up to ``deepen_steps`` times with data, and whenever the
    suspect has no data yet (its sketches late). Group statistics of groups larger than ``max_sample`` ranks come from a strided
    sample.

    Change points (:mod:`detectors.changepoint`), on unless ``change_points`` is False, in
    jobs of at most ``cp_max_ranks`` ranks (the StepFindings carries every rank's own work
    to the temporal stage, and the job's state holds each rank's test: ~390 bytes a rank,
    one document in the stream worker's table; docs/architecture.md#change-points). Each rank's residual (log of its own work
    over its group's and its replica's fast side) against its own baseline, learned over its
    first ``cp_learn`` samples and followed with weight ``cp_alpha`` while nothing is open.
    A CUSUM with reference ``max(cp_k * sigma, cp_min_shift / 2)`` and each step's deviation
    clipped at ``max(cp_clip * sigma, cp_fast_shift)`` (sigma: the long-run one, widened by
    the autocorrelation) opens a change at ``max(cp_h * sigma, cp_min_evidence)`` from three
    samples adding evidence or more (fewer are blips): a shift of ``cp_fast_shift`` or more
    in about three steps (in a job of fewer than ``small_job`` ranks one of
    ``cp_small_shift`` or more adds that much a step), one of ``cp_min_shift`` or less never; it
    ends after about ``cp_end_steps`` steps back below half its size (its size follows it
    with weight ``cp_size_alpha``). Changes whose onsets are within ``cp_onset_within``
    steps, or within the spread of a weak change's onset (at most ``cp_onset_within_max``),
    and whose sizes are within a factor ``cp_size_ratio`` are one cause
    (:mod:`detectors.common_cause`). A rank whose last six spikes (``cp_spike`` or more
    over its baseline, and four of its own sigmas) came at regular gaps (2 to ``cp_max_period`` steps) is slow every
    k-th step: one change from the first of them. A job of fewer than ``small_job`` ranks leads with the
    rank's own past: a rank that only stands out against its few peers (a naturally slower
    worker) is never paged.

    Baselines: a rank or group slow from about the job's first settled step (first seen
    within twice the sightings a confirmation takes, adding at most ``baseline_max_frac`` of
    a step; or since the start with two more suspects slow since then: a speed group; one
    rank far slower alone is a warning "since the start"), or one of ranks that
    stood out (flagged or weakly) in ``baseline_rate`` of the settled steps before its
    episode opened (a static offset, a speed group flickering about the threshold) and adds
    at most ``flicker_max_frac`` of a step, is the job's baseline, never an anomaly; it becomes one only when it adds a tenth of a step more
    than its baseline did. ``max_tracked``: ranks whose flags are counted.

    Severity: a confirmed fault is a warning until it has been seen in ``page_after`` times
    the steps that confirmed it, or adds ``page_cost_frac`` of a step per sighting; then it is
    sent again as a page (noise that runs in streaks, strong autocorrelation or heavy tails,
    confirms for a few steps at a small excess and ends).
    """

    group_column: str = "pp"
    z_pos: float = 6.0
    z_neg: float = 8.0
    min_excess_ms: float = 5.0
    min_excess_frac: float = 0.02
    neg_min_frac: float = 0.04
    tokens_ratio: float = 1.1
    stage_ratio: float = 1.15
    gpus_per_host: int = 8
    host_min_ranks: int = 4
    group_min_frac: float = 0.05
    group_min_size: int = 32
    warmup_steps: int = 5
    iter_window: int = 128
    iter_adopt_steps: int = 256
    recur_within: int = 64
    iter_min_steps: int = 32
    iter_z: float = 6.0
    iter_rel: float = 0.05
    checkpoint_ratio: float = 1.5
    min_steps: int = 4
    min_cost_frac: float = 1.0
    close_after: int = 3
    persistent_within: int = 2
    persistent_settle_steps: int = 200
    persistent_close_after: int = 20
    update_every: int = 5
    global_ratio: float = 1.5
    weak_frac: float = 0.5
    faint_frac: float = 0.25
    fade_frac: float = 0.5
    max_weak: int = 4096
    max_listed: int = LIMITS["max_listed_ranks"]
    max_open: int = 256
    kernel_peers: int = 8
    kernel_degraded_ratio: float = 1.15
    kernel_min_excess: float = 0.02
    stack_min_delta: float = 0.1
    deepen_steps: int = 3
    max_sample: int | None = 256
    change_points: bool = True
    cp_max_ranks: int = 1024
    cp_learn: int = 24
    cp_alpha: float = 0.01
    cp_k: float = 0.75
    cp_clip: float = 2.5
    cp_fast_shift: float = 0.15
    cp_small_shift: float = 0.2
    cp_h: float = 16.0
    cp_min_shift: float = 0.08
    cp_min_evidence: float = 0.3
    cp_end_steps: float = 3.0
    cp_size_alpha: float = 0.1
    cp_onset_within: int = 4
    cp_onset_within_max: int = 127
    cp_size_ratio: float = 2.0
    cp_spike: float = 0.25
    cp_max_period: int = 64
    small_job: int = 33
    baseline_rate: float = 0.25
    baseline_max_frac: float = 0.25
    flicker_max_frac: float = 0.5
    page_after: float = 2.0
    page_cost_frac: float = 0.2
    max_tracked: int = 8192
