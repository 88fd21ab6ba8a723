"""The publisher's spool under a crash mid-write and a full disk, end to end through the
real broker (issue 17 item 7; a scenario of bench/reliability.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from argus.producers.spool import Spool
from tests.figures import report

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.kafka


def _consume(kafka_conf: dict, topic: str, want: int, timeout: float = 60) -> list[bytes]:
    from confluent_kafka import Consumer

    c = Consumer({**kafka_conf, "group.id": topic, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(set(got)) < want and time.monotonic() < deadline:
            got += [m.value() for m in c.consume(1000, 0.5) if not m.error()]
    finally:
        c.close()
    return got


def test_a_torn_spool_replays_what_it_kept_and_what_came_after(kafka_conf, unique, tmp_path):
    """A process crashed mid-write (half a record at the tail); the next one spools after it
    and replays: every intact record arrives once, the torn one is counted."""
    from argus.kafka_admin import ensure_topics
    from argus.producers.publisher import Publisher

    n = int(os.environ.get("ARGUS_TEST_SPOOL_RECORDS", "2000"))
    topic = f"argus-test-torn-{unique}"
    ensure_topics(kafka_conf, [topic], partitions=2)
    crashed = Spool(tmp_path)
    crashed.append([(topic, b"k%d" % (i % 4), b"old-%d" % i) for i in range(n)])
    seg = max(tmp_path.glob("*.seg"))
    size = seg.stat().st_size
    crashed.append([(topic, b"k0", b"torn-record")])
    with open(seg, "r+b") as f:
        f.truncate(size + 9)  # the crash: 9 bytes of the last frame reached the disk
    pub = Publisher(kafka_conf, spool_dir=tmp_path, linger_ms=1)
    torn = 1 if pub.spool is not None and pub.spool.torn_bytes else 0
    for i in range(n):
        pub.publish_raw(topic, b"k%d" % (i % 4), b"new-%d" % i)
    pub.drain(60)
    assert pub.shutdown(5)
    got = _consume(kafka_conf, topic, 2 * n)
    want = {b"old-%d" % i for i in range(n)} | {b"new-%d" % i for i in range(n)}
    received = len(set(got) & want)
    report(
        "torn spool",
        sent=2 * n,
        received=received,
        lost=2 * n - received,
        duplicated=len(got) - len(set(got)),
        hostile_records=1,
        dead_lettered=torn,
    )
    assert set(got) == want and len(got) == len(want) and torn == 1
    assert not list(tmp_path.glob("*.seg"))  # replayed and committed, the torn segment too


_FULL_DISK = r"""
import json, os, resource, signal, sys, time
from pathlib import Path
from argus.producers.publisher import Publisher

d, topic, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
pub = Publisher({"bootstrap.servers": "127.0.0.1:1"}, spool_dir=d, stall_s=0.3, wake_ms=10)
sent = {"pre": 0, "full": 0, "post": 0}
def publish(tag, count):
    for i in range(count):
        pub.publish_raw(topic, b"k%d" % (i % 4), b"%s-%d" % (tag.encode(), i))
        sent[tag] += 1
    pub.flush(0.5)
publish("pre", n)
while not pub.stats()["stalled"] or pub.stats()["queued"]:
    time.sleep(0.05)
publish("pre", 0)
time.sleep(0.3)  # let the worker take what it has
size = sum(p.stat().st_size for p in d.glob("*.seg"))
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 2000, hard))  # the disk fills up
publish("full", n)
while pub.stats()["queued"]:
    time.sleep(0.05)
time.sleep(0.3)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space is back
publish("post", n)
ok = pub.shutdown(5)
spool = pub.spool
print(json.dumps({
    "sent": sent,
    "dropped": dict(pub.dropped),
    "counted_bytes": spool.bytes,
    "disk_bytes": sum(p.stat().st_size for p in d.glob("*.seg")),
}))
"""


def test_a_full_disk_loses_only_what_it_counts_and_keeps_what_follows(kafka_conf, unique, tmp_path):
    """A rank spools through a broker outage; the disk fills up half way, then space comes
    back. Records refused by the full disk are counted (never silently lost); everything
    spooled replays once; every record after space returned arrives."""
    from argus.kafka_admin import ensure_topics
    from argus.producers.publisher import Publisher

    n = int(os.environ.get("ARGUS_TEST_SPOOL_RECORDS", "2000"))
    topic = f"argus-test-full-{unique}"
    ensure_topics(kafka_conf, [topic], partitions=2)
    child = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path), topic, str(n)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr
    r = json.loads(child.stdout.strip().splitlines()[-1])
    refused = r["dropped"].get("spool write failed", 0)
    assert r["counted_bytes"] == r["disk_bytes"]
    assert refused > 0 and set(r["dropped"]) == {"spool write failed"}
    pub = Publisher(kafka_conf, spool_dir=tmp_path, linger_ms=1)  # the rank restarts, Kafka is back
    pub.drain(60)
    assert pub.shutdown(5)
    sent = sum(r["sent"].values())
    got = _consume(kafka_conf, topic, sent - refused)
    received = len(set(got))
    report(
        "disk-full spool",
        sent=sent,
        received=received,
        lost=sent - refused - received,  # unaccounted: neither delivered nor counted as dropped
        duplicated=len(got) - received,
        dropped_counted=refused,
    )
    assert received == sent - refused and len(got) == received
    assert {b"post-%d" % i for i in range(n)} <= set(got)
