"""The ClickHouse dashboards: a job's overview, a rank's drill-down, kernels, anomalies and
the fleet; and the pipeline's own health (Prometheus)."""

from __future__ import annotations

from argus.schemas import COLLECTIVE_COLUMNS, PHASE_COLUMNS
from argus.schemas.causes import FAULT_CAUSES, HANG_CAUSES, UNKNOWN

from .._sql import BUSY_MS as BUSY
from ._panels import EVIDENCE, JOB, KERNEL, KERNEL_STATS, RANK, Dashboard, Panel, each

__all__ = ["ANOMALY_LIST", "DASHBOARDS", "FLEET", "JOB_OVERVIEW", "KERNEL_VIEW", "PIPELINE", "RANK_DRILLDOWN"]


def _rank_averages(key: str, title: str, columns: tuple[str, ...]) -> Panel:
    """A time series of this rank's mean of each of ``columns`` of its steps."""
    sql = f"""SELECT $__timeInterval(time) AS t, {each("avg({c}) AS {name}", columns)}
FROM steps WHERE {JOB} AND {RANK} AND $__timeFilter(time)
GROUP BY t ORDER BY t"""
    return Panel(key, title, "timeseries", sql)


JOB_OVERVIEW = Dashboard(
    uid="argus-job",
    title="Argus / Job overview",
    variables=("job",),
    description="One job: step time, throughput, where ranks spend their time, and what Argus found.",
    panels=(
        Panel(
            "job_summary",
            "Job",
            "stat",
            f"""SELECT uniqMerge(ranks) AS ranks, uniqMerge(hosts) AS hosts, min(first_step) AS first_step,
       max(last_step) AS last_step, max(last_time) AS last_seen
FROM jobs WHERE {JOB}""",
            "Ranks and hosts that reported, and the steps seen.",
            width=24,
            height=4,
        ),
        Panel(
            "step_time",
            "Step time across ranks (ms)",
            "timeseries",
            f"""SELECT $__timeInterval(time) AS t, quantile(0.5)(step_ms) AS median, quantile(0.99)(step_ms) AS p99,
       max(step_ms) AS max
FROM steps WHERE {JOB} AND $__timeFilter(time)
GROUP BY t ORDER BY t""",
            "In a synchronous job every rank's step time is the same: look at busy time to find who is slow.",
        ),
        Panel(
            "throughput",
            "Throughput (sum over ranks, per second)",
            "timeseries",
            f"""SELECT $__timeInterval(time) AS t, sum(tokens) / $__interval_s AS tokens_per_s,
       sum(samples) / $__interval_s AS samples_per_s
FROM steps WHERE {JOB} AND $__timeFilter(time)
GROUP BY t ORDER BY t""",
        ),
        Panel(
            "busy_heatmap",
            "Busy time per rank and minute (step time minus collective wait, ms)",
            "heatmap",
            f"""SELECT t, toString(g) AS rank_group, busy_ms
FROM (
    SELECT t, intDiv(rank, greatest(1, intDiv(top_rank, 256))) AS g, max(busy) AS busy_ms
    FROM (
        SELECT toStartOfInterval(minute, INTERVAL greatest($__interval_s, 60) second) AS t, rank,
               sum(busy_sum) / sum(steps) AS busy, max(rank) OVER () AS top_rank
        FROM steps_rank_minutely WHERE {JOB} AND $__timeFilter(minute)
        GROUP BY t, rank)
    GROUP BY t, g)
ORDER BY t, g""",
            "A straggler is a bright row: it computes while its peers wait for it in collectives. One column "
            "per minute (the per-rank rollup); above 256 ranks, rows are rank groups (the busiest rank of each). "
            "The group is a string: the ClickHouse plugin makes string columns series labels, one row each.",
            width=24,
            height=10,
        ),
        Panel(
            "slow_ranks",
            "Slowest ranks (robust z-score of busy time)",
            "table",
            f"""WITH per_rank AS (
    SELECT rank, any(host) AS rank_host, sum(steps) AS n, sum(busy_sum) / n AS busy_ms,
           sum(collective_sum) / n AS collective_ms, sum(step_sum) / n AS step_mean_ms
    FROM steps_rank_minutely WHERE {JOB} AND $__timeFilter(minute) GROUP BY rank)
SELECT rank, rank_host AS host, n AS steps, round(busy_ms, 2) AS busy_ms, round(collective_ms, 2) AS collective_ms,
       round(step_mean_ms, 2) AS step_ms, round((busy_ms - med) / greatest(1.4826 * mad, 0.01 * med, 0.001), 2) AS z
FROM (SELECT *, median(abs(busy_ms - med)) OVER () AS mad
      FROM (SELECT *, median(busy_ms) OVER () AS med FROM per_rank))
ORDER BY z DESC LIMIT 10""",
            "Mean busy time per rank (from the per-minute rollup); z = (busy − median) / (1.4826 · MAD) "
            "over all ranks of the job in the time range.",
        ),
        Panel(
            "anomalies",
            "Anomalies: window, suspect, root cause, evidence, cost",
            "table",
            f"""SELECT time, start_step, end_step, level, cause, suspect_kind, suspect, round(score, 1) AS score,
       round(step_ms_added, 1) AS step_ms_added, round(gpu_hours_lost, 3) AS gpu_hours_lost, summary,
       {EVIDENCE} AS evidence
FROM anomalies WHERE {JOB} AND $__timeFilter(time)
ORDER BY time DESC, end_step DESC LIMIT 1 BY id LIMIT 100""",
            "Each anomaly once (LIMIT 1 BY id); the cost is what the suspect adds to every step of the job.",
            width=24,
        ),
        Panel(
            "missing_ranks",
            "Ranks missing from steps",
            "timeseries",
            f"""SELECT $__timeInterval(time) AS t, max(length(missing)) AS missing_ranks
FROM step_summaries WHERE {JOB} AND $__timeFilter(time)
GROUP BY t ORDER BY t""",
            "Ranks whose step record never arrived: a hung or lost rank.",
            width=24,
            height=6,
        ),
        Panel(
            "hangs",
            "Hangs and lost ranks: who, which collective, doing what",
            "table",
            f"""SELECT time, cause, suspect_kind, suspect, arrayStringConcat(arrayMap(r -> toString(r), ranks), ',') AS ranks,
       start_step AS stuck_step, round(evidence['stalled_s'], 1) AS stalled_s,
       toUInt64(evidence['seq']) AS collective_seq, round(evidence['nbytes'] / 1048576, 1) AS collective_mib,
       toUInt32(evidence['waiting_ranks']) AS waiting_ranks, round(gpu_hours_lost, 2) AS gpu_hours_lost, summary
FROM anomalies WHERE {JOB} AND level = 'hang' AND $__timeFilter(time)
ORDER BY time DESC, end_step DESC LIMIT 1 BY id LIMIT 50""",
            "A stalled job (no step for longer than its threshold): the ranks that never entered the "
            "collective their peers wait in, or whose heartbeats stopped; the summary names the collective, "
            "its group and what the suspect is doing instead.",
            width=24,
            height=6,
        ),
    ),
)

