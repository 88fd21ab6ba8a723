"""The temporal stage's reordering rule."""

from __future__ import annotations

import pytest

from argus.streams.ordering import AHEAD_FLOOR, Pace, Reorderer, add_gap, next_in_order, take_late


def test_in_order_steps_go_at_once_and_early_ones_wait() -> None:
    assert next_in_order(-1, {0}) == 0
    assert next_in_order(9, {10, 12}) == 10
    assert next_in_order(9, {11, 12}, waited_s=29.0) is None
    assert next_in_order(9, set()) is None


def test_a_job_seen_mid_run_starts_at_its_first_step_after_the_start_wait() -> None:
    assert next_in_order(-1, {1000, 1002}) is None
    assert next_in_order(-1, {1000, 1002}, waited_s=4.9) is None  # an earlier step may still come
    assert next_in_order(-1, {1000, 1002}, waited_s=5.0) == 1000
    assert next_in_order(-1, {1000}, waited_s=1.0, start_wait_s=1.0) == 1000


def test_a_lost_step_is_given_up_after_waiting_or_holding_too_many() -> None:
    assert next_in_order(9, set(range(11, 20)), max_held=8) == 11  # step 10 never comes
    assert next_in_order(9, set(range(11, 19)), max_held=8) is None
    assert next_in_order(9, {11}, waited_s=31.0, max_wait_s=30.0) == 11


def test_the_reorderer_hands_out_held_steps_in_order_on_its_own_clock() -> None:
    r = Reorderer(max_held=8, max_wait_s=30.0, start_wait_s=5.0)
    held: set[int] = set()
    r.hold("job", held, 10, now=100.0)  # seen mid-run: an earlier step may still come
    assert r.release("job", held, -1, now=104.0) is None
    assert r.release("job", held, -1, now=105.0) == 10 and held == set()
    r.hold("job", held, 12, now=106.0)
    assert r.release("job", held, 10, now=106.0) is None  # step 11 may still come
    r.hold("job", held, 11, now=107.0)
    assert [r.release("job", held, last, now=107.0) for last in (10, 11, 12)] == [11, 12, None]
    r.hold("job", held, 14, now=110.0)  # step 13 never comes
    assert r.release("job", held, 12, now=139.0) is None
    assert r.release("job", held, 12, now=140.0) == 14


def test_steps_restored_from_the_table_wait_afresh_and_a_forgotten_job_starts_over() -> None:
    r = Reorderer(max_wait_s=30.0)
    held = {5, 6}  # held before a restart, listed in the job's state
    assert not r.knows("job")
    r.hold("job", held, 7, now=1000.0)
    assert r.knows("job") and r.release("job", held, 3, now=1029.0) is None
    assert r.release("job", held, 3, now=1030.0) == 5
    r.forget("job")
    assert not r.knows("job")


def test_given_up_steps_are_kept_as_gaps_so_a_late_one_is_told_from_a_duplicate() -> None:
    gaps: list[list[int]] = []
    assert add_gap(gaps, 5, 4) == [] and gaps == []  # no step between
    add_gap(gaps, 10, 12)
    add_gap(gaps, 13, 13)  # adjacent: one range
    add_gap(gaps, 20, 20)
    assert gaps == [[10, 13], [20, 20]]
    assert take_late(gaps, 11) and gaps == [[10, 10], [12, 13], [20, 20]]
    assert not take_late(gaps, 11)  # the second copy is a duplicate
    assert not take_late(gaps, 9) and not take_late(gaps, 15) and not take_late(gaps, 21)
    assert take_late(gaps, 20) and take_late(gaps, 10) and gaps == [[12, 13]]
    dropped = [add_gap(gaps, 100 + 2 * i, 100 + 2 * i, max_gaps=3) for i in range(4)]
    assert gaps == [[102, 102], [104, 104], [106, 106]]
    assert dropped[2] == [[12, 13]] and dropped[3] == [[100, 100]]  # the oldest go first


def test_held_bytes_bound_the_wait_like_the_count() -> None:
    assert next_in_order(9, {11, 12}, held_bytes=100, max_held_bytes=100) is None
    assert next_in_order(9, {11, 12}, held_bytes=101, max_held_bytes=100) == 11
    r = Reorderer(max_held=1000, max_held_bytes=100, max_wait_s=30.0)
    held: set[int] = set()
    r.hold("j", held, 11, 0.0)
    assert r.release("j", held, 9, 1.0, held_bytes=50) is None
    assert r.release("j", held, 9, 1.0, held_bytes=150) == 11 and held == set()


def test_the_pace_allows_what_the_job_could_have_run_since_its_frontier_moved() -> None:
    pace = Pace()
    assert not pace.too_far(10**9, 0.0)  # no frontier yet: nothing to judge by
    for i in range(101):
        pace.advance(i, 100.0 + 0.1 * i)  # 10 steps/s
    assert pace.steps_per_s() == pytest.approx(10.0)
    assert not pace.too_far(100 + AHEAD_FLOOR, 110.0)
    assert pace.too_far(100 + 50_000, 110.0)
    assert not pace.too_far(100 + 50_000, 110.0 + 3600.0)  # an hour on, it may be there
    assert Pace.from_list(pace.to_list()).to_list() == pace.to_list() and Pace.from_list(None).frontier == -1
