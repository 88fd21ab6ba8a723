"""``argus demo``: the whole system on this machine, started and stopped by one command.

What runs (all real, nothing mocked):

1. its own Kafka broker (``scripts/kafka.sh`` on 127.0.0.1:19092, data under
   ``<home>/demo/kafka``; or the configured one with ``own_broker=False``), a stream worker
   (``argus worker``) and the sink (``argus sink``) as child processes, under a
   demo-specific ``ARGUS_HOME`` (``<home>/demo``: its own chDB directory) and demo-specific
   consumer groups whose offsets are moved to the end of the topics first, so the demo never
   reads a backlog and never fights a user's own worker or sink over offsets. Its own
   broker also keeps other workers on a shared broker from diagnosing the demo's jobs too;
2. a real 4-rank ``torch.distributed`` (gloo) training with the agent attached and one rank
   slowed (:mod:`argus.examples.train_ddp`);
3. a simulated 4,096-rank job with three different faults
   (:func:`argus.simulate.publish_simulation`);
4. a simulated 128-rank job whose every rank also publishes its kernel sketch and stack
   sample every step, with three kernel-level causes: one GPU's GEMMs 1.3x slower, NCCL
   slow on one link, a host starving its data loaders. The worker narrows each to the
   kernel family or frame (``level=kernel`` anomalies).

The demo waits on the pipeline's own effects: the worker's step summaries and findings of
every job, the worker group's committed offsets past them, the anomalies topic, and the
sink group's committed offsets past everything (the sink commits only after its insert).
Then it stops the sink (which holds the chDB directory), writes the HTML reports with
``argus report``, reads the anomalies back from ClickHouse and checks them against what
was injected. Every child process runs in its own session and is stopped (SIGTERM, then
SIGKILL) on success, error and Ctrl-C alike.
"""

from __future__ import annotations

from ._checks import MIN_IOU, TRAIN_ACCEPT, DemoResult, Finding, JobCheck, check_findings
from ._config import DEMO_FAULTS, KERNEL_DEMO_FAULTS, DemoConfig, DemoError, DemoProgress
from ._processes import _Broker as _Broker  # the tests' handles on the parts
from ._processes import _Children as _Children
from ._run import run_demo

__all__ = [
    "DEMO_FAULTS",
    "KERNEL_DEMO_FAULTS",
    "MIN_IOU",
    "TRAIN_ACCEPT",
    "DemoConfig",
    "DemoError",
    "DemoProgress",
    "DemoResult",
    "Finding",
    "JobCheck",
    "check_findings",
    "run_demo",
]
