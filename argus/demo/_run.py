"""One demo run: its session (settings, children, monitor, clock) and its stages in order."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argus.producers.simulator import Label
from argus.schemas import ALL_TOPICS, ANOMALIES, STEP_FINDINGS
from argus.streams.deepening import EVIDENCE_TOPIC

from ..config import Settings
from ..kafka_admin import (
    KafkaUnavailable,
    end_offsets,
    ensure_topics,
    probe_kafka,
    skip_to_end,
    skip_worker_to_end,
)
from ._checks import TRAIN_ACCEPT, DemoResult, check_findings, read_findings, train_label
from ._config import REPO, DemoConfig, DemoError, DemoProgress
from ._kafka import _lagging, _Monitor
from ._processes import _Broker, _Children, _own_broker_env, _tail, _wait

__all__ = ["run_demo"]


def _write_reports(
    env: dict[str, str], jobs: Sequence[str], out: Path, progress: DemoProgress
) -> tuple[dict[str, Path], str]:
    """``argus report --job J -o FILE`` for each job (progress: jobs done of all); the files
    written, or why none were."""
    out.mkdir(parents=True, exist_ok=True)
    progress.update("report", 0, len(jobs))
    cli = [sys.executable, "-m", "argus.cli"]
    probe = subprocess.run([*cli, "report", "--help"], env=env, capture_output=True, timeout=60, cwd=REPO)
    if probe.returncode != 0:
        return {}, "`argus report` is not available in this installation; no HTML report written"
    written: dict[str, Path] = {}
    for job in jobs:
        path = out / f"{job}.html"
        r = subprocess.run(
            [*cli, "report", "--job", job, "-o", str(path)],
            env=env,
            capture_output=True,
            timeout=120,
            cwd=REPO,
        )
        if r.returncode != 0 or not path.is_file():
            err = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()
            return written, f"argus report --job {job} failed: {err[-1] if err else r.returncode}"
        written[job] = path
        progress.update("report", len(written), len(jobs), job)
    return written, ""


@dataclass
class _Session:
    """One demo run's wiring: settings, child environment, processes, monitor and clock."""

    cfg: DemoConfig
    settings: Settings
    progress: DemoProgress
    home: Path
    env: dict[str, str]
    broker: _Broker | None
    children: _Children
    began: float
    train_job: str
    sim_job: str
    monitor: _Monitor | None = None
    timings: dict[str, float] = field(default_factory=dict)
    kernel_job: str = ""

    @property
    def conf(self) -> dict[str, Any]:
        """librdkafka settings of the demo's broker."""
        return self.settings.kafka_client_config()

    @property
    def logs(self) -> Path:
        """Where the children's logs go."""
        return self.home / "logs"

    @property
    def deadline(self) -> float:
        """When the demo gives up (monotonic clock)."""
        return self.began + self.cfg.timeout_s

    def lap(self, name: str) -> None:
        """Record the seconds since the start under ``name``."""
        self.timings[name] = time.monotonic() - self.began

    def tick(self) -> None:
        """Read the pipeline's output, check the children, draw the progress."""
        assert self.monitor is not None
        self.monitor.poll()
        self.children.check_alive("worker", "sink")
        cfg = self.cfg
        note = f"{cfg.train_ranks} gloo ranks, rank {cfg.slow_rank} +{cfg.slow_ms:.0f} ms from step {cfg.slow_from}"
        self.progress.update("train", len(self.monitor.steps[self.train_job]), cfg.train_steps, note)
        total = cfg.train_steps + cfg.sim_steps + cfg.kernel_steps
        self.progress.update("diagnose", sum(self.monitor.findings.values()), total)


def _session(settings: Settings, progress: DemoProgress, cfg: DemoConfig) -> _Session:
    """The wiring of one run: its home, jobs, broker (own or configured) and child environment."""
    home = settings.home / "demo"
    (home / "logs").mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    broker = _Broker(cfg.broker_port, home / "kafka") if cfg.own_broker else None
    if broker is not None:
        settings = dataclasses.replace(
            settings,
            kafka_bootstrap=broker.bootstrap,
            kafka_security_protocol="PLAINTEXT",
            kafka_sasl_mechanism="",
            kafka_ssl_ca="",
            kafka_ssl_cert="",
            kafka_ssl_key="",
        )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ARGUS_CLICKHOUSE_")},  # chDB: embedded
        "ARGUS_HOME": str(home),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "OMP_NUM_THREADS": "1",
    }
    if broker is not None:
        env = _own_broker_env(env, broker.bootstrap)
    return _Session(
        cfg,
        settings,
        progress,
        home,
        env,
        broker,
        _Children(home / "logs"),
        time.monotonic(),
        f"demo-train-{stamp}",
        f"demo-sim-{stamp}",
        kernel_job=f"demo-kern-{stamp}",
    )