RANK_DRILLDOWN = Dashboard(
    uid="argus-rank",
    title="Argus / Rank drill-down",
    variables=("job", "rank"),
    description="One rank of one job: phases, collectives, kernels, call stacks and its GPU.",
    panels=(
        Panel(
            "rank_vs_job",
            "Busy time: this rank vs the job's median (ms)",
            "timeseries",
            f"""SELECT $__timeInterval(time) AS t, avgIf({BUSY}, {RANK}) AS this_rank,
       quantile(0.5)({BUSY}) AS job_median
FROM steps WHERE {JOB} AND $__timeFilter(time)
GROUP BY t ORDER BY t""",
            width=24,
        ),
        Panel(
            "rank_anomalies",
            "Anomalies naming this rank (kernel level first: which kernels, by how much)",
            "table",
            f"""SELECT time, start_step, end_step, level, cause, suspect, round(score, 1) AS score,
       round(step_ms_added, 1) AS step_ms_added, summary, {EVIDENCE} AS evidence
FROM anomalies
WHERE {JOB} AND has(ranks, toUInt32OrZero(decodeURLComponent('${{rank:percentencode}}'))) AND $__timeFilter(time)
ORDER BY level = 'kernel' DESC, time DESC, end_step DESC LIMIT 1 BY id LIMIT 50""",
            "Every anomaly whose ranks include this one, each once (LIMIT 1 BY id). A kernel-level anomaly "
            "carries the kernels whose p50/p90 shifted against healthy peers (kernel_p90:<name> = ratio), "
            "their family and the idle-gap change; a CPU-side one the frames this rank spends more "
            "samples in.",
            width=24,
            height=6,
        ),
        _rank_averages("phases", "Phases (ms)", PHASE_COLUMNS),
        _rank_averages("collectives", "Collectives (ms)", COLLECTIVE_COLUMNS),
        Panel(
            "kernels",
            "Kernels of this rank (top by total time)",
            "table",
            f"""SELECT name, {KERNEL_STATS}
FROM kernels WHERE {JOB} AND {RANK} AND $__timeFilter(time)
GROUP BY name ORDER BY total_ms DESC LIMIT 20""",
        ),
        Panel(
            "stacks",
            "Call stacks (flame graph)",
            "flamegraph",
            f"""SELECT length(prefix) - 1 AS level, sum(count) AS value,
       sumIf(count, length(prefix) = length(frames)) AS self, prefix[-1] AS label
FROM (
    SELECT arrayConcat(['all'], splitByChar(';', stack)) AS frames, count,
           arrayJoin(arrayMap(i -> arraySlice(frames, 1, i), range(1, length(frames) + 1))) AS prefix
    FROM stacks WHERE {JOB} AND {RANK} AND $__timeFilter(time)
)
GROUP BY prefix ORDER BY prefix""",
            "Nested-set rows in depth-first order, as Grafana's flame graph panel reads them, under one "
            "root ('all'): a stack cut at the agent's max_depth starts below its real root, and the panel "
            "draws a single tree only.",
        ),
        Panel(
            "gpu",
            "GPU health (this rank's GPU)",
            "timeseries",
            f"""WITH (SELECT any(host) FROM steps WHERE {JOB} AND {RANK} AND $__timeFilter(time)) AS h,
     (SELECT any(gpu_uuid) FROM steps WHERE {JOB} AND {RANK} AND $__timeFilter(time)) AS u
SELECT $__timeInterval(time) AS t, avg(sm_clock_mhz) AS sm_clock_mhz, avg(power_w) AS power_w,
       avg(temp_c) AS temp_c, avg(gpu_util) AS util_pct, max(clock_event_reasons) AS clock_event_reasons
FROM gpu_samples WHERE host = h AND (u = '' OR gpu_uuid = u) AND $__timeFilter(time)
GROUP BY t ORDER BY t""",
            "SM clock, power and temperature with the clock-event (throttle) reasons bitmask.",
        ),
    ),
)

