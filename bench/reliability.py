"""Reliability at full size: every scenario of issue 9 on the real broker and store.

The scenarios live once, as tests (tests/producers/test_publisher_outage.py,
tests/streams/test_worker.py, tests/sinks/test_kafka_sink.py, tests/producers/test_relay.py,
tests/streams/test_load.py, tests/security/test_fuzz.py); CI runs them small, this bench runs them at full size through
their environment knobs and tabulates the figures each prints (``ARGUS-FIGURES {...}``):

| scenario | full | --quick |
| --- | --- | --- |
| broker outage (real agent + spool) | 60 s | 15 s |
| worker SIGKILL and restart | 70 steps, 4 faults | same |
| store outage (sink retries) | 30 s, 400 steps | 10 s, 100 steps |
| garbage on the steps topic | 5 hostile messages | same |
| node relay stopped and restarted twice under 8 live ranks | 60 s at 20 steps/s | 15 s |
| 2x the throughput goal | 10 min | 2 min |
| property-based fuzzing | 10,000 cases per property | 2,000 |
| torn spool + disk-full spool (replayed through the broker) | 20,000 records each | 2,000 |
| forged relay sender (user nobody) beside 8 healthy ranks | 200 steps | 20 |
| a poison record per topic (19) while two healthy jobs run, worker + sink | 50 steps x 64 ranks each | same |
| a hung job whose stack has a 5,000-character frame | one hang | same |
| a sink replay cut by other chunks (rollups checked) | 6 batches | same |
| pipeline fuzzers: bytes → decode → worker stage → sink rows | 10,000 cases per record type | same |
| a claimed-size bomb and a forged record of every type on every topic (sink, decoder) | 15 bombs, 69 forged | same |
| broker outage under the real Publisher (8 ranks, 5 steps/s) + producer retries, rollups vs `steps FINAL` | 60 s | 15 s |
| a re-cut redelivery and producer retries, rollups vs `steps FINAL` | 10 steps | same |
| a 1,024-rank job (64 ranks a message) through the worker while 2 processes burn the CPU | 1,000 steps | 300 |
| a step whose findings come after its job moved on; a record 50,000 steps ahead | 100 / 420 steps | same |
| skewed host clocks (60 s behind, 1 h ahead): a healthy and a hung job, live | 45 s | 30 s |
| an upgrade mid-job: the previous build's worker, then this one, from the changelog | 80 steps, 3 faults | same |

    python bench/reliability.py [--quick | --smoke]

Last line: JSON with lost_total, duplicated_total, crashes, max_step_delay_ms, hostile_records
(hostile input sent) and dead_lettered (of it, dead-lettered or refused with a counter),
rollup_excess (rows the rollups count beyond ``steps FINAL``) and forged_stored (records
stored from a topic that does not carry their type), summaries_missing (steps the worker
completed without a summary on ``argus.step-summaries``) and skew_false_pages (hang pages
caused by skewed clocks).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREFIX = "ARGUS-FIGURES "


def run(tests: list[str], env: dict[str, str], timeout: float) -> tuple[bool, list[dict], float, str]:
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *tests],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    # a test's line may follow pytest's progress dots of the tests before it: ".ARGUS-FIGURES {...}"
    figures = [json.loads(ln.split(PREFIX, 1)[1]) for ln in proc.stdout.splitlines() if PREFIX in ln]
    tail = "\n".join(proc.stdout.splitlines()[-15:])
    return proc.returncode == 0, figures, time.monotonic() - began, tail


Scenario = tuple[str, list[str], dict[str, str]]
"""A scenario's name, the tests that run it and their environment knobs."""


