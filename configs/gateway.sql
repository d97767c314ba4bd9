-- The gateway join of configs/gateway.toml in SQL (its streams and operator; a .sql file runs
-- with runtime defaults in `braid replay` and `braid validate`; for `braid run`, put it in
-- `[pipeline] sql` beside [sources] and [sinks]): which command took effect on a device?
-- A command joins the status changes of the same device from 3 s before to 5 s after it; a
-- command with none is a `left_only` result. Flink's watermark is max - delay, braid's
-- max - max_out_of_orderness - 1 ms: a delay of 0.501 s is TOML's max_out_of_orderness = "500ms".

CREATE TABLE status (
  device STRING, ts BIGINT, temp DOUBLE, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'device', 'idle_timeout' = '5s');

CREATE TABLE command (
  device STRING, ts BIGINT, cmd STRING, arg STRING, cmd_id STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'device', 'idle_timeout' = '5s');

CREATE VIEW effect AS
  SELECT c.cmd_id, c.cmd, s.state, s.seq, s.ts AS status_ts
  FROM command c LEFT JOIN status s
    ON c.device = s.device
   AND s.rt BETWEEN c.rt - INTERVAL '3' SECOND AND c.rt + INTERVAL '5' SECOND;
