-- The last step of every rank-minute, so the slow-rank alert can skip a job's warm-up
-- while reading the small per-minute rollup instead of every step row.

ALTER TABLE steps_rank_minutely ADD COLUMN IF NOT EXISTS max_step SimpleAggregateFunction(max, UInt64);

DROP VIEW IF EXISTS steps_rank_minutely_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS steps_rank_minutely_mv TO steps_rank_minutely AS
SELECT job, run, toStartOfMinute(time) AS minute, rank, any(steps.host) AS host, count() AS steps,
       max(steps.step) AS max_step,
       sum(steps.step_ms) AS step_sum,
       sum(steps.step_ms - (all_reduce_ms + all_gather_ms + reduce_scatter_ms + all_to_all_ms + broadcast_ms + p2p_ms))
           AS busy_sum,
       sum(all_reduce_ms + all_gather_ms + reduce_scatter_ms + all_to_all_ms + broadcast_ms + p2p_ms) AS collective_sum,
       sum(forward_ms) AS forward_sum, sum(backward_ms) AS backward_sum, sum(optimizer_ms) AS optimizer_sum,
       sum(dataloader_ms) AS dataloader_sum, sum(h2d_ms) AS h2d_sum, sum(gc_ms) AS gc_sum,
       sum(compile_ms) AS compile_sum, sum(checkpoint_ms) AS checkpoint_sum
FROM steps GROUP BY job, run, minute, rank;
