"""The fault matcher shared by the demo and bench/diagnosis.py."""

from __future__ import annotations

import pytest

from argus.producers.simulator import Label
from argus.producers.simulator.scoring import match_faults, window_iou
from argus.schemas import Anomaly


def anomaly(
    cause: str, suspect_kind: str, suspect: str, start: int, end: int, ranks: tuple[int, ...] = ()
) -> Anomaly:
    return Anomaly(
        id=f"{cause}|{suspect}|{start}",
        job="j",
        run=0,
        start_step=start,
        end_step=end,
        level="cross_rank",
        suspect_kind=suspect_kind,
        suspect=suspect,
        ranks=ranks,
        cause=cause,
        score=5.0,
    )


def test_window_iou_of_inclusive_windows() -> None:
    assert window_iou(10, 39, 10, 39) == 1.0
    assert window_iou(10, 11, 10, 39) == pytest.approx(2 / 30)  # "steps 10-11" for a 30-step fault
    assert window_iou(0, 9, 10, 19) == 0.0
    assert window_iou(5, 5, 5, 5) == 1.0
    assert window_iou(12, 21, 10, 19) == pytest.approx(8 / 12)


def test_a_right_match_needs_place_time_and_class() -> None:
    labels = [Label("compute_straggler", 10, 39, "rank", "rank:2", (2,))]
    found = [
        anomaly("compute_straggler", "rank", "rank:2", 10, 38, (2,)),  # right
        anomaly("dataloader_stall", "rank", "rank:0", 12, 12, (0,)),  # elsewhere: extra
        anomaly("compute_straggler", "rank", "rank:2", 50, 52, (2,)),  # later: extra
        anomaly("link_degradation", "rank", "rank:2", 20, 25, (2,)),  # same place, other class: wrong
    ]
    s = match_faults(found, labels)
    assert [(m.anomaly, m.label, m.right) for m in s.matches] == [(0, 0, True), (3, 0, False)]
    assert s.matches[0].iou == pytest.approx(29 / 30)
    assert s.extras == (1, 2) and s.wrong == (3,) and s.misses == ()
    assert s.right_anomalies == {0} and not s.ok()
    assert match_faults(found[:1], labels).ok()
    assert match_faults(found[:1], labels).ok(min_iou=0.99) is False


def test_a_host_anomaly_matches_every_per_rank_label_of_its_host() -> None:
    ranks = tuple(range(8, 16))
    labels = [Label("compute_straggler", 100, 2999, "rank", f"rank:{r}", (r,)) for r in ranks]
    host = anomaly("compute_straggler", "host", "node-00001", 100, 2999, ranks)
    s = match_faults([host], labels)
    assert len(s.matches) == 8 and all(m.right and m.iou == 1.0 for m in s.matches)
    assert s.anomalies_per_fault() == [1] * 8 and s.ok()
    # and a host label (host CPU contention) is matched by the host's name alone
    busy = Label("host_cpu_contention", 44, 57, "host", "node-00300", ranks)
    named = anomaly("host_cpu_contention", "host", "node-00300", 44, 57)
    assert match_faults([named], [busy]).ok()


def test_fragments_each_match_with_their_own_small_window() -> None:
    labels = [Label("compute_straggler", 100, 299, "rank", "rank:7", (7,))]
    pieces = [anomaly("compute_straggler", "rank", "rank:7", s, s + 2, (7,)) for s in range(100, 300, 40)]
    s = match_faults(pieces, labels)
    assert s.anomalies_per_fault() == [5] and s.extras == () and s.misses == ()
    assert s.iou_min == pytest.approx(3 / 200) and not s.ok()


def test_group_level_faults_and_a_missed_fault() -> None:
    labels = [
        Label("pipeline_stage_imbalance", 0, 63, "stage", "pp:1"),
        Label("sequence_length_imbalance", 26, 39, "dp_group", "dp"),
        Label("link_degradation", 8, 21, "link", "node-00001<->node-00002", (8, 16)),
    ]
    found = [
        anomaly("pipeline_stage_imbalance", "stage", "pp:1", 0, 63),
        anomaly("sequence_length_imbalance", "job", "dp", 27, 39),
        anomaly("link_degradation", "rank", "rank:16", 30, 33, (16,)),  # after the link's window
    ]
    s = match_faults(found, labels)
    assert s.misses == (2,) and s.extras == (2,)
    right = {(m.anomaly, m.label) for m in s.matches if m.right}
    assert right == {(0, 0), (1, 1)}
    # a group-level anomaly meets every group-level label of its time: a wrong-class pair too
    assert {(m.anomaly, m.label) for m in s.matches if not m.right} == {(0, 1), (1, 0)}
    assert s.wrong == ()  # each has a right match besides
    # with slack, a late anomaly still meets the window (its IoU stays 0)
    late = match_faults(found[2:], labels[2:], slack=9)
    assert late.misses == () and late.iou_min == 0.0


def test_accepted_classes_for_a_label() -> None:
    labels = [Label("compute_straggler", 10, 39, "rank", "rank:2", (2,))]
    masked = [anomaly("masked_compute_straggler", "rank", "rank:2", 10, 39, (2,))]
    assert match_faults(masked, labels).wrong == (0,)
    s = match_faults(masked, labels, accept={"compute_straggler": {"masked_compute_straggler"}})
    assert s.ok() and s.wrong == ()


def test_nothing_injected_and_nothing_found_is_ok() -> None:
    assert match_faults([], []).ok()
    assert match_faults([anomaly("gc_pause", "rank", "rank:1", 5, 5, (1,))], []).extras == (0,)