ANOMALY_LIST = Dashboard(
    uid="argus-anomalies",
    title="Argus / Anomalies",
    variables=(),
    description="Everything Argus found across jobs, with evidence and cost.",
    panels=(
        Panel(
            "by_cause",
            "Anomalies by root cause",
            "barchart",
            """SELECT cause, count() AS anomalies, round(sum(step_ms_added), 1) AS step_ms_added,
       round(sum(gpu_hours_lost), 2) AS gpu_hours_lost
FROM (SELECT * FROM anomalies WHERE $__timeFilter(time) ORDER BY time DESC, end_step DESC LIMIT 1 BY id)
GROUP BY cause ORDER BY anomalies DESC""",
        ),
        Panel(
            "costliest",
            "Costliest anomalies",
            "table",
            """SELECT job, time, cause, suspect_kind, suspect, round(gpu_hours_lost, 3) AS gpu_hours_lost,
       round(step_ms_added, 1) AS step_ms_added, summary
FROM anomalies WHERE $__timeFilter(time)
ORDER BY gpu_hours_lost DESC LIMIT 1 BY id LIMIT 50""",
        ),
    ),
)

KERNEL_VIEW = Dashboard(
    uid="argus-kernel",
    title="Argus / Kernel",
    variables=("job", "rank", "kernel"),
    description="One kernel of one job across its ranks: is this rank's kernel slower than its peers'?",
    panels=(
        Panel(
            "kernel_over_time",
            "Kernel p99: this rank vs the median rank (µs)",
            "timeseries",
            f"""SELECT $__timeInterval(time) AS t, quantileIf(0.5)(p99_ns, {RANK}) / 1e3 AS this_rank,
       quantile(0.5)(p99_ns) / 1e3 AS median_rank
FROM kernels WHERE {JOB} AND {KERNEL} AND $__timeFilter(time)
GROUP BY t ORDER BY t""",
            "Per-step p99 of the kernel's duration (from the rank's sketch), this rank against all ranks.",
            width=24,
        ),
        Panel(
            "kernel_ranks",
            "This kernel on every rank (slowest p99 first)",
            "table",
            f"""SELECT rank, {KERNEL_STATS}
FROM kernels WHERE {JOB} AND {KERNEL} AND $__timeFilter(time)
GROUP BY rank ORDER BY p99_us DESC, rank LIMIT 50""",
            "Click a rank for its drill-down.",
            width=24,
        ),
    ),
)

