"""Thresholds of the diagnosis, in one frozen dataclass (defaults tuned on the simulator)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DiagnoserConfig"]


@dataclass(frozen=True)
class DiagnoserConfig:
    """Thresholds and windows of the progressive diagnosis.

    Cross-rank: a rank is flagged on a metric when its robust z-score within its group
    (``group_column``, the pp stage by default) is at least ``z_pos`` and its excess over the
    group median at least ``max(min_excess_ms, min_excess_frac * busy)`` (busy: the
    typical rank's compute + data-loader + copy time, which one rank's stall does not
    inflate); it "waits least" when its collective z-score is at most ``-z_neg`` and its
    deficit at least ``neg_min_frac * busy``. Iteration level: the job's step time is anomalous
    when it exceeds the median of the last ``iter_window`` clean steps by ``iter_z`` robust
    sigmas and by ``iter_rel`` of it (after ``iter_min_steps`` clean steps). No alarm on
    steps below ``warmup_steps``. An episode becomes an anomaly when seen in ``min_steps``
    steps, or for a one-off stall once it cost ``min_cost_frac`` of a step; it closes after
    ``close_after`` steps without a sighting (``persistent_close_after`` for a straggler
    seen within ``persistent_within`` steps of the first step past the warm-up: past
    ``warmup_steps``, or where the job became ``global_ratio`` times faster within its first
    ``persistent_settle_steps`` steps). Steps where the job's step time is
    ``global_ratio`` times its baseline or more (evaluation, checkpoint) are no sightings
    for ranks. Once an episode is an anomaly, a rank at ``weak_frac`` of a threshold still
    counts as a sighting (hysteresis: a fault near the threshold is one anomaly, not many).
    Ranks of one host slow for one cause are one finding from ``host_min_ranks`` on; ranks
    of one group across hosts from ``group_min_frac`` of the group on (fewer are the noise's
    transients). An anomaly lists at most ``max_listed`` ranks. Group medians and MADs of groups larger than ``max_sample`` ranks come from
    a strided sample.
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
    iter_window: int = 32
    iter_min_steps: int = 8
    iter_z: float = 6.0
    iter_rel: float = 0.05
    checkpoint_ratio: float = 1.5
    min_steps: int = 4
    min_cost_frac: float = 0.2
    close_after: int = 3
    persistent_within: int = 2
    persistent_settle_steps: int = 200
    persistent_close_after: int = 20
    update_every: int = 5
    global_ratio: float = 1.5
    weak_frac: float = 0.5
    max_weak: int = 4096
    max_listed: int = 1024
    max_open: int = 256
    kernel_peers: int = 8
    max_sample: int | None = 256
