-- Argus tables, version 1. One DDL for embedded chDB and a ClickHouse server.
-- {ttl_days} is filled in by `argus db migrate` (ARGUS_TTL_DAYS, default 30).

CREATE TABLE IF NOT EXISTS steps
(
    job          LowCardinality(String),
    run          UInt32,
    step         UInt64,
    rank         UInt32,
    host         LowCardinality(String),
    gpu_uuid     LowCardinality(String),
    dp           UInt32,
    tp           UInt32,
    pp           UInt32,
    ep           UInt32,
    cp           UInt32,
    time         DateTime64(3) CODEC(DoubleDelta, ZSTD(1)),
    start_ns     Int64 CODEC(DoubleDelta, ZSTD(1)),
    end_ns       Int64 CODEC(DoubleDelta, ZSTD(1)),
    step_ms      Float32 CODEC(ZSTD(1)),
    forward_ms   Float32 CODEC(ZSTD(1)),
    backward_ms  Float32 CODEC(ZSTD(1)),
    optimizer_ms Float32 CODEC(ZSTD(1)),
    dataloader_ms Float32 CODEC(ZSTD(1)),
    h2d_ms       Float32 CODEC(ZSTD(1)),
    gc_ms        Float32 CODEC(ZSTD(1)),
    compile_ms   Float32 CODEC(ZSTD(1)),
    checkpoint_ms Float32 CODEC(ZSTD(1)),
    all_reduce_ms Float32 CODEC(ZSTD(1)),
    all_gather_ms Float32 CODEC(ZSTD(1)),
    reduce_scatter_ms Float32 CODEC(ZSTD(1)),
    all_to_all_ms Float32 CODEC(ZSTD(1)),
    broadcast_ms Float32 CODEC(ZSTD(1)),
    p2p_ms       Float32 CODEC(ZSTD(1)),
    samples      UInt64 CODEC(Delta, ZSTD(1)),
    tokens       UInt64 CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (job, run, step, rank)
TTL toDateTime(time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE TABLE IF NOT EXISTS kernel_sketches
(
    job       LowCardinality(String),
    run       UInt32,
    rank      UInt32,
    step      UInt64,
    time      DateTime64(3) DEFAULT now64(3) CODEC(DoubleDelta, ZSTD(1)),
    codec     UInt16,
    base_step Int64,
    payload   String CODEC(ZSTD(3))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (job, run, rank, step)
TTL toDateTime(time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE TABLE IF NOT EXISTS kernel_names
(
    job       LowCardinality(String),
    run       UInt32,
    rank      UInt32,
    kernel_id UInt32,
    name      String CODEC(ZSTD(3))
)
ENGINE = ReplacingMergeTree
ORDER BY (job, run, rank, kernel_id);

CREATE TABLE IF NOT EXISTS stacks
(
    job      LowCardinality(String),
    run      UInt32,
    rank     UInt32,
    step     UInt64,
    time     DateTime64(3) CODEC(DoubleDelta, ZSTD(1)),
    stack    String CODEC(ZSTD(3)),
    count    UInt32
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (job, run, rank, step, stack)
TTL toDateTime(time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE TABLE IF NOT EXISTS gpu_samples
(
    host          LowCardinality(String),
    gpu_uuid      LowCardinality(String),
    gpu_index     UInt16,
    time          DateTime64(3) CODEC(DoubleDelta, ZSTD(1)),
    gpu_util      Float32 CODEC(Gorilla, ZSTD(1)),
    sm_clock_mhz  Float32 CODEC(Gorilla, ZSTD(1)),
    power_w       Float32 CODEC(Gorilla, ZSTD(1)),
    temp_c        Float32 CODEC(Gorilla, ZSTD(1)),
    clock_event_reasons UInt64,
    xid           UInt32,
    ecc_dbe       UInt64 CODEC(Delta, ZSTD(1)),
    remapped_rows UInt64 CODEC(Delta, ZSTD(1)),
    nvlink_tx_bytes UInt64 CODEC(Delta, ZSTD(1)),
    nvlink_rx_bytes UInt64 CODEC(Delta, ZSTD(1)),
    nvlink_errors UInt64 CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (host, gpu_index, time)
TTL toDateTime(time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE TABLE IF NOT EXISTS step_summaries
(
    job        LowCardinality(String),
    run        UInt32,
    step       UInt64,
    time       DateTime64(3) CODEC(DoubleDelta, ZSTD(1)),
    ranks      UInt32,
    missing    Array(UInt32),
    step_ms_median Float32,
    step_ms_p99    Float32,
    step_ms_max    Float32,
    compute_ms_median Float32,
    collective_ms_median Float32,
    dataloader_ms_median Float32,
    checkpoint_ms_max Float32,
    tokens     UInt64,
    suspects   Array(UInt32)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (job, run, step)
TTL toDateTime(time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE TABLE IF NOT EXISTS anomalies
(
    id           String,
    job          LowCardinality(String),
    run          UInt32,
    start_step   UInt64,
    end_step     UInt64,
    level        LowCardinality(String),
    suspect_kind LowCardinality(String),
    suspect      String,
    ranks        Array(UInt32),
    cause        LowCardinality(String),
    score        Float64,
    evidence     Map(String, Float64),
    summary      String,
    step_ms_added  Float64,
    gpu_hours_lost Float64,
    time         DateTime64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (job, id)
TTL toDateTime(time) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;

CREATE TABLE IF NOT EXISTS dead_letters
(
    topic     LowCardinality(String),
    partition UInt32,
    offset    UInt64,
    reason    LowCardinality(String),
    error     String,
    time      DateTime64(3),
    payload   String CODEC(ZSTD(3))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(time)
ORDER BY (topic, partition, offset)
TTL toDateTime(time) + INTERVAL {ttl_days} DAY;

CREATE TABLE IF NOT EXISTS schema_migrations
(
    version UInt32,
    applied DateTime DEFAULT now()
)
ENGINE = ReplacingMergeTree
ORDER BY version;
