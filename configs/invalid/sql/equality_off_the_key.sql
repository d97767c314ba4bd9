-- expect: 8:87: braid joins on the tables' keys: c.device = s.device ('key' options); other equalities are not supported yet
CREATE TABLE status (device STRING, ts BIGINT, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE TABLE command (device STRING, site STRING, ts BIGINT, cmd STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE VIEW v AS SELECT c.cmd FROM command c JOIN status s ON c.device = s.device AND c.site = s.state AND s.rt = c.rt;
