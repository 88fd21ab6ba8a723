"""A per-worker step log as a new user wrote one (issue 32, session 21)."""

from __future__ import annotations

import numpy as np


def offset_workers(seed: int, fault: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, str]]:
    """24 workers on 6 hosts, 600 steps of ~850 ms: each worker's own AR(1) noise (3 %,
    0.7), static offsets up to +-5 %, a job-wide per-step factor; with ``fault``, the 4
    workers of node-2 1.18x slower in steps 350-469 (a new user's log, session 21)."""
    rng = np.random.default_rng(seed)
    w, steps, phi = 24, 600, 0.7

    def ar1(rows: int, sd: float) -> np.ndarray:
        x = np.empty((rows, steps))
        x[:, 0] = rng.normal(0.0, sd, rows)
        for t in range(1, steps):
            x[:, t] = phi * x[:, t - 1] + rng.normal(0.0, sd * np.sqrt(1 - phi**2), rows)
        return x

    offsets = rng.uniform(-0.05, 0.05, w)
    ms = 850.0 * (1 + offsets[:, None]) * (1 + ar1(1, 0.02)) * (1 + ar1(w, 0.03))
    if fault:
        ms[8:12, 350:470] *= 1.18
    hosts = {r: f"node-{r // 4}" for r in range(w)}
    return np.tile(np.arange(w), steps), np.repeat(np.arange(steps), w), ms.T.ravel(), hosts


def heavy_workers(
    seed: int, *, host_end: int = 550, periodic: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, str]]:
    """32 workers on 4 hosts, 800 steps of ~900 ms: each worker's own AR(0.9) noise of
    Student-t (2 degrees of freedom) innovations (one step of 4x from noise alone), a 1 %
    job-wide per-step factor; host2's 8 workers 1.2x slower from step 300 to ``host_end``
    (none where it is 300 or less), and with ``periodic`` worker 5 1.6x slower on every
    sixth step from 600 to 756 (a new user's log, session 30)."""
    rng = np.random.default_rng(seed)
    w, steps = 32, 800
    own = np.zeros(w)
    ms = np.empty((steps, w))
    for s in range(steps):
        own = 0.9 * own + 0.006 * rng.standard_t(2, w)
        ms[s] = 900.0 * (1 + 0.01 * rng.standard_normal()) * np.exp(own)
    ms[300:host_end, 16:24] *= 1.2
    if periodic:
        ms[600:757:6, 5] *= 1.6
    hosts = {r: f"host{r // 8}" for r in range(w)}
    return np.tile(np.arange(w), steps), np.repeat(np.arange(steps), w), ms.ravel(), hosts


def sawtooth_workers(seed: int, *, fault: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8 workers, 900 steps of ~420 ms: each worker's own AR(0.7) noise (1.8 %), a 1.7 %
    job-wide per-step factor; with ``fault``, workers 0 and 7 throttling in a sawtooth
    from step 180 to 579: up to 1.24x over 13 steps, then back, over and over (a small job
    of the noise space, session 32)."""
    rng = np.random.default_rng(seed)
    w, steps, phi = 8, 900, 0.7
    own = np.zeros(w)
    ms = np.empty((steps, w))
    for s in range(steps):
        own = phi * own + 0.018 * np.sqrt(1 - phi**2) * rng.standard_normal(w)
        ms[s] = 420.0 * (1 + 0.017 * rng.standard_normal()) * np.exp(own)
    if fault:
        tooth = 1 + 0.24 * (np.arange(400) % 13 + 1) / 13
        ms[180:580, [0, 7]] *= tooth[:, None]
    return np.tile(np.arange(w), steps), np.repeat(np.arange(steps), w), ms.ravel()


def own_clock_workers(seed: int, *, fault: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4 workers, 2,400 steps of ~300 ms each at its own pace (static offsets up to +-10 %:
    a faster worker is further on in time), sampled by time: each logs the mean of its
    steps since its last row every 1.6-3.2 s at moments of its own (staggered); its own
    AR(0.6) noise (1.8 %), an evaluation step every 288 steps (4.6x); with ``fault``, worker
    2 throttling in a sawtooth from step 1,670 to 1,899: up to 1.2x over 40 steps, then
    back (session 33). Returns (rank, time in s, mean step ms) rows."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    w, steps, phi = 4, 2400, 0.6
    own = lfilter([0.018 * np.sqrt(1 - phi**2)], [1.0, -phi], rng.standard_normal((steps, w)), axis=0)
    ms = 300.0 * np.exp(own) * (1 + rng.uniform(-0.1, 0.1, w))
    ms[::288] *= 4.6
    if fault:
        ms[1670:1900, 2] *= 1 + 0.2 * (np.arange(230) % 40 + 1) / 40
    rows = []
    for r in range(w):
        ends = np.cumsum(ms[:, r]) / 1e3
        at = float(rng.uniform(0, 2.4))
        last = 0
        while True:
            k = int(np.searchsorted(ends, at, side="right"))
            if k >= steps:
                break
            if k > last:
                rows.append((r, at, float(ms[last:k, r].mean())))
                last = k
            at += float(rng.uniform(1.6, 3.2))
    a = np.array(rows)
    return a[:, 0].astype(int), a[:, 1], a[:, 2]
