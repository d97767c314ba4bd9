-- expect: 6:20: braid writes the key under its own name and the window bounds as _window_start and _window_end: select them without AS
CREATE TABLE status (device STRING, ts BIGINT, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE VIEW v AS
  SELECT device AS d, window_start, window_end, COUNT(*) AS n
  FROM TABLE(TUMBLE(TABLE status, DESCRIPTOR(rt), INTERVAL '1' MINUTE))
  GROUP BY device, window_start, window_end;
