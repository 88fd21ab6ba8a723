"""producers/simulator/_fleet.py: a fleet of random placements, bad nodes that act only after
their onset and only on the jobs they host, steps named after the fleet's nodes, and NVML
samples that carry what each kind of bad node shows."""

from __future__ import annotations

import numpy as np
import pytest

from argus.producers.simulator import (
    BAD_NODE_KINDS,
    COMPUTE_STRAGGLER,
    HOST_CPU_CONTENTION,
    LINK_DEGRADATION,
    THROTTLE_REASONS,
    FleetSimulator,
)


@pytest.fixture(scope="module")
def fleet() -> FleetSimulator:
    return FleetSimulator(nodes=40, jobs=300, days=10, bad_nodes=4, seed=3, manifest=1.0)


def test_the_same_seed_gives_the_same_fleet(fleet: FleetSimulator) -> None:
    again = FleetSimulator(nodes=40, jobs=300, days=10, bad_nodes=4, seed=3, manifest=1.0)
    assert again.bad == fleet.bad and again.jobs == fleet.jobs
    assert FleetSimulator(nodes=40, jobs=300, days=10, bad_nodes=4, seed=4).jobs != fleet.jobs


def test_bad_nodes_of_every_kind_act_after_their_onset_on_the_jobs_they_host(fleet: FleetSimulator) -> None:
    assert sorted(b.kind for b in fleet.bad) == sorted(BAD_NODE_KINDS)
    onset = {b.node: b.onset_ns for b in fleet.bad}
    for job in fleet.jobs:
        hosted = [n for n in job.nodes if n in onset and onset[n] <= job.start_ns]
        assert sorted(job.bad) == sorted(hosted)  # manifest=1: every job it hosts after its onset
        assert len(set(job.nodes)) == len(job.nodes)
    kinds = {b.kind: b for b in fleet.bad}
    slowed = {
        "slow_gpu": COMPUTE_STRAGGLER,
        "throttling": COMPUTE_STRAGGLER,
        "flaky_link": LINK_DEGRADATION,
        "starved_loaders": HOST_CPU_CONTENTION,
    }
    for kind, cause in slowed.items():
        jobs = [j for j in fleet.jobs if kinds[kind].node in j.bad]
        assert jobs, kind
        for j in jobs:
            h = j.nodes.index(kinds[kind].node)
            mine = [
                f
                for f in j.faults
                if f.kind == cause and (f.host == h or any(r // j.layout.gpus_per_host == h for r in f.ranks))
            ]
            assert mine, (kind, j.job)


def test_steps_name_the_fleet_nodes_and_gpus_the_job_was_placed_on(fleet: FleetSimulator) -> None:
    job = fleet.jobs[0]
    first = next(fleet.run(job))
    hosts = first.batch["host"]
    per_host = job.layout.gpus_per_host
    assert [str(hosts[i * per_host]) for i in range(len(job.nodes))] == [
        fleet.node_names[n] for n in job.nodes
    ]
    uuids = first.batch["gpu_uuid"]
    assert len(set(uuids.tolist())) == job.layout.n_ranks
    assert str(uuids[per_host + 2]) == fleet.gpu_uuids[job.nodes[1]][2]
    assert int(first.batch["start_ns"].min()) >= job.start_ns


def test_health_samples_show_throttling_and_link_errors_only_on_their_bad_nodes(
    fleet: FleetSimulator,
) -> None:
    kinds = {b.kind: b for b in fleet.bad}
    throttled: dict[str, int] = {}
    link_errors: dict[str, int] = {}
    for batch in fleet.gpu_samples():
        for s in batch:
            if s.clock_event_reasons & (0x40 | 0x08):  # hardware thermal slowdown or hardware slowdown
                throttled[s.host] = throttled.get(s.host, 0) + 1
                assert s.time_ns >= kinds["throttling"].onset_ns
            link_errors[s.host] = max(link_errors.get(s.host, 0), s.nvlink_errors)
    assert set(throttled) == {fleet.node_names[kinds["throttling"].node]}
    assert {h for h, n in link_errors.items() if n} == {fleet.node_names[kinds["flaky_link"].node]}
    assert THROTTLE_REASONS & 0x40 and not THROTTLE_REASONS & 0x01  # idle is no throttling


def test_a_fleet_too_small_or_jobs_too_short_are_refused() -> None:
    with pytest.raises(ValueError, match="16 nodes"):
        FleetSimulator(nodes=8, jobs=10)
    with pytest.raises(ValueError, match="60 steps"):
        FleetSimulator(nodes=40, jobs=10, steps=(20, 40))
    assert np.isfinite(FleetSimulator(nodes=16, jobs=1, bad_nodes=0).end_ns)
