//! What one frame of `braid status` shows, and how it is drawn — both pure, so the tests need no
//! service: [`Frame::from_scrapes`] turns one or two scrapes of `/metrics` (and `/healthz`'s
//! answer) into figures, [`Frame::render`] turns figures into at most [`WIDTH`]-column lines.
//!
//! - rates (rows/s, acked/s) are counter differences between the two scrapes over the time
//!   between them; with one scrape, or after a counter went back (the service restarted), "–";
//! - watermark lag = processing time (the clock of the machine running `braid status`, which is
//!   the service's machine for a loopback address) − the stream's watermark; "–" before the
//!   stream's first row (the watermark is −∞, exported as i64::MIN);
//! - join rate = matched / (matched + unmatched) summed over the operator's inputs, since the
//!   service started; "–" for operators that are not joins or that no row has left yet.

use crate::ops::prom::Scrape;

/// Every line fits this many columns.
pub const WIDTH: usize = 80;
/// Names longer than this are cut, ending in `…`.
const NAME: usize = 18;
/// Shown for a figure that cannot be known yet.
pub const NONE: &str = "–";

/// `/healthz`'s answer: 200 "ok", or the reasons (one a line) of a 503 or of warnings under 200.
#[derive(Clone, Debug, PartialEq)]
pub struct Health {
    pub ok: bool,
    pub reasons: Vec<String>,
}