# -- the fleet (argus fleet; docs/operations.md "The fleet view") -------------------------

_HOST_COST = """SELECT host, id, any(job) AS a_job, any(cause) AS a_cause, min(time) AS first_seen,
             argMax(gpu_hours_lost, end_step) AS a_lost, argMax(gpus, end_step) AS a_gpus
      FROM anomaly_nodes WHERE $__timeFilter(time) GROUP BY host, id"""
"""Each anomaly on each host it implicates, once: its latest version's cost share there."""

FLEET = Dashboard(
    uid="argus-fleet",
    title="Argus / Fleet",
    variables=(),
    description="Which nodes keep slowing jobs down across jobs (argus fleet), and what slowness costs "
    "the fleet.",
    panels=(
        Panel(
            "host_day_lost",
            "GPU-hours lost per host and day (the 50 costliest hosts)",
            "heatmap",
            f"""SELECT t, host, round(sum(a_lost), 3) AS gpu_hours_lost
FROM (SELECT toStartOfDay(first_seen) AS t, host, a_lost FROM ({_HOST_COST}))
WHERE host IN (SELECT host FROM ({_HOST_COST}) GROUP BY host ORDER BY sum(a_lost) DESC LIMIT 50)
GROUP BY t, host ORDER BY t, host""",
            "The host's share of the GPU-hours its anomalies cost, by the day they were found. A row bright "
            "day after day is a bad node; a column bright on many hosts is a fleet-wide event (a switch, "
            "storage, a bad image); scattered cells are jobs' bad luck. Which nodes are suspect with "
            "statistical confidence is the next panel's (the fleet model), not this one's.",
            width=24,
            height=10,
        ),
        Panel(
            "suspect_nodes",
            "Suspect nodes (argus fleet --record, hourly)",
            "table",
            """SELECT host, max(time) AS last_named, round(argMax(confidence, time), 4) AS confidence,
       argMax(decided_by, time) AS decided_by, round(argMax(rate_x_fleet_min, time), 1) AS rate_x_fleet_min,
       argMax(jobs, time) AS jobs, round(argMax(jobs_expected, time), 2) AS jobs_expected,
       argMax(slower_than_peers, time) AS slower_than_peers,
       round(argMax(gpu_hours_lost, time), 2) AS gpu_hours_lost, toString(argMax(causes, time)) AS causes,
       toString(argMax(gpus, time)) AS gpus, argMax(xid_samples, time) AS xid_samples,
       argMax(throttled_samples, time) AS throttled_samples, argMax(ecc_errors, time) AS ecc_errors,
       argMax(link_errors, time) AS link_errors, arrayStringConcat(argMax(anomaly_ids, time), ' ') AS anomaly_ids
FROM node_suspects WHERE $__timeFilter(time)
GROUP BY host ORDER BY last_named DESC, rate_x_fleet_min DESC LIMIT 100""",
            "Each host the fleet model named in the range, as last recorded: its confidence (1 - the "
            "Holm-adjusted p-value over the fleet), what decided (a cause of its anomalies, a health signal "
            "on a GPU, or a GPU slower than its job peers), its rate over the fleet's at the 95 % bound, the "
            "jobs that implicated it (or in which its GPU was the slow one) against those a healthy node "
            "would have had, its GPUs slower than their job peers (in how many of their jobs, by how much) "
            "and its evidence. What to do: docs/operations.md, The fleet view.",
            width=24,
        ),
        Panel(
            "suspect_anomalies",
            "Anomalies on the suspect nodes",
            "table",
            f"""SELECT host, a_job AS job, id AS anomaly, a_cause AS cause, first_seen,
       round(a_lost, 3) AS gpu_hours_lost, arrayStringConcat(a_gpus, ' ') AS gpus
FROM ({_HOST_COST})
WHERE host IN (SELECT host FROM node_suspects WHERE $__timeFilter(time))
ORDER BY host, first_seen LIMIT 1000""",
            "Every anomaly that implicated a suspect node, with the GPUs it named there. Click a job for "
            "its overview (the anomaly, its evidence and cost).",
            width=24,
        ),
        Panel(
            "lost_by_cause",
            "GPU-hours lost by cause per day",
            "timeseries",
            """SELECT t, """
            + ", ".join(
                f"round(sumIf(a_lost, a_cause = '{c}'), 3) AS {c}"
                for c in (*FAULT_CAUSES, UNKNOWN, *HANG_CAUSES)
            )
            + """
FROM (SELECT id, toStartOfDay(min(time)) AS t, any(cause) AS a_cause, argMax(gpu_hours_lost, end_step) AS a_lost
      FROM anomalies WHERE $__timeFilter(time) GROUP BY id)
GROUP BY t ORDER BY t""",
            "Every anomaly once (its latest version), by the day it was found: the workload's classes too.",
            width=24,
        ),
    ),
)

