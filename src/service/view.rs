//! What the running service shows: `/metrics`, `/healthz`, the STATUS= line and the demo's
//! summary, all read from counters the threads keep anyway (never from the row path).

use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::ops::http::OpsView;
use crate::ops::warnings::Warnings;
use crate::plan::Plan;
use crate::shard::Figures;
use crate::sink::mqtt::{Blocked, Uplink};
use crate::source::mqtt::SourceStatus;
use crate::storage::write_faults;

use super::Control;
use super::outputs::OutputCounters;

/// The running generation's figures.
#[derive(Default)]
pub struct LiveView {
    current: Mutex<Option<Current>>,
}

struct Current {
    plan: Arc<Plan>,
    outputs: Arc<OutputCounters>,
    sources: Vec<Arc<SourceStatus>>,
    uplinks: Vec<Arc<Uplink>>,
    control: Arc<Control>,
    /// The runtime's figures, copied by the intake thread about once a second.
    figures: Option<Figures>,
    /// Judged at every copy of the figures.
    warnings: Warnings,
}

/// Totals at one moment, for rates.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub taken: u64,
    pub results: u64,
    pub late: u64,
    pub dead_letters: u64,
    pub state_rows: usize,
    pub state_bytes: usize,
    pub queued_bytes: u64,
    pub sent: u64,
    pub connected_sinks: usize,
    pub sinks: usize,
}

impl Totals {
    /// `in 1200/s · results 800/s · late 0 · dead 0 · state 1.2k rows · uplink 3.1 KiB queued`
    pub fn status_line(&self, before: &Totals, over: Duration) -> String {
        let secs = over.as_secs_f64().max(1e-3);
        let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / secs;
        let mut line = format!(
            "in {:.0}/s · results {:.0}/s · late {} · dead letters {} · state {} rows",
            rate(self.taken, before.taken),
            rate(self.results, before.results),
            self.late,
            self.dead_letters,
            self.state_rows,
        );
        if self.sinks > 0 {
            let _ = write!(
                line,
                " · uplink {}/{} up, {} sent, {} B queued",
                self.connected_sinks, self.sinks, self.sent, self.queued_bytes
            );
        }
        line
    }
}

impl LiveView {
    pub fn set(
        &self,
        plan: Arc<Plan>,
        outputs: Arc<OutputCounters>,
        (sources, uplinks): (Vec<Arc<SourceStatus>>, Vec<Arc<Uplink>>),
        control: Arc<Control>,
    ) {
        let warnings = Warnings::new(&plan, plan.ops_thresholds);
        *self.lock() = Some(Current { plan, outputs, sources, uplinks, control, figures: None, warnings });
    }

    /// The intake thread's copy of the runtime's figures; `None`: the generation ended.
    pub fn update_figures(&self, figures: Option<Figures>) {
        let mut current = self.lock();
        match figures {
            Some(f) => {
                if let Some(c) = current.as_mut() {
                    c.warnings.look(&c.plan, &f);
                    c.figures = Some(f);
                }
            }
            None => *current = None,
        }
    }

    /// Sinks with a full buffer that the intake waits on (`overflow = "block"`): backpressure on
    /// purpose, not a hang.
    pub fn backpressure(&self) -> Vec<(String, Blocked)> {
        let current = self.lock();
        let Some(c) = current.as_ref() else { return Vec::new() };
        c.uplinks.iter().filter_map(|u| u.blocked().map(|b| (u.name().to_owned(), b))).collect()
    }

    /// The shards at their state budget, as reasons ([`state_budget_reasons`]).
    pub fn state_budget(&self) -> Vec<String> {
        let current = self.lock();
        let Some(c) = current.as_ref() else { return Vec::new() };
        c.figures.as_ref().map(|f| state_budget_reasons(&c.plan, f)).unwrap_or_default()
    }

    pub fn is_running(&self) -> bool {
        self.lock().is_some()
    }

