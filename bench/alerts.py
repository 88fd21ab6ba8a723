"""The provisioned alert rules on a replayed timeline: who is paged, when, how often.

Simulated jobs diagnosed by the real detectors (a straggler that grows, closes and recurs; a
second job's straggler meanwhile; warn-only anomalies; transients; a quiet job; a 20-minute
hang; a lost rank; a declared checkpoint: :func:`argus.alert_timeline.scenarios`), their
records written through the sink's path into a fresh embedded ClickHouse as they would arrive,
and every rule of deploy/grafana/provisioning/alerting/argus.yaml evaluated each interval as
Grafana evaluates it (:mod:`argus.sinks.grafana.evaluation`). Prints a table rule × scenario
(fired at, resolved at, in minutes from the start; alert instances), one line per stored page
anomaly, how the stored anomalies compare with what was injected (the detectors' part), then
one JSON line: ``alert_instances_per_fault_max``, ``false_pages``, ``fire_delay_evals_max``,
``resolve_delay_min_max`` and the rest of :meth:`TimelineReport.summary`.

    .venv/bin/python bench/alerts.py [--quick | --smoke]

``--quick``: 45 minutes (no declared checkpoint past its end), ``--smoke``: 30 minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from argus.alert_timeline import rule_models, run_timeline, scenarios
from argus.sinks import ChdbStore, migrate

RULES = (
    Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "provisioning" / "alerting" / "argus.yaml"
)


def _times(values: list[float | None]) -> str:
    return ", ".join("-" if v is None else f"{v:g}" for v in values) or "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a 45-minute timeline")
    size.add_argument("--smoke", action="store_true", help="a 30-minute timeline")
    args = ap.parse_args()
    minutes = 30 if args.smoke else 45 if args.quick else 60
    tag = uuid.uuid4().hex[:8]

    t0 = time.perf_counter()
    scs = scenarios(tag, minutes)
    t_sim = time.perf_counter() - t0
    rules = rule_models(yaml.safe_load(RULES.read_text()))
    with tempfile.TemporaryDirectory(prefix="argus-alerts-") as folder:
        store = ChdbStore(folder)
        try:
            migrate(store)
            t0 = time.perf_counter()
            report = run_timeline(store, scs, rules, minutes=minutes, tag=tag)
            t_eval = time.perf_counter() - t0
        finally:
            store.close()

    print(
        f"{minutes}-minute timeline, {len(scs)} jobs, {len(rules)} rules evaluated every "
        f"{rules[0].interval_s:g} s ({report.evaluations} evaluations)"
    )
    print()
    print(f"{'rule':<18} {'scenario':<12} {'fired at (min)':<16} {'resolved at (min)':<18} instances")
    for row in report.table:
        print(
            f"{row['rule']:<18} {row['scenario']:<12} {_times(row['fired_at']):<16} "
            f"{_times(row['resolved_at']):<18} {row['instances']}"
        )
    print()
    print(f"{'rule':<18} {'scenario':<12} {'suspect':<10} inst pages fire_delay_evals resolve_delay_min")
    for f in report.faults:
        delay = "-" if f.resolve_delay_min is None else f"{f.resolve_delay_min:.1f}"
        print(
            f"{f.rule:<18} {f.scenario:<12} {f.suspect:<10} {f.instances:>4} {f.pages:>5} "
            f"{'-' if f.fire_delay_evals is None else f.fire_delay_evals:>16} {delay:>17}"
        )
    for row in report.false_pages:
        print(f"FALSE PAGE {row}")
    for kind, items in report.detector.items():
        for item in items:
            print(f"detector {kind}: {item}")
    for err in report.errors[:5]:
        print(f"query error: {err}")
    print()
    out = {
        **report.summary(),
        "minutes": minutes,
        "simulate_s": round(t_sim, 1),
        "evaluate_s": round(t_eval, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
