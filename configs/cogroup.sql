-- configs/cogroup.toml in SQL: per user and browsing session (30 s without a view or a
-- purchase ends it), pages viewed, purchases and their total, the landing page and the last
-- order. Two window aggregates joined on the key and the window are braid's cogroup: its
-- sessions span both tables (in Flink each side would form its own sessions), and a side with
-- no rows counts 0.

SET 'table.exec.emit.allow-lateness' = '1 min';

CREATE TABLE browse (
  `user` STRING, ts BIGINT, page STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'user', 'idle_timeout' = '5s');

CREATE TABLE purchase (
  `user` STRING, ts BIGINT, amount DOUBLE, `order` STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND
) WITH ('key' = 'user', 'idle_timeout' = '5s');

CREATE VIEW per_session AS
  SELECT b.`user`, b.window_start, b.window_end, b.views, p.buys, p.total, b.first_view,
         p.last_buy, b.landing, p.final_order
  FROM (
    SELECT `user`, window_start, window_end, COUNT(*) AS views, MIN(ts) AS first_view,
           FIRST_VALUE(page) AS landing
    FROM TABLE(SESSION(TABLE browse PARTITION BY `user`, DESCRIPTOR(rt), INTERVAL '30' SECOND))
    GROUP BY `user`, window_start, window_end
  ) b
  LEFT JOIN (
    SELECT `user`, window_start, window_end, COUNT(*) AS buys, SUM(amount) AS total,
           MAX(ts) AS last_buy, LAST_VALUE(`order`) AS final_order
    FROM TABLE(SESSION(TABLE purchase PARTITION BY `user`, DESCRIPTOR(rt), INTERVAL '30' SECOND))
    GROUP BY `user`, window_start, window_end
  ) p
  ON b.`user` = p.`user` AND b.window_start = p.window_start AND b.window_end = p.window_end;
