-- configs/temporal_join.toml in SQL: each telemetry reading with the configuration its device
-- had at the reading's event time (FOR SYSTEM_TIME AS OF); readings before any configuration
-- are `left_only` results.

CREATE TABLE telemetry (
  device STRING, ts BIGINT, temp DOUBLE,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'device', 'idle_timeout' = '5s');

CREATE TABLE device_config (
  device STRING, ts BIGINT, max_temp DOUBLE, profile STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'device', 'idle_timeout' = '5s');

CREATE VIEW with_limits AS
  SELECT t.device, t.temp, c.max_temp, c.profile, c.ts AS config_ts
  FROM telemetry t
  LEFT JOIN device_config FOR SYSTEM_TIME AS OF t.rt AS c
    ON t.device = c.device;
