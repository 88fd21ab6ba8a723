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

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from argus.producers.simulator import Label
from argus.schemas import (
    ALL_TOPICS,
    ANOMALIES,
    STEP_FINDINGS,
    STEP_SUMMARIES,
    Anomaly,
    SchemaError,
    StepSummary,
    decode,
    job_key,
)
from argus.streams.deepening import EVIDENCE_TOPIC

from ._errors import ArgusError
from .config import Settings
from .kafka_admin import (
    KafkaUnavailable,
    end_offsets,
    ensure_topics,
    probe_kafka,
    skip_to_end,
    skip_worker_to_end,
)
from .scoring import Scoring, match_faults

__all__ = [
    "DEMO_FAULTS",
    "KERNEL_DEMO_FAULTS",
    "MIN_IOU",
    "DemoConfig",
    "DemoError",
    "DemoProgress",
    "DemoResult",
    "Finding",
    "JobCheck",
    "check_findings",
    "run_demo",
]

REPO = Path(__file__).resolve().parents[1]
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


TRAIN_ACCEPT: dict[str, frozenset[str]] = {"compute_straggler": frozenset({"masked_compute_straggler"})}
"""The real run's slowed rank is slower in forward while its peers wait for it in the
all-reduce: a compute straggler, or a masked one when the waiting dominates."""
MIN_IOU = 0.8
"""Every matched window must overlap its injected fault's by this much (docs/architecture.md#numbers)."""


@dataclass(frozen=True)
class Finding:
    """One anomaly as stored in ClickHouse (the latest version of its id)."""

    job: str
    start_step: int
    end_step: int
    suspect: str
    cause: str
    ranks: tuple[int, ...]
    score: float
    evidence: dict[str, float]
    step_ms_added: float
    gpu_hours_lost: float
    summary: str
    suspect_kind: str = "rank"
    severity: str = "page"


@dataclass(frozen=True)
class JobCheck:
    """One job's findings against what was injected into it (:func:`argus.scoring.match_faults`)."""

    job: str
    labels: tuple[Label, ...]
    findings: tuple[Finding, ...]
    scoring: Scoring

    def ok(self, min_iou: float = MIN_IOU) -> bool:
        """Every fault found with its class, nothing else reported, every window IoU ≥ ``min_iou``."""
        return self.scoring.ok(min_iou)


def check_findings(
    findings: Sequence[Finding],
    labels: Mapping[str, Sequence[Label]],
    accept: Mapping[str, Mapping[str, Collection[str]]] | None = None,
) -> tuple[JobCheck, ...]:
    """Per job of ``labels``, its findings matched to its injected faults; ``accept`` gives,
    per job, other classes that count as right for a label kind (see ``match_faults``)."""
    out = []
    for job, labs in labels.items():
        mine = tuple(f for f in findings if f.job == job)
        scoring = match_faults(mine, labs, accept=(accept or {}).get(job))
        out.append(JobCheck(job, tuple(labs), mine, scoring))
    return tuple(out)


@dataclass(frozen=True)
class DemoResult:
    """What ran, what was found, and how it compares with what was injected."""

    train_job: str
    sim_job: str
    home: Path
    findings: tuple[Finding, ...]
    checks: tuple[JobCheck, ...]
    reports: dict[str, Path]
    report_error: str
    timings: dict[str, float] = field(default_factory=dict)
    min_iou: float = MIN_IOU
    kernel_job: str = ""

    @property
    def ok(self) -> bool:
        """Every injected fault (and the slowed rank) named with its class and a window of
        IoU ≥ ``min_iou``, and no other anomaly reported."""
        return all(c.ok(self.min_iou) for c in self.checks)


# --- child processes ---------------------------------------------------------------


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]


