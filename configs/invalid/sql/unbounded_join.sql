-- expect: 8:72: a join without a time bound would keep every row forever: bound it (s.rt BETWEEN c.rt - INTERVAL … AND c.rt + INTERVAL …, or >, >=, <, <=), window both sides, or join FOR SYSTEM_TIME AS OF
CREATE TABLE status (device STRING, ts BIGINT, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE TABLE command (device STRING, site STRING, ts BIGINT, cmd STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE VIEW v AS SELECT c.cmd, s.state FROM command c JOIN status s ON c.device = s.device;
