"""Jobs of the noise space live (issue 32): faults of small jobs the engine missed
outright, and one fault in many anomalies."""

from __future__ import annotations

from argus.detectors import JobDiagnoser
from argus.producers.simulator import draw_job
from argus.schemas import Anomaly


def _live(seed: int, faulty: bool = True) -> list[Anomaly]:
    job = draw_job(seed, faulty=faulty)
    sim = job.simulator()
    diag = JobDiagnoser(sim.job, 0)
    final = {a.id: a for s in sim.run(job.steps) for a in diag.step(s.batch).anomalies}
    final.update((a.id, a) for a in diag.flush())
    return sorted(final.values(), key=lambda a: a.start_step)


def test_a_rank_that_stood_out_now_and_then_slowed_2x_is_paged() -> None:
    """Rank 14 of 16 stood out in 42 % of the steps before (an offset of ~6 % among AR 0.85
    noise), then ran 2.2x slower over steps 1060-1326. Its wait made every rank's step 2.2x
    longer, so the 290 ms it added were 0.35 of that step, under the half a step a baseline
    seen again may add: the fault was taken for its baseline and stayed silent throughout.
    Its own past's change says otherwise."""
    job = draw_job(8_000_285, faulty=True)
    (fault,) = job.faults
    assert list(fault.ranks) == [14] and fault.magnitude > 2
    found = [(a.suspect, a.start_step, a.end_step, a.severity) for a in _live(8_000_285)]
    mine = [f for f in found if f[0] == "rank:14"]
    assert len(mine) == 1, found
    (_, start, end, severity) = mine[0]
    assert abs(start - 1060) <= 3 and abs(end - 1326) <= 5 and severity == "page", found


def test_a_job_rise_that_two_slowed_workers_make_is_theirs() -> None:
    """Two of seven workers (two speed groups) 1.24x slower from step 611: they raised the
    typical rank's work, and the job was paged as a whole a step before their own change
    opened. Their test still building, the rise is theirs: one anomaly, the two ranks. (The
    job's other fault, worker 3 ramping to 1.42x over steps 444-455, is found too since its
    building change no longer teaches its noise model.)"""
    found = [(a.suspect_kind, sorted(a.ranks), a.start_step) for a in _live(8_000_124)]
    late = [f for f in found if f[2] > 100]
    assert [(k, r) for k, r, _ in late] == [("rank", [3]), ("ranks", [4, 6])], found
    assert abs(late[0][2] - 444) <= 3 and abs(late[1][2] - 611) <= 3, found


def test_hosts_whose_ranks_were_baselines_are_one_anomaly_when_they_slow() -> None:
    """Four hosts of a 1,024-rank job 1.33x slower over steps 253-293, some of their ranks
    silent baselines of their (slower) replicas since the start: the change of their stage
    was one anomaly and 21 more, one per rank whose change from its baseline opened with it.
    Then one, named by their stage (``pp:0``, 512 ranks) and sighted to the job's end (step
    429) by those ranks' baseline slowness. It is the four hosts', over 253-293."""
    found = [(a.suspect, a.start_step, a.end_step) for a in _live(8_000_157) if 245 <= a.start_step <= 300]
    assert len(found) == 1 and abs(found[0][1] - 253) <= 3 and abs(found[0][2] - 293) <= 5, found
    assert found[0][0] == "hosts:node-00015,node-00016,node-00017,node-00018", found


def test_shocks_no_longer_than_a_streaky_jobs_own_runs_do_not_page() -> None:
    """A quiet job of 1,024 ranks whose noise is heavy-tailed (Student-t, 1.9 degrees of
    freedom) and autocorrelated (0.94): a rank or two run away from their peers for 10-30
    steps every few dozen steps and come back. A rank's own change opened on such a run in
    a few steps and paged at once (runs of 16 and 26 steps); a change now waits, as a
    z-score's finding does, for the job's own noise streaks to be outlasted. Two ranks
    faster than their peers in the warm-up were paged for 140 steps when they fell back into
    the pack. Two shocks of 50 steps, the rank up to 3x slower, still page."""
    found = _live(7_000_074, faulty=False)
    pages = [(a.suspect, a.start_step, a.end_step) for a in found if a.severity == "page"]
    assert len(pages) <= 2 and all(end - start >= 40 for _, start, end in pages), pages


def test_links_a_speed_group_slows_since_the_start_are_its_baseline() -> None:
    """A 1,024-rank job with 46 % of its ranks 3.9x slower all along (a speed group, their
    episodes silent baselines): the peers that wait for them in their point-to-point calls
    raised 23 links "since the job's start", warnings no one needed. Links slow since the
    start three or more at once are the baseline too; the job's one fault (three hosts
    1.23x over 456-506) is still one page."""
    found = _live(8_000_008)
    assert not [a.suspect for a in found if a.cause == "link_degradation"], found
    fault = [(a.suspect, a.start_step, a.end_step, a.severity) for a in found if a.start_step > 100]
    assert len(fault) == 1 and abs(fault[0][1] - 456) <= 3 and fault[0][3] == "page", fault


def test_one_link_slow_since_the_start_is_still_a_warning() -> None:
    """A link degraded from the job's start (2.5x on the pair 9<->17 of a 64-rank job), the
    only one: a fault of the start, not a speed group's waits: a warning, since the start."""
    from argus.producers.simulator import ClusterSimulator, Fault, Layout

    fault = Fault("link_degradation", 0, 200, (9, 17), magnitude=2.5)
    sim = ClusterSimulator(Layout(dp=8, tp=4, pp=2), seed=11, job="t", faults=[fault])
    diag = JobDiagnoser("t")
    final = {a.id: a for s in sim.run(200) for a in diag.step(s.batch).anomalies}
    final.update((a.id, a) for a in diag.flush())
    found = [(a.cause, a.severity, bool(a.evidence.get("persistent"))) for a in final.values()]
    assert found == [("link_degradation", "warn", True)], found


def test_a_stage_ramping_is_the_stage_s_finding_not_its_ranks() -> None:
    """A pipeline stage of a 1,024-rank job (256 ranks) slowing by degrees to 1.3x over
    steps 109-188: against their stage's peers its ranks do not move, against their
    replicas' (across the stages) they cross the line one by one. That was six anomalies of
    one or two of its ranks, paged, beside the stage's imbalance. A change seen against the
    replica only is the stage's: one anomaly, the stage's."""
    found = [(a.suspect, a.cause, a.start_step) for a in _live(8_000_121) if 100 <= a.start_step <= 190]
    assert [(s, c) for s, c, _ in found] == [("pp:3", "pipeline_stage_imbalance")], found
