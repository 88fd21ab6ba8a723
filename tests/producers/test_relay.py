"""The node relay: the pure merge, and ranks → relay (`argus node-agent`) → the real broker."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from argus.producers.relay import HeartbeatMerger, NodeRelay, RelayError, StepMerger
from argus.schemas import STEPS, Heartbeat, StepBatch, StepRecord


def part(job: str, step: int, rank: int) -> StepBatch:
    t = 1_800_000_000_000_000_000 + 1_000_000_000 * step
    return StepBatch.from_records(
        [StepRecord(job, 0, step, rank, start_ns=t, end_ns=t + 900_000_000 + rank, host="n0")]
    )


def test_merger_learns_the_node_and_releases_whole_steps_at_once():
    m = StepMerger(max_wait_s=0.2)
    # the first step: the node's rank count is unknown, so it waits max_wait_s
    assert [m.add(part("j", 0, r), now=0.0) for r in range(8)] == [[]] * 8
    assert m.due(0.1) == []
    (first,) = m.due(0.2)
    assert sorted(first["rank"]) == list(range(8))
    # from then on a step goes as soon as its 8th rank is in, with no wait
    for r in range(7):
        assert m.add(part("j", 1, r), now=1.0) == []
    (second,) = m.add(part("j", 1, 7), now=1.0)
    assert second.step == 1 and len(second) == 8 and m.open_steps == 0
    # a straggler: 7 ranks go after max_wait_s, the 8th follows alone; a retried rank counts once
    for r in [0, 1, 2, 3, 4, 5, 5, 6]:
        assert m.add(part("j", 2, r), now=2.0) == []
    (short,) = m.due(2.2)
    assert sorted(short["rank"]) == list(range(7))
    assert m.due(2.5) == []
    m.add(part("j", 2, 7), now=2.6)
    (late,) = m.due(2.9)
    assert list(late["rank"]) == [7]
    # other jobs on the node are independent, and drain() empties everything
    m.add(part("k", 0, 3), now=3.0)
    assert [b.job for b in m.drain()] == ["k"] and m.open_steps == 0


def test_merger_columns_are_the_ranks_own():
    m = StepMerger(max_wait_s=0.1)
    for r in (3, 1, 2):
        m.add(part("j", 4, r), now=0.0)
    (batch,) = m.due(1.0)
    assert list(batch["rank"]) == [3, 1, 2]
    assert list(batch["end_ns"] - batch["start_ns"]) == [900_000_003, 900_000_001, 900_000_002]
    assert set(batch["host"]) == {"n0"}


def test_merger_forgets_a_job_gone_silent():
    m = StepMerger(max_wait_s=0.1, forget_s=100)
    for r in range(4):
        m.add(part("old", 0, r), now=0.0)
    m.due(1.0)
    assert m.add(part("old", 1, 0), now=2.0) == []  # learned: waits for 4
    m.due(3.0)
    assert m.world("old", 0) == 4
    m.due(200.0)  # silent for longer than forget_s
    assert m.world("old", 0) == 0
    # relearned from scratch: the 4th rank of its next step no longer completes it
    assert [m.add(part("old", 2, r), now=201.0) for r in range(4)] == [[]] * 4


class Null:
    def publish(self, *a: object) -> None: ...

    def publish_raw(self, *a: object) -> None: ...


def test_a_second_relay_on_a_served_socket_is_refused(tmp_path):
    path = tmp_path / "relay.sock"
    first = NodeRelay(path, Null())
    with pytest.raises(RelayError, match="another relay"):
        NodeRelay(path, Null())
    first._sock.close()
    # a dead relay's socket file is replaced
    again = NodeRelay(path, Null())
    again._sock.close()


def test_a_relay_path_that_is_not_a_socket_is_refused_and_left_alone(tmp_path):
    (tmp_path / "file").write_text("keep me")
    with pytest.raises(RelayError, match="exists and is not a socket"):
        NodeRelay(tmp_path / "file", Null())
    assert (tmp_path / "file").read_text() == "keep me"
    (tmp_path / "dir").mkdir()
    with pytest.raises(RelayError, match="exists and is not a socket"):
        NodeRelay(tmp_path / "dir", Null())


def test_a_stopping_relay_publishes_everything_it_took_and_sends_the_rest_back(tmp_path):
    """Datagrams still queued in the socket at stop are published; later sends are refused."""
    from argus.producers.relay import RelayClient
    from argus.schemas import encode

    class Keep:
        def __init__(self) -> None:
            self.rows: list[int] = []
            self.late: list[bool] = []

        def publish(self, topic: str, key: bytes, record: StepBatch) -> None:
            self.rows += [int(r) for r in record["rank"]]
            # a rank sending while the relay drains (it stopped receiving, not yet closed)
            self.late.append(late_client.send(encode(part("j", 1, 0))))

        def publish_raw(self, *a: object) -> None:
            raise AssertionError("every part decodes")

    sink = Keep()
    relay = NodeRelay(tmp_path / "relay.sock", sink, max_wait_s=30)  # nothing is due before the stop
    clients = [RelayClient(relay.path) for _ in range(8)]  # net.unix.max_dgram_qlen is 10 by default
    late_client = RelayClient(relay.path)
    assert late_client._connect() is not None
    assert all(c.send(encode(part("j", 0, r))) for r, c in enumerate(clients))
    stop = threading.Event()
    stop.set()
    server = threading.Thread(target=relay.serve, args=(stop,))
    server.start()  # stops at once: all 8 are still queued in the socket
    server.join(10)
    assert sorted(sink.rows) == list(range(8)) and relay.received == 8
    assert sink.late == [False]  # refused while draining: that record goes to Kafka, not lost
    assert not relay.path.exists()
    assert not clients[0].send(encode(part("j", 1, 0)))  # refused: the rank goes to Kafka


def _steps_of(
    kafka_conf: dict, job: str, want_rows: int, want_bad: int, timeout: float = 60
) -> tuple[list[StepBatch], list[bytes]]:
    """The job's StepBatches on the steps topic, and the undecodable messages naming it."""
    from confluent_kafka import Consumer

    from argus.schemas import SchemaError, decode

    c = Consumer({**kafka_conf, "group.id": f"relay-{job}", "auto.offset.reset": "earliest"})
    c.subscribe([STEPS])
    got: list[StepBatch] = []
    bad: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while (sum(map(len, got)) < want_rows or len(bad) < want_bad) and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() or job.encode() not in (m.value() or b""):
                    continue
                try:
                    got.append(decode(m.value(), expect=StepBatch))
                except SchemaError:
                    bad.append(m.value())
    finally:
        c.close()
    return got, bad


