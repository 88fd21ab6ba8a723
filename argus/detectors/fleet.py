"""Fleet health: which nodes slow jobs down more often than the fleet, given what they hosted.

One diagnosis names a rank, a host or a link of one job; a node that several different jobs
found slow is bad with far more certainty than any one diagnosis gives. The metric comes
first and the decision second (as in HTA's straggler analysis): per node, the distinct jobs
whose anomalies implicated it and the GPU-hours it hosted; then a test against the fleet.

The model (stated in :func:`node_health`'s Notes): a healthy node is implicated by the jobs
it hosts at the fleet's background rate per GPU-hour hosted, so its count of implicating
jobs in a window is Poisson with mean ``rate x exposure``, in each stratum (every cause
apart, and all pooled). A node is *suspect* when its count is improbably high under the
fleet rate in some stratum after multiple-testing control over the strata (Bonferroni) and
every node tested (Holm, family-wise), it was implicated by at least ``min_jobs`` different jobs,
and the rate it shows is at least ``min_ratio`` times the fleet's even at the low end of its
posterior (Gamma prior at the fleet rate): a node that hosted little cannot reach the top
of the list by one anomaly.

A second, independent piece of evidence can stand in for job counts (:func:`health_test`,
:func:`corroborate`): the node agent's NVML health. A host whose GPUs report throttling,
XIDs or rising ECC / link-error counters improbably often for the samples they sent (Holm
over the fleet), *and* whose flagged GPU itself was named by at least
``corroborating_jobs`` different jobs, more than a healthy GPU's share of the fleet's
implications would give, is a suspect on fewer jobs: a throttling GPU that slowed two jobs
is as sure as an unexplained one that slowed five.

A third, :func:`slow_test`, needs no anomaly at all: a GPU slower than its job peers from a
small job's start is that job's baseline (a naturally slower worker: no page), so a slow GPU
that every job takes for its baseline implicates no node by anomaly. Per GPU, of the jobs it
hosted long enough to judge, those in which its compute was ``slow_frac`` above its peers'
median, against the fleet's rate of that happening by chance (binomial): the GPU that is the
slow one in job after job is named. Pure numpy/scipy; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from argus.schemas.causes import (
    CHECKPOINT_STALL,
    COMPUTE_STRAGGLER,
    DATALOADER_STALL,
    HANG,
    HOST_CPU_CONTENTION,
    LINK_DEGRADATION,
    LOST_RANK,
    MASKED_COMPUTE_STRAGGLER,
    UNKNOWN,
)

__all__ = [
    "HEALTH_SIGNALS",
    "NODE_CAUSES",
    "NODE_SUSPECT_KINDS",
    "Corroboration",
    "FleetConfig",
    "HealthTest",
    "NodeHealth",
    "SlowTest",
    "corroborate",
    "fleet_rate",
    "health_test",
    "holm",
    "node_health",
    "slow_test",
]

NODE_CAUSES: frozenset[str] = frozenset(
    {
        COMPUTE_STRAGGLER,
        MASKED_COMPUTE_STRAGGLER,
        LINK_DEGRADATION,
        HOST_CPU_CONTENTION,
        DATALOADER_STALL,
        CHECKPOINT_STALL,
        HANG,
        LOST_RANK,
        UNKNOWN,
    }
)
"""Causes a node can be behind: slow or throttled GPUs, links, a starved host, its storage,
a hang or a lost rank. The workload's own classes (pipeline stage and sequence-length
imbalance, the pipeline bubble) and the job's software (JIT compiles, GC pauses) never
implicate a node."""

NODE_SUSPECT_KINDS: frozenset[str] = frozenset({"rank", "host", "link", "ranks"})
"""Suspect kinds that place an anomaly on nodes (its ranks' hosts, the host, both ends of a
link). A stage, a data-parallel group or the whole job is the workload, not a node."""

HEALTH_SIGNALS: tuple[str, ...] = ("throttled", "xid", "ecc", "link_errors")
"""The node agent's health signals, per GPU: samples throttled (hardware slowdown, thermal,
power brake), samples with an XID, and the rise of the ECC double-bit and NVLink error
counters."""


@dataclass(frozen=True)
class FleetConfig:
    """Thresholds of the fleet test.

    Args:
        alpha: family-wise error rate over the nodes tested in one window (Holm): the chance
            that any healthy node of the fleet is called suspect in that window, if healthy
            nodes follow the model.
        min_jobs: a suspect was implicated by at least this many different jobs.
        min_ratio: a suspect's rate is at least this many times the fleet's at the
            ``credible`` lower end of its posterior.
        credible: the posterior's lower quantile used for ``min_ratio`` and the ranking.
        prior_jobs: the strength of the Gamma prior at the fleet rate, in implicating jobs
            (1: the prior weighs as much as the exposure in which the fleet sees one; of the
            most frequent stratum, all causes pooled, when there are several).
        trim_alpha: nodes whose unadjusted p-value is below this are left out of the fleet
            rate (bad nodes must not raise the bar they are measured against).
        health_alpha: family-wise error rate of the health test over the hosts (Holm): the
            chance that any host whose GPUs are healthy is flagged in a window.
        min_events: a flagged host's GPUs showed at least this many events of the signal.
        corroborating_jobs: a host named on its health is a suspect only when its flagged GPU
            was named by at least this many different jobs ...
        corroborate_alpha: ... more than a healthy GPU's share would give: Holm-adjusted over
            the flagged GPUs, the chance of that many jobs is at most this.
        slow_frac: a GPU is slower than its job peers in a job when its rank's mean compute
            time there is at least this fraction above the median of its peers' (the ranks of
            its job run and pipeline stage) ...
        slow_min_steps: ... over at least this many steps of the window ...
        slow_min_peers: ... among at least this many ranks (itself included) so judged.
    """

    alpha: float = 1e-3
    min_jobs: int = 3
    min_ratio: float = 2.0
    credible: float = 0.05
    prior_jobs: float = 1.0
    trim_alpha: float = 1e-3
    health_alpha: float = 1e-3
    min_events: int = 3
    corroborating_jobs: int = 2
    corroborate_alpha: float = 0.01
    slow_frac: float = 0.08
    slow_min_steps: int = 50
    slow_min_peers: int = 4

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0 or not 0.0 < self.credible < 0.5 or not 0.0 < self.trim_alpha < 1.0:
            raise ValueError("alpha and trim_alpha must be in (0, 1), credible in (0, 0.5)")
        if self.min_jobs < 1 or self.min_ratio < 1.0 or self.prior_jobs <= 0.0:
            raise ValueError("min_jobs >= 1, min_ratio >= 1 and prior_jobs > 0 are required")
        if not 0.0 < self.health_alpha < 1.0 or not 0.0 < self.corroborate_alpha < 1.0:
            raise ValueError("health_alpha and corroborate_alpha must be in (0, 1)")
        if self.min_events < 1 or self.corroborating_jobs < 1:
            raise ValueError("min_events >= 1 and corroborating_jobs >= 1 are required")
        if not 0.0 < self.slow_frac < 1.0 or self.slow_min_steps < 1 or self.slow_min_peers < 3:
            raise ValueError("slow_frac must be in (0, 1), slow_min_steps >= 1 and slow_min_peers >= 3")


@dataclass(frozen=True)
class NodeHealth:
    """The fleet test over nodes (one entry per node, in the input's order).

    ``rate``: the fleet's background rate of each stratum (implicating jobs per GPU-hour
    hosted); per node: ``stratum``, the stratum that decided (its smallest p-value),
    ``count`` its implicating jobs there and ``expected`` those of a healthy node
    (``rate x exposure``); ``p_value``: P(count >= observed) under the fleet rate, times the
    strata tested (Bonferroni); ``p_adjusted``: Holm-adjusted over the nodes tested;
    ``confidence``: ``1 - p_adjusted``; ``ratio_low``: the node's rate over the fleet's at the
    ``credible`` lower quantile of its posterior (ranks the list); ``suspect``: the decision.
    """

    rate: np.ndarray
    expected: np.ndarray
    p_value: np.ndarray
    p_adjusted: np.ndarray
    ratio_low: np.ndarray
    suspect: np.ndarray
    stratum: np.ndarray
    count: np.ndarray

    @property
    def confidence(self) -> np.ndarray:
        """``1 - p_adjusted``: how sure the test is that the node is worse than the fleet."""
        out: np.ndarray = 1.0 - self.p_adjusted
        return out

    def order(self) -> np.ndarray:
        """Node indices, suspects first, then by ``ratio_low`` and confidence, descending."""
        return np.lexsort((-self.confidence, -self.ratio_low, ~self.suspect))


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control, any dependence)."""
    p = np.asarray(p, dtype=float)
    m = len(p)
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(stepped, 1.0)
    return out


