"""The temporal stage's reordering rule."""

from __future__ import annotations

from argus.streams.ordering import next_in_order


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
