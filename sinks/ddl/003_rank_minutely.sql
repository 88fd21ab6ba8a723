-- Per-rank per-minute sums of step phases, for the per-rank panels ("slowest ranks") and
-- `argus report`'s phase breakdown: at 10M step rows a GROUP BY rank over `steps` takes
-- seconds on a small machine, over this rollup milliseconds. Means are sum / steps.
-- Filled by a materialized view (deduplicated inserts do not reach it) and backfilled once.

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
       sum(steps.step_ms) AS step_sum,
       sum(steps.step_ms - (all_reduce_ms + all_gather_ms + reduce_scatter_ms + all_to_all_ms + broadcast_ms + p2p_ms))
           AS busy_sum,
       sum(all_reduce_ms + all_gather_ms + reduce_scatter_ms + all_to_all_ms + broadcast_ms + p2p_ms) AS collective_sum,
       sum(forward_ms) AS forward_sum, sum(backward_ms) AS backward_sum, sum(optimizer_ms) AS optimizer_sum,
       sum(dataloader_ms) AS dataloader_sum, sum(h2d_ms) AS h2d_sum, sum(gc_ms) AS gc_sum,
       sum(compile_ms) AS compile_sum, sum(checkpoint_ms) AS checkpoint_sum
FROM steps GROUP BY job, run, minute, rank;

INSERT INTO steps_rank_minutely
SELECT job, run, toStartOfMinute(time) AS minute, rank, any(steps.host) AS host, count() AS steps,
       sum(steps.step_ms) AS step_sum,
       sum(steps.step_ms - (all_reduce_ms + all_gather_ms + reduce_scatter_ms + all_to_all_ms + broadcast_ms + p2p_ms))
           AS busy_sum,
       sum(all_reduce_ms + all_gather_ms + reduce_scatter_ms + all_to_all_ms + broadcast_ms + p2p_ms) AS collective_sum,
       sum(forward_ms) AS forward_sum, sum(backward_ms) AS backward_sum, sum(optimizer_ms) AS optimizer_sum,
       sum(dataloader_ms) AS dataloader_sum, sum(h2d_ms) AS h2d_sum, sum(gc_ms) AS gc_sum,
       sum(compile_ms) AS compile_sum, sum(checkpoint_ms) AS checkpoint_sum
FROM steps GROUP BY job, run, minute, rank;