def _node_agent(path, env: dict) -> subprocess.Popen:
    """`argus node-agent --relay PATH`, once its socket is served (no GPU here: the relay runs alone)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "argus.cli", "node-agent", "--relay", str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert path.exists(), proc.communicate()[0] if proc.poll() is not None else "no relay socket"
    return proc


def _env(kafka_conf: dict, tmp_path) -> dict:
    return {
        **os.environ,
        "ARGUS_HOME": str(tmp_path / "home"),
        "ARGUS_KAFKA_BOOTSTRAP": kafka_conf["bootstrap.servers"],
    }


@pytest.mark.kafka
def test_ranks_through_the_node_agent_relay_to_kafka_and_back_to_direct(kafka_conf, unique, tmp_path):
    """8 rank publishers → `argus node-agent --relay` → broker; after the relay stops, ranks go direct."""
    from argus.kafka_admin import ensure_topics
    from argus.producers.publisher import Publisher
    from argus.schemas import ALL_TOPICS

    ensure_topics(kafka_conf, ALL_TOPICS, partitions=4)
    path = tmp_path / "run" / "relay.sock"
    agent = _node_agent(path, _env(kafka_conf, tmp_path))
    try:
        job = f"relay-{unique}"
        ranks = [Publisher(kafka_conf, relay=path, linger_ms=1, wake_ms=10) for _ in range(8)]
        steps = 6
        for step in range(steps):
            for r, pub in enumerate(ranks):
                pub.publish(STEPS, b"k", part(job, step, r))
            time.sleep(0.4)
        # bytes that are not a StepBatch are forwarded as they are, for the worker to dead-letter
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as raw:
            raw.sendto(b"not avro " + job.encode(), str(path))
        for pub in ranks:
            pub.drain(30)
        assert sum(p.relayed for p in ranks) == 8 * steps

        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=60)
        assert agent.returncode == 0, out
        assert f"node relay: {{'received': 49, 'published': {steps}" in out, out
        assert not path.exists()

        # the relay is gone: the next step goes to Kafka directly, nothing is lost
        for r, pub in enumerate(ranks):
            pub.publish(STEPS, b"k", part(job, steps, r))
            pub.drain(30)
            assert pub.relayed == steps and pub.delivered == 1 and not pub.dropped
            pub.shutdown(5)
    finally:
        if agent.poll() is None:
            agent.kill()

    batches, bad = _steps_of(kafka_conf, job, want_rows=8 * (steps + 1), want_bad=1)
    assert bad == [b"not avro " + job.encode()]
    rows = sorted((b.step, int(r)) for b in batches for r in b["rank"])
    assert rows == [(s, r) for s in range(steps + 1) for r in range(8)]  # each rank-step exactly once
    merged = [b for b in batches if b.step < steps]
    assert len(merged) == steps and all(len(b) == 8 for b in merged)  # one message per step per node
    assert sum(1 for b in batches if b.step == steps) == 8  # direct: one message per rank
    assert np.all(np.concatenate([b["host"] for b in batches]) == "n0")


@pytest.mark.kafka
def test_a_relay_restart_under_live_ranks_loses_and_doubles_nothing(kafka_conf, unique, tmp_path):
    """8 ranks publish steps at 20/s; meanwhile the node agent is stopped (SIGTERM) and
    started again twice; every rank-step arrives exactly once (through the relay, or direct
    while it is away)."""
    from argus.kafka_admin import ensure_topics
    from argus.producers.publisher import Publisher
    from argus.schemas import ALL_TOPICS
    from tests.figures import report

    seconds = float(os.environ.get("ARGUS_TEST_RELAY_S", "6"))
    ensure_topics(kafka_conf, ALL_TOPICS, partitions=4)
    path = tmp_path / "relay.sock"
    env = _env(kafka_conf, tmp_path)
    job = f"relay-restart-{unique}"
    ranks = [Publisher(kafka_conf, relay=path, linger_ms=1, wake_ms=10) for _ in range(8)]
    for pub in ranks:
        pub._relay.retry_s = 0.5  # reconnect soon after the restart (5 s by default)
    agent = _node_agent(path, env)
    steps = int(seconds * 20)
    outputs = []

    def train() -> None:  # the ranks go on publishing while the relay restarts
        for step in range(steps):
            for r, pub in enumerate(ranks):
                pub.publish(STEPS, b"k", part(job, step, r))
            time.sleep(0.05)

    ranks_thread = threading.Thread(target=train)
    ranks_thread.start()
    try:
        for _ in range(2):
            time.sleep(seconds / 3)
            agent.send_signal(signal.SIGTERM)
            outputs.append(agent.communicate(timeout=60)[0])
            assert agent.returncode == 0, outputs[-1]
            agent = _node_agent(path, env)
        ranks_thread.join()
        for pub in ranks:
            pub.drain(60)
    finally:
        agent.send_signal(signal.SIGTERM)
        outputs.append(agent.communicate(timeout=60)[0])
    relayed = sum(p.relayed for p in ranks)
    direct = sum(p.delivered for p in ranks)
    for pub in ranks:
        assert not pub.dropped
        pub.shutdown(5)

    batches, _ = _steps_of(kafka_conf, job, want_rows=8 * steps, want_bad=0, timeout=120)
    rows = [(b.step, int(r)) for b in batches for r in b["rank"]]
    sent = 8 * steps
    received = len(set(rows))
    report(
        "relay restart",
        sent=sent,
        received=received,
        lost=sent - received,
        duplicated=len(rows) - received,
        relayed=relayed,
        direct=direct,
        messages=len(batches),
    )
    assert sorted(rows) == [(s, r) for s in range(steps) for r in range(8)], outputs
    assert relayed + direct == sent and relayed > 0
    assert len(batches) - direct <= relayed / 2  # what the relay sent, it sent merged


@pytest.mark.kafka
def test_ranks_without_a_relay_publish_to_kafka_directly(kafka_conf, unique, tmp_path):
    from argus.kafka_admin import ensure_topics
    from argus.producers.publisher import Publisher

    ensure_topics(kafka_conf, [STEPS], partitions=4)
    job = f"norelay-{unique}"
    pub = Publisher(kafka_conf, relay=tmp_path / "nobody-here.sock")
    for r in range(8):
        pub.publish(STEPS, b"k", part(job, 0, r))
    pub.drain(30)
    assert pub.relayed == 0 and pub.delivered == 8
    pub.shutdown(5)
    batches, _ = _steps_of(kafka_conf, job, want_rows=8, want_bad=0)
    assert sorted(int(r) for b in batches for r in b["rank"]) == list(range(8))


class Keep:
    """A sink that keeps what the relay publishes."""

    def __init__(self) -> None:
        self.parts: list[StepBatch] = []
        self.raw: list[bytes] = []

    def publish(self, topic: str, key: bytes, record: StepBatch) -> None:
        self.parts.append(record)

    def publish_raw(self, topic: str, key: bytes, value: bytes) -> None:
        self.raw.append(value)


def _serve_until(relay: NodeRelay, done, rounds: int = 400) -> None:
    """Serve rounds until ``done()`` (bounded: a missing datagram fails the test, never hangs)."""
    for _ in range(rounds):
        relay._round(0.05)
        if done():
            return


_FORGER = r"""
import os, socket, sys
from argus.schemas import StepBatch, StepRecord, encode
path = sys.argv[1]
t = 1_800_000_000_000_000_000
forged = encode(StepBatch.from_records([StepRecord("victim-job", 0, 5, 1_048_575, start_ns=t, end_ns=t + 1)]))
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.connect(path)          # as root: the socket is reachable...
os.setgid(65534)
os.setuid(65534)         # ...but what is sent, is sent as nobody
for value in (forged, b"garbage" * 10, os.urandom(60_000)):
    s.send(value)
