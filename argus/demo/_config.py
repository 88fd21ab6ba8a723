"""The demo's knobs, its faults, its error and the progress protocol the CLI draws."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .._errors import ArgusError

__all__ = ["DEMO_FAULTS", "KERNEL_DEMO_FAULTS", "REPO", "DemoConfig", "DemoError", "DemoProgress"]

REPO = Path(__file__).resolve().parents[2]
DEMO_FAULTS = (
    "link_degradation@8+14:2051",
    "sequence_length_imbalance@26+14:1234",
    "host_cpu_contention@44+14:host=300",
)
"""The simulated job's faults: a slow link, a data-parallel load imbalance, a busy host."""
KERNEL_DEMO_FAULTS = (
    "compute_straggler@12+20:45,kernel=gemm,x=1.3",
    "link_degradation@12+20:70,x=2.5",
    "host_cpu_contention@12+20:host=13,x=150",
)
"""The kernel job's faults: one GPU's GEMMs slower, NCCL slow on one link, a host starving
its data loaders (named by the kernel level: gemm, nccl:AllReduce, the data-loading frame)."""


class DemoError(ArgusError):
    """The demo could not complete; the message says which part failed and where its log is."""


class DemoProgress(Protocol):
    """Where the demo reports what it is doing (the CLI draws rich progress bars)."""

    def update(self, task: str, done: float, total: float | None = None, note: str = "") -> None:
        """Task ``task`` has ``done`` of ``total`` units (None: indeterminate)."""


@dataclass(frozen=True)
class DemoConfig:
    """The demo's knobs; the defaults finish in a few minutes on a 2-core machine."""

    train_ranks: int = 4
    train_steps: int = 40
    slow_rank: int = 2
    slow_ms: float = 60.0
    slow_from: int = 10
    """The training job runs normally until this step, then the slow rank slows down."""
    sim_ranks: int = 4096
    sim_steps: int = 64
    faults: tuple[str, ...] = DEMO_FAULTS
    kernel_ranks: int = 128
    kernel_steps: int = 36
    kernel_faults: tuple[str, ...] = KERNEL_DEMO_FAULTS
    kernel_rate: float = 4.0
    """Steps per second of the kernel job (its kernel sketches and stacks flow live)."""
    app_id: str = "argus-demo"
    own_broker: bool = True
    broker_port: int = 19092
    timeout_s: float = 240.0
    reports: bool = True

    @property
    def sink_group(self) -> str:
        """The demo sink's consumer group (the worker's is ``app_id``)."""
        return f"{self.app_id}-sink"