def _p_values(counts: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """P(Poisson(expected) >= counts); 1 where nothing was seen."""
    p: np.ndarray = np.where(counts > 0, stats.poisson.sf(counts - 1, np.maximum(expected, 1e-300)), 1.0)
    return p


def fleet_rate(counts: np.ndarray, exposure: np.ndarray, *, trim_alpha: float = 1e-3) -> float:
    """The fleet's background rate of implicating jobs per GPU-hour hosted.

    Pooled (sum of counts over sum of exposure), then again without the nodes that the rate
    finds improbable (p < ``trim_alpha``), until that set settles (at most 5 rounds), so that
    a few bad nodes do not raise the rate the others are judged by. 0 when the fleet hosted
    nothing.
    """
    counts = np.asarray(counts, dtype=float)
    exposure = np.asarray(exposure, dtype=float)
    total = exposure.sum()
    if total <= 0.0:
        return 0.0
    rate = counts.sum() / total
    keep = np.ones(len(counts), bool)
    for _ in range(5):  # a few bad nodes in a small fleet hide each other: trim until it settles
        now = _p_values(counts, rate * exposure) >= trim_alpha
        if not now.any() or exposure[now].sum() <= 0.0 or (now == keep).all():
            break
        keep = now
        rate = counts[keep].sum() / exposure[keep].sum()
    return float(rate)


def node_health(
    counts: Sequence[int] | np.ndarray,
    exposure: Sequence[float] | np.ndarray,
    config: FleetConfig | None = None,
) -> NodeHealth:
    """Test every node's count of implicating jobs against the fleet's rate.

    Args:
        counts: per node, the distinct jobs whose anomalies (of :data:`NODE_CAUSES`, as
            :data:`NODE_SUSPECT_KINDS`) implicated it in the window; one column per stratum
            (e.g. every cause, and all of them together) or a single column.
        exposure: per node, the GPU-hours it hosted in the window (from the steps).
        config: thresholds (:class:`FleetConfig`).

    Returns:
        :class:`NodeHealth`, one entry per node in the input's order.

    Notes:
        Counts are distinct jobs, not anomalies: one job's repeated anomalies on a node are
        one piece of evidence (they share the job's code, data and neighbours). Under the
        null a healthy node's count in each stratum is Poisson(``rate x exposure``), the
        stratum's ``rate`` from :func:`fleet_rate` plus half a job over the fleet's exposure
        (a cause seen only on the nodes the rate leaves out is rare, not untestable). A bad node keeps failing the same way
        (a slow GPU's jobs see compute stragglers, a flaky link's see link faults) while
        healthy nodes' bad luck spreads over the causes: a stratum per cause needs fewer jobs
        to tell it apart than all causes pooled. A node's p-value is its smallest over the
        strata times their number (Bonferroni); the test is one-sided (only worse than the
        fleet matters) and Holm-adjusted over the nodes tested (those that hosted anything),
        so ``alpha`` bounds the chance of naming any healthy node in the window. The posterior of a node's rate
        is Gamma(``a + count``, ``a / rate + exposure``), ``a = prior_jobs x rate / max rate``: a
        prior at the stratum's fleet rate whose exposure is the same in every stratum (that in
        which the fleet sees ``prior_jobs`` jobs of its most frequent stratum; with one
        stratum, ``prior_jobs`` jobs): with little exposure it stays near the fleet rate, so
        ``ratio_low`` (its ``credible`` quantile over the fleet rate) keeps a node with one
        anomaly and no history off the top. Jobs that
        run on few nodes, a node that hosts one job for weeks, and correlated faults (a
        rack's switch) bend the Poisson assumption; the distinct-job count and
        ``min_jobs`` are the guard.
    """
    cfg = config or FleetConfig()
    k = np.asarray(counts, dtype=float)
    e = np.asarray(exposure, dtype=float)
    if k.ndim == 1:
        k = k[:, None]
    if e.ndim != 1 or k.ndim != 2 or k.shape[0] != e.shape[0]:
        raise ValueError(f"counts and exposure need one value per node (got {k.shape} and {e.shape})")
    if (k < 0).any() or (e < 0).any() or not np.isfinite(e).all():
        raise ValueError("counts and exposure must be finite and >= 0")
    n, strata = k.shape
    # plus half a job over the fleet's exposure (Jeffreys) in a stratum with any job: when
    # every job of a cause is on nodes the trimmed rate finds improbable, the cause is rare
    # among healthy nodes, not untestable
    half = 0.5 / e.sum() if n and e.sum() > 0.0 else 0.0
    rate = np.array(
        [
            fleet_rate(k[:, j], e, trim_alpha=cfg.trim_alpha) + (half if k[:, j].any() else 0.0)
            for j in range(strata)
        ]
    )
    if n == 0 or strata == 0 or (rate <= 0.0).all():
        zeros = np.zeros(n)
        return NodeHealth(
            rate, zeros, np.ones(n), np.ones(n), zeros, np.zeros(n, bool), np.zeros(n, int), zeros
        )
    expected_all = rate[None, :] * e[:, None]
    p_all = np.where(rate[None, :] > 0.0, _p_values(k, expected_all), 1.0)
    best = np.argmin(p_all, axis=1)
    rows = np.arange(n)
    p = np.minimum(p_all[rows, best] * strata, 1.0)
    count, expected, r = k[rows, best], expected_all[rows, best], rate[best]
    tested = e > 0.0
    p_adj = np.ones(n)
    p_adj[tested] = holm(p[tested])
    safe = np.where(r > 0.0, r, 1.0)
    # the prior's exposure is the same in every stratum: that in which the fleet sees
    # prior_jobs implicating jobs of its most frequent stratum (all causes pooled), so in a
    # rare cause it is worth a fraction of a job, not more exposure than any node hosts
    prior = cfg.prior_jobs * safe / rate.max()
    shape = prior + count
    scale = 1.0 / (prior / safe + e)
    ratio_low = np.where(r > 0.0, stats.gamma.ppf(cfg.credible, shape, scale=scale) / safe, 0.0)
    suspect = (p_adj <= cfg.alpha) & (count >= cfg.min_jobs) & (ratio_low >= cfg.min_ratio)
    return NodeHealth(rate, expected, p, p_adj, ratio_low, suspect, best, count)


@dataclass(frozen=True)
class HealthTest:
    """The health test over hosts (one entry per host, in the input's order).

    ``rate``: the fleet's events per sample of each signal (:data:`HEALTH_SIGNALS`); per host:
    ``signal``, the one that decided (its smallest p-value), ``events`` its count there and
    ``expected`` a healthy host's; ``p_value``: P(events >= observed) times the signals tested
    (Bonferroni); ``p_adjusted``: Holm over the hosts that sent samples; ``flagged``: the
    decision.
    """

    rate: np.ndarray
    signal: np.ndarray
    events: np.ndarray
    expected: np.ndarray
    p_value: np.ndarray
    p_adjusted: np.ndarray
    flagged: np.ndarray


def health_test(
    events: Sequence[Sequence[float]] | np.ndarray,
    samples: Sequence[float] | np.ndarray,
    config: FleetConfig | None = None,
) -> HealthTest:
    """Test every host's health events against the fleet's rate per sample.

    Args:
        events: per host, one column per signal (:data:`HEALTH_SIGNALS`): its GPUs' samples
            throttled, samples with an XID, rise of the ECC and link-error counters.
        samples: per host, the health samples its GPUs sent in the window (the exposure).
        config: ``health_alpha``, ``min_events``, ``trim_alpha`` (:class:`FleetConfig`).

    Notes:
        Under the null a healthy host's events of a signal are Poisson(``rate x samples``),
        the signal's ``rate`` pooled over the fleet without the hosts it finds improbable
        (:func:`fleet_rate`), plus half an event over the whole fleet (Jeffreys): a signal no
        healthy host showed in the window still has a finite rate, so one stray event is never
        infinitely improbable. One-sided, Bonferroni over the signals, Holm over the hosts.
    """
    cfg = config or FleetConfig()
    k = np.asarray(events, dtype=float)
    e = np.asarray(samples, dtype=float)
    if k.ndim == 1:
        k = k[:, None]
    if e.ndim != 1 or k.ndim != 2 or k.shape[0] != e.shape[0]:
        raise ValueError(f"events and samples need one row per host (got {k.shape} and {e.shape})")
    if (k < 0).any() or (e < 0).any() or not np.isfinite(k).all() or not np.isfinite(e).all():
        raise ValueError("events and samples must be finite and >= 0")
    n, signals = k.shape
    total = e.sum()
    if n == 0 or signals == 0 or total <= 0.0:
        z = np.zeros(n)
        return HealthTest(
            np.zeros(signals), np.zeros(n, int), z, z, np.ones(n), np.ones(n), np.zeros(n, bool)
        )
    rate = np.array([fleet_rate(k[:, j], e, trim_alpha=cfg.trim_alpha) + 0.5 / total for j in range(signals)])
    expected_all = rate[None, :] * e[:, None]
    p_all = _p_values(k, expected_all)
    best = np.argmin(p_all, axis=1)
    rows = np.arange(n)
    p = np.minimum(p_all[rows, best] * signals, 1.0)
    tested = e > 0.0
    p_adj = np.ones(n)
    p_adj[tested] = holm(p[tested])
    count = k[rows, best]
    flagged = tested & (p_adj <= cfg.health_alpha) & (count >= cfg.min_events)
    return HealthTest(rate, best, count, expected_all[rows, best], p, p_adj, flagged)


@dataclass(frozen=True)
class Corroboration:
    """The jobs test of the GPUs the health test flagged (one entry per GPU, input order):
    ``expected`` jobs of a healthy GPU, ``p_value`` P(jobs >= observed), ``p_adjusted`` Holm
    over the GPUs tested, ``ratio_low`` the GPU's rate over a healthy GPU's at the ``credible``
    bound of its posterior (reported, not required: the health evidence stands in for it),
    ``suspect`` the decision."""

    expected: np.ndarray
    p_value: np.ndarray
    p_adjusted: np.ndarray
    ratio_low: np.ndarray
    suspect: np.ndarray


def corroborate(
    jobs: Sequence[int] | np.ndarray,
    exposure: Sequence[float] | np.ndarray,
    rate: float,
    config: FleetConfig | None = None,
) -> Corroboration:
    """Were the flagged GPUs named by more jobs than healthy GPUs are?

    Args:
        jobs: per flagged GPU, the distinct jobs whose anomalies (of :data:`NODE_CAUSES`, as
            :data:`NODE_SUSPECT_KINDS`) named it in the window.
        exposure: per GPU, the GPU-hours it hosted (its host's over the host's GPUs).
        rate: a healthy GPU's rate of implicating jobs per GPU-hour (the fleet's job-GPU
            pairs over its GPU-hours, without the suspects).
        config: ``corroborating_jobs``, ``corroborate_alpha``, ``credible``, ``prior_jobs``.

    Notes:
        Health and job counts of a healthy GPU are independent (a thermal event does not make
        a background fault land on it), so a healthy host is named this way only if the
        health test flags it, at most ``health_alpha`` per window over the fleet; the jobs
        test keeps a GPU that reports events but slows nobody off the list. A GPU that hosted
        nothing in the window (exposure 0) is never a suspect.
    """
    cfg = config or FleetConfig()
    k = np.asarray(jobs, dtype=float)
    e = np.asarray(exposure, dtype=float)
    if k.shape != e.shape or k.ndim != 1:
        raise ValueError(f"jobs and exposure need one value per GPU (got {k.shape} and {e.shape})")
    if (k < 0).any() or (e < 0).any() or not np.isfinite(e).all() or not np.isfinite(rate) or rate < 0:
        raise ValueError("jobs, exposure and rate must be finite and >= 0")
    expected = rate * e
    p = np.where(rate > 0.0, _p_values(k, expected), 1.0) if len(k) else np.ones(0)
    p_adj = holm(p)
    safe = rate if rate > 0.0 else 1.0
    shape = cfg.prior_jobs + k
    scale = 1.0 / (cfg.prior_jobs / safe + e)
    ratio_low = stats.gamma.ppf(cfg.credible, shape, scale=scale) / safe if rate > 0.0 else np.zeros(len(k))
    suspect = (k >= cfg.corroborating_jobs) & (p_adj <= cfg.corroborate_alpha) & (rate > 0.0) & (e > 0.0)
    return Corroboration(expected, p, p_adj, np.asarray(ratio_low, dtype=float), suspect)


@dataclass(frozen=True)
class SlowTest:
    """The test of chronic slowness against job peers (one entry per GPU, in the input's order).

    ``rate``: the fleet's chance that a GPU is the slow one in a job it hosts; per GPU:
    ``expected`` slow jobs of a healthy GPU (``rate x jobs``), ``p_value`` P(slow jobs >=
    observed) under the fleet rate (binomial), ``p_adjusted`` Holm over the GPUs judged,
    ``ratio_low`` its share of slow jobs over the fleet rate at the ``credible`` lower bound of
    its posterior (Jeffreys), ``suspect`` the decision."""

    rate: float
    expected: np.ndarray
    p_value: np.ndarray
    p_adjusted: np.ndarray
    ratio_low: np.ndarray
    suspect: np.ndarray

    @property
    def confidence(self) -> np.ndarray:
        """``1 - p_adjusted``."""
        out: np.ndarray = 1.0 - self.p_adjusted
        return out


def slow_test(
    slow: Sequence[int] | np.ndarray,
    jobs: Sequence[int] | np.ndarray,
    config: FleetConfig | None = None,
    *,
    others: int = 0,
    others_jobs: float = 0.0,
) -> SlowTest:
    """Test every GPU's count of jobs in which it was slower than its peers against the fleet.

    Args:
        slow: per GPU, the jobs in which its compute was ``slow_frac`` above its peers' median.
        jobs: per GPU, the jobs it hosted long enough to be judged (``slow_min_steps``
            steps); ``slow <= jobs``.
        config: ``alpha``, ``min_jobs``, ``min_ratio``, ``credible``, ``trim_alpha``.
        others, others_jobs: GPUs never slow in the window, left out of ``slow`` and ``jobs``
            (a fleet's are most of its GPUs): how many, and their jobs together. They count
            in the fleet rate and in the number of GPUs tested.

    Notes:
        Under the null a healthy GPU is the slow one in each job it hosts independently with
        the fleet's chance ``rate`` (a background fault that landed on it, a transient slowdown
        of its node), so its slow jobs are Binomial(``jobs``, ``rate``). ``rate`` is the
        fleet's share of slow GPU-jobs without the GPUs it finds improbable (:func:`fleet_rate`,
        bad GPUs must not raise the bar), plus half a slow job over all the GPU-jobs judged
        (Jeffreys: one slow job nobody else shows is rare, not infinitely improbable). One-sided,
        Holm over the GPUs judged, so ``alpha`` bounds the chance of naming any healthy GPU in a
        window. A suspect was also slow in at least ``min_jobs`` jobs (a healthy GPU unlucky once
        or twice is never named, however little it hosted) and its share of slow jobs is at
        least ``min_ratio`` times the fleet's at the ``credible`` bound of its posterior,
        Beta(slow + 1/2, jobs - slow + 1/2): where being the slow one is common, a GPU slow now
        and then is not named. A workload whose heavy rank always lands on the same GPU (a
        scheduler that always puts rank 0 there) would bend the independence; peers are the
        ranks of the same pipeline stage, so stages that differ by design do not.
    """
    cfg = config or FleetConfig()
    k = np.asarray(slow, dtype=float)
    n = np.asarray(jobs, dtype=float)
    if k.shape != n.shape or k.ndim != 1:
        raise ValueError(f"slow and jobs need one value per GPU (got {k.shape} and {n.shape})")
    if (k < 0).any() or (k > n).any() or not np.isfinite(n).all():
        raise ValueError("slow and jobs must be finite with 0 <= slow <= jobs")
    if others < 0 or others_jobs < 0 or (others_jobs > 0) != (others > 0):
        raise ValueError("others and others_jobs must be >= 0, both or neither")
    total = n.sum() + others_jobs
    if total <= 0.0:
        z = np.zeros(len(n))
        return SlowTest(0.0, z, np.ones(len(n)), np.ones(len(n)), z, np.zeros(len(n), bool))
    rate = fleet_rate(np.append(k, 0.0), np.append(n, others_jobs), trim_alpha=cfg.trim_alpha)
    rate = min(rate + 0.5 / total, 1.0)
    p = np.where(k > 0, stats.binom.sf(k - 1, n, rate), 1.0)
    judged = n > 0
    p_adj = np.ones(len(n))
    p_adj[judged] = holm(np.append(p[judged], np.ones(others)))[: int(judged.sum())]
    low = stats.beta.ppf(cfg.credible, k + 0.5, n - k + 0.5)
    ratio_low = np.where(judged, np.nan_to_num(low) / rate, 0.0)
    suspect = judged & (p_adj <= cfg.alpha) & (k >= cfg.min_jobs) & (ratio_low >= cfg.min_ratio)
    return SlowTest(float(rate), rate * n, p, p_adj, ratio_low, suspect)