# and through the path itself, as nobody: the directory (0750) keeps it out
t2 = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    t2.connect(path)
    print("connected")
except PermissionError:
    print("EACCES")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="sending as another uid needs root (setuid)")
def test_a_sender_of_another_uid_is_refused_and_counted(tmp_path):
    """As `nobody`: a forged StepBatch for another job, garbage and a 60 KB blob are all
    refused and counted, none forwarded (before: all accepted and sent to Kafka)."""
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp"))
    top.chmod(0o755)  # nobody may walk to the relay's directory; the directory decides
    try:
        sink = Keep()
        relay = NodeRelay(top / "run" / "relay.sock", sink)
        assert stat.S_IMODE((top / "run").stat().st_mode) == 0o750
        assert stat.S_IMODE(relay.path.stat().st_mode) == 0o660
        out = subprocess.run(
            [sys.executable, "-c", _FORGER, str(relay.path)], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["EACCES"]
        _serve_until(relay, lambda: sum(relay.refused.values()) >= 3)
        assert relay.refused == {"peer": 3}
        assert sink.parts == [] and sink.raw == [] and relay.received == 0
        # the relay's own uid still goes through
        from argus.producers.relay import RelayClient
        from argus.schemas import encode

        assert RelayClient(relay.path).send(encode(part("j", 0, 0)))
        _serve_until(relay, lambda: relay.received >= 1)
        relay.merger.parts.max_wait_s = 1e-9
        _serve_until(relay, lambda: bool(sink.parts))
        assert [p.job for p in sink.parts] == ["j"]
        relay._sock.close()
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_allowed_uids_and_gids_are_configurable(tmp_path):
    me = os.geteuid()
    relay = NodeRelay(tmp_path / "a.sock", Null(), allowed_uids=[me + 1], allowed_gids=[os.getegid()])
    from argus.producers.relay import RelayClient
    from argus.schemas import encode

    assert RelayClient(relay.path).send(encode(part("j", 0, 0)))
    _serve_until(relay, lambda: relay.received >= 1)
    assert relay.received == 1 and not relay.refused  # the gid is allowed
    relay._sock.close()
    strict = NodeRelay(tmp_path / "b.sock", Null(), allowed_uids=[me + 1])
    assert RelayClient(strict.path).send(encode(part("j", 0, 0)))
    _serve_until(strict, lambda: bool(strict.refused))
    assert strict.refused == {"peer": 1} and strict.received == 0
    strict._sock.close()


def test_an_oversized_datagram_is_refused_and_the_client_sends_it_direct(tmp_path):
    """100-400 KB blobs were accepted and 700 KB spooled: now the bound is 64 KB."""
    from argus.producers.relay import MAX_DATAGRAM, RelayClient

    sink = Keep()
    relay = NodeRelay(tmp_path / "relay.sock", sink)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    raw.connect(str(relay.path))
    raw.send(b"x" * (MAX_DATAGRAM + 1))
    _serve_until(relay, lambda: bool(relay.refused))
    assert relay.refused == {"size": 1} and sink.raw == [] and relay.received == 0
    assert relay.stats()["refused_size"] == 1
    assert not RelayClient(relay.path).send(b"x" * (MAX_DATAGRAM + 1))  # to Kafka, not the relay
    raw.close()
    relay._sock.close()


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o775])
def test_a_shared_socket_directory_keeps_its_mode_and_the_relay_serves_in_its_own(tmp_path, mode):
    """Issue 34, item 11: pointed at a socket in a root-owned 1777 directory (/tmp), the relay
    made it 0750, locking every other user out. It makes a private subdirectory instead,
    and a rank given the same path finds the socket there."""
    from argus.producers.relay import RelayClient, served_path
    from argus.schemas import encode

    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(mode)
    relay = NodeRelay(shared / "relay.sock", Keep())
    try:
        assert stat.S_IMODE(shared.stat().st_mode) == mode
        assert relay.path == shared / "argus-relay" / "relay.sock" == served_path(shared / "relay.sock")
        assert stat.S_IMODE(relay.path.parent.stat().st_mode) == 0o750
        assert stat.S_IMODE(relay.path.stat().st_mode) == 0o660
        assert RelayClient(shared / "relay.sock").send(encode(part("j", 0, 0)))
        _serve_until(relay, lambda: relay.received >= 1)
    finally:
        relay._sock.close()


