-- configs/window_join.toml in SQL: which product pages did a user view in the same minute as a
-- purchase over 100? `table.exec.emit.allow-lateness` is the windows' allowed_lateness.

SET 'table.exec.emit.allow-lateness' = '30 s';

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

CREATE VIEW views_and_buys AS
  SELECT b.page, b.ts AS viewed, p.`order`, p.amount, b.window_start, b.window_end
  FROM TABLE(TUMBLE(TABLE browse, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) b
  JOIN TABLE(TUMBLE(TABLE purchase, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) p
    ON b.`user` = p.`user` AND b.window_start = p.window_start AND b.window_end = p.window_end
  WHERE p.amount > 100;
