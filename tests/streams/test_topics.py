"""The topics a worker creates (issue 34, item 14): its tables' changelogs and its internal
topic are created by the worker before Faust starts, with the replication factor of a
setting (default: the brokers'), never Faust's fixed 1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from argus.streams import StreamConfig, Streams
from argus.streams.app import own_topics
from argus.streams.deepening import EVIDENCE_TOPIC


def test_every_topic_the_app_would_create_itself_is_created_by_the_worker(tmp_path) -> None:
    streams = Streams(StreamConfig(datadir=str(tmp_path / "streams")))
    app = streams.app
    declared = {t.changelog_topic.get_topic_name() for t in app.tables.values()} | {EVIDENCE_TOPIC}
    assert {name for name, _ in own_topics(app)} == declared
    assert all(
        cfg == {"cleanup.policy": "compact"} for name, cfg in own_topics(app) if name != EVIDENCE_TOPIC
    )
    assert app.conf.topic_disable_leader  # no leader topic Faust would create on its own
    assert app.conf.topic_replication_factor != 1  # Faust's own fallback is not one replica
    assert (
        Streams(
            StreamConfig(datadir=str(tmp_path / "s2"), replication_factor=2)
        ).app.conf.topic_replication_factor
        == 2
    )


@pytest.mark.kafka
def test_the_replication_factor_setting_reaches_the_topics_the_worker_creates(
    kafka_conf, tmp_path, unique
) -> None:
    """On the one-broker test cluster, three replicas cannot be placed: the worker says so
    and exits, instead of creating its changelogs with one replica (before: the setting did
    not exist and Faust created them with 1, whatever the cluster)."""
    env = {
        **os.environ,
        "ARGUS_HOME": str(tmp_path),
        "ARGUS_KAFKA_BOOTSTRAP": kafka_conf["bootstrap.servers"],
        "ARGUS_STREAMS_REPLICATION_FACTOR": "3",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "argus.cli", "worker", "--app-id", f"rf-{unique}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert f"rf-{unique}-argus-job-state-changelog" in out and "replication factor" in out.lower(), out[
        -2000:
    ]
    assert "Traceback" not in out, out[-2000:]
