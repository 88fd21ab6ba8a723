"""Issue 34, item 4: the Helm chart's Kafka ACLs give each principal only its topics."""

from __future__ import annotations

import re

from argus.schemas import ANOMALIES, DEAD_LETTER, STEP_SUMMARIES
from argus.sinks.kafka_sink import SINK_TOPICS
from tests.deploy.test_helm import by_kind, render

_ACL = re.compile(r'^acl --allow-principal "([^"]+)" (.*?) --(topic|group|cluster)\s*(\S*)$')


def _grants() -> dict[str, set[tuple[str, str]]]:
    """Per principal, the (operation, topic) pairs the rendered script allows."""
    (cm,) = (
        by_kind(render("kafka.acls.enabled=true"), "ConfigMap")
        .get("argus-kafka-acls", {})
        .get("data", {})
        .values()
    )
    out: dict[str, set[tuple[str, str]]] = {}
    for line in cm.splitlines():
        m = _ACL.match(line.strip())
        if m and m.group(3) == "topic":
            for op in re.findall(r"--operation (\w+)", m.group(2)):
                out.setdefault(m.group(1), set()).add((op, m.group(4)))
    return out


def test_only_the_workers_write_the_topics_that_page_and_sinks_only_read() -> None:
    grants = _grants()
    writers = {p for p, g in grants.items() for op, t in g if op in ("Write", "All") and t == ANOMALIES}
    assert writers == {"User:argus-worker"}
    for topic in (STEP_SUMMARIES, DEAD_LETTER):
        assert ("Write", topic) not in grants["User:argus-agent"] | grants["User:argus-node-agent"]
    sink = grants["User:argus-sink"]
    assert {op for op, _ in sink} == {"Read", "Describe"}
    assert {t for _, t in sink} == set(SINK_TOPICS)


def test_no_acls_are_rendered_unless_asked() -> None:
    assert "argus-kafka-acls" not in by_kind(render(), "ConfigMap")
