-- An anomaly's severity: page (a person should act now), warn (persistent or job-level:
-- worth a look, never a page), info. Rows written before this column read as 'page'.
ALTER TABLE anomalies ADD COLUMN IF NOT EXISTS severity LowCardinality(String) DEFAULT 'page';