def issue9_scenarios(quick: bool) -> list[Scenario]:
    """Issue 9: outages, a worker crash, garbage, a relay restart, load, fuzzing."""
    q = quick
    return [
        (
            "broker outage",
            ["tests/producers/test_publisher_outage.py"],
            {"ARGUS_TEST_OUTAGE_S": "15" if q else "60"},
        ),
        (
            "worker crash",
            ["tests/streams/test_worker.py::test_sigkill_and_restart_emit_the_same_anomalies"],
            {},
        ),
        (
            "store outage",
            ["tests/sinks/test_kafka_sink.py::test_store_outage_is_retried_until_it_returns"],
            {
                "ARGUS_TEST_STORE_OUTAGE_S": "10" if q else "30",
                "ARGUS_TEST_STORE_STEPS": "100" if q else "400",
            },
        ),
        (
            "hostile input",
            [
                "tests/streams/test_worker.py::"
                "test_garbage_on_the_steps_topic_goes_to_dead_letters_and_the_worker_goes_on"
            ],
            {},
        ),
        (
            "relay restart",
            [
                "tests/producers/test_relay.py::test_a_relay_restart_under_live_ranks_loses_and_doubles_nothing"
            ],
            {"ARGUS_TEST_RELAY_S": "15" if q else "60"},
        ),
        ("load 2x", ["tests/streams/test_load.py"], {"ARGUS_TEST_LOAD_S": "120" if q else "600"}),
        ("fuzzing", ["tests/security/test_fuzz.py"], {"ARGUS_FUZZ_EXAMPLES": "2000" if q else "10000"}),
    ]


def hostile_input_scenarios(quick: bool) -> list[Scenario]:
    """Issue 17: a poison record per topic while healthy jobs run (worker, broker, sink,
    chDB), a hung job with a long frame, a replay cut by other chunks, the pipeline fuzzers."""
    return [
        (
            "poison on every topic",
            [
                "tests/security/test_hostile.py::test_poison_on_every_topic_while_healthy_jobs_run",
                "tests/security/test_hostile.py::test_a_hung_job_with_a_long_frame_is_named_and_the_worker_lives",
            ],
            {},
        ),
        (
            "replay, other chunks",
            [
                "tests/sinks/test_kafka_sink.py::"
                "test_a_replay_cut_by_other_chunks_ends_at_the_recorded_offset_and_rollups_count_once"
            ],
            {},
        ),
        (
            "pipeline fuzzers",
            ["tests/security/test_pipeline_fuzz.py"],
            {"ARGUS_FUZZ_PIPELINE_CASES": "10000"},
        ),
    ]


def spool_and_relay_scenarios(quick: bool) -> list[Scenario]:
    """Issue 17: a torn spool and a disk-full spool replayed through the real broker, and a
    forged sender (user nobody) on the node relay while 8 healthy ranks publish."""
    return [
        (
            "torn + disk-full spool",
            ["tests/producers/test_publisher_spool_faults.py"],
            {"ARGUS_TEST_SPOOL_RECORDS": "2000" if quick else "20000"},
        ),
        (
            "forged relay sender",
            [
                "tests/producers/test_relay.py::test_a_forged_sender_is_refused_while_healthy_ranks_lose_nothing"
            ],
            {"ARGUS_TEST_FORGED_STEPS": "20" if quick else "200"},
        ),
    ]


def sink_integrity_scenarios(quick: bool) -> list[Scenario]:
    """Issue 34, items 2, 4, 5: claimed-size bombs and forged records on every topic; rollups
    exact through a broker outage, a re-cut redelivery and producer retries."""
    return [
        (
            "bombs + forged",
            [
                "tests/sinks/test_kafka_sink.py::"
                "test_each_topic_stores_only_its_own_records_and_size_bombs_are_dead_lettered",
                "tests/schemas/test_codec.py::test_no_claimed_size_bomb_escapes_the_error_tree",
            ],
            {},
        ),
        (
            "outage, rollups",
            [
                "tests/sinks/test_kafka_sink.py::test_rollups_stay_exact_through_a_broker_outage_and_producer_retries",
                "tests/sinks/test_kafka_sink.py::"
                "test_rollups_count_each_row_once_after_a_re_cut_redelivery_and_a_producer_retry",
            ],
            {"ARGUS_TEST_ROLLUP_OUTAGE_S": "15" if quick else "60"},
        ),
    ]