DASHBOARDS = (JOB_OVERVIEW, RANK_DRILLDOWN, KERNEL_VIEW, ANOMALY_LIST, FLEET)

PIPELINE = Dashboard(
    uid="argus-pipeline",
    title="Argus / Pipeline health",
    variables=(),
    description="Argus itself, from Prometheus: consumer lag, throughput, dead letters, sink retries, "
    "relay drops and the workers' step latency.",
    panels=(
        Panel(
            "lag",
            "Consumer lag (messages)",
            "timeseries",
            "{{topic}}=max by (topic) (argus_worker_consumer_lag)",
            "Messages the stream workers have not processed yet, per topic. Every worker reports its whole "
            "consumer group's lag, so the panel takes the largest report, not the sum over workers.",
        ),
        Panel(
            "throughput",
            "Throughput (per second)",
            "timeseries",
            "worker records=sum(rate(argus_worker_records_total[5m]))\n"
            "sink rows {{table}}=sum by (table) (rate(argus_sink_rows_total[5m]))",
        ),
        Panel(
            "dead_letters",
            "Dead letters (per second)",
            "timeseries",
            "worker {{reason}}=sum by (reason) (rate(argus_worker_dead_letters_total[5m]))\n"
            "sink=sum(rate(argus_sink_dead_letters_total[5m]))",
        ),
        Panel(
            "sink_retries",
            "Sink insert retries and store down",
            "timeseries",
            "retries/s=sum(rate(argus_sink_insert_retries_total[5m]))\n"
            "sinks with store down=sum(argus_sink_store_down)",
        ),
        Panel(
            "relay_drops",
            "Node relay: refused datagrams and publisher drops (per second)",
            "timeseries",
            "refused {{reason}}=sum by (reason) (rate(argus_relay_refused_total[5m]))\n"
            "dropped {{reason}}=sum by (reason) (rate(argus_node_publisher_dropped_total[5m]))",
        ),
        Panel(
            "step_latency",
            "Step latency: first part in to findings out (s)",
            "timeseries",
            "p50=histogram_quantile(0.5, sum by (le) (rate(argus_worker_step_completion_seconds_bucket[5m])))\n"
            "p99=histogram_quantile(0.99, sum by (le) (rate(argus_worker_step_completion_seconds_bucket[5m])))",
        ),
    ),
)
"""Argus's own health (Prometheus queries, one ``legend=expr`` per line); not a ClickHouse dashboard."""