class _Children:
    """Child processes, each the leader of its own session so its whole tree can be stopped."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[_Child] = []

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> _Child:
        log_path = self.logs / f"{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        proc = subprocess.Popen(
            list(argv), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO
        )
        child = _Child(name, proc, log_path, log)
        self.started.append(child)
        return child

    def check_alive(self, *names: str) -> None:
        """Raise DemoError when one of ``names`` exited early."""
        for c in self.started:
            if c.name in names and c.proc.poll() is not None:
                raise DemoError(f"{c.name} exited early (code {c.proc.returncode}); {_tail(c.log_path)}")

    def stop(self, child: _Child, timeout: float = 30.0) -> int:
        """SIGTERM the child's process group, SIGKILL it after ``timeout``; its exit code."""
        if child.proc.poll() is None:
            _signal_group(child.proc.pid, signal.SIGTERM)
            try:
                child.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(child.proc.pid, signal.SIGKILL)
                child.proc.wait(10)
        _signal_group(child.proc.pid, signal.SIGKILL)  # stragglers of its tree, if any
        child.log.close()
        return int(child.proc.returncode)

    def stop_all(self) -> None:
        """Stop every child still running, newest first."""
        for c in reversed(self.started):
            self.stop(c, timeout=15.0)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"log {path} unreadable"
    return f"last lines of {path}:\n  " + "\n  ".join(text[-lines:]) if text else f"log {path} is empty"


# --- Kafka offsets -----------------------------------------------------------------