def stream_integrity_scenarios(quick: bool) -> list[Scenario]:
    """Issue 34, items 1, 3, 6, 13: every step summarized once under load; a late step and
    a far-ahead record; skewed host clocks; an upgrade mid-job."""
    return [
        (
            "1,024 ranks, loaded",
            [
                "tests/streams/test_summaries.py::"
                "test_a_1024_rank_job_replayed_on_a_loaded_machine_has_one_summary_per_step"
            ],
            {"ARGUS_TEST_SUMMARY_STEPS": "300" if quick else "1000"},
        ),
        (
            "late + far-ahead steps",
            [
                "tests/streams/test_summaries.py::"
                "test_a_step_whose_findings_come_after_the_job_moved_on_still_gets_its_one_summary",
                "tests/streams/test_far_ahead.py",
            ],
            {},
        ),
        (
            "skewed clocks",
            [
                "tests/streams/test_hang_worker.py::"
                "test_skewed_host_clocks_neither_page_nor_hide_a_hang_in_the_worker"
            ],
            {"ARGUS_TEST_SKEW_S": "30" if quick else "45"},
        ),
        (
            "upgrade mid-job",
            [
                "tests/streams/test_state_upgrade.py::test_an_upgrade_mid_job_finishes_it_with_the_same_anomalies"
            ],
            {},
        ),
    ]


SCENARIOS: list[Callable[[bool], list[Scenario]]] = [
    issue9_scenarios,
    spool_and_relay_scenarios,
    hostile_input_scenarios,
    sink_integrity_scenarios,
    stream_integrity_scenarios,
]
"""The registry: each function gives its scenarios for ``--quick`` or full size; append yours."""
SMOKE_SCENARIO = "replay, other chunks"
"""What ``--smoke`` runs: one short scenario through the broker, the sink and chDB."""


def main() -> None:
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true")
    g.add_argument("--smoke", action="store_true", help="one quick scenario: the bench runs (CI)")
    args = ap.parse_args()
    scenarios = [s for make in SCENARIOS for s in make(args.quick or args.smoke)]
    if args.smoke:
        scenarios = [s for s in scenarios if s[0] == SMOKE_SCENARIO] or scenarios[:1]
    rows = []
    crashes = 0
    for name, tests, env in scenarios:
        print(f"running {name} ...", flush=True)
        ok, figures, seconds, tail = run(tests, env, timeout=3600)
        if not ok:
            crashes += 1
            print(f"  FAILED after {seconds:.0f} s:\n{tail}", flush=True)
        if not figures:
            figures = [{"scenario": name}]
        for f in figures:
            f["passed"] = ok
            f["seconds"] = round(seconds, 1)
            f.setdefault("crashes", 0 if ok else 1)
            rows.append(f)
    print()
    head = (
        f"{'scenario':<22} {'sent':>10} {'received':>10} {'lost':>6} {'dup':>5} {'max step delay ms':>18} "
        f"{'worker RSS MB':>14} {'passed':>7} {'s':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['scenario']:<22} {r.get('sent', '-'):>10} {r.get('received', '-'):>10} {r.get('lost', '-'):>6} "
            f"{r.get('duplicated', '-'):>5} {r.get('max_step_delay_ms', '-'):>18} {r.get('worker_rss_mb', '-'):>14} "
            f"{'yes' if r['passed'] else 'NO':>7} {r['seconds']:>6}"
        )
    delays = [r["max_step_delay_ms"] for r in rows if "max_step_delay_ms" in r]
    print(
        json.dumps(
            {
                "lost_total": sum(r.get("lost", 0) for r in rows),
                "duplicated_total": sum(r.get("duplicated", 0) for r in rows),
                "crashes": crashes + sum(r.get("crashes", 0) for r in rows if r["passed"]),
                "max_step_delay_ms": max(delays) if delays else None,
                "hostile_records": sum(r.get("hostile_records", 0) for r in rows),
                "dead_lettered": sum(r.get("dead_lettered", 0) for r in rows),
                "rollup_excess": sum(r.get("rollup_excess", 0) for r in rows),
                "forged_stored": sum(r.get("forged_stored", 0) for r in rows),
                "summaries_missing": sum(r.get("summaries_missing", 0) for r in rows),
                "skew_false_pages": sum(r.get("skew_false_pages", 0) for r in rows),
                "scenarios": len(scenarios),
                "failed": [r["scenario"] for r in rows if not r["passed"]],
            }
        )
    )


if __name__ == "__main__":
    main()
