-- Retention counts from when a row arrived, not from the time it describes: an imported
-- 2023 trace is kept {ttl_days} days like live data (before, a TTL on `time` deleted it at
-- once). Each table with a TTL gets `inserted` (filled by the server at insert, also for
-- rows written through materialized views) and its TTL moves to it. Rows stored before
-- this migration get their `inserted` when their part is next rewritten (the TTL
-- materialization right after MODIFY TTL), so they are kept {ttl_days} days from then.
-- The rollups (AggregatingMergeTree) keep the latest arrival of the rows they merge.
-- ClickHouse DateTime ends in 2106: `argus` bounds ARGUS_TTL_DAYS so that the sum stays below.

ALTER TABLE steps ADD COLUMN IF NOT EXISTS inserted DateTime DEFAULT now() CODEC(Delta, ZSTD(1));
ALTER TABLE steps MODIFY TTL inserted + INTERVAL {ttl_days} DAY;

ALTER TABLE kernel_sketches ADD COLUMN IF NOT EXISTS inserted DateTime DEFAULT now() CODEC(Delta, ZSTD(1));
ALTER TABLE kernel_sketches MODIFY TTL inserted + INTERVAL {ttl_days} DAY;

ALTER TABLE stacks ADD COLUMN IF NOT EXISTS inserted DateTime DEFAULT now() CODEC(Delta, ZSTD(1));
ALTER TABLE stacks MODIFY TTL inserted + INTERVAL {ttl_days} DAY;

ALTER TABLE gpu_samples ADD COLUMN IF NOT EXISTS inserted DateTime DEFAULT now() CODEC(Delta, ZSTD(1));
ALTER TABLE gpu_samples MODIFY TTL inserted + INTERVAL {ttl_days} DAY;

ALTER TABLE step_summaries ADD COLUMN IF NOT EXISTS inserted DateTime DEFAULT now() CODEC(Delta, ZSTD(1));
ALTER TABLE step_summaries MODIFY TTL inserted + INTERVAL {ttl_days} DAY;

ALTER TABLE anomalies ADD COLUMN IF NOT EXISTS inserted DateTime DEFAULT now() CODEC(Delta, ZSTD(1));
ALTER TABLE anomalies MODIFY TTL inserted + INTERVAL {ttl_days} DAY;

ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS inserted DateTime DEFAULT now() CODEC(Delta, ZSTD(1));
ALTER TABLE dead_letters MODIFY TTL inserted + INTERVAL {ttl_days} DAY;

ALTER TABLE kernels ADD COLUMN IF NOT EXISTS inserted DateTime DEFAULT now() CODEC(Delta, ZSTD(1));
ALTER TABLE kernels MODIFY TTL inserted + INTERVAL {ttl_days} DAY;

ALTER TABLE steps_minutely ADD COLUMN IF NOT EXISTS inserted SimpleAggregateFunction(max, DateTime) DEFAULT now();
ALTER TABLE steps_minutely MODIFY TTL inserted + INTERVAL {ttl_days} DAY;

ALTER TABLE steps_by_rank ADD COLUMN IF NOT EXISTS inserted SimpleAggregateFunction(max, DateTime) DEFAULT now();
ALTER TABLE steps_by_rank MODIFY TTL inserted + INTERVAL {ttl_days} DAY;

ALTER TABLE steps_rank_minutely ADD COLUMN IF NOT EXISTS inserted SimpleAggregateFunction(max, DateTime) DEFAULT now();
ALTER TABLE steps_rank_minutely MODIFY TTL inserted + INTERVAL {ttl_days} DAY;
