"""`argus demo`: its pieces, and the whole demo end to end on the real broker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from argus.demo import (
    TRAIN_ACCEPT,
    DemoError,
    DemoResult,
    Finding,
    JobCheck,
    _Broker,
    _Children,
    check_findings,
)
from argus.producers.simulator import Label

REPO = Path(__file__).resolve().parents[2]


def finding(
    job: str, cause: str, suspect: str, start: int, end: int, ranks: tuple[int, ...] = (), kind: str = "rank"
) -> Finding:
    return Finding(job, start, end, suspect, cause, ranks, 5.0, {"z": 5.0}, 10.0, 0.1, "", kind)


LINK = Label("link_degradation", 10, 20, "link", "node-1<->node-2", (8, 16))
SLOW = Label("compute_straggler", 10, 39, "rank", "rank:2", (2,))


def test_every_finding_is_matched_to_an_injected_fault_or_is_an_extra() -> None:
    found = [
        finding("j", "link_degradation", "node-1<->node-2", 25, 30, kind="link"),  # after the window
        finding("j", "compute_straggler", "node-1<->node-2", 12, 14, kind="link"),  # wrong class
        finding("other", "link_degradation", "node-1<->node-2", 12, 14, kind="link"),  # other job
        finding("t", "masked_compute_straggler", "rank:2", 10, 39, (2,)),
        finding("t", "dataloader_stall", "rank:0", 5, 6, (0,)),  # nothing injected there
    ]
    link, train = check_findings(found, {"j": [LINK], "t": [SLOW]}, {"t": TRAIN_ACCEPT})
    assert link.job == "j" and [f.job for f in link.findings] == ["j", "j"]
    assert link.scoring.misses == (0,) and link.scoring.extras == (0,) and link.scoring.wrong == (1,)
    assert train.scoring.misses == () and train.scoring.extras == (1,)  # the dataloader stall: ✘ extra
    assert not link.ok() and not train.ok()
    (train,) = check_findings(found[3:4], {"t": [SLOW]}, {"t": TRAIN_ACCEPT})
    assert train.ok()
    # the real demo's old defect: "rank 2, steps 10-11" for a fault over steps 10-39
    (short,) = check_findings([finding("t", "compute_straggler", "rank:2", 10, 11, (2,))], {"t": [SLOW]})
    assert short.scoring.misses == () and not short.ok()


def _result(checks: tuple[JobCheck, ...], findings: tuple[Finding, ...]) -> DemoResult:
    return DemoResult("t", "j", Path("/nowhere"), findings, checks, {}, "", {})


def test_the_check_table_marks_extras_and_narrow_windows() -> None:
    from rich.console import Console

    from argus.cli.demo import _check_table, _verdict

    found = (
        finding("t", "compute_straggler", "rank:2", 10, 11, (2,)),
        finding("t", "dataloader_stall", "rank:0", 5, 6, (0,)),
    )
    result = _result(check_findings(found, {"t": [SLOW]}), found)
    assert not result.ok
    console = Console(width=250, record=True)
    console.print(_check_table(result))
    text = console.export_text()
    assert "✘ extra" in text and "dataloader_stall rank:0" in text and "0.07" in text
    assert "✓" not in text
    assert _verdict(result) == (
        "1 anomaly matching no injected fault; 1 window(s) with IoU < 0.8 (see the table above)"
    )
    good = (finding("t", "compute_straggler", "rank:2", 10, 39, (2,)),)
    result = _result(check_findings(good, {"t": [SLOW]}), good)
    console = Console(width=250, record=True)
    console.print(_check_table(result))
    assert result.ok and "✓" in console.export_text() and "✘" not in console.export_text()


def test_the_diagnosis_table_reads_on_an_80_column_terminal() -> None:
    from rich.console import Console

    from argus.cli.demo import _check_table, _diagnosis_table

    found = (finding("demo-train-20261124-001200", "masked_compute_straggler", "rank:2", 10, 39, (2,)),)
    result = _result(check_findings(found, {"demo-train-20261124-001200": [SLOW]}), found)
    narrow = Console(width=80, record=True)
    narrow.print(_diagnosis_table(result, narrow.width))
    text = narrow.export_text()
    for whole in ("train", "10–39", "rank:2", "masked_compute_straggler", "+ms/step", "10.0"):
        assert whole in text, text
    table = text.splitlines()[1:]
    assert len(table) == 5 and all(line.rstrip()[-1] in "┓┃┩│┘" for line in table), text  # one row, whole
    assert "evidence" not in text
    wide = Console(width=200, record=True)
    wide.print(_diagnosis_table(result, wide.width))
    text = wide.export_text()
    assert "evidence" in text and "demo-train-20261124-001200" in text and "steps 10–39" in text
    # the check table: the job by its kind, what was found by what differs from the fault
    job = "demo-train-20261124-001200"
    found = (finding(job, "compute_straggler", "rank:2", 10, 39, (2,)),)
    result = _result(check_findings(found, {job: [SLOW]}), found)
    narrow = Console(width=80, record=True)
    narrow.print(_check_table(result, narrow.width))
    text = narrow.export_text()
    assert "✓" in text and "train" in text and "same, steps 10–39" in text, text
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines()), text


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_stopping_a_child_stops_its_whole_process_tree(tmp_path: Path) -> None:
    children = _Children(tmp_path)
    pidfile = tmp_path / "grandchild"
    child = children.start("tree", ["sh", "-c", f"sleep 120 & echo $! > {pidfile}; wait"], dict(os.environ))
    deadline = time.monotonic() + 10
    while not (pidfile.is_file() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    children.check_alive("tree")  # running: no error
    assert _running(grandchild)
    children.stop(child, timeout=5)
    deadline = time.monotonic() + 5
    while _running(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(grandchild)


def test_a_child_that_exits_early_is_reported_with_its_log(tmp_path: Path) -> None:
    children = _Children(tmp_path)
    child = children.start("sink", ["sh", "-c", "echo broker refused us; exit 3"], dict(os.environ))
    child.proc.wait(10)
    with pytest.raises(DemoError, match=r"sink exited early \(code 3\)(.|\n)*broker refused us"):
        children.check_alive("worker", "sink")
    children.stop_all()


def test_an_unreachable_broker_is_a_clean_error(tmp_path: Path) -> None:
    env = {**os.environ, "ARGUS_HOME": str(tmp_path), "ARGUS_KAFKA_BOOTSTRAP": "10.255.255.1:9"}
    out = subprocess.run(
        [sys.executable, "-m", "argus.cli", "demo", "--broker", "configured"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert "cannot reach Kafka" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.kafka
@pytest.mark.slow
def test_the_demo_names_the_slowed_rank_and_every_injected_fault(unique: str, tmp_path: Path) -> None:
    """`argus demo` as `make demo` runs it: its own broker (on another port), worker, sink."""
    app_id = f"demo-test-{unique}"
    env = {
        **os.environ,
        "ARGUS_HOME": str(tmp_path),
        "COLUMNS": "250",
    }
    began = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "argus.cli",
            "demo",
            "--train-steps",
            "24",
            "--app-id",
            app_id,
            "--port",
            "19192",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    seconds = time.monotonic() - began
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert text.count("✓") == 7 and "✘" not in text, text
    for cause in ("link_degradation", "sequence_length_imbalance", "host_cpu_contention"):
        assert cause in text
    assert "rank:2" in text
    reports = sorted((tmp_path / "demo" / "reports").glob("*.html"))
    assert [p.name.split("-")[1] for p in reports] == ["kern", "sim", "train"]
    # the kernel job: each cause narrowed to its kernel family or frame, in the report too
    kern_report = reports[0].read_text()
    for named in ("slow kernels: gemm", "nccl:AllReduce", "dataloader.py"):
        assert named in kern_report, named
    reports = reports[1:]
    sim_report = reports[0].read_text()
    assert "host_cpu_contention" in sim_report and "node-00300" in sim_report
    assert "rank:2" in reports[1].read_text()
    # it stopped everything it started: no process of this demo is left
    left = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if app_id in cmdline or str(tmp_path) in cmdline:
            left.append(cmdline)
    assert not left, left
    assert seconds < 240


def test_the_demo_will_not_share_a_port_another_broker_answers_on(tmp_path) -> None:
    """Something else listens on the demo's port: the demo says so and stops, rather than
    letting kafka.sh reuse that broker (whose workers would diagnose the demo's jobs too)."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        broker = _Broker(other.getsockname()[1], tmp_path / "kafka")
        assert broker.taken()
        with pytest.raises(DemoError, match="already answers, and it is not this demo's broker"):
            broker.start(tmp_path / "kafka.log")
        assert not broker.started
    assert not broker.taken()  # the port is free again


def test_the_wide_diagnosis_table_keeps_every_column_between_130_and_240_columns() -> None:
    """A new user's terminal: folded into 130-240 columns, the suspect column was squeezed to
    nothing (and window and severity at 130) by the long evidence cells."""
    from rich.console import Console

    from argus.cli.demo import _diagnosis_table

    job = "demo-sim-4096-20261126-131800"
    evidence = {"step_ms": 598.0, "dataloader_ms_z": 63.9, "dataloader_ms_excess": 31.9}
    found = (
        Finding(
            job,
            20,
            59,
            "node-00017",
            "host_cpu_contention",
            (136, 137),
            5.0,
            evidence,
            84.4,
            1.34,
            "",
            "host",
        ),
        Finding(
            job,
            30,
            79,
            "node-00005<->node-00006",
            "link_degradation",
            (40,),
            5.0,
            evidence,
            12.0,
            0.2,
            "",
            "link",
        ),
    )
    result = _result((), found)
    for width in (130, 160, 200, 240):
        console = Console(width=width, record=True)
        console.print(_diagnosis_table(result, console.width))
        text = console.export_text()
        for whole in ("node-00017", "steps 20–59", "page", "host_cpu_contention"):
            assert whole in text, (width, text)
