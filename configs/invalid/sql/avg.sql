-- expect: 12:47: AVG is not supported yet: select SUM and COUNT
CREATE TABLE status (device STRING, ts BIGINT, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE TABLE command (device STRING, site STRING, ts BIGINT, cmd STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE VIEW v AS
  SELECT c.device, c.n, s.mean_seq FROM
    (SELECT device, window_start, window_end, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE command, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) GROUP BY device, window_start, window_end) c
  JOIN
    (SELECT device, window_start, window_end, AVG(seq) AS mean_seq FROM TABLE(TUMBLE(TABLE status, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) GROUP BY device, window_start, window_end) s
  ON c.device = s.device AND c.window_start = s.window_start AND c.window_end = s.window_end;
