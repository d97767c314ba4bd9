//! Where the service's rows go: every `[sinks.NAME]` with the inputs it names, each row written as
//! the JSON object replay writes (CONTRACT.md "Replay": "A sink writes each row as the same JSON
//! object that replay writes").
//!
//! File and stdout sinks append JSON lines, flushed after every batch the intake runs. An MQTT sink
//! renders the publish topic from the row (`{field}`) and queues topic and JSON in its durable
//! outbound spool ([`Uplink`]); a row whose value would change the topic's shape
//! (`bad_topic_value:FIELD`) goes to `dead_letter` instead, never into another topic.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use thiserror::Error;

use super::taken::Taken;
use crate::checkpoint::Completed;
use crate::config::{SinkDef, SinkKind};
use crate::operator::{ExpiryReason, Side};
use crate::plan::{EXPIRED_SUFFIX, LATE_SUFFIX, Plan, Target};
use crate::record::decode::TOO_LARGE;
use crate::record::frame::to_row;
use crate::record::view::RowView;
use crate::record::{ArchivedRow, Row, Schema, json};
use crate::shard::Emit;
use crate::sink::mqtt::Uplink;
use crate::sink::topic::TopicTemplate;
use crate::sink::{Meanwhile, Patience};
use crate::storage::write_faults;

#[derive(Debug, Error)]
pub enum OutputError {
    #[error("sink {sink}: cannot open {path}: {error}")]
    Open { sink: String, path: String, error: std::io::Error },
    #[error("sink {sink}: topic for input {input:?}: {message}")]
    Topic { sink: String, input: String, message: String },
    #[error("sink {sink}: input {input:?} is no stream, operator, OPERATOR.late, OPERATOR.expired or dead_letter")]
    Input { sink: String, input: String },
    #[error("sink {sink}: {error}")]
    Uplink { sink: String, error: String },
}

/// Counters the service shows (metrics, status line, the demo's summary).
#[derive(Debug, Default)]
pub struct OutputCounters {
    /// Per operator: results emitted.
    pub results: Vec<AtomicU64>,
    /// Per operator: late rows.
    pub late: Vec<AtomicU64>,
    pub dead_letters: AtomicU64,
    /// Rows a sink refused because a topic value was unusable (they went to `dead_letter`).
    pub bad_topic: AtomicU64,
    /// Rows an MQTT sink could not queue because the service stopped while its buffer was full
    /// (the journal produces them again at the next start).
    pub unqueued_at_stop: AtomicU64,
    /// File and stdout write errors.
    pub write_errors: AtomicU64,
    /// Rows not handed to the sinks again after a restart: they had taken them (taken.rs).
    pub repeats_dropped: AtomicU64,
}

impl OutputCounters {
    pub fn new(operators: usize) -> Arc<OutputCounters> {
        Arc::new(OutputCounters {
            results: (0..operators).map(|_| AtomicU64::new(0)).collect(),
            late: (0..operators).map(|_| AtomicU64::new(0)).collect(),
            ..Default::default()
        })
    }
}

enum Writer {
    /// The file and its path (how its write failures are reported).
    File(BufWriter<File>, std::path::PathBuf),
    Stdout(BufWriter<std::io::Stdout>),
    /// The sink's uplink and, per target it reads, the topic template compiled for its schema (a
    /// late side output: one per operator input, whose rows it carries).
    Mqtt {
        uplink: Arc<Uplink>,
        topics: Vec<(Target, Vec<TopicTemplate>)>,
    },
}

struct Sink {
    name: String,
    /// `file sink NAME`: how its write failures are reported (storage/write_faults.rs).
    site: String,
    targets: Vec<Target>,
    writer: Writer,
}