def test_a_private_socket_directory_it_was_given_keeps_its_mode(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    d.chmod(0o755)
    relay = NodeRelay(d / "relay.sock", Null())
    assert stat.S_IMODE(d.stat().st_mode) == 0o755 and relay.path == d / "relay.sock"
    relay._sock.close()
    fresh = NodeRelay(tmp_path / "new" / "relay.sock", Null())  # made by the relay: 0750
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o750
    fresh._sock.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="a subdirectory of another user needs root (chown)")
def test_a_subdirectory_another_user_made_in_the_shared_directory_is_refused(tmp_path):
    from argus.producers.relay import RelayError

    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "argus-relay").mkdir()
    os.chown(shared / "argus-relay", 65534, 65534)
    with pytest.raises(RelayError, match="not a directory of this user's"):
        NodeRelay(shared / "relay.sock", Null())


_HOSTILE = r"""
import os, socket, sys
from argus.schemas import StepBatch, StepRecord, encode
path, victim = sys.argv[1], sys.argv[2]
t = 1_800_000_000_000_000_000
def step(job, rank, step=5):
    return encode(StepBatch.from_records([StepRecord(job, 0, step, rank, start_ns=t, end_ns=t + 1)]))
hostile = [
    step(victim, 3),                     # a forged step of another job
    step(victim, 1_048_575),             # the poison rank of issue 17 item 1
    step(victim, 0, step=10**12 - 1),    # a far-future step
    b"garbage " + victim.encode(),       # not a record at all
    victim.encode() + os.urandom(60_000),  # a big blob
]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.connect(path)
os.setgid(65534)
os.setuid(65534)  # from here on, a process of user nobody
sent = 0
for value in hostile:
    s.send(value)
    sent += 1
print(sent)
"""


