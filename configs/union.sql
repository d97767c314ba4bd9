-- configs/union.toml in SQL: two sites' status streams merged into one, each row tagged with
-- the site it came from (`_stream`).

CREATE TABLE status_site_a (
  device STRING, ts BIGINT, temp DOUBLE, state STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'device', 'idle_timeout' = '5s');

CREATE TABLE status_site_b (
  device STRING, ts BIGINT, temp DOUBLE, state STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'device', 'idle_timeout' = '5s');

CREATE VIEW all_status AS
  SELECT * FROM status_site_a
  UNION ALL
  SELECT * FROM status_site_b;
