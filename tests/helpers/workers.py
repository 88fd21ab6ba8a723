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
