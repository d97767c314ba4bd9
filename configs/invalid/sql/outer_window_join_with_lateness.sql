-- expect: 11:8: view v: an outer window join takes no allowed_lateness: a late row could turn a row emitted alone into a pair, and a consumer upserting by _id cannot retract the row emitted alone
CREATE TABLE status (device STRING, ts BIGINT, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
CREATE TABLE command (device STRING, site STRING, ts BIGINT, cmd STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device');
SET 'table.exec.emit.allow-lateness' = '30 s';
CREATE VIEW v AS
  SELECT c.cmd, s.state
  FROM TABLE(TUMBLE(TABLE command, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) c
  LEFT JOIN TABLE(TUMBLE(TABLE status, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) s
  ON c.device = s.device AND c.window_start = s.window_start AND c.window_end = s.window_end;
