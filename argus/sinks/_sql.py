"""SQL expressions that the DDL migrations and the dashboard/report queries share.

Each concept is written here once, from the schema's column lists, and filled into both:
the migrations name it as ``{busy_ms}``, ``{collective_ms}`` or ``{rank_minutely_sums}``
(see :func:`argus.sinks.migrate.migrations`), the queries use the constants.

A migration already applied to a store is never run again there, but a fresh store runs
every migration: what a name below expands to is part of every migration that uses it.
``tests/sinks/test_migrate.py`` pins each migration's rendered text, so a change here that
would alter an applied migration fails there (write the change as a new migration, and the
text the old ones had as a literal in them).
"""

from __future__ import annotations

from argus.schemas import COLLECTIVE_COLUMNS, PHASE_COLUMNS

__all__ = ["BUSY_MS", "COLLECTIVE_MS", "DDL_FRAGMENTS", "RANK_MINUTELY_SUMS"]

COLLECTIVE_MS = "(" + " + ".join(COLLECTIVE_COLUMNS) + ")"
"""A step's time in collectives: the sum of the collective columns."""

BUSY_MS = f"(steps.step_ms - {COLLECTIVE_MS})"
"""Time a rank spends outside collectives: the straggler is the rank that waits least.
Qualified (``steps.``) because a rollup's SELECT names its own ``step_ms`` aggregate."""

RANK_MINUTELY_SUMS = ",\n       ".join(
    (
        f"sum(steps.step_ms) AS step_sum, sum({BUSY_MS}) AS busy_sum, sum({COLLECTIVE_MS}) AS collective_sum",
        ", ".join(f"sum({c}) AS {c.removesuffix('_ms')}_sum" for c in PHASE_COLUMNS),
    )
)
"""The sums of ``steps_rank_minutely`` (step, busy, collective and every phase), as its
materialized view and its backfill select them."""

DDL_FRAGMENTS = {"busy_ms": BUSY_MS, "collective_ms": COLLECTIVE_MS, "rank_minutely_sums": RANK_MINUTELY_SUMS}
"""What ``{name}`` in a migration stands for."""
