-- configs/window_aggregate.toml in SQL: per device and 10-second window of telemetry, the
-- count, mean, lowest and highest temperature and the first and last state, over the readings
-- at or above -40 °C. A window aggregate over one table is braid's window_aggregate.

SET 'table.exec.emit.allow-lateness' = '5 s';

CREATE TABLE telemetry (
  device STRING, ts BIGINT, temp DOUBLE, state STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'device', 'idle_timeout' = '5s');

CREATE VIEW per_device AS
  SELECT device, window_start, window_end, COUNT(*) AS n, AVG(temp) AS mean, MIN(temp) AS low,
         MAX(temp) AS high, FIRST_VALUE(state) AS first_state, LAST_VALUE(state) AS last_state
  FROM TABLE(TUMBLE(TABLE telemetry, DESCRIPTOR(rt), INTERVAL '10' SECOND))
  WHERE temp >= -40
  GROUP BY window_start, window_end, device;
