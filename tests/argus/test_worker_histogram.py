"""The worker's step latency is a Prometheus histogram (aggregatable across workers), served for real."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from argus.metrics import serve_metrics
from argus.streams.metrics import LATENCY_BUCKETS_S, LatencyHistogram
from tests.helpers.net import free_port


def test_every_append_is_counted_once_even_after_the_deque_drops_it() -> None:
    h = LatencyHistogram(maxlen=3)
    for v in (0.1, 0.3, 0.3, 7.0, 400.0):
        h.append(v)
    assert list(h) == [0.3, 7.0, 400.0]  # the quantile window keeps the last 3
    buckets, total = h.buckets()
    by_le = dict(buckets)
    assert (by_le[0.25], by_le[0.5], by_le[10.0], by_le[300.0], by_le[float("inf")]) == (1, 3, 4, 4, 5)
    assert total == sum((0.1, 0.3, 0.3, 7.0, 400.0))
    assert [n for _, n in buckets] == sorted(n for _, n in buckets) and len(buckets) == len(LATENCY_BUCKETS_S)


def test_served_as_a_histogram_prometheus_parses() -> None:
    h = LatencyHistogram([0.2, 1.5, 1.5], maxlen=10)
    port = free_port()
    server = serve_metrics(
        port,
        lambda: {"argus_worker_step_completion_seconds": ("histogram", "latency", {(): h.buckets()})},
        addr="127.0.0.1",
    )
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "argus_worker_step_completion_seconds"
    ]
    assert family.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("argus_worker_step_completion_seconds_bucket", "0.25")] == 1
    assert samples[("argus_worker_step_completion_seconds_bucket", "2.0")] == 3
    assert samples[("argus_worker_step_completion_seconds_bucket", "+Inf")] == 3
    assert samples[("argus_worker_step_completion_seconds_count", None)] == 3
    assert abs(samples[("argus_worker_step_completion_seconds_sum", None)] - 3.2) < 1e-9


def test_the_stop_line_says_in_words_how_steps_completed() -> None:
    import inspect
    import re
    from collections import Counter

    from argus.streams import assembly
    from argus.streams.metrics import StreamMetrics, summary

    # every reason the assembler gives a step has its words
    given = set(re.findall(r'"(\w+)"\)', inspect.getsource(assembly)))
    assert given >= {"all_ranks", "peers_done", "timeout", "late"}
    assert given <= set(assembly.COMPLETIONS), given - set(assembly.COMPLETIONS)
    m = StreamMetrics()
    m.steps = Counter(all_ranks=70, peers_done=10)
    line = summary(m)
    assert (
        "80 steps completed (all_ranks 70: every rank in, peers_done 10: every rank a later step had)" in line
    )
