-- expect: 9:3: view v: bad item "(case when (right.seq > 3) then \"late\" else 0 end) AS phase": case mixes string and int 0 at column 45 (one type, or int and float)
CREATE TABLE status (device STRING, ts BIGINT, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE TABLE command (device STRING, site STRING, ts BIGINT, cmd STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE VIEW v AS
  SELECT c.cmd, CASE WHEN s.seq > 3 THEN 'late' ELSE 0 END AS phase
  FROM command c JOIN status s ON c.device = s.device AND s.rt BETWEEN c.rt AND c.rt + INTERVAL '1' SECOND;
