-- expect: 8:110: WHERE after an outer join would drop its outer rows too: write the condition in ON (braid's where decides which pairs join, as ON does)
CREATE TABLE status (device STRING, ts BIGINT, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE TABLE command (device STRING, site STRING, ts BIGINT, cmd STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE VIEW v AS SELECT c.cmd FROM command c LEFT JOIN status s ON c.device = s.device AND s.rt = c.rt WHERE s.seq > 3;
