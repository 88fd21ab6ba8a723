"""The `argus` command as a user runs it: real processes, real broker, real store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.net import free_port, http_get

ARGUS = [sys.executable, "-m", "argus.cli"]


def run(args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "ARGUS_HOME": str(home), "COLUMNS": "200", **env}
    return subprocess.run([*ARGUS, *args], capture_output=True, text=True, env=full, timeout=180)


def test_version(tmp_path: Path) -> None:
    out = run(["--version"], tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("argus ")


@pytest.mark.kafka
def test_doctor_reports_kafka_clickhouse_and_absent_gpu(kafka_conf, tmp_path: Path) -> None:
    out = run(["doctor"], tmp_path, ARGUS_KAFKA_BOOTSTRAP=kafka_conf["bootstrap.servers"])
    assert out.returncode == 0, out.stdout + out.stderr
    lines = {ln.split("│")[1].strip(): ln for ln in out.stdout.splitlines() if ln.count("│") >= 3}
    assert " ok " in lines["Kafka"] and " ok " in lines["ClickHouse"]
    assert "absent" in lines["NVML (GPU health)"] and "no NVIDIA driver" in lines["NVML (GPU health)"]
    assert "absent" in lines["CUPTI (GPU kernels)"]


def test_doctor_names_a_broker_that_is_down(tmp_path: Path) -> None:
    out = run(["doctor"], tmp_path, ARGUS_KAFKA_BOOTSTRAP="127.0.0.1:1")
    assert out.returncode == 3
    assert "cannot reach Kafka at 127.0.0.1:1" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_doctor_never_prints_secrets(tmp_path: Path) -> None:
    out = run(
        ["doctor"],
        tmp_path,
        ARGUS_KAFKA_BOOTSTRAP="127.0.0.1:1",
        ARGUS_KAFKA_SASL_PASSWORD="hunter2-secret",
        ARGUS_GRAFANA_TOKEN="glsa_do_not_print",
        ARGUS_CLICKHOUSE_PASSWORD="ch-pass-xyz",
    )
    text = out.stdout + out.stderr
    for secret in ("hunter2-secret", "glsa_do_not_print", "ch-pass-xyz"):
        assert secret not in text


def test_sql_prints_rows_and_rejects_bad_sql(tmp_path: Path) -> None:
    ok = run(["sql", "SELECT {n:UInt32} * 2 AS doubled", "--param", "n=21", "--format", "json"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == [{"doubled": 42}]
    bad = run(["sql", "SELEC nonsense"], tmp_path)
    assert bad.returncode == 2 and "ClickHouse rejected the query" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_sql_on_a_locked_store_is_a_clear_error(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys\nfrom argus.sinks import ChdbStore\nheld = ChdbStore({str(tmp_path / 'clickhouse')!r})\n"
            "print('ready', flush=True)\nsys.stdin.readline()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        out = run(["sql", "SELECT 1"], tmp_path)
        assert out.returncode == 3
        assert f"in use by process {holder.pid}" in out.stderr.replace("\n", " ")
        assert "Traceback" not in out.stderr
    finally:
        holder.communicate("\n", timeout=30)


def test_sql_prints_datetimes_as_clickhouse_client_does(tmp_path: Path) -> None:
    query = (
        "SELECT toDateTime('2026-01-02 03:04:05', 'UTC') AS at, "
        "toDateTime64('2026-01-02 03:04:05.250', 3, 'Asia/Tokyo') AS ms, "
        "[toDateTime('2026-01-02 03:04:05', 'UTC')] AS listed, toUInt32(7) AS n"
    )
    tsv = run(["sql", query], tmp_path)
    assert tsv.returncode == 0, tsv.stderr
    assert tsv.stdout.splitlines() == [
        "at\tms\tlisted\tn",
        "2026-01-02 03:04:05\t2026-01-02 03:04:05.250\t['2026-01-02 03:04:05']\t7",
    ]
    # what ClickHouse itself writes for the same query (the FORMAT clause path) is the same text
    passthrough = run(["sql", query + " FORMAT TabSeparatedWithNames"], tmp_path)
    assert passthrough.stdout == tsv.stdout
    js = run(["sql", "-f", "json", query], tmp_path)
    assert json.loads(js.stdout) == [
        {
            "at": "2026-01-02 03:04:05",
            "ms": "2026-01-02 03:04:05.250",
            "listed": ["2026-01-02 03:04:05"],
            "n": 7,
        }
    ]


def _serving(kafka_conf: dict[str, str], home: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """``argus *args --metrics-port P`` on the broker, started; the process and its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "ARGUS_HOME": str(home),
        "ARGUS_KAFKA_BOOTSTRAP": kafka_conf["bootstrap.servers"],
        "ARGUS_METRICS_ADDR": "127.0.0.1",
    }
    proc = subprocess.Popen(
        [*ARGUS, *args, "--metrics-port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def _stop(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """SIGTERM, then the process's output once it exited; killed (and the test failed) if it
    does not stop within ``timeout``, so that no worker outlives its test."""
    import signal

    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
        raise AssertionError(f"still running {timeout:g} s after SIGTERM; stderr: {err[-2000:]}") from None


def _wait_ready(proc: subprocess.Popen[str], url: str, timeout: float) -> tuple[int, str]:
    import time

    deadline = time.monotonic() + timeout
    got = (0, "")
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            got = http_get(url)
        except OSError:  # not listening yet
            got = (0, "")
        if got[0] == 200:
            break
        time.sleep(0.5)
    return got


@pytest.mark.kafka
def test_sink_serves_readiness_and_liveness_for_the_kubelet(kafka_conf, tmp_path: Path) -> None:
    """`argus sink --metrics-port`: /readyz turns 200 once the consumer is in its group and
    ClickHouse answered; /livez is 200 while it polls; /metrics stays Prometheus'."""
    import time

    group = f"health-{os.getpid()}-{time.monotonic_ns()}"
    proc, base = _serving(kafka_conf, tmp_path, "sink", "--group", group)
    try:
        ready = _wait_ready(proc, f"{base}/readyz", 90)
        assert ready[0] == 200 and ready[1].startswith("ready: "), ready
        live = http_get(f"{base}/livez")
        assert live[0] == 200 and live[1].startswith("polled "), live
        status, metrics = http_get(f"{base}/metrics")
        assert status == 200 and "argus_sink_messages_total" in metrics
    finally:
        out, err = _stop(proc)
    assert proc.returncode == 0, err
    assert "sink: stopped after" in out


@pytest.mark.kafka
def test_worker_serves_readiness_and_liveness_for_the_kubelet(kafka_conf, tmp_path: Path) -> None:
    """`argus worker --metrics-port`: /readyz is 503 until the Faust consumer has its
    assignment, then 200; /livez says the event loop ticks."""
    import time

    app_id = f"health-{os.getpid()}-{time.monotonic_ns()}"
    proc, base = _serving(kafka_conf, tmp_path, "worker", "--app-id", app_id)
    try:
        ready = _wait_ready(proc, f"{base}/readyz", 120)
        assert ready[0] == 200 and ready[1].startswith("ready: "), ready
        live = http_get(f"{base}/livez")
        assert live[0] == 200 and live[1].startswith("event loop ticked "), live
    finally:
        _stop(proc)


@pytest.mark.kafka
def test_a_worker_holding_an_open_step_stops_on_sigterm(kafka_conf, tmp_path: Path) -> None:
    """A step waiting for a rank holds its parts unacknowledged; on SIGTERM the worker drops
    them (the next owner of the partition reads them again) and stops, instead of waiting
    forever for acknowledgements that never come (Kubernetes would kill it uncommitted)."""
    import time

    from argus.producers.publisher import Publisher
    from argus.schemas import STEPS, StepBatch, step_key
    from tests.records import step_batch

    app_id = f"held-{os.getpid()}-{time.monotonic_ns()}"
    proc, base = _serving(kafka_conf, tmp_path, "worker", "--app-id", app_id)
    try:
        assert _wait_ready(proc, f"{base}/readyz", 120)[0] == 200
        job = f"held-{time.monotonic_ns()}"
        pub = Publisher(kafka_conf)
        for step in range(5):  # two ranks, then rank 0 alone: step 4 waits for rank 1
            whole = step_batch(2, step=step)
            batch = StepBatch(job, whole.run, step, whole.columns)
            for part in [batch.take([0]), batch.take([1])] if step < 4 else [batch.take([0])]:
                pub.publish(STEPS, step_key(job, step), part)
        pub.drain(30)
        pub.shutdown()
        deadline = time.monotonic() + 60
        while "argus_worker_open_steps 1" not in http_get(f"{base}/metrics")[1]:
            assert time.monotonic() < deadline, "the worker never held the lone part"
            time.sleep(0.2)
    finally:
        out, err = _stop(proc)
    assert proc.returncode == 0, err[-2000:]
    # what it did, in one line of its log (a new consumer group also reads what earlier runs left)
    done = re.search(
        r"stopped after [\d.]+ s: (\d+) rank-step records in (\d+) messages, \d+ steps completed", out
    )
    assert done and int(done[1]) >= 9 and int(done[2]) >= 9, out[-2000:]