impl Health {
    pub fn from_answer(status: u16, body: &str) -> Health {
        let reasons = body.lines().map(str::trim).filter(|l| !l.is_empty() && *l != "ok").map(str::to_owned);
        Health { ok: status == 200, reasons: reasons.collect() }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct StreamFigures {
    pub name: String,
    pub rows: u64,
    pub rate: Option<f64>,
    pub lag_ms: Option<i64>,
    pub idle: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OperatorFigures {
    pub name: String,
    /// Rows in (all inputs) per second.
    pub rate: Option<f64>,
    pub join_rate: Option<f64>,
    pub late: u64,
    pub state_rows: u64,
    pub state_bytes: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SinkFigures {
    pub name: String,
    pub connected: bool,
    pub queued_bytes: u64,
    pub acked: u64,
    pub acked_rate: Option<f64>,
}

/// One screen's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// The ops address shown in the header.
    pub addr: String,
    pub health: Health,
    /// (source, connected).
    pub sources: Vec<(String, bool)>,
    pub streams: Vec<StreamFigures>,
    pub operators: Vec<OperatorFigures>,
    pub sinks: Vec<SinkFigures>,
}

/// A counter or gauge as a whole number (negative and NaN read as 0).
fn whole(v: Option<f64>) -> u64 {
    v.filter(|v| v.is_finite() && *v > 0.0).map_or(0, |v| v as u64)
}

impl Frame {
    /// The figures of `cur`, taken at `now_ms` (processing time); rates against `prev`, taken
    /// `elapsed_s` seconds earlier, when given.
    pub fn from_scrapes(addr: &str, prev: Option<(&Scrape, f64)>, cur: &Scrape, now_ms: i64, health: Health) -> Frame {
        let rate = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
            let (prev, elapsed_s) = prev?;
            let (before, after) = (prev.sum(name, labels)?, cur.sum(name, labels)?);
            (elapsed_s > 0.0 && after >= before).then(|| (after - before) / elapsed_s)
        };
        let streams = cur
            .label_values("braid_stream_rows_total", "stream")
            .into_iter()
            .map(|name| {
                let l = [("stream", name.as_str())];
                let watermark = cur.value("braid_stream_watermark_ms", &l);
                // −∞ is exported saturated (i64::MIN), +∞ as i64::MAX: no lag to show.
                let lag_ms = watermark.filter(|w| w.abs() < 1e15).map(|w| now_ms - w as i64);
                StreamFigures {
                    rows: whole(cur.value("braid_stream_rows_total", &l)),
                    rate: rate("braid_stream_rows_total", &l),
                    lag_ms,
                    idle: cur.value("braid_stream_idle", &l) == Some(1.0),
                    name,
                }
            })
            .collect();
        let operators = cur
            .label_values("braid_operator_state_rows", "operator")
            .into_iter()
            .map(|name| {
                let l = [("operator", name.as_str())];
                let matched = cur.sum("braid_operator_matched_total", &l);
                let unmatched = cur.sum("braid_operator_unmatched_total", &l);
                let join_rate = match (matched, unmatched) {
                    (Some(m), Some(u)) if m + u > 0.0 => Some(m / (m + u)),
                    _ => None,
                };
                OperatorFigures {
                    rate: rate("braid_operator_rows_total", &l),
                    join_rate,
                    late: whole(cur.sum("braid_operator_late_total", &l)),
                    state_rows: whole(cur.value("braid_operator_state_rows", &l)),
                    state_bytes: whole(cur.value("braid_operator_state_bytes", &l)),
                    name,
                }
            })
            .collect();
        let sinks = cur
            .label_values("braid_sink_sent_total", "sink")
            .into_iter()
            .map(|name| {
                let l = [("sink", name.as_str())];
                SinkFigures {
                    connected: cur.value("braid_sink_connected", &l) == Some(1.0),
                    queued_bytes: whole(cur.value("braid_sink_queued_bytes", &l)),
                    acked: whole(cur.value("braid_sink_sent_total", &l)),
                    acked_rate: rate("braid_sink_sent_total", &l),
                    name,
                }
            })
            .collect();
        let sources = cur
            .family("braid_source_connected")
            .filter_map(|s| Some((s.label("source")?.to_owned(), s.value == 1.0)))
            .collect();
        Frame { addr: addr.to_owned(), health, sources, streams, operators, sinks }
    }

    /// The screen: a header (address, health, sources, reasons), then a table each for streams,
    /// operators and sinks (a table without rows is left out). No line is wider than [`WIDTH`].
    pub fn render(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let health = if self.health.ok { "ok" } else { "DEGRADED" };
        lines.push(format!("braid status  {}  health: {health}", self.addr));
        if !self.sources.is_empty() {
            let sources: Vec<String> = self
                .sources
                .iter()
                .map(|(name, up)| format!("{} {}", cut(name), if *up { "connected" } else { "NOT CONNECTED" }))
                .collect();
            lines.push(format!("source {}", sources.join(", ")));
        }
        lines.extend(self.health.reasons.iter().map(|r| format!("! {r}")));
        lines.push(String::new());
        lines.push(format!("{:<18} {:>9} {:>12} {:>14} {:>5}", "STREAM", "ROWS/S", "ROWS", "WATERMARK LAG", "IDLE"));
        for s in &self.streams {
            lines.push(format!(
                "{:<18} {:>9} {:>12} {:>14} {:>5}",
                cut(&s.name),
                per_second(s.rate),
                s.rows,
                s.lag_ms.map_or_else(|| NONE.to_owned(), duration),
                if s.idle { "idle" } else { "no" }
            ));
        }
        if !self.operators.is_empty() {
            lines.push(String::new());
            lines.push(format!(
                "{:<18} {:>9} {:>9} {:>9} {:>12} {:>10}",
                "OPERATOR", "ROWS/S", "JOIN RATE", "LATE", "STATE ROWS", "STATE"
            ));
            for o in &self.operators {
                lines.push(format!(
                    "{:<18} {:>9} {:>9} {:>9} {:>12} {:>10}",
                    cut(&o.name),
                    per_second(o.rate),
                    o.join_rate.map_or_else(|| NONE.to_owned(), |r| format!("{:.1}%", r * 100.0)),
                    o.late,
                    o.state_rows,
                    bytes(o.state_bytes)
                ));
            }
        }
        if !self.sinks.is_empty() {
            lines.push(String::new());
            lines.push(format!("{:<18} {:>9} {:>10} {:>12} {:>9}", "SINK", "UPLINK", "QUEUED", "ACKED", "ACKED/S"));
            for s in &self.sinks {
                lines.push(format!(
                    "{:<18} {:>9} {:>10} {:>12} {:>9}",
                    cut(&s.name),
                    if s.connected { "up" } else { "DOWN" },
                    bytes(s.queued_bytes),
                    s.acked,
                    per_second(s.acked_rate)
                ));
            }
        }
        lines.into_iter().map(|l| fit(&l, WIDTH)).collect()
    }
}

/// `s` cut to `width` characters, the last one `…` when cut.
fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(width - 1).collect();
    out.push('…');
    out
}

fn cut(name: &str) -> String {
    fit(name, NAME)
}

fn per_second(rate: Option<f64>) -> String {
    match rate {
        None => NONE.to_owned(),
        Some(r) if r < 10.0 => format!("{r:.1}"),
        Some(r) if r < 1e6 => format!("{r:.0}"),
        Some(r) => format!("{:.1}M", r / 1e6),
    }
}

/// Milliseconds as a short duration: `850ms`, `12.3s`, `4m05s`, `3h12m`, `2d05h`; negative with
/// a `-`.
fn duration(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    let body = if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60)
    } else if ms < 86_400_000 {
        format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60)
    } else {
        format!("{}d{:02}h", ms / 86_400_000, ms / 3_600_000 % 24)
    };
    format!("{sign}{body}")
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1}{}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_010_000;

    /// The service's metrics for the gateway join, with `rows` rows per stream so far.
    fn metrics(rows: u64, sent: u64) -> Scrape {
        let text = format!(
            "# HELP braid_stream_rows_total Rows.\n# TYPE braid_stream_rows_total counter\n\
             braid_stream_rows_total{{stream=\"status\"}} {rows}\n\
             braid_stream_rows_total{{stream=\"command_stream_with_a_very_long_name\"}} {half}\n\
             braid_stream_watermark_ms{{stream=\"status\"}} {wm}\n\
             braid_stream_watermark_ms{{stream=\"command_stream_with_a_very_long_name\"}} -9223372036854775808\n\
             braid_stream_idle{{stream=\"status\"}} 0\n\
             braid_stream_idle{{stream=\"command_stream_with_a_very_long_name\"}} 1\n\
             braid_operator_rows_total{{operator=\"effect\",input=\"command\"}} {half}\n\
             braid_operator_rows_total{{operator=\"effect\",input=\"status\"}} {rows}\n\
             braid_operator_late_total{{operator=\"effect\",input=\"command\"}} 2\n\
             braid_operator_late_total{{operator=\"effect\",input=\"status\"}} 1\n\
             braid_operator_matched_total{{operator=\"effect\",input=\"command\"}} 30\n\
             braid_operator_matched_total{{operator=\"effect\",input=\"status\"}} 60\n\
             braid_operator_unmatched_total{{operator=\"effect\",input=\"command\"}} 10\n\
             braid_operator_unmatched_total{{operator=\"effect\",input=\"status\"}} 0\n\
             braid_operator_state_rows{{operator=\"effect\"}} 120\n\
             braid_operator_state_bytes{{operator=\"effect\"}} 46182\n\
             braid_operator_state_rows{{operator=\"all\"}} 0\n\
             braid_operator_state_bytes{{operator=\"all\"}} 0\n\
             braid_sink_queued_bytes{{sink=\"up\"}} 2048\n\
             braid_sink_sent_total{{sink=\"up\"}} {sent}\n\
             braid_sink_connected{{sink=\"up\"}} 1\n\
             braid_source_connected{{source=\"devices\"}} 1\n",
            half = rows / 2,
            wm = NOW - 1_240,
        );
        Scrape::parse(&text).unwrap()
    }

    fn ok() -> Health {
        Health::from_answer(200, "ok\n")
    }

    #[test]
    fn figures_and_rates_from_two_scrapes() {
        let (before, after) = (metrics(100, 40), metrics(300, 90));
        let frame = Frame::from_scrapes("127.0.0.1:9464", Some((&before, 2.0)), &after, NOW, ok());
        let status = &frame.streams[0];
        assert_eq!(
            (status.name.as_str(), status.rows, status.rate, status.lag_ms, status.idle),
            ("status", 300, Some(100.0), Some(1_240), false)
        );
        let command = &frame.streams[1];
        assert_eq!((command.rate, command.lag_ms, command.idle), (Some(50.0), None, true));
        let effect = &frame.operators[0];
        // Rows in over both inputs: (150 + 300 − 50 − 100) / 2 s; 90 of 100 rows matched.
        assert_eq!((effect.rate, effect.join_rate, effect.late), (Some(150.0), Some(0.9), 3));
        assert_eq!((effect.state_rows, effect.state_bytes), (120, 46182));
        assert_eq!(frame.operators[1].join_rate, None, "no matched/unmatched: not a join");
        assert_eq!(
            frame.sinks[0],
            SinkFigures { name: "up".into(), connected: true, queued_bytes: 2048, acked: 90, acked_rate: Some(25.0) }
        );
        assert_eq!(frame.sources, vec![("devices".to_owned(), true)]);
    }

    #[test]
    fn one_scrape_or_a_counter_that_went_back_has_no_rates() {
        let frame = Frame::from_scrapes("a", None, &metrics(300, 90), NOW, ok());
        assert!(frame.streams.iter().all(|s| s.rate.is_none()));
        assert_eq!(frame.operators[0].rate, None);
        let restarted = Frame::from_scrapes("a", Some((&metrics(300, 90), 1.0)), &metrics(10, 1), NOW, ok());
        assert_eq!((restarted.streams[0].rate, restarted.sinks[0].acked_rate), (None, None));
    }

    #[test]
    fn the_screen_fits_80_columns_and_names_everything() {
        let health = Health::from_answer(503, &format!("source devices: not connected\n{}\n", "x".repeat(200)));
        let frame =
            Frame::from_scrapes("127.0.0.1:9464", Some((&metrics(100, 40), 1.0)), &metrics(300, 90), NOW, health);
        let lines = frame.render();
        let screen = lines.join("\n");
        println!("{screen}");
        for line in &lines {
            assert!(line.chars().count() <= WIDTH, "{} columns: {line:?}", line.chars().count());
        }
        let expected = [
            "braid status  127.0.0.1:9464  health: DEGRADED",
            "source devices connected",
            "! source devices: not connected",
            "",
            "STREAM                ROWS/S         ROWS  WATERMARK LAG  IDLE",
            "status                   200          300           1.2s    no",
            "command_stream_wi…       100          150              –  idle",
            "",
            "OPERATOR              ROWS/S JOIN RATE      LATE   STATE ROWS      STATE",
            "effect                   300     90.0%         3          120    45.1KiB",
            "all                        –         –         0            0         0B",
            "",
            "SINK                  UPLINK     QUEUED        ACKED   ACKED/S",
            "up                        up     2.0KiB           90        50",
        ];
        assert_eq!(lines[..3], expected[..3]);
        assert!(lines[3].starts_with("! xxx") && lines[3].ends_with('…'), "{:?}", lines[3]);
        assert_eq!(lines[4..], expected[3..], "\n{screen}");
    }

    #[test]
    fn a_frame_without_rates_shows_dashes() {
        let lines = Frame::from_scrapes("h:1", None, &metrics(300, 90), NOW, ok()).render();
        assert_eq!(lines[0], "braid status  h:1  health: ok");
        assert!(lines.iter().any(|l| l.starts_with("status") && l.contains(" – ")), "{lines:#?}");
    }

    #[test]
    fn units() {
        assert_eq!(
            [duration(850), duration(12_345), duration(245_000), duration(11_520_000), duration(190_800_000)],
            ["850ms", "12.3s", "4m05s", "3h12m", "2d05h"]
        );
        assert_eq!(duration(-1_500), "-1.5s");
        assert_eq!([bytes(0), bytes(1023), bytes(1536), bytes(5 << 30)], ["0B", "1023B", "1.5KiB", "5.0GiB"]);
        assert_eq!(
            [per_second(None), per_second(Some(2.26)), per_second(Some(1234.4)), per_second(Some(2.5e6))],
            ["–", "2.3", "1234", "2.5M"]
        );
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abcd", 4), "abcd");
    }
}
