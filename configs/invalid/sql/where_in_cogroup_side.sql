-- expect: 11:81: WHERE inside a cogroup's window aggregate is not supported: a cogroup aggregates every row of its tables (a window aggregate over one table takes WHERE)
CREATE TABLE status (device STRING, ts BIGINT, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE TABLE command (device STRING, site STRING, ts BIGINT, cmd STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE VIEW v AS
  SELECT s.device, s.window_start, s.window_end, s.n, c.m
  FROM (SELECT device, window_start, window_end, COUNT(*) AS n
    FROM TABLE(TUMBLE(TABLE status, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) WHERE seq > 0
    GROUP BY device, window_start, window_end) s
  JOIN (SELECT device, window_start, window_end, COUNT(*) AS m
    FROM TABLE(TUMBLE(TABLE command, DESCRIPTOR(rt), INTERVAL '1' MINUTE))
    GROUP BY device, window_start, window_end) c
  ON s.device = c.device AND s.window_start = c.window_start AND s.window_end = c.window_end;