def _start_kafka(run: _Session) -> None:
    """The broker up, the topics there, the demo's groups at the topics' ends, the monitor on."""
    from argus.sinks.kafka_sink import SINK_TOPICS

    cfg, conf = run.cfg, run.conf
    run.progress.update("broker", 0, None, run.settings.kafka_bootstrap)
    if run.broker is not None:
        run.broker.start(run.logs / "kafka.log")
    try:
        probe_kafka(conf, timeout=10)
        ensure_topics(conf, [*ALL_TOPICS, STEP_FINDINGS], partitions=run.settings.kafka_partitions)
        ensure_topics(conf, [EVIDENCE_TOPIC], partitions=run.settings.kafka_partitions)
    except KafkaUnavailable as exc:
        hint = (
            f"see {run.logs / 'kafka.log'}"
            if run.broker
            else "start it, or let the demo run its own (--broker own)"
        )
        raise DemoError(f"{exc}; {hint}") from None
    try:  # the worker's groups and the sink's start at the end of their inputs: no old backlog
        skip_worker_to_end(conf, cfg.app_id)
        skip_to_end(conf, cfg.sink_group, SINK_TOPICS)
    except KafkaUnavailable as exc:
        raise DemoError(f"{exc}; is another demo running?") from None
    run.monitor = _Monitor(conf, [run.train_job, run.sim_job, run.kernel_job])
    own = "own broker on " if run.broker else ""
    run.progress.update("broker", 1, 1, f"{own}{run.settings.kafka_bootstrap}")


def _start_pipeline(run: _Session) -> None:
    """The stream worker and the sink, in the demo's own consumer groups."""
    cli = [sys.executable, "-m", "argus.cli"]
    run.children.start("worker", [*cli, "worker", "--app-id", run.cfg.app_id], run.env)
    sink = [*cli, "sink", "--group", run.cfg.sink_group, "--batch-seconds", "0.5"]
    run.children.start("sink", sink, run.env)


def _train(run: _Session) -> None:
    """The real gloo training with one rank slowed, to its end."""
    cfg = run.cfg
    argv = [
        sys.executable,
        "-m",
        "argus.examples.train_ddp",
        *("--world", str(cfg.train_ranks), "--steps", str(cfg.train_steps), "--job", run.train_job),
        *(
            "--slow-rank",
            str(cfg.slow_rank),
            "--slow-ms",
            str(cfg.slow_ms),
            "--slow-from",
            str(cfg.slow_from),
        ),
        *("--bootstrap", run.settings.kafka_bootstrap, "--home", str(run.home)),
    ]
    train = run.children.start("train", argv, run.env)
    _wait("the training", lambda: train.proc.poll() is not None, run.deadline, tick=run.tick)
    if train.proc.returncode != 0:
        raise DemoError(f"the training exited with code {train.proc.returncode}; {_tail(train.log_path)}")
    run.children.stop(train)
    run.lap("train_s")


def _simulate(run: _Session) -> dict[str, tuple[Label, ...]]:
    """Publish the simulated jobs with their faults; per job, the faults' labels (the ground
    truth)."""
    from argus.producers.publisher import Publisher, PublishError

    from ..simulate import layout_for, parse_fault, publish_simulation

    cfg = run.cfg
    layout = layout_for(cfg.sim_ranks)
    faults = [parse_fault(f, layout) for f in cfg.faults]
    publisher = Publisher(run.conf, block_when_full=True)
    note = f"{cfg.sim_ranks:,} ranks ({layout.dp}×{layout.tp}×{layout.pp}), {len(faults)} faults"
    published = [0]
    total = cfg.sim_steps + cfg.kernel_steps

    def sim_step(n: int, note: str = note) -> None:
        published[0] += n
        run.progress.update("simulate", published[0], total, note)

    def kernel_step(n: int) -> None:
        sim_step(
            n, f"{note}; then {cfg.kernel_ranks} ranks with kernel sketches, {len(cfg.kernel_faults)} faults"
        )

    sim = publish_simulation(
        publisher.publish,
        job=run.sim_job,
        layout=layout,
        steps=cfg.sim_steps,
        faults=faults,
        seed=0,
        checkpoint_every=0,
        progress=sim_step,
    )
    klayout = layout_for(cfg.kernel_ranks)
    kern = publish_simulation(
        publisher.publish,
        job=run.kernel_job,
        layout=klayout,
        steps=cfg.kernel_steps,
        faults=[parse_fault(f, klayout) for f in cfg.kernel_faults],
        seed=0,
        rate=cfg.kernel_rate,
        checkpoint_every=0,
        kernels=True,
        progress=kernel_step,
    )
    try:
        publisher.drain(60)
    except PublishError as exc:
        raise DemoError(f"the simulated jobs: {exc}") from None
    publisher.shutdown()
    run.lap("simulate_s")
    return {run.sim_job: tuple(sim.labels), run.kernel_job: tuple(kern.labels)}