@pytest.mark.kafka
@pytest.mark.skipif(os.geteuid() != 0, reason="a sender of another uid needs root (setuid)")
def test_a_forged_sender_is_refused_while_healthy_ranks_lose_nothing(kafka_conf, unique, tmp_path):
    """`argus node-agent --relay` serves 8 healthy ranks; a process of user `nobody` sends a
    forged step of another job, the poison rank record, a far-future step, garbage and a
    60 KB blob, and an allowed process sends a datagram over the size bound. Every hostile
    datagram is refused and counted, none reaches Kafka; every healthy rank-step arrives once."""
    from confluent_kafka import Consumer

    from argus.kafka_admin import ensure_topics
    from argus.producers.publisher import Publisher
    from argus.producers.relay import MAX_DATAGRAM
    from argus.schemas import ALL_TOPICS, SchemaError, decode
    from tests.figures import report

    ensure_topics(kafka_conf, ALL_TOPICS, partitions=4)
    path = tmp_path / "run" / "relay.sock"
    agent = _node_agent(path, _env(kafka_conf, tmp_path))
    job, victim = f"healthy-{unique}", f"victim-{unique}"
    steps = int(os.environ.get("ARGUS_TEST_FORGED_STEPS", "10"))
    ranks = [Publisher(kafka_conf, relay=path, linger_ms=1, wake_ms=10) for _ in range(8)]
    try:
        forger = subprocess.run(
            [sys.executable, "-c", _HOSTILE, str(path), victim], capture_output=True, text=True, timeout=120
        )
        assert forger.returncode == 0, forger.stderr
        hostile = int(forger.stdout.split()[-1])
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as big:  # allowed uid, too big
            big.sendto(victim.encode() + b"x" * MAX_DATAGRAM, str(path))
        hostile += 1
        for step in range(steps):
            for r, pub in enumerate(ranks):
                pub.publish(STEPS, b"k", part(job, step, r))
            time.sleep(0.05)
        for pub in ranks:
            pub.drain(30)
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=60)
        assert agent.returncode == 0, out
    finally:
        if agent.poll() is None:
            agent.kill()
    for pub in ranks:
        assert not pub.dropped
        pub.shutdown(5)
    stats = " ".join(out.split())  # rich may wrap the counters line
    refused = int(stats.split("'refused': ")[1].split(",")[0].rstrip("}"))

    c = Consumer({**kafka_conf, "group.id": f"forged-{unique}", "auto.offset.reset": "earliest"})
    c.subscribe([STEPS])
    rows: list[tuple[int, int]] = []
    victim_messages = 0
    deadline = time.monotonic() + 60
    try:
        while len(set(rows)) < 8 * steps and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                value = m.value() or b""
                if m.error():
                    continue
                if victim.encode() in value:
                    victim_messages += 1
                elif job.encode() in value:
                    try:
                        b = decode(value, expect=StepBatch)
                    except SchemaError:
                        continue
                    rows += [(b.step, int(r)) for r in b["rank"]]
    finally:
        c.close()
    sent = 8 * steps
    received = len(set(rows))
    report(
        "forged relay sender",
        sent=sent,
        received=received,
        lost=sent - received,
        duplicated=len(rows) - received,
        hostile_records=hostile,
        dead_lettered=refused,
    )
    assert refused == hostile and victim_messages == 0, stats
    assert sorted(rows) == [(s, r) for s in range(steps) for r in range(8)]