pub struct Outputs {
    plan: Arc<Plan>,
    sinks: Vec<Sink>,
    counters: Arc<OutputCounters>,
    /// Set when the service stops: an MQTT sink with a full buffer stops waiting for room.
    stop: Arc<AtomicBool>,
    /// How a sink that waits spends the rounds of its wait ([`Meanwhile::Run`]); `None`: asleep.
    meanwhile: Option<Box<dyn Fn(std::time::Duration) + Send>>,
    line: Vec<u8>,
    topic: String,
    /// What the sinks took since the last checkpoint.
    pub taken: Taken,
    /// An MQTT sink made the intake wait for room since [`Outputs::take_stalled`] last looked.
    stalled: bool,
    /// A row could not be queued or written because the service stopped while a sink waited (a
    /// full buffer, a full disk): no checkpoint may be committed after it, so that the next start
    /// produces it again from the journal.
    pub lost_at_stop: bool,
}

impl Outputs {
    /// Opens every sink of the plan; `uplinks` holds the opened outbound spool of each MQTT sink.
    pub fn open(
        plan: Arc<Plan>,
        uplinks: &[Arc<Uplink>],
        counters: Arc<OutputCounters>,
        stop: Arc<AtomicBool>,
        taken: Taken,
    ) -> Result<Outputs, OutputError> {
        let mut sinks = Vec::new();
        for def in &plan.sinks {
            sinks.push(open_sink(&plan, def, uplinks)?);
        }
        Ok(Outputs {
            plan,
            sinks,
            counters,
            stop,
            meanwhile: None,
            line: Vec::with_capacity(512),
            topic: String::new(),
            taken,
            stalled: false,
            lost_at_stop: false,
        })
    }

    /// How a sink that waits (a full buffer, a full disk) spends the rounds of its wait: the
    /// service runs its sources and MQTT sinks (sources.rs) for the given time.
    pub fn meanwhile(&mut self, meanwhile: Box<dyn Fn(std::time::Duration) + Send>) {
        self.meanwhile = Some(meanwhile);
    }

    /// Whether a full sink buffer made the intake wait since the last call (the intake then
    /// takes the time it stood still out of the streams' idleness).
    pub fn take_stalled(&mut self) -> bool {
        std::mem::take(&mut self.stalled)
    }

    fn wants(&self, target: Target) -> bool {
        self.sinks.iter().any(|s| s.targets.contains(&target))
    }

    /// A decoded row of an input stream (for sinks that list the stream itself).
    pub fn input_row(&mut self, stream: usize, row: RowView<'_>) {
        if self.wants(Target::Stream(stream)) {
            let def = &self.plan.streams[stream];
            json::write_input_row(&mut self.line, &def.schema, &def.name, row);
            self.deliver(Target::Stream(stream), 0, Some(&row.to_row().values), false);
        }
    }

    /// A payload of `stream` that could not be used.
    pub fn dead_letter(&mut self, stream: &str, raw: &str, reason: &str) {
        self.counters.dead_letters.fetch_add(1, Ordering::Relaxed);
        if self.wants(Target::DeadLetter) {
            json::write_dead_letter(&mut self.line, stream, raw, reason);
            self.deliver(Target::DeadLetter, 0, None, false);
        }
    }

