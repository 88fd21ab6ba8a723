-- Every table remembers the dedup tokens of its last 10,000 inserted blocks (was 1,000, and
-- none for dead_letters and kernel_names). A sink that dies after its insert but before its
-- commit is replayed by the partition's next owner after the consumer session times out
-- (librdkafka's default 45 s) plus a rebalance; meanwhile every other partition's sink keeps
-- inserting, one block per batch and per day the batch spans, into the same tables and, via
-- the materialized views, into the rollups. At the default batch_seconds = 1 that is up to
-- 45 x partitions blocks per table: 720 at 16 partitions, past 1,000 from 23 partitions on,
-- and the replayed insert would then be stored twice (rollups for good). 10,000 covers 200
-- partitions at one batch a second (ClickHouse's own default for replicated tables).
-- The window is a count of blocks: the cost is 10,000 hashes per table.

ALTER TABLE steps MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE kernel_sketches MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE kernel_names MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE stacks MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE gpu_samples MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE step_summaries MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE anomalies MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE dead_letters MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE jobs MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE steps_minutely MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE steps_by_rank MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE kernels MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE steps_rank_minutely MODIFY SETTING non_replicated_deduplication_window = 10000;
