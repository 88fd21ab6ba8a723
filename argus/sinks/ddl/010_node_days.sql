-- GPU-hours each host hosted per day, for the whole days of a window: the fleet view reads a
-- month of a 10,000-host fleet from 300,000 rows here instead of 7.2 million hourly ones in
-- node_hours, which it reads only for the hours at the window's two ends. Filled from
-- node_hours (a view on the table another view fills) and backfilled from it once.

CREATE TABLE IF NOT EXISTS node_days
(
    host     LowCardinality(String),
    day      Date,
    gpu_ms   SimpleAggregateFunction(sum, Float64),
    steps    SimpleAggregateFunction(sum, UInt64),
    inserted SimpleAggregateFunction(max, DateTime) DEFAULT now()
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (host, day)
TTL inserted + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS node_days_mv TO node_days AS
SELECT node_hours.host AS host, toDate(node_hours.hour) AS day, sum(node_hours.gpu_ms) AS gpu_ms,
       sum(node_hours.steps) AS steps
FROM node_hours GROUP BY host, day;

INSERT INTO node_days (host, day, gpu_ms, steps)
SELECT node_hours.host AS host, toDate(node_hours.hour) AS day, sum(node_hours.gpu_ms) AS gpu_ms,
       sum(node_hours.steps) AS steps
FROM node_hours GROUP BY host, day;
