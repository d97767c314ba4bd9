-- expect: 8:106: a join needs its keys equal: r.site = l.site AND r.device = l.device
CREATE TABLE reading (site STRING, device BIGINT, ts BIGINT, temp DOUBLE,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'site, device');
CREATE TABLE limits (site STRING, device BIGINT, ts BIGINT, max_temp DOUBLE,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'site, device');
CREATE VIEW v AS SELECT r.temp, l.max_temp FROM reading r JOIN limits FOR SYSTEM_TIME AS OF r.rt AS l ON r.site = l.site;