    /// Flushes file and stdout sinks (after each batch: a line is never left half-written in a
    /// buffer for long) and wakes MQTT sinks for the results queued since the last flush; whether
    /// the file sinks hold every row handed to them (a checkpoint is committed only then).
    pub fn flush(&mut self) -> bool {
        let mut files_written = true;
        for sink in &mut self.sinks {
            let flushed = match &mut sink.writer {
                // What a failed flush did not write stays in the buffer for the next one.
                Writer::File(w, path) => match w.flush() {
                    Ok(()) => {
                        write_faults::recovered(&sink.site);
                        Ok(())
                    }
                    Err(error) => {
                        write_faults::failed(&sink.site, path, &error, FILE_SINK_MEANWHILE);
                        files_written = false;
                        Err(error)
                    }
                },
                Writer::Stdout(w) => {
                    w.flush().inspect_err(|error| tracing::warn!(sink = %sink.name, %error, "cannot write"))
                }
                Writer::Mqtt { uplink, .. } => {
                    uplink.wake();
                    Ok(())
                }
            };
            if flushed.is_err() {
                self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        // After the rows: the log names only rows the sinks hold.
        self.taken.flush();
        files_written
    }

    /// `durability = "power"`: forces what the sinks and the log of rows taken hold to the disk,
    /// before a checkpoint lets the journal go of the input that produced it.
    pub fn sync(&mut self) -> std::io::Result<()> {
        if !self.flush() {
            return Err(std::io::Error::other("a file sink cannot write"));
        }
        self.taken.sync()?;
        for sink in &mut self.sinks {
            match &mut sink.writer {
                Writer::File(w, _) => w.get_ref().sync_data()?,
                Writer::Mqtt { uplink, .. } => uplink.sync()?,
                Writer::Stdout(_) => {}
            }
        }
        Ok(())
    }

    /// Hands the JSON line in `self.line` (newline-terminated, as the JSON writers leave it) to
    /// every sink reading `target`; `values` (laid out by the schema of the target's input
    /// `input`) fill MQTT topic templates. `early`: it left after the barrier of the checkpoint
    /// under way. A row the sinks took before a restart is not handed to them again.
    fn deliver(&mut self, target: Target, input: usize, values: Option<&[crate::record::Value]>, early: bool) {
        if !self.taken.admit(target, &self.line, early) {
            self.counters.repeats_dropped.fetch_add(1, Ordering::Relaxed);
            self.line.clear();
            return;
        }
        let mut refused = None;
        let mut lost = false;
        for sink in self.sinks.iter_mut().filter(|s| s.targets.contains(&target)) {
            match &mut sink.writer {
                Writer::File(w, path) => {
                    let patience = Patience { stop: &self.stop, meanwhile: meanwhile_of(&self.meanwhile) };
                    let written = write_file_line(w, &self.line, FileSite { site: &sink.site, path }, patience);
                    if let Err(failures) = written {
                        self.counters.write_errors.fetch_add(failures, Ordering::Relaxed);
                        lost = true;
                    }
                }
                Writer::Stdout(w) => write_line(w, &self.line, &self.counters),
                Writer::Mqtt { uplink, topics } => {
                    let template = topics.iter().find(|(t, _)| *t == target).and_then(|(_, by)| by.get(input));
                    let Some(template) = template else { continue };
                    if let Err(error) = template.render(values.unwrap_or(&[]), &mut self.topic) {
                        refused = Some(error.label(target_schema(&self.plan, target, input)));
                        continue;
                    }
                    let payload = &self.line[..self.line.len() - 1];
                    // Woken once per batch, in `flush`.
                    let patience = Patience { stop: &self.stop, meanwhile: meanwhile_of(&self.meanwhile) };
                    match uplink.queue(&self.topic, payload, patience) {
                        Ok(waited) => self.stalled |= waited,
                        Err(error) => {
                            self.counters.unqueued_at_stop.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(sink = %sink.name, %error, "Result not queued; the next start produces it again");
                            lost = true;
                        }
                    }
                }
            }
        }
        if lost {
            // Not taken after all: the next start must hand it over again (taken.rs), and from a
            // checkpoint before it.
            self.taken.retract();
            self.lost_at_stop = true;
        }
        if let Some(reason) = refused {
            self.counters.bad_topic.fetch_add(1, Ordering::Relaxed);
            let raw = String::from_utf8_lossy(&self.line[..self.line.len() - 1]).into_owned();
            let name = target_name(&self.plan, target);
            self.line.clear();
            self.dead_letter(&name, &raw, &reason);
        }
        self.line.clear();
    }
}

/// What a file sink does while it cannot write (storage/write_faults.rs).
const FILE_SINK_MEANWHILE: &str =
    "its next line waits in memory and the intake with it; the brokers keep the devices' messages";

/// A file sink's report name and path.
#[derive(Clone, Copy)]
struct FileSite<'a> {
    site: &'a str,
    path: &'a Path,
}

/// Writes one line to a file sink; while the file system refuses it (a full disk), the line waits
/// and is tried again every second — the intake waits with it, so nothing is dropped — until it is
/// written or the service stops (then `Err(failed attempts)`: the line is not written).
fn write_file_line(w: &mut BufWriter<impl Write>, line: &[u8], at: FileSite, patience: Patience) -> Result<(), u64> {
    let mut failures = 0;
    loop {
        // A BufWriter that cannot make room writes none of the line (and keeps what it holds).
        match w.write_all(line) {
            Ok(()) => {
                if failures > 0 {
                    write_faults::recovered(at.site);
                }
                return Ok(());
            }
            Err(error) => {
                failures += 1;
                write_faults::failed(at.site, at.path, &error, FILE_SINK_MEANWHILE);
                if !sleep_unless_stopped(write_faults::RETRY_EVERY, patience) {
                    return Err(failures);
                }
            }
        }
    }
}

fn meanwhile_of(run: &Option<Box<dyn Fn(std::time::Duration) + Send>>) -> Meanwhile<'_> {
    run.as_deref().map_or(Meanwhile::Sleep, |run| Meanwhile::Run(run))
}