def hb(job: str, rank: int, t: int, step: int = 3) -> Heartbeat:
    return Heartbeat(job, 0, rank, "n0", 1_800_000_000_000_000_000 + t, step, stack="train.py:main")


def test_heartbeat_merger_sends_one_batch_per_job_per_period():
    m = HeartbeatMerger(max_wait_s=2.0)
    # the first period: the node's rank count is unknown, so the batch waits max_wait_s
    assert [m.add(hb("j", r, 0), now=0.0) for r in range(8)] == [[]] * 8
    assert m.add(hb("j", 3, 5), now=0.5) == []  # a rank's newer heartbeat replaces its older one
    assert m.due(1.9) == [] and m.held == 8
    (first,) = m.due(2.0)
    assert first["rank"].tolist() == list(range(8)) and first["time_ns"][3] == first["time_ns"][0] + 5
    # from then on the batch goes as soon as every local rank has sent one
    for r in range(7):
        assert m.add(hb("j", r, 10), now=5.0) == []
    (second,) = m.add(hb("j", 7, 10), now=5.1)
    assert len(second) == 8 and m.held == 0
    # a silent rank: the others go after max_wait_s; another job on the node is independent
    for r in range(7):
        m.add(hb("j", r, 20), now=10.0)
    m.add(hb("k", 0, 20), now=10.5)
    (short,) = m.due(12.0)
    assert short.job == "j" and len(short) == 7
    assert [b.job for b in m.drain()] == ["k"] and m.held == 0


