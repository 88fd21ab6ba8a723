-- Rollups for dashboards and a lookup of jobs, filled by materialized views on insert.
-- Inserts deduplicated in the source table (retried sink batches) do not reach the views.
-- Busy and collective time (busy_ms, collective_ms) are defined once in sinks/_sql.py, with the dashboards.

CREATE TABLE IF NOT EXISTS jobs
(
    job        LowCardinality(String),
    run        UInt32,
    first_time SimpleAggregateFunction(min, DateTime64(3)),
    last_time  SimpleAggregateFunction(max, DateTime64(3)),
    first_step SimpleAggregateFunction(min, UInt64),
    last_step  SimpleAggregateFunction(max, UInt64),
    ranks      AggregateFunction(uniq, UInt32),
    hosts      AggregateFunction(uniq, String)
)
ENGINE = AggregatingMergeTree
ORDER BY (job, run)
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS jobs_mv TO jobs AS
SELECT job, run, min(time) AS first_time, max(time) AS last_time, min(step) AS first_step,
       max(step) AS last_step, uniqState(rank) AS ranks, uniqState(toString(host)) AS hosts
FROM steps GROUP BY job, run;

CREATE TABLE IF NOT EXISTS steps_minutely
(
    job        LowCardinality(String),
    run        UInt32,
    minute     DateTime,
    rows       SimpleAggregateFunction(sum, UInt64),
    tokens     SimpleAggregateFunction(sum, UInt64),
    samples    SimpleAggregateFunction(sum, UInt64),
    max_step   SimpleAggregateFunction(max, UInt64),
    step_ms    AggregateFunction(quantiles(0.5, 0.9, 0.99), Float32),
    busy_ms    AggregateFunction(quantiles(0.5, 0.99), Float32),
    ranks      AggregateFunction(uniq, UInt32)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (job, run, minute)
TTL minute + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS steps_minutely_mv TO steps_minutely AS
SELECT job, run, toStartOfMinute(time) AS minute, count() AS rows, sum(tokens) AS tokens,
       sum(samples) AS samples, max(step) AS max_step,
       quantilesState(0.5, 0.9, 0.99)(steps.step_ms) AS step_ms,
       quantilesState(0.5, 0.99)(toFloat32({busy_ms})) AS busy_ms,
       uniqState(rank) AS ranks
FROM steps GROUP BY job, run, minute;

CREATE TABLE IF NOT EXISTS steps_by_rank
(
    job        LowCardinality(String),
    run        UInt32,
    rank       UInt32,
    hour       DateTime,
    host       SimpleAggregateFunction(any, LowCardinality(String)),
    steps      SimpleAggregateFunction(sum, UInt64),
    step_ms    SimpleAggregateFunction(sum, Float64),
    busy_ms    SimpleAggregateFunction(sum, Float64),
    collective_ms SimpleAggregateFunction(sum, Float64),
    dataloader_ms SimpleAggregateFunction(sum, Float64),
    max_step_ms   SimpleAggregateFunction(max, Float32)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(hour)
ORDER BY (job, run, rank, hour)
TTL hour + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS steps_by_rank_mv TO steps_by_rank AS
SELECT job, run, rank, toStartOfHour(time) AS hour, any(steps.host) AS host, count() AS steps, sum(step_ms) AS step_ms,
       sum({busy_ms}) AS busy_ms, sum({collective_ms}) AS collective_ms,
       sum(steps.dataloader_ms) AS dataloader_ms, max(steps.step_ms) AS max_step_ms
FROM steps GROUP BY job, run, rank, hour;

-- Decoded kernel statistics (one row per rank, step and kernel), written by the sink from
-- the kernel sketches so analysts can query kernels in SQL.
CREATE TABLE IF NOT EXISTS kernels
(
    job       LowCardinality(String),
    run       UInt32,
    rank      UInt32,
    step      UInt64,
    time      DateTime64(3) DEFAULT now64(3) CODEC(DoubleDelta, ZSTD(1)),
    kernel_id UInt32,
    name      LowCardinality(String),
    count     UInt32 CODEC(T64, ZSTD(1)),
    total_ns  UInt64 CODEC(T64, ZSTD(1)),
    p50_ns    Float32 CODEC(ZSTD(1)),
    p90_ns    Float32 CODEC(ZSTD(1)),
    p99_ns    Float32 CODEC(ZSTD(1)),
    max_ns    UInt64 CODEC(T64, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (job, run, rank, kernel_id, step)
TTL toDateTime(time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;
