-- The fleet model's input, kept small (`argus fleet` ranks every host from this table and
-- node_hours alone, never from anomaly_nodes or anomalies): node_jobs holds one row per host,
-- hour, cause, suspect kind and job that implicated the host, with the host's GPUs the job's
-- anomalies named there. The job is a 64-bit hash (cityHash64): only its distinct count is
-- read, and a number hashes and compares far faster than a name.
-- Filled from anomaly_nodes (a view on the table another view fills: every block
-- anomaly_nodes_mv writes comes through here too), so an anomaly's versions (its window
-- growing, the idle refresh resending it) and a job's repeated anomalies on one host collapse
-- into one row once merged; readers count distinct jobs, so rows not merged yet count once
-- as well. Hours, as node_hours: a window of whole hours reads exactly what it covers.

CREATE TABLE IF NOT EXISTS node_jobs
(
    host         LowCardinality(String),
    hour         DateTime,
    cause        LowCardinality(String),
    suspect_kind LowCardinality(String),
    job_hash     UInt64,
    gpus         SimpleAggregateFunction(groupUniqArrayArray, Array(String)),
    inserted     SimpleAggregateFunction(max, DateTime) DEFAULT now()
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(hour)
ORDER BY (host, cause, suspect_kind, job_hash, hour)
TTL inserted + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS node_jobs_mv TO node_jobs AS
SELECT host, toStartOfHour(time) AS hour, cause, suspect_kind, cityHash64(job) AS job_hash,
       groupUniqArrayArray(gpus) AS gpus
FROM anomaly_nodes GROUP BY host, hour, cause, suspect_kind, job_hash;

INSERT INTO node_jobs (host, hour, cause, suspect_kind, job_hash, gpus)
SELECT host, toStartOfHour(time) AS hour, cause, suspect_kind, cityHash64(job) AS job_hash,
       groupUniqArrayArray(gpus) AS gpus
FROM anomaly_nodes GROUP BY host, hour, cause, suspect_kind, job_hash;