def test_heartbeat_merger_holds_a_bounded_number_of_ranks():
    m = HeartbeatMerger(max_wait_s=60.0, max_ranks=16)
    released = [b for r in range(40) for b in m.add(hb(f"j{r}", 0, r), now=0.0)]
    assert m.held <= 16 and sum(map(len, released)) + m.held == 40


def test_ranks_heartbeats_through_the_relay_become_one_batch(tmp_path):
    """8 ranks' heartbeats (and their step records) through the relay socket: one
    HeartbeatBatch on the heartbeats topic, one StepBatch on the steps topic; a heartbeat
    that does not decode is forwarded to the heartbeats topic unchanged."""
    from argus.producers.relay import RelayClient
    from argus.schemas import HEARTBEATS, HeartbeatBatch, encode

    class Keep:
        def __init__(self) -> None:
            self.records: list[tuple[str, object]] = []
            self.raw: list[tuple[str, bytes]] = []

        def publish(self, topic: str, key: bytes, record: object) -> None:
            self.records.append((topic, record))

        def publish_raw(self, topic: str, key: bytes, value: bytes) -> None:
            self.raw.append((topic, value))

    sink = Keep()
    relay = NodeRelay(tmp_path / "relay.sock", sink, max_wait_s=30, heartbeat_max_wait_s=30)
    clients = [RelayClient(relay.path) for _ in range(8)]
    assert all(c.send(encode(hb("j", r, r))) for r, c in enumerate(clients))
    from dataclasses import replace

    alone = encode(replace(hb("j", 9, 9), pause="ckpt\nsave"))  # a newline: cannot be batched
    assert clients[1].send(alone)
    bad = bytearray(encode(hb("j", 0, 0)))
    bad[-12:] = b"\xff" * 12  # a heartbeat's schema id, a broken body
    assert clients[0].send(bytes(bad))
    stop = threading.Event()
    server = threading.Thread(target=relay.serve, args=(stop,))
    server.start()
    deadline = time.monotonic() + 10
    while relay.received < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    server.join(10)
    ((topic, batch),) = sink.records
    assert topic == HEARTBEATS and isinstance(batch, HeartbeatBatch)
    assert batch.beats() == [hb("j", r, r) for r in range(8)]
    assert sorted(sink.raw) == sorted([(HEARTBEATS, bytes(bad)), (HEARTBEATS, alone)])
    assert relay.stats()["published_heartbeats"] == 1


def test_a_rank_publishers_heartbeats_go_through_the_relay(kafka_conf, tmp_path):
    """The rank agent's Publisher hands heartbeats to the node relay like its step records
    (one batch per node and period leaves the relay), not straight to Kafka."""
    from argus.producers.publisher import Publisher
    from argus.schemas import HEARTBEATS, HeartbeatBatch

    class Keep:
        def __init__(self) -> None:
            self.records: list[tuple[str, object]] = []

        def publish(self, topic: str, key: bytes, record: object) -> None:
            self.records.append((topic, record))

    sink = Keep()
    relay = NodeRelay(tmp_path / "relay.sock", sink, max_wait_s=30, heartbeat_max_wait_s=30)
    ranks = [Publisher(kafka_conf, relay=relay.path, linger_ms=1, wake_ms=10) for _ in range(2)]
    stop = threading.Event()
    server = threading.Thread(target=relay.serve, args=(stop,))
    server.start()
    try:
        for r, pub in enumerate(ranks):
            pub.publish(HEARTBEATS, b"k", hb("j", r, r))
            pub.drain(10)
        assert [p.relayed for p in ranks] == [1, 1] and not any(p.delivered for p in ranks)
        deadline = time.monotonic() + 10
        while relay.received < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        server.join(10)
        for pub in ranks:
            pub.shutdown(5)
    ((topic, batch),) = sink.records
    assert (
        topic == HEARTBEATS
        and isinstance(batch, HeartbeatBatch)
        and batch.beats() == [hb("j", r, r) for r in range(2)]
    )