/// Waits `how_long` in short steps, each asleep or spent as `patience.meanwhile` says; false as
/// soon as `patience.stop` is set.
pub fn sleep_unless_stopped(how_long: std::time::Duration, patience: Patience) -> bool {
    let step = std::time::Duration::from_millis(50);
    let mut slept = std::time::Duration::ZERO;
    while slept < how_long {
        if patience.stop.load(Ordering::Relaxed) {
            return false;
        }
        match patience.meanwhile {
            Meanwhile::Sleep => std::thread::sleep(step),
            Meanwhile::Run(run) => run(step),
        }
        slept += step;
    }
    !patience.stop.load(Ordering::Relaxed)
}

fn write_line(w: &mut impl Write, line: &[u8], counters: &OutputCounters) {
    if w.write_all(line).is_err() {
        counters.write_errors.fetch_add(1, Ordering::Relaxed);
    }
}

impl Emit for Outputs {
    fn result(&mut self, operator: usize, row: &Row, early: bool) {
        self.counters.results[operator].fetch_add(1, Ordering::Relaxed);
        if self.wants(Target::Operator(operator)) {
            json::write_result(&mut self.line, &self.plan.operators[operator].output, RowView::Heap(row));
            self.deliver(Target::Operator(operator), 0, Some(&row.values), early);
        }
    }

    /// Written from the frame as it lies, unless an MQTT sink's topic needs the row's values.
    fn result_archived(&mut self, operator: usize, row: &ArchivedRow, _archive: &[u8], early: bool) {
        let target = Target::Operator(operator);
        let to_topics =
            self.sinks.iter().any(|s| s.targets.contains(&target) && matches!(s.writer, Writer::Mqtt { .. }));
        if to_topics {
            self.result(operator, &to_row(row), early);
            return;
        }
        self.counters.results[operator].fetch_add(1, Ordering::Relaxed);
        if self.wants(target) {
            json::write_result(&mut self.line, &self.plan.operators[operator].output, RowView::Archived(row));
            self.deliver(target, 0, None, early);
        }
    }

    fn late(&mut self, operator: usize, input: usize, row: &Row, early: bool) {
        self.counters.late[operator].fetch_add(1, Ordering::Relaxed);
        if self.wants(Target::Late(operator)) {
            self.plan.write_side_row(&mut self.line, operator, Side::Late(input), row);
            self.deliver(Target::Late(operator), input, Some(&row.values), early);
        }
    }

    fn expired(&mut self, operator: usize, reason: ExpiryReason, input: Option<usize>, row: &Row, early: bool) {
        if self.wants(Target::Expired(operator)) {
            self.plan.write_side_row(&mut self.line, operator, Side::Expired { reason, input }, row);
            let schema = input.unwrap_or(self.plan.operators[operator].inputs.len());
            self.deliver(Target::Expired(operator), schema, Some(&row.values), early);
        }
    }

