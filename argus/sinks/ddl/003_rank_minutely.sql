-- Per-rank per-minute sums of step phases, for the per-rank panels ("slowest ranks") and
-- `argus report`'s phase breakdown: at 10M step rows a GROUP BY rank over `steps` takes
-- seconds on a small machine, over this rollup milliseconds. Means are sum / steps.
-- Filled by a materialized view (deduplicated inserts do not reach it) and backfilled once.
-- The select names its sums (step, busy, collective and phases) once: rank_minutely_sums in sinks/_sql.py.

CREATE TABLE IF NOT EXISTS steps_rank_minutely
(
    job            LowCardinality(String),
    run            UInt32,
    minute         DateTime,
    rank           UInt32,
    host           SimpleAggregateFunction(any, LowCardinality(String)),
    steps          SimpleAggregateFunction(sum, UInt64),
    step_sum       SimpleAggregateFunction(sum, Float64),
    busy_sum       SimpleAggregateFunction(sum, Float64),
    collective_sum SimpleAggregateFunction(sum, Float64),
    forward_sum    SimpleAggregateFunction(sum, Float64),
    backward_sum   SimpleAggregateFunction(sum, Float64),
    optimizer_sum  SimpleAggregateFunction(sum, Float64),
    dataloader_sum SimpleAggregateFunction(sum, Float64),
    h2d_sum        SimpleAggregateFunction(sum, Float64),
    gc_sum         SimpleAggregateFunction(sum, Float64),
    compile_sum    SimpleAggregateFunction(sum, Float64),
    checkpoint_sum SimpleAggregateFunction(sum, Float64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (job, run, minute, rank)
TTL minute + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS steps_rank_minutely_mv TO steps_rank_minutely AS
SELECT job, run, toStartOfMinute(time) AS minute, rank, any(steps.host) AS host, count() AS steps,
       {rank_minutely_sums}
FROM steps GROUP BY job, run, minute, rank;

INSERT INTO steps_rank_minutely
SELECT job, run, toStartOfMinute(time) AS minute, rank, any(steps.host) AS host, count() AS steps,
       {rank_minutely_sums}
FROM steps GROUP BY job, run, minute, rank;
