"""The merging core of the node relay and the worker: grouping, the world, the release rule."""

from __future__ import annotations

import numpy as np
import pytest

from argus.schemas import PartMerger, dense_world


def merger(**kw: object) -> PartMerger[int, list[int]]:
    """Parts are their own rank here (the callers' parts are StepBatches and heartbeats)."""
    args: dict[str, object] = {"max_wait_s": 1.0, "new": list, "put": list.append, **kw}
    return PartMerger(**args)  # type: ignore[arg-type]


def add(m: PartMerger[int, list[int]], key: tuple[object, ...], ranks: list[int], now: float) -> list[str]:
    return [reason for reason, _ in m.add(key, ranks[0], ranks, now)]


def test_dense_world_counts_a_rank_only_with_half_the_ranks_below_it() -> None:
    assert dense_world(np.arange(8)) == 8
    assert dense_world(np.array([*range(8), (1 << 20) - 1])) == 8
    assert dense_world(np.array([1, 3, 5, 7])) == 8  # half of a world of 8
    assert dense_world(np.arange(512, 1024)) == 1024  # a late host's ranks first
    assert dense_world(np.array([1 << 19])) == 0
    assert dense_world({7, 0, 1, 2, 3, 4, 5, 6}) == 8  # a group's set of ranks too


def test_a_group_is_released_whole_once_a_released_group_taught_the_world() -> None:
    m = merger()
    for r in range(4):
        assert add(m, ("j", 0, 0), [r], now=0.0) == []  # the world is unknown: no group is whole
    assert m.world(("j", 0)) == 0 and m.due(0.5) == []
    ((reason, group),) = m.due(1.0)
    assert reason == "timeout" and group.parts == [0, 1, 2, 3] and group.ranks == {0, 1, 2, 3}
    assert m.world(("j", 0)) == 0  # released is not yet taught: the caller may refuse the group
    assert m.learn(group.job, m.shows(group)) == 4
    assert [add(m, ("j", 0, 1), [r], now=2.0) for r in (3, 1, 1, 2)] == [[]] * 4  # a rank twice counts once
    assert add(m, ("j", 0, 1), [0], now=2.0) == ["all_ranks"] and not m.groups


def test_an_open_group_that_shows_more_grows_a_known_world() -> None:
    m = merger()
    add(m, ("j", 0, 0), [0, 1], now=0.0)
    ((_, g),) = m.due(1.0)
    m.learn(g.job, m.shows(g))
    assert add(m, ("j", 0, 1), [0, 1, 2], now=2.0) == ["all_ranks"] and m.world(("j", 0)) == 3


def test_due_releases_a_group_that_became_whole_before_its_wait_is_over() -> None:
    m = merger()
    add(m, ("j", 0, 0), [0, 1], now=0.0)
    add(m, ("j", 0, 1), [0, 1], now=0.5)  # the world unknown: it waits too
    ((reason, first),) = m.due(1.0)
    assert reason == "timeout" and first.key == ("j", 0, 0)
    m.learn(first.job, m.shows(first))
    ((reason, second),) = m.due(1.0)
    assert reason == "all_ranks" and second.key == ("j", 0, 1)


def test_dense_ranks_beyond_the_world_complete_nothing_and_a_claim_needs_half_the_ranks() -> None:
    m = merger(dense=True)
    add(m, ("j", 0, 0), list(range(8)), now=0.0)
    ((_, g),) = m.due(1.0)
    assert m.learn(g.job, m.shows(g)) == 8
    # 7 real ranks and one beyond the world: not whole, and the far claim grows nothing
    assert add(m, ("j", 0, 1), [*range(7), 1 << 20], now=2.0) == []
    assert m.world(("j", 0)) == 8
    # ranks 8..15 of a world of 16 (half present): the world grows, the step waits for 16
    assert add(m, ("j", 0, 2), list(range(8, 16)), now=2.0) == [] and m.world(("j", 0)) == 16
    assert add(m, ("j", 0, 2), list(range(8)), now=2.0) == ["all_ranks"]
    # the step with rank 1 << 20: ranks that came outside the world stay outside
    assert add(m, ("j", 0, 1), list(range(7, 16)), now=2.0) == ["all_ranks"]


def test_the_oldest_group_goes_early_beyond_the_bounds() -> None:
    m = merger(max_open=2)
    assert add(m, ("a", 0, 0), [0], 0.0) + add(m, ("b", 0, 0), [0], 0.1) == []
    ((reason, group),) = m.add(("c", 0, 0), 0, [0], 0.2)
    assert reason == "overflow" and group.key == ("a", 0, 0)
    m = merger(max_ranks=3)
    add(m, ("a", 0, 0), [0, 1], 0.0)
    assert add(m, ("b", 0, 0), [0, 1], 0.1) == ["overflow"] and m.ranks_held == 2


def test_job_runs_are_forgotten_when_silent_or_beyond_max_jobs_but_never_while_held() -> None:
    forgotten: list[tuple[str, int]] = []
    m = merger(max_jobs=2, forget_s=10.0, on_forget=forgotten.append)
    add(m, ("a", 0, 0), [0], 0.0)  # held: kept
    add(m, ("b", 0, 0), [0], 0.0)
    m.release(("b", 0, 0))
    add(m, ("c", 0, 0), [0], 0.0)  # a third: the least recently seen one not held goes
    assert forgotten == [("b", 0)]
    m.drain()
    m.touch(("c", 0), 5.0)
    m.due(12.0)  # "a" silent for 12 s, "c" for 7 s
    assert forgotten == [("b", 0), ("a", 0)]


def test_drop_forgets_the_groups_and_learns_nothing() -> None:
    m = merger()
    add(m, ("j", 0, 0), [0, 1], now=0.0)
    (dropped,) = m.drop()
    assert dropped.parts == [0] and not m.groups and m.ranks_held == 0 and m.world(("j", 0)) == 0


@pytest.mark.parametrize("kw", [{"max_wait_s": 0}, {"max_open": 0}, {"max_ranks": 0}, {"forget_s": 0}])
def test_bounds_must_be_positive(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        merger(**kw)
