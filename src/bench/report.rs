//! Printing a bench report: one `key=value` figure a line.

use std::io::{self, Write};

use super::Report;
use braid::shard::result_latency::BOUNDS_US;

impl Report {
    /// The bound of the bucket of the shards' held results (`cpu`: their CPU time, else wall
    /// time) that holds quantile `q`, in µs (`na` without results, `>100000` above the last).
    fn shard_held_bound(&self, cpu: bool, q: f64) -> String {
        let held = &self.shard_results_held;
        let latency = if cpu { &held.cpu } else { &held.wall };
        match latency.quantile_bound_us(q) {
            Some(us) => us.to_string(),
            None if latency.count() == 0 => "na".to_owned(),
            None => format!(">{}", BOUNDS_US[BOUNDS_US.len() - 1]),
        }
    }

    /// The `key=value` lines (stdout): one figure each, `na` where it is not available.
    pub fn write_figures(&self, out: &mut impl Write) -> io::Result<()> {
        let kib = |v: Option<u64>| v.map_or("na".to_owned(), |v| v.to_string());
        let us = |pick: fn((u64, u64, u64)) -> u64| {
            self.latency_ns.map_or("na".to_owned(), |l| format!("{:.2}", pick(l) as f64 / 1000.0))
        };
        let secs = self.wall.as_secs_f64();
        let per_s = |n: u64| if secs > 0.0 { format!("{:.0}", n as f64 / secs) } else { "na".to_owned() };
        let cpu = self.cpu.as_secs_f64();
        let per_cpu_s = |n: u64| if cpu > 0.0 { format!("{:.0}", n as f64 / cpu) } else { "na".to_owned() };
        let results = self.results();
        let per_row =
            |n: u64| if self.rows > 0 { format!("{:.4}", n as f64 / self.rows as f64) } else { "na".to_owned() };
        let (feeder, shards, (voluntary, involuntary)) = (&self.feeder_bell, &self.shard_bells, self.context_switches);
        let a = &self.args;
        let figures = [
            ("config", a.config_name.clone()),
            ("devices", a.devices.to_string()),
            ("shards", a.shards.to_string()),
            ("state_backend", self.state_backend.to_owned()),
            ("rate_per_device", a.rate_per_device.to_string()),
            ("match_fanout_asked", a.match_fanout.to_string()),
            ("late_share", a.late_share.to_string()),
            ("rows", self.rows.to_string()),
            ("event_seconds", format!("{:.1}", self.event_seconds)),
            ("wall_seconds", format!("{secs:.3}")),
            ("finish_seconds", format!("{:.3}", self.finish.as_secs_f64())),
            ("cpu_seconds", format!("{cpu:.3}")),
            ("rows_per_s", per_s(self.rows)),
            ("rows_per_cpu_s", per_cpu_s(self.rows)),
            ("results", results.to_string()),
            ("results_per_s", per_s(results)),
            ("results_at_ingest", self.results_at_ingest.to_string()),
            ("results_at_tick", self.results_at_tick.to_string()),
            ("results_at_finish", self.results_at_finish.to_string()),
            ("late_rows", self.late_rows.to_string()),
            ("match_fanout", self.match_fanout.map_or("na".to_owned(), |f| format!("{f:.3}"))),
            ("latency_p50_us", us(|l| l.0)),
            ("latency_p99_us", us(|l| l.1)),
            ("latency_max_us", us(|l| l.2)),
            ("shard_result_latency_p50_us", self.shard_held_bound(false, 0.5)),
            ("shard_result_latency_p99_us", self.shard_held_bound(false, 0.99)),
            ("shard_result_cpu_p50_us", self.shard_held_bound(true, 0.5)),
            ("shard_result_cpu_p99_us", self.shard_held_bound(true, 0.99)),
            ("peak_rss_kib", kib(self.peak_rss_kib)),
            ("rss_end_kib", kib(self.rss_end_kib)),
            ("anon_rss_start_kib", kib(self.anon_rss_start_kib)),
            ("anon_rss_end_kib", kib(self.anon_rss_end_kib)),
            ("anon_rss_peak_kib", kib(self.anon_rss_peak_kib)),
            ("anon_rss_at_peak_state_kib", kib(self.anon_rss_at_peak_state_kib)),
            ("state_rows_peak", self.state_peak.0.to_string()),
            ("state_bytes_peak", self.state_peak.1.to_string()),
            ("state_rows_end", self.state_end.0.to_string()),
            ("state_bytes_end", self.state_end.1.to_string()),
            ("wakeups_per_row", per_row(feeder.rung + shards.rung)),
            ("feeder_wakeups_per_row", per_row(feeder.rung)),
            ("shard_wakeups_per_row", per_row(shards.rung)),
            ("feeder_sleeps_per_row", per_row(feeder.parked)),
            ("shard_sleeps_per_row", per_row(shards.parked)),
            ("feeder_spins_won_per_row", per_row(feeder.spun)),
            ("shard_spins_won_per_row", per_row(shards.spun)),
            ("shard_nudges", shards.nudged.to_string()),
            ("context_switches_per_row", per_row(voluntary + involuntary)),
            ("voluntary_context_switches_per_row", per_row(voluntary)),
        ];
        for (key, value) in figures {
            writeln!(out, "{key}={value}")?;
        }
        if let Some(c) = &self.checkpoints {
            let ms = |d: std::time::Duration| format!("{:.3}", d.as_secs_f64() * 1000.0);
            let per_row = if self.rows > 0 { c.bytes_total as f64 / self.rows as f64 } else { 0.0 };
            let checkpoint_figures = [
                ("checkpoint_interval_ms", a.checkpoint_interval_ms.to_string()),
                ("checkpoints", c.committed.to_string()),
                ("checkpoint_bytes_max", c.bytes_max.to_string()),
                ("checkpoint_bytes_per_row", format!("{per_row:.1}")),
                ("checkpoint_ms_p50", ms(c.duration_p50)),
                ("checkpoint_ms_max", ms(c.duration_max)),
                ("restore_ms", c.restore.map_or("na".to_owned(), ms)),
                ("restored_checkpoint_bytes", c.restored_bytes.to_string()),
                ("checkpoint_shard_ms", ms(c.shard_snapshot)),
                ("checkpoint_stall_ms", ms(c.shard_stall)),
                (
                    "checkpoint_cpu_share",
                    format!(
                        "{:.4}",
                        (c.shard_snapshot + c.shard_stall).as_secs_f64() / self.cpu.as_secs_f64().max(1e-9)
                    ),
                ),
            ];
            for (key, value) in checkpoint_figures {
                writeln!(out, "{key}={value}")?;
            }
        }
        Ok(())
    }