    pub fn totals(&self) -> Totals {
        let current = self.lock();
        let Some(c) = current.as_ref() else { return Totals::default() };
        let sum = |v: &[std::sync::atomic::AtomicU64]| v.iter().map(|a| a.load(Ordering::Relaxed)).sum::<u64>();
        let state = c.figures.as_ref().map(|f| f.operator_state.iter().fold((0, 0), |a, s| (a.0 + s.0, a.1 + s.1)));
        let (state_rows, state_bytes) = state.unwrap_or_default();
        let stats: Vec<_> = c.uplinks.iter().map(|u| u.stats()).collect();
        Totals {
            taken: c.control.taken.load(Ordering::Relaxed),
            results: sum(&c.outputs.results),
            late: sum(&c.outputs.late),
            dead_letters: c.outputs.dead_letters.load(Ordering::Relaxed),
            state_rows,
            state_bytes,
            queued_bytes: stats.iter().map(|s| s.queued_bytes).sum(),
            sent: stats.iter().map(|s| s.sent_total).sum(),
            connected_sinks: stats.iter().filter(|s| s.connected).count(),
            sinks: stats.len(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        // A poisoned lock only means a reader panicked; the figures are plain data.
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl LiveView {
    /// `GET /journal`: asks the intake thread for a copy of the journal's messages, and turns them
    /// into replay input lines off the io thread.
    fn journal_reader(&self) -> Option<crate::ops::http::JournalReader> {
        let (plan, control) = {
            let current = self.lock();
            let current = current.as_ref()?;
            (Arc::clone(&current.plan), Arc::clone(&current.control))
        };
        let copy = control.ask_journal();
        Some(Box::new(move || {
            let entries = copy
                .recv_timeout(crate::ops::http::JOURNAL_WAIT)
                .map_err(|_| "the intake thread did not hand the journal over (starting or stopping?)".to_owned())?;
            let ingest = super::ingest::Ingest::new(&plan);
            let mut lines = String::new();
            for entry in entries.iter() {
                let super::journal::What::Message { topic, payload } = &entry.what else { continue };
                let Some(source) = plan.sources.iter().position(|s| s.name == entry.source) else { continue };
                ingest.replay_lines(&plan, source, topic, payload, entry.arrival, &mut lines);
            }
            Ok(lines)
        }))
    }
}

impl OpsView for LiveView {
    fn metrics(&self) -> String {
        let current = self.lock();
        let Some(c) = current.as_ref() else { return String::new() };
        let mut out = c.figures.as_ref().map(|f| crate::ops::metrics::render(&c.plan, f)).unwrap_or_default();
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, String)>| {
            crate::ops::metrics::write_family(&mut out, name, kind, help, samples);
        };
        let sinks: Vec<(&str, crate::sink::mqtt::UplinkStats)> =
            c.uplinks.iter().map(|u| (u.name(), u.stats())).collect();
        let per_sink = |f: &dyn Fn(&crate::sink::mqtt::UplinkStats) -> String| {
            sinks.iter().map(|(name, s)| (format!("sink=\"{name}\""), f(s))).collect::<Vec<_>>()
        };
        family(
            "braid_sink_queued_bytes",
            "gauge",
            "Store-and-forward backlog.",
            per_sink(&|s| s.queued_bytes.to_string()),
        );
        family(
            "braid_sink_sent_total",
            "counter",
            "Results acknowledged upstream.",
            per_sink(&|s| s.sent_total.to_string()),
        );
        family(
            "braid_sink_connected",
            "gauge",
            "1 while the uplink is connected.",
            per_sink(&|s| u8::from(s.connected).to_string()),
        );
        family(
            "braid_sink_dropped_total",
            "counter",
            "Results dropped by overflow = \"drop_oldest\".",
            per_sink(&|s| s.dropped_total.to_string()),
        );
        let sources: Vec<(String, String)> = c
            .plan
            .sources
            .iter()
            .zip(&c.sources)
            .map(|(d, s)| (format!("source=\"{}\"", d.name), u8::from(s.connected.load(Ordering::Relaxed)).to_string()))
            .collect();
        family("braid_source_connected", "gauge", "1 while the source is connected to its broker.", sources);
        let trimmed: Vec<(String, String)> = c
            .plan
            .sources
            .iter()
            .zip(&c.sources)
            .map(|(d, s)| (format!("source=\"{}\"", d.name), s.oversized_trimmed.load(Ordering::Relaxed).to_string()))
            .collect();
        family(
            "braid_source_oversized_trimmed_total",
            "counter",
            "Packets over the source's incoming limit read through the trimming relay (each a dead letter `oversized`).",
            trimmed,
        );
        let refused: Vec<(String, String)> = c
            .plan
            .sources
            .iter()
            .zip(&c.sources)
            .filter_map(|(d, s)| s.broker.get().map(|r| (d, r)))
            .flat_map(|(d, r)| {
                [("connection", &r.connections), ("publish", &r.publishes), ("subscription", &r.subscriptions)].map(
                    |(what, n)| {
                        (format!("source=\"{}\",what=\"{what}\"", d.name), n.load(Ordering::Relaxed).to_string())
                    },
                )
            })
            .collect();
        let lost: Vec<(String, String)> = c
            .plan
            .sources
            .iter()
            .zip(&c.sources)
            .filter_map(|(d, s)| {
                s.broker.get().map(|r| (format!("source=\"{}\"", d.name), r.lost.load(Ordering::Relaxed).to_string()))
            })
            .collect();
        if !lost.is_empty() {
            family(
                "braid_broker_lost_total",
                "counter",
                "Times the embedded broker dropped messages braid had not taken yet: its in-memory log per subscription (4 MiB) was full while braid held input (a full disk, a full sink buffer).",
                lost,
            );
        }
        if !refused.is_empty() {
            family(
                "braid_broker_refused_total",
                "counter",
                "What the embedded broker refused to devices: connections (credentials), publishes and subscription filters (ACL).",
                refused,
            );
        }
        let control = &c.control;
        let one = |v: u64| vec![(String::new(), v.to_string())];
        family(
            "braid_ingest_taken_total",
            "counter",
            "MQTT messages the intake took (journaled, in the shards' rings); live, unlike the runtime's figures, which are copied about once a second.",
            one(control.taken.load(Ordering::Relaxed)),
        );
        family(
            "braid_journal_bytes",
            "gauge",
            "Bytes the ingest journal holds.",
            one(control.journal_bytes.load(Ordering::Relaxed)),
        );
        family(
            "braid_journal_dropped_total",
            "counter",
            "Journal entries released before their retention because the journal was full.",
            one(control.journal_dropped.load(Ordering::Relaxed)),
        );
        family(
            "braid_state_quarantined_files_total",
            "counter",
            "State files found damaged since the start and put into STATE_DIR/quarantine (moved, or copied where their intact records stay in use).",
            one(crate::storage::quarantine::quarantined_files()),
        );
        family(
            "braid_state_lost_records_total",
            "counter",
            "Records (journal entries, buffered results) lost to damaged state files since the start; a lower bound where damage hides how many.",
            one(crate::storage::quarantine::lost_records()),
        );
        family(
            "braid_journal_replayed",
            "gauge",
            "Journal entries replayed at the last start.",
            one(control.replayed.load(Ordering::Relaxed)),
        );
        family(
            "braid_checkpoint_last_epoch",
            "gauge",
            "Epoch of the last checkpoint committed (0: none yet).",
            one(control.checkpoint_epoch.load(Ordering::Relaxed)),
        );
        family(
            "braid_checkpoint_duration_seconds",
            "gauge",
            "Processing time from the last committed checkpoint's barrier to its commit.",
            vec![(String::new(), format!("{:.3}", control.checkpoint_millis.load(Ordering::Relaxed) as f64 / 1000.0))],
        );
        family(
            "braid_checkpoint_bytes",
            "gauge",
            "Bytes of the last committed checkpoint's files.",
            one(control.checkpoint_bytes.load(Ordering::Relaxed)),
        );
        family(
            "braid_source_redelivered_total",
            "counter",
            "Messages a broker sent again that the journal already held: acknowledged, not taken twice.",
            one(control.redelivered.load(Ordering::Relaxed)),
        );
        family(
            "braid_source_unrouted_total",
            "counter",
            "Messages whose topic fed no stream of their source.",
            one(control.unrouted.load(Ordering::Relaxed)),
        );
        family(
            "braid_warning_active",
            "gauge",
            "1 while the warning holds for its subject (listed in /healthz's body; never a 503).",
            c.warnings
                .active()
                .iter()
                .map(|w| (format!("warning=\"{}\",subject=\"{}\"", w.warning, w.subject), "1".to_owned()))
                .collect(),
        );
        family(
            "braid_storage_write_failing",
            "gauge",
            "1 while a write site cannot write (disk full or another write error; listed with its path in /healthz): what it holds waits and is tried again every second.",
            write_faults::failing()
                .iter()
                .map(|f| {
                    let cause = if f.disk_full { "disk_full" } else { "write_error" };
                    (format!("site=\"{}\",cause=\"{cause}\"", f.site), "1".to_owned())
                })
                .collect(),
        );
        family(
            "braid_storage_write_failures_total",
            "counter",
            "Failed write attempts per write site (journal, sink NAME, taken log, checkpoint, file sink NAME, arena), retries included.",
            write_faults::failures().into_iter().map(|(site, n)| (format!("site=\"{site}\""), n.to_string())).collect(),
        );
        let counter = |v: &std::sync::atomic::AtomicU64| one(v.load(Ordering::Relaxed));
        family(
            "braid_sink_write_errors_total",
            "counter",
            "Failed writes of file and stdout sinks.",
            counter(&c.outputs.write_errors),
        );
        family(
            "braid_sink_unqueued_at_stop_total",
            "counter",
            "Results a full MQTT sink buffer could not take when the service stopped (the journal produces them again).",
            counter(&c.outputs.unqueued_at_stop),
        );
        family(
            "braid_sink_repeats_dropped_total",
            "counter",
            "Rows produced again after a restart that the sinks had taken already: not handed to them twice.",
            counter(&c.outputs.repeats_dropped),
        );
        family(
            "braid_sink_bad_topic_total",
            "counter",
            "Rows refused by a sink topic (sent to dead_letter).",
            counter(&c.outputs.bad_topic),
        );
        out
    }

    fn health(&self) -> Result<(), Vec<String>> {
        let current = self.lock();
        let Some(c) = current.as_ref() else {
            let mut reasons = vec!["starting or reloading".to_owned()];
            reasons.extend(write_faults::failing().iter().map(|f| f.reason()));
            return Err(reasons);
        };
        let mut reasons = Vec::new();
        for (def, status) in c.plan.sources.iter().zip(&c.sources) {
            if !status.connected.load(Ordering::Relaxed) {
                reasons.push(format!("source {}: not connected", def.name));
            }
            let stuck = status.oversized_stuck.load(Ordering::Relaxed);
            if stuck > 0 {
                reasons.push(format!(
                    "source {}: {stuck} oversized message(s) are stuck at the broker (limit its message_size_limit)",
                    def.name
                ));
            }
        }
        if let Some(figures) = &c.figures {
            reasons.extend(state_budget_reasons(&c.plan, figures));
        }
        for uplink in &c.uplinks {
            if let Some(blocked) = uplink.blocked() {
                reasons.push(backpressure_reason(uplink.name(), &blocked));
            }
            if !uplink.stats().connected {
                reasons.push(format!("sink {}: uplink down (results are buffered)", uplink.name()));
            }
        }
        reasons.extend(write_faults::failing().iter().map(|f| f.reason()));
        if reasons.is_empty() { Ok(()) } else { Err(reasons) }
    }

    fn warnings(&self) -> Vec<String> {
        let current = self.lock();
        let mut lines: Vec<String> =
            current.as_ref().map(|c| c.warnings.active().iter().map(|w| w.line()).collect()).unwrap_or_default();
        let files = crate::storage::quarantine::quarantined_files();
        if files > 0 {
            let records = crate::storage::quarantine::lost_records();
            lines.push(format!(
                "warning state_quarantined STATE_DIR/quarantine: {files} damaged state file(s) quarantined since the start, {records} record(s) lost (the log names them)"
            ));
        }
        lines
    }

    fn journal(&self) -> Option<crate::ops::http::JournalReader> {
        self.journal_reader()
    }
}

/// One reason per full shard (state/budget.rs): `backpressure: state budget full on shard 0
/// (8MiB of 8MiB); intake waits, the brokers keep the devices' messages, until idle inputs
/// move the watermark`, or, when nothing can free state while the intake waits, saying so.
pub fn state_budget_reasons(plan: &Plan, figures: &Figures) -> Vec<String> {
    let Some(budget) = plan.runtime.state_budget else { return Vec::new() };
    let show = crate::state::budget::show_bytes;
    let frees = state_frees_while_waiting(plan);
    figures
        .shard_state
        .iter()
        .enumerate()
        .filter(|(_, (_, full))| *full)
        .map(|(shard, &(bytes, _))| {
            let until = match &frees {
                Ok(()) => "until idle inputs move the watermark and free state".to_owned(),
                Err(why) => format!(
                    "and nothing frees state while the intake waits ({why}): raise runtime.state_budget, set a ttl or on_state_full = \"evict_oldest\""
                ),
            };
            format!(
                "backpressure: state budget full on shard {shard} ({} of {}); intake waits, the brokers keep the devices' messages, {until}",
                show(bytes.div_ceil(1024) * 1024),
                show(budget)
            )
        })
        .collect()
}

/// Whether a paused intake lets state go: every stream turns idle, and idle inputs advance the
/// operators' watermarks. Else why not.
fn state_frees_while_waiting(plan: &Plan) -> Result<(), String> {
    if !plan.runtime.idle_advance {
        return Err("idle_advance = false".into());
    }
    match plan.streams.iter().find(|s| s.idle_timeout <= 0) {
        Some(stream) => Err(format!("stream {} never turns idle: idle_timeout = \"0ms\"", stream.name)),
        None => Ok(()),
    }
}

/// `backpressure: sink up full (262144 of 262144 B queued, uplink down); intake waits, the
/// brokers keep the devices' messages` — one reason of `/healthz` and the STATUS= line.
pub fn backpressure_reason(sink: &str, blocked: &Blocked) -> String {
    let uplink = if blocked.connected { "uplink slow" } else { "uplink down" };
    if blocked.disk_full {
        return format!(
            "backpressure: sink {sink} cannot grow its buffer, its disk refuses a new segment ({} B queued, {uplink}); intake waits, the brokers keep the devices' messages",
            blocked.queued_bytes
        );
    }
    format!(
        "backpressure: sink {sink} full ({} of {} B queued, {uplink}); intake waits, the brokers keep the devices' messages",
        blocked.queued_bytes, blocked.buffer_bytes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(status_idle: &str) -> Plan {
        let text = format!(
            r#"[runtime]
state_budget = "8MiB"

[streams.command]
key = "device"
time = {{ field = "ts" }}
fields = {{ device = "string", ts = "int" }}

[streams.status]
key = "device"
time = {{ field = "ts" }}
idle_timeout = "{status_idle}"
fields = {{ device = "string", ts = "int" }}

[operators.effect]
kind = "interval_join"
left = "command"
right = "status"
lower = "-1s"
upper = "1s"
select = ["left.ts AS command_ts"]
"#
        );
        crate::config::parse("v.toml", &text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_full_shard_is_a_reason_that_says_whether_anything_frees_state() {
        let figures = Figures { shard_state: vec![(3 << 20, false), (8 << 20, true)], ..Figures::default() };
        assert!(state_budget_reasons(&plan("5s"), &Figures::default()).is_empty());
        assert_eq!(
            state_budget_reasons(&plan("5s"), &figures),
            ["backpressure: state budget full on shard 1 (8MiB of 8MiB); intake waits, the brokers keep the devices' \
              messages, until idle inputs move the watermark and free state"]
        );
        assert_eq!(
            state_budget_reasons(&plan("0ms"), &figures),
            ["backpressure: state budget full on shard 1 (8MiB of 8MiB); intake waits, the brokers keep the devices' \
              messages, and nothing frees state while the intake waits (stream status never turns idle: idle_timeout = \
              \"0ms\"): raise runtime.state_budget, set a ttl or on_state_full = \"evict_oldest\""]
        );
    }
}
