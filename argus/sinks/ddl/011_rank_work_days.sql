-- The fleet view's second kind of evidence: which GPUs are slower than their job peers, job
-- after job (a GPU slow from a small job's start is that job's baseline, never an anomaly).
-- rank_work_days: per day, job run, pipeline stage and rank, the host and GPU it ran on, its
-- steps (the first and last of the day) and the sum of its compute time (forward + backward +
-- optimizer: the diagnosis's compute_ms, the first of a rank's own work). A rank's mean
-- compute on a day is compute_sum / steps; its peers are that day's ranks of its job run and
-- stage (stages differ in their work by design). The job run and the GPU are also 64-bit
-- hashes (job_key: cityHash64(job, run); gpu_key: cityHash64(host, gpu_uuid), 0 without a
-- uuid): the fleet view groups a month of a 10,000-host fleet's rank-days by numbers, and
-- reads the names of the few GPUs it reports. Filled by a materialized view on steps and
-- backfilled from them once.

CREATE TABLE IF NOT EXISTS rank_work_days
(
    day         Date,
    job_key     UInt64,
    pp          UInt32,
    rank        UInt32,
    job         SimpleAggregateFunction(any, LowCardinality(String)),
    run         SimpleAggregateFunction(any, UInt32),
    host        SimpleAggregateFunction(any, LowCardinality(String)),
    gpu_uuid    SimpleAggregateFunction(any, LowCardinality(String)),
    gpu_key     SimpleAggregateFunction(any, UInt64),
    first_time  SimpleAggregateFunction(min, DateTime64(3)),
    last_time   SimpleAggregateFunction(max, DateTime64(3)),
    steps       SimpleAggregateFunction(sum, UInt64),
    compute_sum SimpleAggregateFunction(sum, Float64),
    inserted    SimpleAggregateFunction(max, DateTime) DEFAULT now()
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (day, job_key, pp, rank)
TTL inserted + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS rank_work_days_mv TO rank_work_days AS
SELECT day, cityHash64(job, run) AS job_key, pp, rank, job, run, host, gpu_uuid,
       if(gpu_uuid = '', 0, cityHash64(host, gpu_uuid)) AS gpu_key, first_time, last_time, steps, compute_sum
FROM (
    SELECT toDate(steps.time) AS day, steps.job AS job, steps.run AS run, steps.pp AS pp, steps.rank AS rank,
           toString(any(steps.host)) AS host, toString(any(steps.gpu_uuid)) AS gpu_uuid,
           min(steps.time) AS first_time, max(steps.time) AS last_time, count() AS steps,
           sum(steps.forward_ms + steps.backward_ms + steps.optimizer_ms) AS compute_sum
    FROM steps GROUP BY day, job, run, pp, rank
);

INSERT INTO rank_work_days (day, job_key, pp, rank, job, run, host, gpu_uuid, gpu_key, first_time, last_time,
                            steps, compute_sum)
SELECT day, cityHash64(job, run) AS job_key, pp, rank, job, run, host, gpu_uuid,
       if(gpu_uuid = '', 0, cityHash64(host, gpu_uuid)) AS gpu_key, first_time, last_time, steps, compute_sum
FROM (
    SELECT toDate(steps.time) AS day, steps.job AS job, steps.run AS run, steps.pp AS pp, steps.rank AS rank,
           toString(any(steps.host)) AS host, toString(any(steps.gpu_uuid)) AS gpu_uuid,
           min(steps.time) AS first_time, max(steps.time) AS last_time, count() AS steps,
           sum(steps.forward_ms + steps.backward_ms + steps.optimizer_ms) AS compute_sum
    FROM steps GROUP BY day, job, run, pp, rank
);

-- What decided each recorded suspect (the anomalies' stratum, a health signal, or its GPU
-- slower than its job peers) and that slowness as one line, for the dashboard's table.
ALTER TABLE node_suspects ADD COLUMN IF NOT EXISTS decided_by String DEFAULT '';

ALTER TABLE node_suspects ADD COLUMN IF NOT EXISTS slower_than_peers String DEFAULT '';