    /// The human table (stderr).
    pub fn write_table(&self, out: &mut impl Write) -> io::Result<()> {
        let a = &self.args;
        let secs = self.wall.as_secs_f64().max(f64::MIN_POSITIVE);
        let per_row = (self.rows as f64).max(1.0);
        let mib = |v: Option<u64>| v.map_or("n/a".to_owned(), |v| format!("{:.1} MiB", v as f64 / 1024.0));
        let latency = match self.latency_ns {
            Some((p50, p99, max)) => format!(
                "p50 {:.2} µs, p99 {:.2} µs, max {:.1} µs",
                p50 as f64 / 1e3,
                p99 as f64 / 1e3,
                max as f64 / 1e3
            ),
            None => "no result traced to its row".to_owned(),
        };
        let rows = [
            (
                "load",
                format!(
                    "{}, {} devices, {} shard thread(s), {} rows over {:.1} s of event time",
                    a.config_name, a.devices, a.shards, self.rows, self.event_seconds
                ),
            ),
            (
                "input",
                format!(
                    "{:.3} M rows/s ({} rows in {:.3} s measured; {:.3} M rows per CPU-second of the process)",
                    self.rows as f64 / secs / 1e6,
                    self.rows,
                    secs,
                    self.rows as f64 / self.cpu.as_secs_f64().max(f64::MIN_POSITIVE) / 1e6
                ),
            ),
            (
                "results",
                format!(
                    "{:.3} M/s ({} traced to their row, {} at ticks, {} at finish; late rows {})",
                    self.results() as f64 / secs / 1e6,
                    self.results_at_ingest,
                    self.results_at_tick,
                    self.results_at_finish,
                    self.late_rows
                ),
            ),
            ("latency", format!("{latency}   (hand-over to result, the wait behind the batch included)")),
            (
                "in the shard",
                format!(
                    "a result held p50 <= {} µs, p99 <= {} µs; the shard's CPU over it p50 <= {} µs, p99 <= {} µs   (target: p99 <= 10 µs)",
                    self.shard_held_bound(false, 0.5),
                    self.shard_held_bound(false, 0.99),
                    self.shard_held_bound(true, 0.5),
                    self.shard_held_bound(true, 0.99)
                ),
            ),
            (
                "state",
                format!(
                    "peak {} rows, {:.2} MB; at end of input {} rows, {:.2} MB",
                    self.state_peak.0,
                    self.state_peak.1 as f64 / 1e6,
                    self.state_end.0,
                    self.state_end.1 as f64 / 1e6
                ),
            ),
            (
                "memory",
                format!(
                    "peak RSS {}; anon RSS {} at end, {} at peak state, {} peak, {} before load   (target: anon <= 16 MB, RSS <= 32 MB at 10 k devices)",
                    mib(self.peak_rss_kib),
                    mib(self.anon_rss_end_kib),
                    mib(self.anon_rss_at_peak_state_kib),
                    mib(self.anon_rss_peak_kib),
                    mib(self.anon_rss_start_kib)
                ),
            ),
            (
                "wake-ups",
                format!(
                    "{:.4} per input row (feeder {:.4}, shards {:.4}); sleeps {:.4} / {:.4}, spins that found work {:.4} / {:.4}; context switches {:.4} per row ({:.4} voluntary)",
                    (self.feeder_bell.rung + self.shard_bells.rung) as f64 / per_row,
                    self.feeder_bell.rung as f64 / per_row,
                    self.shard_bells.rung as f64 / per_row,
                    self.feeder_bell.parked as f64 / per_row,
                    self.shard_bells.parked as f64 / per_row,
                    self.feeder_bell.spun as f64 / per_row,
                    self.shard_bells.spun as f64 / per_row,
                    (self.context_switches.0 + self.context_switches.1) as f64 / per_row,
                    self.context_switches.0 as f64 / per_row,
                ),
            ),
        ];
        for (name, text) in rows {
            writeln!(out, "{name:<9} {text}")?;
        }
        for line in &self.operators {
            writeln!(out, "{:<9} {line}", "operator")?;
        }
        Ok(())
    }

    pub(super) fn results(&self) -> u64 {
        self.results_at_ingest + self.results_at_tick + self.results_at_finish
    }
}
