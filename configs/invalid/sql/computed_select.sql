-- expect: 9:17: computed select expressions are not supported yet: select fields (a.f, b.g AS h)
CREATE TABLE status (device STRING, ts BIGINT, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE TABLE command (device STRING, site STRING, ts BIGINT, cmd STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE VIEW v AS
  SELECT c.cmd, CASE WHEN s.seq > 3 THEN 'late' ELSE 'early' END AS phase
  FROM command c JOIN status s ON c.device = s.device AND s.rt BETWEEN c.rt AND c.rt + INTERVAL '1' SECOND;
