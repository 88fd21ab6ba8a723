"""The temporal stage's reordering rule."""

from __future__ import annotations

from streams.ordering import next_in_order


def test_in_order_steps_go_at_once_and_early_ones_wait() -> None:
    assert next_in_order(-1, {0}) == 0
    assert next_in_order(9, {10, 12}) == 10
    assert next_in_order(9, {11, 12}) is None
    assert next_in_order(9, set()) is None


def test_a_lost_step_is_given_up_after_max_held_later_steps() -> None:
    held = set(range(11, 20))  # step 10 never comes
    assert next_in_order(9, held, max_held=8) == 11
    assert next_in_order(9, set(range(11, 19)), max_held=8) is None
