-- configs/site_limits.toml in SQL: both tables keyed by (site, device), a composite key
-- ('key' = 'site, device'); a join matches it with one equality per key field.

CREATE TABLE telemetry (
  site STRING, device BIGINT, ts BIGINT, temp DOUBLE,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'site, device', 'idle_timeout' = '5s');

CREATE TABLE limits (
  site STRING, device BIGINT, ts BIGINT, max_temp DOUBLE,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'site, device', 'idle_timeout' = '5s');

CREATE VIEW with_limits AS
  SELECT t.site, t.device, t.temp, l.max_temp, l.ts AS limit_ts
  FROM telemetry t
  LEFT JOIN limits FOR SYSTEM_TIME AS OF t.rt AS l
    ON t.site = l.site AND t.device = l.device;

CREATE VIEW per_window AS
  SELECT t.site, t.device, t.window_start, t.window_end, t.readings, t.hottest, l.limit_changes
  FROM (
    SELECT site, device, window_start, window_end, COUNT(*) AS readings, MAX(temp) AS hottest
    FROM TABLE(TUMBLE(TABLE telemetry, DESCRIPTOR(rt), INTERVAL '10' SECOND))
    GROUP BY site, device, window_start, window_end
  ) t
  LEFT JOIN (
    SELECT site, device, window_start, window_end, COUNT(*) AS limit_changes
    FROM TABLE(TUMBLE(TABLE limits, DESCRIPTOR(rt), INTERVAL '10' SECOND))
    GROUP BY site, device, window_start, window_end
  ) l
  ON t.site = l.site AND t.device = l.device
     AND t.window_start = l.window_start AND t.window_end = l.window_end;