    fn too_large(&mut self, operator: usize, raw: &str) {
        let name = self.plan.operators[operator].name.clone();
        self.dead_letter(&name, raw, TOO_LARGE);
    }

    fn checkpointed(&mut self, done: Completed) {
        self.taken.completed(done);
    }
}

fn open_sink(plan: &Plan, def: &SinkDef, uplinks: &[Arc<Uplink>]) -> Result<Sink, OutputError> {
    let mut targets = Vec::new();
    for input in &def.inputs {
        let t =
            plan.target(input).ok_or_else(|| OutputError::Input { sink: def.name.clone(), input: input.clone() })?;
        targets.push(t);
    }
    let writer = match def.kind {
        SinkKind::File => {
            let path = def.path.as_deref().unwrap_or_default();
            let file = open_append(Path::new(path)).map_err(|error| OutputError::Open {
                sink: def.name.clone(),
                path: path.to_owned(),
                error,
            })?;
            // Lines up to 64 KiB are buffered whole: a failed write never leaves half a line.
            Writer::File(BufWriter::with_capacity(64 << 10, file), path.into())
        }
        SinkKind::Stdout => Writer::Stdout(BufWriter::new(std::io::stdout())),
        SinkKind::Mqtt => {
            let uplink = uplinks.iter().find(|u| u.name() == def.name).map(Arc::clone).ok_or_else(|| {
                OutputError::Uplink { sink: def.name.clone(), error: "no outbound spool opened".into() }
            })?;
            let template = def.topic.as_deref().unwrap_or_default();
            let mut topics = Vec::new();
            for (input, &t) in def.inputs.iter().zip(&targets) {
                let schemas = match t {
                    Target::Late(op) => plan.operators[op].inputs.len(),
                    Target::Expired(op) => plan.operators[op].inputs.len() + 1,
                    _ => 1,
                };
                let compiled = (0..schemas)
                    .map(|i| TopicTemplate::compile(template, target_schema(plan, t, i)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|message| OutputError::Topic { sink: def.name.clone(), input: input.clone(), message })?;
                topics.push((t, compiled));
            }
            Writer::Mqtt { uplink, topics }
        }
    };
    Ok(Sink { name: def.name.clone(), site: format!("file sink {}", def.name), targets, writer })
}

/// Opens a file sink for appending (a restart continues it), creating its directory.
fn open_append(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).append(true).open(path)
}

/// The schema rows of `target` are laid out by (a late side output: that of its input `input`;
/// an expired one: that of its input `input`, or past the last input the operator's output's).
/// Dead letters have none: an empty schema, so a topic template naming a field fails to compile
/// for them, at start.
fn target_schema(plan: &Plan, target: Target, input: usize) -> &Schema {
    static EMPTY: std::sync::OnceLock<Schema> = std::sync::OnceLock::new();
    match target {
        Target::Stream(s) => &plan.streams[s].schema,
        Target::Operator(op) => &plan.operators[op].output,
        Target::Late(op) => plan.side_schema(op, Side::Late(input)),
        Target::Expired(op) => {
            let input = (input < plan.operators[op].inputs.len()).then_some(input);
            plan.side_schema(op, Side::Expired { reason: ExpiryReason::Ttl, input })
        }
        Target::DeadLetter => EMPTY.get_or_init(|| Schema::new(Vec::new(), None, crate::record::TimeSpec::Ingest)),
    }
}

