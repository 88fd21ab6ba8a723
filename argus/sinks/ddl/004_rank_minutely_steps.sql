-- The last step of every rank-minute, so the slow-rank alert can skip a job's warm-up
-- while reading the small per-minute rollup instead of every step row.
-- Its sums: rank_minutely_sums in sinks/_sql.py.

ALTER TABLE steps_rank_minutely ADD COLUMN IF NOT EXISTS max_step SimpleAggregateFunction(max, UInt64);

DROP VIEW IF EXISTS steps_rank_minutely_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS steps_rank_minutely_mv TO steps_rank_minutely AS
SELECT job, run, toStartOfMinute(time) AS minute, rank, any(steps.host) AS host, count() AS steps,
       max(steps.step) AS max_step,
       {rank_minutely_sums}
FROM steps GROUP BY job, run, minute, rank;
