-- The fleet view (`argus fleet`, the fleet dashboard): which nodes slow jobs down, given the
-- GPU-hours they hosted. Three rollups, filled by materialized views and backfilled once:
--   rank_placement: where each rank of each job run ran (host, GPU), from the steps;
--   node_hours:     GPU-hours each host hosted per hour (a rank-step's step_ms is GPU time);
--   anomaly_nodes:  each anomaly placed on the hosts of its ranks, one row per host and
--                   version (ReplacingMergeTree on end_step: a longer window is a later
--                   version), with its GPUs there and the host's share of the GPU-hours lost
--                   (its ranks' share of the anomaly's ranks).
-- anomaly_nodes is filled when the anomaly is stored: its ranks' placement is looked up then
-- (the job's steps are stored before its anomalies: an anomaly's window follows its onset).
-- The lookup reads only the placements of the jobs in the inserted block.

CREATE TABLE IF NOT EXISTS rank_placement
(
    job        LowCardinality(String),
    run        UInt32,
    rank       UInt32,
    host       SimpleAggregateFunction(any, LowCardinality(String)),
    gpu_uuid   SimpleAggregateFunction(any, LowCardinality(String)),
    first_time SimpleAggregateFunction(min, DateTime64(3)),
    last_time  SimpleAggregateFunction(max, DateTime64(3)),
    inserted   SimpleAggregateFunction(max, DateTime) DEFAULT now()
)
ENGINE = AggregatingMergeTree
ORDER BY (job, run, rank)
TTL inserted + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS rank_placement_mv TO rank_placement AS
SELECT job, run, rank, any(steps.host) AS host, any(steps.gpu_uuid) AS gpu_uuid,
       min(steps.time) AS first_time, max(steps.time) AS last_time
FROM steps GROUP BY job, run, rank;

INSERT INTO rank_placement (job, run, rank, host, gpu_uuid, first_time, last_time)
SELECT job, run, rank, any(steps.host) AS host, any(steps.gpu_uuid) AS gpu_uuid,
       min(steps.time) AS first_time, max(steps.time) AS last_time
FROM steps GROUP BY job, run, rank;

CREATE TABLE IF NOT EXISTS node_hours
(
    host     LowCardinality(String),
    hour     DateTime,
    gpu_ms   SimpleAggregateFunction(sum, Float64),
    steps    SimpleAggregateFunction(sum, UInt64),
    inserted SimpleAggregateFunction(max, DateTime) DEFAULT now()
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(hour)
ORDER BY (host, hour)
TTL inserted + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS node_hours_mv TO node_hours AS
SELECT steps.host AS host, toStartOfHour(steps.time) AS hour, sum(steps.step_ms) AS gpu_ms, count() AS steps
FROM steps GROUP BY host, hour;

INSERT INTO node_hours (host, hour, gpu_ms, steps)
SELECT steps.host AS host, toStartOfHour(steps.time) AS hour, sum(steps.step_ms) AS gpu_ms, count() AS steps
FROM steps GROUP BY host, hour;

CREATE TABLE IF NOT EXISTS anomaly_nodes
(
    host           LowCardinality(String),
    id             String,
    job            LowCardinality(String),
    run            UInt32,
    cause          LowCardinality(String),
    suspect_kind   LowCardinality(String),
    time           DateTime64(3),
    end_step       UInt64,
    gpus           Array(String),
    gpu_hours_lost Float64,
    inserted       DateTime DEFAULT now()
)
ENGINE = ReplacingMergeTree(end_step)
PARTITION BY toDate(time)
ORDER BY (host, id)
TTL inserted + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS anomaly_nodes_mv TO anomaly_nodes AS
SELECT p.host AS host, a.id AS id, any(a.job) AS job, any(a.run) AS run, any(a.cause) AS cause,
       any(a.suspect_kind) AS suspect_kind, any(a.time) AS time, max(a.end_step) AS end_step,
       groupUniqArray(toString(p.gpu_uuid)) AS gpus, sum(a.gpu_hours_lost / a.n) AS gpu_hours_lost
FROM (
    SELECT id, job, run, arrayJoin(ranks) AS rank, length(ranks) AS n, cause, suspect_kind, time, end_step,
           gpu_hours_lost
    FROM anomalies
) AS a
INNER JOIN (
    SELECT job, run, rank, any(host) AS host, any(gpu_uuid) AS gpu_uuid
    FROM rank_placement WHERE (job, run) IN (SELECT job, run FROM anomalies)
    GROUP BY job, run, rank
) AS p ON a.job = p.job AND a.run = p.run AND a.rank = p.rank
GROUP BY p.host, a.id, a.end_step;

INSERT INTO anomaly_nodes (host, id, job, run, cause, suspect_kind, time, end_step, gpus, gpu_hours_lost)
SELECT p.host AS host, a.id AS id, any(a.job) AS job, any(a.run) AS run, any(a.cause) AS cause,
       any(a.suspect_kind) AS suspect_kind, any(a.time) AS time, max(a.end_step) AS end_step,
       groupUniqArray(toString(p.gpu_uuid)) AS gpus, sum(a.gpu_hours_lost / a.n) AS gpu_hours_lost
FROM (
    SELECT id, job, run, arrayJoin(ranks) AS rank, length(ranks) AS n, cause, suspect_kind, time, end_step,
           gpu_hours_lost
    FROM anomalies FINAL
) AS a
INNER JOIN (
    SELECT job, run, rank, any(host) AS host, any(gpu_uuid) AS gpu_uuid
    FROM rank_placement GROUP BY job, run, rank
) AS p ON a.job = p.job AND a.run = p.run AND a.rank = p.rank
GROUP BY p.host, a.id, a.end_step;

-- The node agent's health per GPU and day: samples, samples with an XID (and which), samples
-- with a throttle reason (hardware slowdown, thermal, power brake: mask 0xE8), and the range
-- of the ECC double-bit and NVLink error counters (their rise in the window is max - min).
CREATE TABLE IF NOT EXISTS gpu_health_daily
(
    host          LowCardinality(String),
    gpu_uuid      LowCardinality(String),
    day           Date,
    samples       SimpleAggregateFunction(sum, UInt64),
    xid_samples   SimpleAggregateFunction(sum, UInt64),
    xids          SimpleAggregateFunction(groupUniqArrayArray, Array(UInt32)),
    throttled     SimpleAggregateFunction(sum, UInt64),
    ecc_min       SimpleAggregateFunction(min, UInt64),
    ecc_max       SimpleAggregateFunction(max, UInt64),
    link_err_min  SimpleAggregateFunction(min, UInt64),
    link_err_max  SimpleAggregateFunction(max, UInt64),
    inserted      SimpleAggregateFunction(max, DateTime) DEFAULT now()
)
ENGINE = AggregatingMergeTree
PARTITION BY day
ORDER BY (host, gpu_uuid, day)
TTL inserted + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_health_daily_mv TO gpu_health_daily AS
SELECT host, gpu_uuid, toDate(time) AS day, count() AS samples, countIf(xid != 0) AS xid_samples,
       groupUniqArrayIf(xid, xid != 0) AS xids, countIf(bitAnd(clock_event_reasons, 232) != 0) AS throttled,
       min(ecc_dbe) AS ecc_min, max(ecc_dbe) AS ecc_max, min(nvlink_errors) AS link_err_min,
       max(nvlink_errors) AS link_err_max
FROM gpu_samples GROUP BY host, gpu_uuid, day;

INSERT INTO gpu_health_daily (host, gpu_uuid, day, samples, xid_samples, xids, throttled, ecc_min, ecc_max,
                              link_err_min, link_err_max)
SELECT host, gpu_uuid, toDate(time) AS day, count() AS samples, countIf(xid != 0) AS xid_samples,
       groupUniqArrayIf(xid, xid != 0) AS xids, countIf(bitAnd(clock_event_reasons, 232) != 0) AS throttled,
       min(ecc_dbe) AS ecc_min, max(ecc_dbe) AS ecc_max, min(nvlink_errors) AS link_err_min,
       max(nvlink_errors) AS link_err_max
FROM gpu_samples GROUP BY host, gpu_uuid, day;

-- The suspects `argus fleet --record` named (run it hourly: a cron job): the fleet model's
-- decisions, for the fleet dashboard and the "node suspect across jobs" alert rule, which
-- read them instead of re-deriving them in SQL. One row per suspect host and recording.
CREATE TABLE IF NOT EXISTS node_suspects
(
    time              DateTime,
    host              LowCardinality(String),
    since             DateTime,
    confidence        Float64,
    rate_x_fleet_min  Float64,
    jobs              UInt32,
    jobs_expected     Float64,
    anomalies         UInt32,
    gpu_hours_hosted  Float64,
    gpu_hours_lost    Float64,
    causes            Map(String, UInt32),
    gpus              Map(String, UInt32),
    xid_samples       UInt64,
    ecc_errors        UInt64,
    throttled_samples UInt64,
    link_errors       UInt64,
    anomaly_ids       Array(String),
    inserted          DateTime DEFAULT now()
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (host, time)
TTL inserted + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;
