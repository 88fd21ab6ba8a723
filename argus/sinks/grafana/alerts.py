"""The alert rules Grafana pages from: one row per alert instance, its labels fixed for the
life of what it reports (see :class:`AlertRule`)."""

from __future__ import annotations

from ._panels import AlertRule

__all__ = ["ACTIVE_S", "ALERTS", "RESENT_S", "SCAN_S", "TEAM"]

TEAM = "if(position(job, '/') > 0, splitByChar('/', job)[1], 'platform')"
"""The team a job belongs to: the part of its name before the first ``/`` (``llm/pretrain-70b``
is team ``llm``), else ``platform``: the notification policy routes pages by it."""

ACTIVE_S = 180
"""A slow-rank anomaly pages while its suspect was last seen slow at most this long ago (the
time of its latest version's ``end_step`` in ``step_summaries``)."""
RESENT_S = 150
"""A hang or lost-rank anomaly pages while its latest version is at most this old: the worker
re-sends it every 60 s while the job is stalled (``streams.hangs.HangTracker.update_s``)."""
SCAN_S = 86_400
"""How far back a rule looks for an anomaly (a straggler's ``time`` is its confirmation): an
incident pages as one instance for up to a day. The rows are ordered current first, so the
``LIMIT`` never cuts one that pages."""


def _hang_rule_sql(cause: str) -> str:
    """One row per stored hang-level anomaly of ``cause`` in the scan window, 1 while the worker
    still re-sends it. ``from_ms``: 15 minutes before the stall began (its latest version's time
    less its ``stalled_s``, to the minute), where the dashboard link starts."""
    return f"""SELECT job, {TEAM} AS team, id AS anomaly, any(cause) AS cause, any(suspect) AS suspect,
       toString((intDiv(toUInt64(toUnixTimestamp(max(time)) - max(evidence['stalled_s'])), 60) * 60 - 900) * 1000)
           AS from_ms,
       toFloat64(max(time) >= $__toTime - INTERVAL {RESENT_S} SECOND) AS stalled
FROM anomalies WHERE anomalies.level = 'hang' AND anomalies.cause = '{cause}' AND $__timeFilter(time)
GROUP BY job, id ORDER BY stalled DESC, job, anomaly LIMIT 1000"""


def _hang_rule(cause: str, *, uid: str, title: str, summary: str, description: str) -> AlertRule:
    """The page of a hang-level cause: firing while the worker re-sends its anomaly
    (:func:`_hang_rule_sql`), at once, for a minute after the re-sends stop."""
    return AlertRule(
        uid=uid,
        title=title,
        sql=_hang_rule_sql(cause),
        value="stalled",
        fire_above=0.5,
        recover_below=0.5,
        pending="0s",
        keep_firing="1m",
        window_s=SCAN_S,
        runbook=cause,
        summary=summary,
        description=description,
    )


ALERTS = (
    AlertRule(
        uid="argus-slow-rank",
        title="Argus: slow rank",
        sql=f"""SELECT a.job AS job, {TEAM.replace("job", "a.job")} AS team, a.id AS anomaly, a.cause AS cause,
       a.suspect AS suspect, if(startsWith(a.suspect, 'rank:'), substring(a.suspect, 6), '') AS rank,
       toString(a.onset) AS onset, a.from_ms AS from_ms,
       toFloat64(s.seen >= $__toTime - INTERVAL {ACTIVE_S} SECOND) AS slow
FROM (SELECT id, any(job) AS job, any(run) AS run, any(cause) AS cause, any(suspect) AS suspect,
             min(start_step) AS onset, max(end_step) AS last_step,
             toString(toUnixTimestamp64Milli(min(time)) - 900000) AS from_ms,
             argMax(severity, (end_step, time)) AS latest_severity
      FROM anomalies WHERE $__timeFilter(time) AND level != 'hang' GROUP BY id) AS a
LEFT JOIN (SELECT job, run, step, max(time) AS seen FROM step_summaries
           WHERE time > $__toTime - INTERVAL 600 SECOND AND time <= $__toTime GROUP BY job, run, step) AS s
       ON s.job = a.job AND s.run = a.run AND s.step = a.last_step
WHERE a.latest_severity = 'page'
ORDER BY slow DESC, job, onset, suspect LIMIT 1000""",
        value="slow",
        fire_above=0.5,
        recover_below=0.5,
        pending="0s",
        keep_firing="5m",
        drilldown="rank",
        window_s=SCAN_S,
        runbook="{{ $labels.cause }}",
        summary="Job {{ $labels.job }}: {{ $labels.cause }} at {{ $labels.suspect }} since step {{ $labels.onset }}",
        description="An anomaly the stream worker stored with severity page (sustained, worth a person: "
        "transients and persistent stragglers are not pages) whose suspect was seen slow within the last "
        f"{ACTIVE_S // 60} minutes. Its ranks, evidence and cost are in the anomaly (dashboard link, "
        "argus report); this rule does not re-derive them.",
    ),
    _hang_rule(
        "lost_rank",
        uid="argus-lost-rank",
        title="Argus: rank lost",
        summary="Job {{ $labels.job }}: {{ $labels.suspect }} lost while the job stalls",
        description="The worker stored a lost_rank anomaly: heartbeats of the suspect "
        "stopped (process down, host silent) and no step completes; it re-sends it every minute while "
        "that lasts, and the page clears once it stops. Which collective its peers wait in, and what it "
        "last did: the dashboard link (Hangs and lost ranks).",
    ),
    _hang_rule(
        "hang",
        uid="argus-hang",
        title="Argus: job hangs",
        summary="Job {{ $labels.job }} hangs: {{ $labels.suspect }}",
        description="No step completed for longer than the job's threshold; the worker re-sends the hang "
        "anomaly every minute while it lasts, and the page clears once it stops. The collective, its group "
        "and what the suspect does instead: the dashboard link (Hangs and lost ranks).",
    ),
    AlertRule(
        uid="argus-node-suspect",
        title="Argus: node suspect across jobs",
        sql="""SELECT host, toFloat64(max(time) >= $__toTime - INTERVAL 7200 SECOND) AS suspect
FROM node_suspects WHERE $__timeFilter(time) AND time <= $__toTime
GROUP BY host ORDER BY suspect DESC, host LIMIT 1000""",
        value="suspect",
        fire_above=0.5,
        recover_below=0.5,
        pending="0s",
        keep_firing="1h",
        severity="ticket",
        drilldown="fleet",
        window_s=SCAN_S,
        runbook="argus-node-suspect",
        summary="Node {{ $labels.host }} slows jobs across jobs: cordon it, read its evidence, file a ticket",
        description="argus fleet --record (hourly) named this host in the last 2 hours: over the last 7 days "
        "different jobs found it slow far more often than the fleet's rate for the GPU-hours it hosted "
        "(Holm-corrected, at least 3 jobs, at least 2x the fleet rate at the 95 % bound), or one of its GPUs "
        "throttled or reported errors improbably often and at least 2 jobs found that GPU slow, or one of its "
        "GPUs was slower than its job peers in improbably many of its jobs (at least 3; no anomaly needed). "
        "Its jobs, anomalies, GPUs and NVML health: the fleet dashboard (link) or argus fleet. A ticket, "
        "not a page.",
    ),
)