/// The `_stream` of a dead letter made of a row of `target`.
fn target_name(plan: &Plan, target: Target) -> String {
    match target {
        Target::Stream(s) => plan.streams[s].name.clone(),
        Target::Operator(op) => plan.operators[op].name.clone(),
        Target::Late(op) => format!("{}{LATE_SUFFIX}", plan.operators[op].name),
        Target::Expired(op) => format!("{}{EXPIRED_SUFFIX}", plan.operators[op].name),
        Target::DeadLetter => crate::config::DEAD_LETTER.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk that refuses the first `refuse` writes with ENOSPC, then takes everything.
    struct FillingDisk {
        refuse: usize,
        written: Vec<u8>,
    }

    impl Write for FillingDisk {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if self.refuse > 0 {
                self.refuse -= 1;
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.written.extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Expected: a file sink whose disk is full keeps its line (and what its buffer holds), is
    /// shown as a failing write site, tries again every second and writes every line in order
    /// once the disk takes them; stopped while the disk is full, it gives up (the caller retracts
    /// the row, so the next start writes it).
    #[test]
    fn a_file_sink_waits_for_a_full_disk_and_drops_no_line() {
        let site = FileSite { site: "file sink diskfull-test", path: Path::new("/x/archive.jsonl") };
        let stop = AtomicBool::new(false);
        let mut w = BufWriter::with_capacity(16, FillingDisk { refuse: 2, written: Vec::new() });
        write_file_line(&mut w, b"{\"ab\":1}\n", site, Patience::idle(&stop)).unwrap();
        let started = write_faults::now();
        // The second line does not fit beside the first: the buffer must be written, and the
        // disk refuses it twice.
        write_file_line(&mut w, b"{\"bc\":2}\n", site, Patience::idle(&stop)).unwrap();
        assert!(started.elapsed() >= 2 * write_faults::RETRY_EVERY, "tried again every second");
        w.flush().unwrap();
        assert_eq!(w.get_ref().written, b"{\"ab\":1}\n{\"bc\":2}\n");
        assert!(!write_faults::is_failing("file sink diskfull-test"), "resumed");
        assert!(write_faults::failures().contains(&("file sink diskfull-test".to_owned(), 2)));

        let mut w = BufWriter::with_capacity(16, FillingDisk { refuse: usize::MAX, written: Vec::new() });
        write_file_line(&mut w, b"{\"ab\":1}\n", site, Patience::idle(&stop)).unwrap();
        stop.store(true, Ordering::Relaxed);
        assert_eq!(write_file_line(&mut w, b"{\"bc\":2}\n", site, Patience::idle(&stop)), Err(1));
        assert!(write_faults::is_failing("file sink diskfull-test"));
        assert_eq!(w.buffer(), b"{\"ab\":1}\n", "the line the buffer held is still there");
    }

    /// The wait for a full disk does what it is given between its short sleeps (the service runs
    /// its sources there) and ends as soon as that sets the stop.
    #[test]
    fn a_file_sink_waiting_for_the_disk_runs_meanwhile_between_its_sleeps() {
        let site = FileSite { site: "file sink meanwhile-test", path: Path::new("/x/archive.jsonl") };
        let stop = AtomicBool::new(false);
        let rounds = std::cell::Cell::new(0);
        let meanwhile = |_| {
            rounds.set(rounds.get() + 1);
            if rounds.get() == 4 {
                stop.store(true, Ordering::Relaxed);
            }
        };
        let mut w = BufWriter::with_capacity(16, FillingDisk { refuse: usize::MAX, written: Vec::new() });
        write_file_line(&mut w, b"{\"ab\":1}\n", site, Patience::idle(&stop)).unwrap();
        let started = write_faults::now();
        let patience = Patience { stop: &stop, meanwhile: Meanwhile::Run(&meanwhile) };
        // Should `meanwhile` never run, the wait would never end: stopped after 5 s instead.
        let written = crate::sink::stopped_after(&stop, std::time::Duration::from_secs(5), || {
            write_file_line(&mut w, b"{\"bc\":2}\n", site, patience)
        });
        assert_eq!(written, Err(1));
        assert_eq!(rounds.get(), 4, "one `meanwhile` per sleep until it stopped the wait");
        assert!(started.elapsed() < write_faults::RETRY_EVERY, "stopped at once, not after the retry");
    }
}