def _await_diagnosis(run: _Session) -> None:
    """Every step of both jobs diagnosed, the temporal stage done, its anomalies read."""
    monitor, conf = run.monitor, run.conf
    assert monitor is not None
    want = {
        run.train_job: run.cfg.train_steps,
        run.sim_job: run.cfg.sim_steps,
        run.kernel_job: run.cfg.kernel_steps,
    }
    _wait(
        "the stream worker to diagnose every step",
        lambda: all(monitor.findings[j] >= n and len(monitor.steps[j]) >= n for j, n in want.items()),
        run.deadline,
        tick=run.tick,
    )
    _wait(
        "the stream worker to finish the temporal stage",
        lambda: _lagging(conf, run.cfg.app_id, monitor.findings_end) == 0,
        run.deadline,
        tick=run.tick,
    )
    from argus.streams.app import StreamConfig

    # the worker sends the open anomalies of a job that stopped sending steps once it has
    # been quiet for idle_refresh_s (checked as often): their final windows and costs
    quiet_until = time.monotonic() + 2 * StreamConfig.idle_refresh_s + 1.0
    _wait("the finished jobs' anomalies", lambda: time.monotonic() > quiet_until, run.deadline, tick=run.tick)
    anomalies_end = dict(end_offsets(conf, [ANOMALIES]))
    _wait("the anomalies", lambda: monitor.reached(anomalies_end), run.deadline, tick=run.tick)
    run.lap("diagnose_s")


def _await_sink(run: _Session) -> None:
    """Everything stored (the sink group's offsets past every topic's end), then the sink and
    the worker stopped cleanly (the sink holds the chDB directory)."""
    from argus.sinks.kafka_sink import SINK_TOPICS

    targets = end_offsets(run.conf, SINK_TOPICS)
    lag = [len(targets)]

    def sink_tick() -> None:
        run.tick()
        lag[0] = _lagging(run.conf, run.cfg.sink_group, targets)
        run.progress.update("sink", len(targets) - lag[0], len(targets), "partitions stored")

    _wait("the sink to store everything", lambda: lag[0] == 0, run.deadline, tick=sink_tick)
    for name in ("sink", "worker"):
        child = next(c for c in run.children.started if c.name == name)
        code = run.children.stop(child)
        if code not in (0, -signal.SIGTERM):
            raise DemoError(f"{name} stopped with code {code}; {_tail(child.log_path)}")
    run.lap("stored_s")


def run_demo(settings: Settings, progress: DemoProgress, cfg: DemoConfig | None = None) -> DemoResult:
    """Run the demo end to end (see the module docstring); stop everything it started.

    Raises :class:`DemoError` with the failing part and its log when something does not
    come up or does not finish within ``cfg.timeout_s``.
    """
    cfg = cfg or DemoConfig()
    run = _session(settings, progress, cfg)
    try:
        _start_kafka(run)
        _start_pipeline(run)
        _train(run)
        sim_labels = _simulate(run)
        _await_diagnosis(run)
        _await_sink(run)
    finally:
        if run.monitor is not None:
            run.monitor.close()
        run.children.stop_all()
        if run.broker is not None:
            run.broker.stop()
    reports: dict[str, Path] = {}
    report_error = "skipped"
    jobs = [run.train_job, run.sim_job, run.kernel_job]
    if cfg.reports:
        reports, report_error = _write_reports(run.env, jobs, run.home / "reports", progress)
    run.lap("report_s")
    findings = read_findings(run.home, jobs)
    checks = check_findings(
        findings,
        {run.train_job: (train_label(cfg),), **sim_labels},
        {run.train_job: TRAIN_ACCEPT},
    )
    run.lap("total_s")
    return DemoResult(
        run.train_job,
        run.sim_job,
        run.home,
        tuple(findings),
        checks,
        reports,
        report_error,
        run.timings,
        kernel_job=run.kernel_job,
    )