def _consumer(conf: dict[str, Any], group: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer({**conf, "group.id": group, "enable.auto.commit": False, "log_level": 3})


def _lagging(conf: dict[str, Any], group: str, targets: dict[tuple[str, int], int]) -> int:
    """How many of ``targets`` the group's committed offsets have not reached yet."""
    from confluent_kafka import TopicPartition

    if not targets:
        return 0
    c = _consumer(conf, group)
    try:
        got = c.committed([TopicPartition(t, p) for t, p in targets], timeout=10)
    finally:
        c.close()
    return sum(1 for tp in got if tp.offset < targets[(tp.topic, tp.partition)])


class _Monitor:
    """Reads the worker's output for the demo's jobs, from the topics' ends at creation."""

    def __init__(self, conf: dict[str, Any], jobs: Sequence[str]) -> None:
        from confluent_kafka import TopicPartition

        self._keys = {job_key(j): j for j in jobs}
        self.steps: dict[str, set[int]] = {j: set() for j in jobs}
        self.findings: dict[str, int] = dict.fromkeys(jobs, 0)
        self.findings_end: dict[tuple[str, int], int] = {}
        self.anomalies: dict[str, Anomaly] = {}
        self.position: dict[tuple[str, int], int] = {}
        ends = end_offsets(conf, [STEP_SUMMARIES, STEP_FINDINGS, ANOMALIES])
        self._c = _consumer(conf, "argus-demo-monitor")
        self._c.assign([TopicPartition(t, p, o) for (t, p), o in ends.items()])
        self.position.update(ends)

    def poll(self, seconds: float = 0.3) -> None:
        """Consume what arrived within ``seconds``."""
        for m in self._c.consume(1000, timeout=seconds):
            if m.error():
                continue
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            self.position[(topic, partition)] = offset + 1
            job = self._keys.get(m.key() or b"")
            if job is None:
                continue
            if topic == STEP_FINDINGS:
                self.findings[job] += 1
                self.findings_end[(topic, partition)] = offset + 1
                continue
            try:
                rec = decode(m.value())
            except SchemaError:
                continue
            if isinstance(rec, StepSummary):
                self.steps[job].add(rec.step)
            elif isinstance(rec, Anomaly):
                self.anomalies[rec.id] = rec

    def reached(self, targets: dict[tuple[str, int], int]) -> bool:
        """Whether this monitor has read up to ``targets``."""
        return all(self.position.get(tp, 0) >= o for tp, o in targets.items())

    def close(self) -> None:
        self._c.close()


# --- the demo ------------------------------------------------------------------------


def _wait(
    what: str,
    done: Callable[[], bool],
    deadline: float,
    *,
    tick: Callable[[], None] = lambda: time.sleep(0.3),
) -> None:
    while not done():
        if time.monotonic() > deadline:
            raise DemoError(f"timed out waiting for {what}")
        tick()


class _Broker:
    """The demo's own single-node broker (``scripts/kafka.sh``) on ``port``, data under ``data``."""

    def __init__(self, port: int, data: Path) -> None:
        self.script = REPO / "scripts" / "kafka.sh"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ARGUS_KAFKA_SCRAM")}
        self.env.update(ARGUS_KAFKA_PORT=str(port), ARGUS_KAFKA_DATA=str(data))
        self.port, self.data = port, data
        self.bootstrap = f"127.0.0.1:{port}"
        self.started = False

    def taken(self) -> bool:
        """Something other than this demo's broker answers on the port (kafka.sh would use
        it, and that broker's workers would diagnose the demo's jobs too)."""
        with socket.socket() as sock:
            sock.settimeout(1.0)
            if sock.connect_ex(("127.0.0.1", self.port)) != 0:
                return False
        try:
            os.kill(int((self.data / "broker.pid").read_text().strip()), 0)
        except (OSError, ValueError):
            return True  # no live broker of ours behind it
        return False

    def start(self, log: Path) -> None:
        """Start it (fetching the jars the first time) and wait until it answers."""
        if not self.script.is_file():
            raise DemoError(
                f"{self.script} is missing: run the demo from a checkout, or use --broker configured"
            )
        if self.taken():
            raise DemoError(
                f"127.0.0.1:{self.port} already answers, and it is not this demo's broker: "
                "pass --port with a free port (or --broker configured to use that one on purpose)"
            )
        self.started = True
        with open(log, "ab") as out:
            r = subprocess.run(
                [str(self.script), "up"],
                env=self.env,
                stdout=out,
                stderr=out,
                timeout=600,
                start_new_session=True,
            )
        if r.returncode != 0:
            raise DemoError(f"the demo's Kafka broker did not start; {_tail(log)}")

    def stop(self) -> None:
        """Stop it (by the PID file kafka.sh keeps) if this demo started it."""
        if self.started:
            subprocess.run(
                [str(self.script), "down"], env=self.env, capture_output=True, timeout=120, check=False
            )


def _own_broker_env(env: dict[str, str], bootstrap: str) -> dict[str, str]:
    """``env`` for children of a demo on its own broker: a user's Kafka address and SASL/TLS
    variables replaced by the plain local broker's."""
    out = {k: v for k, v in env.items() if not k.startswith(("ARGUS_KAFKA_", "ARGUS_CONFIG"))}
    out.update(ARGUS_KAFKA_BOOTSTRAP=bootstrap, ARGUS_KAFKA_SECURITY_PROTOCOL="PLAINTEXT")
    if "ARGUS_KAFKA_PARTITIONS" in env:
        out["ARGUS_KAFKA_PARTITIONS"] = env["ARGUS_KAFKA_PARTITIONS"]
    return out


def _read_findings(home: Path, jobs: Sequence[str]) -> list[Finding]:
    """The latest version of every anomaly of ``jobs`` from the demo's chDB store."""
    from argus.sinks import ChdbStore, SinkError

    params = {f"j{i}": j for i, j in enumerate(jobs)}
    try:
        store = ChdbStore(home / "clickhouse")
        try:
            rows = store.query_rows(
                "SELECT job, start_step, end_step, suspect, cause, ranks, score, evidence, step_ms_added, "
                "gpu_hours_lost, summary, suspect_kind, severity FROM anomalies FINAL "
                f"WHERE job IN ({', '.join(f'{{{k}:String}}' for k in params)}) "
                "ORDER BY job, start_step, suspect",
                params,
            )
        finally:
            store.close()
    except SinkError as exc:
        raise DemoError(
            f"cannot read the anomalies from ClickHouse at {home / 'clickhouse'}: {exc}"
        ) from None
    return [
        Finding(
            str(r[0]),
            int(r[1]),
            int(r[2]),
            str(r[3]),
            str(r[4]),
            tuple(int(x) for x in r[5]),
            float(r[6]),
            {str(k): float(v) for k, v in (r[7].items() if isinstance(r[7], dict) else r[7])},
            float(r[8]),
            float(r[9]),
            str(r[10]),
            str(r[11]),
            str(r[12]),
        )
        for r in rows
    ]


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

    from .simulate import layout_for, parse_fault, publish_simulation

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


def _train_label(cfg: DemoConfig) -> Label:
    """The real run's ground truth: the slowed rank, from ``slow_from`` to the last step."""
    rank = cfg.slow_rank
    return Label("compute_straggler", cfg.slow_from, cfg.train_steps - 1, "rank", f"rank:{rank}", (rank,))


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
    findings = _read_findings(run.home, jobs)
    checks = check_findings(
        findings,
        {run.train_job: (_train_label(cfg),), **sim_labels},
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
