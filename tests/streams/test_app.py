"""The stream worker's agents without a broker (Faust's ``agent.test_context()``): parts of a
step in, its findings out; findings out of order held, then diagnosed in order, each step's
summary sent once as it is diagnosed; heartbeats in (as the heartbeat intake hands over its
consumer batches), a hang anomaly out once the clock passes the threshold.

Sends are recorded, not made: each output topic's ``send`` and the producer's ``flush`` are
replaced by fakes (the end-to-end tests in test_worker.py and test_hang_worker.py run the
same agents against the real broker)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from argus.detectors import DiagnoserConfig
from argus.producers.simulator import ClusterSimulator, HangScenario, HangSimulator, Layout
from argus.schemas import HEARTBEATS, JobOrder, StepFindings, StepSummary, decode, encode, job_key
from argus.streams import AssemblyConfig, CompleteStep, StreamConfig, Streams
from argus.streams.intake import RawInput
from argus.streams.metrics import metric_families
from argus.streams.outputs import step_outputs

OUTPUTS = ("summaries", "findings", "anomalies", "dead")


class Recorded:
    """What a :class:`Streams` sent, per output topic: (key, value) pairs."""

    def __init__(self, streams: Streams) -> None:
        self.sent: dict[str, list[tuple[bytes, bytes]]] = {name: [] for name in OUTPUTS}
        self.flushes = 0
        for name in OUTPUTS:
            topic = getattr(streams.topics, name)
            topic.send = self._sender(self.sent[name])
        streams.app.producer.flush = self._flush

    @staticmethod
    def _sender(into: list[tuple[bytes, bytes]]) -> Callable[..., Any]:
        async def send(*, key: bytes, value: bytes, headers: Any = None) -> asyncio.Future[None]:
            into.append((key, value))
            delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            delivered.set_result(None)  # as a delivered message's future
            return delivered

        return send

    async def _flush(self) -> None:
        self.flushes += 1


def make(tmp_path, **overrides: Any) -> tuple[Streams, Recorded]:
    streams = Streams(StreamConfig(datadir=str(tmp_path / "streams"), **overrides))
    return streams, Recorded(streams)


def as_from_kafka(agent: Any) -> Any:
    """Make the test agent's messages hold the reference Faust's consumer gives each
    delivered message (released when the stream acknowledges the event), so that
    ``message.acked`` means what it means on a broker."""
    to_message = agent.to_message

    def referenced(*args: Any, **kwargs: Any) -> Any:
        message = to_message(*args, **kwargs)
        message.incref()
        return message

    agent.to_message = referenced
    return agent


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for the agent to get there (a put returns once its value entered the stream)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the agent did not get there"
        await asyncio.sleep(0.01)


def parts(batch, size: int):
    return [batch.take(np.arange(i, min(i + size, len(batch)))) for i in range(0, len(batch), size)]


def test_parts_of_a_step_become_its_findings_acknowledged_only_after(tmp_path) -> None:
    sim = ClusterSimulator(Layout(dp=2, tp=4, pp=1), seed=1, job="asm")
    first, second = (s.batch for s in sim.run(2))
    streams, out = make(tmp_path, assembly=AssemblyConfig(settle_s=0.1, max_wait_s=0.3))

    async def run() -> None:
        async with streams.agents["assemble"].test_context() as agent:
            as_from_kafka(agent)
            events = [await agent.put(encode(p), key=job_key("asm")) for p in parts(first, 2)]
            await until(lambda: streams.metrics.messages == 4 and not streams.reading)
            # the job's world is not known yet: step 0 waits (the timer completes it), and
            # its parts stay unacknowledged until its outputs are delivered
            assert streams.metrics.open_steps == 1 and out.sent["findings"] == []
            assert not any(e.message.acked for e in events)
            await asyncio.sleep(0.35)
            await streams.complete_waiting()
            assert all(e.message.acked for e in events)
            # step 1: all 8 ranks (the world learned from step 0) complete it inside the agent
            for p in parts(second, 4):
                await agent.put(encode(p), key=job_key("asm"))
            await until(lambda: len(out.sent["findings"]) == 2)
            await agent.put(b"not a step", key=job_key("asm"))
            await until(lambda: len(out.sent["dead"]) == 1)

    asyncio.run(run())
    assert dict(streams.metrics.steps) == {"timeout": 1, "all_ranks": 1}
    assert streams.metrics.records == 16 and streams.metrics.messages == 7
    # the summary goes out once, from the temporal stage (a step completed twice after a
    # rebalance is a duplicate there): here it travels inside the findings
    assert out.sent["summaries"] == []
    findings = [decode(v, expect=StepFindings) for _, v in out.sent["findings"]]
    assert [(f.job, f.step) for f in findings] == [("asm", 0), ("asm", 1)]
    assert [(f.summary.step, f.summary.ranks) for f in findings] == [(0, 8), (1, 8)]
    assert {k for k, _ in out.sent["findings"]} == {job_key("asm")}
    assert sum(streams.metrics.dead_letters.values()) == 1 and out.sent["anomalies"] == []


def findings_of(job: str, steps: int) -> list[bytes]:
    sim = ClusterSimulator(Layout(dp=2, tp=4, pp=1), seed=2, job=job)
    return [
        step_outputs(CompleteStep(s.batch, (), (), "all_ranks"), DiagnoserConfig())[1] for s in sim.run(steps)
    ]


def test_a_step_that_overtakes_an_earlier_one_waits_for_it_and_a_gap_times_out(tmp_path) -> None:
    job, key = "order", b"order|0"
    found = findings_of(job, 6)
    streams, out = make(tmp_path, start_wait_s=0.0, reorder_wait_s=0.3)
    applied: list[int] = []
    apply = streams.apply

    async def recording_apply(state, step_findings) -> None:
        applied.append(step_findings.step)
        await apply(state, step_findings)

    streams.apply = recording_apply  # type: ignore[method-assign]

    def job_doc() -> dict[str, Any]:
        raw = streams.job_states.get(key)
        return json.loads(raw) if raw else {}

    def at(last: int, held: list[int]) -> Callable[[], bool]:
        return lambda: (
            bool(job_doc()) and (job_doc()["state"]["last_step"], job_doc()["held"]) == (last, held)
        )

    async def run() -> None:
        async with streams.agents["diagnose"].test_context() as agent:
            await agent.put(found[0], key=job_key(job))
            await until(at(0, []))
            await agent.put(found[2], key=job_key(job))  # overtook step 1: held
            await until(at(0, [2]))
            assert streams.held_findings.get(b"order|0|2") == found[2]
            await agent.put(found[1], key=job_key(job))  # the gap fills: 1, then 2
            await until(at(2, []))
            assert streams.held_findings.get(b"order|0|2") is None
            await agent.put(found[1], key=job_key(job))  # replayed: a duplicate, ignored
            await agent.put(found[4], key=job_key(job))  # step 3 never comes
            await until(at(2, [4]))
            await asyncio.sleep(0.35)  # longer than reorder_wait_s
            await agent.put(found[5], key=job_key(job))  # 4 waited long enough: 4, then 5
            await until(at(5, []))

    asyncio.run(run())
    assert applied == [0, 1, 2, 4, 5]
    # one summary per diagnosed step, in order (the replayed step 1 is not summarized again)
    summaries = [decode(v) for _, v in out.sent["summaries"]]
    assert all(isinstance(s, StepSummary) for s in summaries)
    assert [s.step for s in summaries] == [0, 1, 2, 4, 5]
    assert out.sent["dead"] == [] and out.sent["anomalies"] == []


def test_a_held_step_whose_copy_a_killed_worker_lost_is_taken_from_its_replay(tmp_path) -> None:
    """The job's state lists a held step; its copy in the held-findings table is a separate
    write, which a worker killed between the two never made. The step's findings read
    again after the restart are that copy: its summary is sent when the gap fills."""
    job = "kept"
    found = findings_of(job, 3)
    streams, out = make(tmp_path, start_wait_s=0.0, reorder_wait_s=30.0)

    def held() -> list[int]:
        raw = streams.job_states.get(b"kept|0")
        return json.loads(raw)["held"] if raw else []

    async def run() -> None:
        async with streams.agents["diagnose"].test_context() as agent:
            await agent.put(found[0], key=job_key(job))
            await agent.put(found[2], key=job_key(job))  # overtook step 1: held
            await until(lambda: held() == [2])
            del streams.held_findings.data[b"kept|0|2"]  # the copy the killed worker never wrote
            await agent.put(found[2], key=job_key(job))  # read again after the restart
            await until(lambda: streams.held_findings.get(b"kept|0|2") == found[2])
            await agent.put(found[1], key=job_key(job))
            await until(lambda: len(out.sent["summaries"]) == 3)

    asyncio.run(run())
    assert [decode(v).step for _, v in out.sent["summaries"]] == [0, 1, 2]
    assert streams.metrics.summaries["lost"] == 0 and streams.metrics.summaries["duplicate"] == 0


def test_the_findings_topic_takes_findings_and_job_orders_the_rest_is_dead_lettered(tmp_path) -> None:
    """Everything on the findings topic has a schema: the cross-rank stage's StepFindings and
    the expire timer's JobOrder; anything else (garbage, the JSON of older builds, another
    record type, findings these detectors cannot read) is dead-lettered, not a crash."""
    job, key = "ttl", b"ttl|0"
    found = findings_of(job, 1)[0]
    streams, out = make(tmp_path, job_ttl_s=0.2, start_wait_s=0.0)
    summary = decode(found).summary
    bad = {
        "decode": [b"not avro", b'{"expire_job": "ttl", "run": 0}', encode(summary)],
        "invalid": [encode(dataclasses.replace(decode(found), job_median=np.zeros(3)))],
    }

    async def run() -> None:
        async with streams.agents["diagnose"].test_context() as agent:
            await agent.put(found, key=job_key(job))
            await until(lambda: streams.job_states.get(key) is not None)
            for value in bad["decode"] + bad["invalid"]:
                await agent.put(value, key=job_key(job))
            await until(lambda: len(out.sent["dead"]) == 4)
            await asyncio.sleep(0.3)  # the job is silent past its TTL
            await streams.expire_jobs()  # the timer orders it forgotten, through the topic
            (order,) = out.sent["findings"]
            assert decode(order[1]) == JobOrder(job, 0, "expire") and order[0] == job_key(job)
            await agent.put(order[1], key=order[0])
            await until(lambda: streams.job_states.get(key) is None)

    asyncio.run(run())
    reasons = [decode(v).reason for _, v in out.sent["dead"]]
    assert reasons == ["decode"] * 3 + ["invalid"]
    assert [decode(v).step for _, v in out.sent["summaries"]] == [0]


def latest_beat(streams: Streams, job_run: tuple[str, int]) -> int:
    state = streams.hangs.states.get(job_run)
    return int(state.time_ns.max()) if state is not None and state.seen.any() else -1


def test_heartbeats_in_a_hang_anomaly_out_once_the_clock_passes_the_threshold(tmp_path, monkeypatch) -> None:
    sim = HangSimulator(
        Layout(dp=2, tp=4, pp=1),
        HangScenario("collective_hang", at_s=20.0, rank=5),
        job="hung",
        heartbeat_s=1.0,
    )
    streams, out = make(tmp_path)
    clock = [sim.start_ns]
    monkeypatch.setattr(time, "time_ns", lambda: clock[0])  # the detector's clock (detect_hangs)

    offsets = iter(range(10**6))
    fed = [0]

    async def beat_until(t_ns: int) -> None:
        # as the heartbeat intake hands them over: a consumer batch at a time, one not a heartbeat,
        # arriving at t_ns (their times go on the worker's clock: a host's offset is learned
        # from its freshest heartbeat, sent less than a heartbeat period before)
        beats = sim.beats(clock[0], t_ns)
        clock[0] = t_ns
        raw = [RawInput(HEARTBEATS, 0, next(offsets), job_key("hung"), encode(b)) for b in beats]
        junk = RawInput(HEARTBEATS, 0, next(offsets), job_key("hung"), b"not avro")
        for lo in range(0, len(raw), 64):
            batch = [*raw[lo : lo + 64], *([junk] if lo == 0 else [])]
            fed[0] += len(batch)
            await streams.take_heartbeats(batch)
        sent = max(b.time_ns for b in beats)
        assert sent <= latest_beat(streams, ("hung", 0)) < sent + 10**9

    async def run() -> None:
        await beat_until(sim.hang_ns + 2 * 10**9)  # 2 s into the hang: under the 10 s floor
        await streams.detect_hangs()
        assert out.sent["anomalies"] == []
        await beat_until(sim.hang_ns + 30 * 10**9)  # past the threshold
        await streams.detect_hangs()
        await streams.detect_hangs()  # named once; sent again only after hang_update_s

    asyncio.run(run())
    assert streams.metrics.hang_jobs == 1 and streams.metrics.heartbeats > 0
    assert [decode(v).reason for _, v in out.sent["dead"]] == ["decode", "decode"]
    families = metric_families(streams.metrics, {})  # what /metrics shows
    assert families["argus_worker_heartbeats_total"][2][()] == streams.metrics.heartbeats
    assert families["argus_worker_hang_jobs"][2][()] == 1
    assert families["argus_worker_intake_messages_total"][2][(("input", "heartbeats"),)] == fed[0]
    (sent,) = out.sent["anomalies"]
    anomaly = decode(sent[1])
    assert (anomaly.cause, anomaly.level, anomaly.suspect, anomaly.ranks) == ("hang", "hang", "rank:5", (5,))
    assert "all_reduce" in anomaly.summary and streams.metrics.anomalies == {"hang": 1}
