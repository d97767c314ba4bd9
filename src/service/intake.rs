//! The service's intake: the thread that owns the shard [`Runtime`] and is its only producer.
//!
//! It starts from the last checkpoint and replays the journal entries after it first (rebuilding
//! the state the previous run had), then loops: move
//! processing time to the wall clock (monotonic: a clock stepped back holds time still), take the
//! deliveries waiting in the intake channel — journal each, route and decode it, put its rows into
//! the shards' rings — publish the rings, and only then confirm the deliveries to their sources,
//! which acknowledge them to the broker. Results drain into the sinks meanwhile. The loop sleeps
//! on the runtime's doorbell, rung by shards with results and by sources with deliveries, and
//! wakes at least for every 200 ms tick.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::config::Durability;
use crate::plan::Plan;
use crate::shard::{Runtime, RuntimeError};
use crate::source::mqtt::SourceStatus;
use crate::source::{Confirmations, Delivery};
use crate::storage::write_faults;
use crate::time::next_tick;

use super::ServiceError;
use super::checkpoints::{Schedule, ServiceBarrier};
use super::ingest::{Ingest, Message};
use super::journal::{Journal, JournalError, What};
use super::outputs::Outputs;
use super::redelivery::Recent;
use super::sources::SourceRuntime;
use super::view::LiveView;

/// Deliveries taken per round before the rings are published and the deliveries confirmed.
const BATCH: usize = 256;
/// How often old journal entries are released.
const RETENTION_EVERY_MS: i128 = 1000;
/// Journal entries replayed between two requests for more start-up time.
const EXTEND_EVERY_ENTRIES: u64 = 100_000;
/// The most payload bytes one `GET /journal` copies (the newest messages).
pub const JOURNAL_COPY_BYTES: usize = 64 << 20;
/// A stall of the intake at least this long (one tick) is taken out of idleness.
const STALL_MS: i128 = 200;
/// Fault injection for tests: the journal's first N syncs under `durability = "power"` fail, as
/// an `msync` the disk refuses (EIO) would.
pub const FAULT_JOURNAL_SYNC_FAILS: &str = "BRAID_FAULT_JOURNAL_SYNC_FAILS";
/// How often the live figures are copied.
const SHOW_EVERY_MS: i128 = 1000;
/// How the journal's write failures are reported (storage/write_faults.rs).
pub(super) const JOURNAL_SITE: &str = "journal";
const JOURNAL_MEANWHILE: &str = "input is not acknowledged (the brokers keep it) and processing time stands still";

/// What the io thread asks of the intake thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Request {
    Run = 0,
    Stop = 1,
    Reload = 2,
}

/// Shared between the io thread (signals) and the intake thread.
#[derive(Debug, Default)]
pub struct Control {
    request: AtomicU8,
    /// Set with any stop or reload request: a sink waiting for room in a full buffer gives up
    /// (the journal produces its rows again at the next start), so the intake thread can stop.
    pub interrupt: Arc<std::sync::atomic::AtomicBool>,
    /// Rounds of the intake loop (the watchdog checks that it moves).
    pub heartbeat: AtomicU64,
    /// Deliveries taken (journaled and in the rings).
    pub taken: AtomicU64,
    /// Messages whose topic fed no stream of their source.
    pub unrouted: AtomicU64,
    /// Journal entries replayed at the last start.
    pub replayed: AtomicU64,
    /// Consecutive figure rounds (about a second each) in which some shard took no frame from a
    /// non-empty ring: the watchdog stops pinging when it grows.
    pub stalled_rounds: AtomicU64,
    /// Bytes the journal holds, and entries it let go early because it was full.
    pub journal_bytes: AtomicU64,
    pub journal_dropped: AtomicU64,
    /// The last checkpoint committed: its epoch, how long it took (ms of processing time from
    /// its barrier to its commit) and its bytes.
    pub checkpoint_epoch: AtomicU64,
    pub checkpoint_millis: AtomicU64,
    pub checkpoint_bytes: AtomicU64,
    /// Redelivered messages recognised as taken already (redelivery.rs).
    pub redelivered: AtomicU64,
    /// `GET /journal` waiting for a copy of the journal's messages ([`Control::ask_journal`]).
    journal_asked: std::sync::atomic::AtomicBool,
    journal_wanted: std::sync::Mutex<Vec<crossbeam_channel::Sender<JournalCopy>>>,
}

/// The journal's messages at one moment: (source name, arrival, topic, payload), oldest first.
pub type JournalCopy = Arc<Vec<super::journal::Entry>>;

impl Control {
    pub fn request(&self) -> Request {
        match self.request.load(Ordering::Acquire) {
            1 => Request::Stop,
            2 => Request::Reload,
            _ => Request::Run,
        }
    }

    /// Asks for `request`; a stop is never turned back into a reload.
    pub fn ask(&self, request: Request) {
        match request {
            Request::Stop => self.request.store(Request::Stop as u8, Ordering::Release),
            other => {
                let _ =
                    self.request.compare_exchange(Request::Run as u8, other as u8, Ordering::AcqRel, Ordering::Acquire);
            }
        }
        if request != Request::Run {
            self.interrupt.store(true, Ordering::Release);
        }
    }

    /// Asks the intake thread for a copy of the journal's messages; it answers on the next round
    /// of its loop (within a tick, 200 ms) on the returned channel.
    pub fn ask_journal(&self) -> crossbeam_channel::Receiver<JournalCopy> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.journal_wanted.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(tx);
        self.journal_asked.store(true, Ordering::Release);
        rx
    }

    /// Back to running (after a reload was applied or refused).
    pub fn clear_reload(&self) {
        let cleared = self.request.compare_exchange(
            Request::Reload as u8,
            Request::Run as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if cleared.is_ok() {
            self.interrupt.store(false, Ordering::Release);
        }
    }
}

/// How the intake thread talks to the io thread.
pub struct Links {
    pub intake: Receiver<Delivery>,
    pub confirmations: Arc<Confirmations>,
    pub control: Arc<Control>,
    pub view: Arc<LiveView>,
}

pub struct Intake<'a> {
    pub plan: &'a Plan,
    pub runtime: Runtime,
    pub journal: Journal,
    pub ingest: Ingest,
    pub outputs: Outputs,
    pub intake: Receiver<Delivery>,
    pub confirmations: Arc<Confirmations>,
    pub control: Arc<Control>,
    view: Arc<LiveView>,
    /// Processing time, ms: never moves back.
    pub now: i128,
    /// Per source: the highest delivery taken so far.
    taken: Vec<u64>,
    last_shown: i128,
    /// Per source: payload bytes worth journaling.
    keep: Vec<usize>,
    /// Per source: the streams it feeds.
    source_streams: Vec<Vec<usize>>,
    /// Per source (live): its connection state, and whether it was connected at the last round.
    sources: Vec<Arc<SourceStatus>>,
    connected: Vec<bool>,
    last_release: i128,
    /// Per source: the messages last taken, to recognise a redelivery.
    pub recent: Vec<Recent>,
    /// The journal entries before this position are in the checkpoint the run started from.
    journal_from: u64,
    pub schedule: Schedule,
    /// The journal refused a write (a full disk): when to try again. Meanwhile nothing is
    /// journaled, taken or acknowledged and the shards' processing time stands still.
    stuck: Option<Instant>,
    /// The delivery the journal refused: the first to go in once it writes again.
    held: Option<Delivery>,
    /// The state budget held the intake at the last round.
    state_held: bool,
    /// `durability = "power"`: the journal's last sync failed at this time. Its deliveries wait
    /// for a sync that works, tried again every [`write_faults::RETRY_EVERY`] even without input
    /// (the brokers send none while their messages wait for acknowledgement), and no checkpoint
    /// commits meanwhile.
    sync_failed: Option<Instant>,
    /// Syncs left to fail ([`FAULT_JOURNAL_SYNC_FAILS`]).
    sync_faults: u64,
}

impl<'a> Intake<'a> {
    pub fn new(
        plan: &'a Plan,
        runtime: Runtime,
        journal: Journal,
        outputs: Outputs,
        links: Links,
        start: i128,
        schedule: Schedule,
    ) -> Intake<'a> {
        let Links { intake, confirmations, control, view } = links;
        Intake {
            plan,
            runtime,
            journal,
            ingest: Ingest::new(plan),
            outputs,
            intake,
            confirmations,
            control,
            view,
            now: start,
            last_shown: start,
            taken: vec![0; plan.sources.len()],
            // One byte more than a source's largest payload: an oversized payload is
            // dead-lettered again on replay, with the same first KiB.
            keep: (0..plan.sources.len())
                .map(|s| usize::try_from(plan.source_max_payload(s).saturating_add(1)).unwrap_or(usize::MAX))
                .collect(),
            source_streams: (0..plan.sources.len()).map(|s| plan.source_streams(s).map(|(i, _)| i).collect()).collect(),
            sources: Vec::new(),
            connected: Vec::new(),
            last_release: start,
            recent: plan.sources.iter().map(|_| Recent::default()).collect(),
            journal_from: 0,
            schedule,
            stuck: None,
            held: None,
            state_held: false,
            sync_failed: None,
            sync_faults: std::env::var(FAULT_JOURNAL_SYNC_FAILS).ok().and_then(|v| v.parse().ok()).unwrap_or(0),
        }
    }

    /// Goes on from a checkpoint's barrier: its processing time, the messages last taken, and
    /// only the journal entries after it to replay.
    pub fn resume_from(&mut self, epoch: u64, barrier: &ServiceBarrier) {
        self.now = self.now.max(barrier.now);
        self.last_shown = self.now;
        self.last_release = self.now;
        self.journal_from = barrier.journal_next;
        self.schedule.resumed(epoch, barrier.journal_next);
        let held = self.journal.positions().start;
        if held > barrier.journal_next {
            // The checkpoint the start fell back to is older than what the journal holds.
            let lost = held - barrier.journal_next;
            tracing::warn!(
                from = barrier.journal_next,
                to = held,
                entries = lost,
                "Journal entries after the checkpoint restored were released: their input is lost"
            );
            crate::storage::quarantine::note_lost(lost);
        }
        self.recent = self.plan.sources.iter().map(|def| Recent::from_barrier(barrier, &def.name)).collect();
    }

    /// Feeds every journal entry after the checkpoint the run started from at the processing
    /// time it was first taken at.
    pub fn replay_journal(&mut self) -> Result<u64, ServiceError> {
        let mut count = 0;
        let positions = self.journal.positions();
        let notifier = crate::ops::systemd::Notifier::from_env();
        let mut next_extend = 0;
        for position in positions.start.max(self.journal_from)..positions.end {
            // A long recovery (a journal without a checkpoint before it) must not hit systemd's
            // start timeout: ask for more time now and then while it runs.
            if count >= next_extend {
                next_extend += EXTEND_EVERY_ENTRIES;
                notifier.extend_timeout(Duration::from_secs(60));
            }
            // One at a time: the journal may hold far more than memory should.
            let Some(entry) = self.journal.entry(position) else { continue };
            count += 1;
            let source = self.plan.sources.iter().position(|s| s.name == entry.source);
            if source.is_none() && entry.what != What::Start {
                // A reload removed the source: its messages feed no stream any more.
                continue;
            }
            self.now = self.now.max(entry.arrival);
            if let (Some(source), What::Message { topic, payload }) = (source, &entry.what) {
                self.recent[source].took(topic, payload);
            }
            self.apply(source.unwrap_or(0), &entry.what)?;
        }
        self.runtime.flush(&mut self.outputs)?;
        self.outputs.flush();
        self.control.replayed.store(count, Ordering::Relaxed);
        Ok(count)
    }

    /// The service starts at wall-clock time `now`: braid's own downtime is no idleness of its
    /// streams (the devices may well have published meanwhile; the broker kept it).
    pub fn start_live(&mut self, now: i128, sources: Vec<Arc<SourceStatus>>) -> Result<(), ServiceError> {
        self.now = self.now.max(now);
        match self.journal.append_event(&What::Start, "", self.now) {
            Ok(()) => self.apply(0, &What::Start)?,
            // The start is journaled and applied once the journal writes again.
            Err(error) => self.journal_refused(error)?,
        }
        // Until a source reports its connection, its streams count as connected (the first round
        // journals the actual state).
        self.connected = vec![true; sources.len()];
        self.sources = sources;
        Ok(())
    }

    /// Does what a journal entry records, live or replayed, at `self.now`. Resuming goes before
    /// the ticks up to now (the gap was not idleness), suspending after them.
    fn apply(&mut self, source: usize, what: &What) -> Result<(), ServiceError> {
        match what {
            What::Start => {
                self.runtime.downtime_ends(self.now, &mut self.outputs)?;
                let all: Vec<usize> = (0..self.plan.streams.len()).collect();
                self.runtime.resume_streams(&all, self.now);
            }
            What::Connected => {
                self.recent[source].reconnected();
                self.runtime.resume_streams(&self.source_streams[source], self.now);
            }
            What::Disconnected | What::Message { .. } => {}
        }
        self.runtime.advance_to(self.now, &mut self.outputs)?;
        match what {
            What::Disconnected => self.runtime.suspend_streams(&self.source_streams[source]),
            What::Message { topic, payload } => self.accept(source, topic, payload)?,
            What::Start | What::Connected => {}
        }
        Ok(())
    }

    /// Feeds one message (live or journaled) at `self.now`; counts it when no stream took it.
    fn accept(&mut self, source: usize, topic: &str, payload: &[u8]) -> Result<(), ServiceError> {
        let message = Message { source, topic, payload, now: self.now };
        if !self.ingest.accept(self.plan, message, &mut self.runtime, &mut self.outputs)? {
            self.control.unrouted.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Journals and applies every source's change of connection since the last round.
    fn watch_connections(&mut self) -> Result<(), ServiceError> {
        for source in 0..self.sources.len() {
            let connected = self.sources[source].connected.load(Ordering::Acquire);
            if connected == self.connected[source] {
                continue;
            }
            let what = if connected { What::Connected } else { What::Disconnected };
            let name = &self.plan.sources[source].name;
            if let Err(error) = self.journal.append_event(&what, name, self.now) {
                // Seen again at the next round after the journal writes again.
                return self.journal_refused(error);
            }
            self.connected[source] = connected;
            self.apply(source, &what)?;
        }
        Ok(())
    }

    /// Runs until the io thread asks for a stop or a reload; returns which.
    /// The sources run on this thread (sources.rs): each round pumps them once, and the round's
    /// sleep drives them.
    pub fn run(&mut self, wall_clock: impl Fn() -> i128, sources: &SourceRuntime) -> Result<Request, ServiceError> {
        loop {
            sources.pump();
            let request = self.control.request();
            if request != Request::Run {
                return Ok(request);
            }
            let before = self.now;
            self.now = self.now.max(wall_clock());
            if self.journal_writes()? {
                self.resume_after_stall(before)?;
                self.watch_connections()?;
            }
            // Not while the journal refuses writes (what the shards see stays what it holds), nor
            // while a shard's state is at its budget.
            let mut state_full = false;
            if self.stuck.is_none() {
                self.runtime.advance_to(self.now, &mut self.outputs)?;
                state_full = self.hold_for_state_budget();
            }
            if self.stuck.is_none() && !state_full {
                self.take_batch()?;
            }
            if self.sync_failed.is_some_and(|at| write_faults::now() >= at + write_faults::RETRY_EVERY) {
                self.sync_and_confirm();
            }
            self.checkpoint_if_due()?;
            self.commit_completed();
            self.outputs.flush();
            self.release_old_entries();
            self.show_figures();
            self.copy_journal_if_asked();
            self.control.heartbeat.fetch_add(1, Ordering::Relaxed);
            let until_tick = Duration::from_millis((next_tick(self.now) - self.now).clamp(1, 200) as u64);
            let (intake, control, stuck) = (&self.intake, &self.control, self.stuck.is_some());
            // While the journal refuses writes or the state budget holds the intake, waiting
            // deliveries are no reason to wake.
            let waiting = || !stuck && !state_full && !intake.is_empty();
            self.runtime.wait(&mut self.outputs, until_tick, || waiting() || control.request() != Request::Run)?;
        }
    }

    /// A full sink buffer held the intake (backpressure) from about `before` until now: that
    /// standstill is braid's, not silence of the devices (the broker kept their messages), so
    /// like braid's downtime it is no idleness. Every stream's idleness counts from now, journaled
    /// as a start so that a restart replays the same. Waits shorter than a tick change nothing a
    /// tick could see and are not journaled.
    fn resume_after_stall(&mut self, before: i128) -> Result<(), ServiceError> {
        if !self.outputs.take_stalled() || self.now - before < STALL_MS {
            return Ok(());
        }
        match self.journal.append_event(&What::Start, "", self.now) {
            Ok(()) => self.apply(0, &What::Start),
            // Resuming journals a start anyway.
            Err(error) => self.journal_refused(error),
        }
    }

    /// The journal refused `error`'s write: a write failure (a full disk) holds the input until
    /// it writes again ([`journal_writes`](Self::journal_writes)); any other error ends the run.
    fn journal_refused(&mut self, error: JournalError) -> Result<(), ServiceError> {
        let Some((path, io)) = error.write_failure() else { return Err(error.into()) };
        write_faults::failed(JOURNAL_SITE, path, io, JOURNAL_MEANWHILE);
        self.stuck = Some(write_faults::now() + write_faults::RETRY_EVERY);
        Ok(())
    }

    /// Whether the journal takes entries: true unless it refused a write and still does. Tried
    /// again every [`write_faults::RETRY_EVERY`] with a start: the standstill was braid's, so every
    /// stream's idleness counts from now (as after a restart), replayed the same.
    fn journal_writes(&mut self) -> Result<bool, ServiceError> {
        let Some(next_try) = self.stuck else { return Ok(true) };
        if write_faults::now() < next_try {
            return Ok(false);
        }
        // The held delivery goes right after the start: room for both first, so that a start is
        // journaled only once the input can go on.
        let room = match &self.held {
            Some(held) => {
                let name = &self.plan.sources[held.source].name;
                self.journal.make_room_for(name, held, self.keep[held.source])
            }
            None => Ok(()),
        };
        if let Err(error) = room.and_then(|()| self.journal.append_event(&What::Start, "", self.now)) {
            self.journal_refused(error)?;
            return Ok(false);
        }
        self.stuck = None;
        write_faults::recovered(JOURNAL_SITE);
        self.apply(0, &What::Start)?;
        Ok(true)
    }

    /// Whether a shard is at its state budget (state/budget.rs, `backpressure`): the intake then
    /// takes nothing — the deliveries wait in the channel, then at the brokers, unacknowledged —
    /// while ticks go on running, so idle inputs can move the watermark and free state. Logged
    /// when it begins and ends; `/healthz` and `STATUS=` say it meanwhile (view.rs).
    fn hold_for_state_budget(&mut self) -> bool {
        let full = self.runtime.state_full();
        if full != self.state_held {
            self.state_held = full;
            if full {
                tracing::warn!(
                    shards = ?self.runtime.shard_state(),
                    "State budget full; the intake waits until the watermark frees state (the brokers keep the messages)"
                );
            } else {
                tracing::info!("State back under its budget; the intake takes input again");
            }
        }
        full
    }

    /// Journals and ingests up to [`BATCH`] waiting deliveries, publishes them to the shards,
    /// then confirms them to their sources.
    fn take_batch(&mut self) -> Result<(), ServiceError> {
        let mut any = false;
        for _ in 0..BATCH {
            // The delivery the journal refused last goes first.
            let Some(delivery) = self.held.take().or_else(|| self.intake.try_recv().ok()) else { break };
            any = true;
            let source = delivery.source;
            if delivery.redelivered && self.recent[source].is_repeat(&delivery.topic, &delivery.payload) {
                // Journaled and taken before the broker sent it again: acknowledged, not retaken.
                self.taken[source] = self.taken[source].max(delivery.seq);
                self.control.redelivered.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let name = &self.plan.sources[source].name;
            if let Err(error) = self.journal.append(name, &delivery, self.now, self.keep[source]) {
                // Not acknowledged: it waits here, the ones behind it at the broker.
                self.held = Some(delivery);
                self.journal_refused(error)?;
                break;
            }
            self.taken[source] = self.taken[source].max(delivery.seq);
            self.recent[source].took(&delivery.topic, &delivery.payload);
            self.accept(source, &delivery.topic, &delivery.payload)?;
            self.control.taken.fetch_add(1, Ordering::Relaxed);
        }
        if !any {
            return Ok(());
        }
        self.runtime.flush(&mut self.outputs)?;
        self.sync_and_confirm();
        Ok(())
    }

    /// Confirms the deliveries taken so far to their sources, with `durability = "power"` once
    /// the journal is synced. A failed sync leaves them waiting (the brokers keep them) for the
    /// next batch's sync or the retry, whichever comes first.
    fn sync_and_confirm(&mut self) {
        if self.plan.runtime.durability == Durability::Power {
            if let Err(error) = self.sync_journal() {
                let path = self.journal.dir().to_owned();
                write_faults::failed_with(JOURNAL_SITE, &path, &error.to_string(), false, JOURNAL_MEANWHILE);
                self.sync_failed = Some(write_faults::now());
                return;
            }
            self.sync_failed = None;
        }
        if self.stuck.is_none() {
            write_faults::recovered(JOURNAL_SITE);
        }
        for (source, &seq) in self.taken.iter().enumerate() {
            if seq > 0 {
                self.confirmations.confirm(source, seq);
            }
        }
    }

    /// Syncs the journal, unless [`FAULT_JOURNAL_SYNC_FAILS`] says this sync fails.
    fn sync_journal(&mut self) -> Result<(), JournalError> {
        if let Some(left) = self.sync_faults.checked_sub(1) {
            self.sync_faults = left;
            return Err(JournalError::Sync(std::io::Error::other(format!("{FAULT_JOURNAL_SYNC_FAILS}: injected"))));
        }
        self.journal.sync()
    }

    /// Whether every journaled delivery is as durable as `durability` asks: false while a sync
    /// under `power` has failed (a checkpoint then must not let its input go).
    pub(super) fn journal_durable(&self) -> bool {
        self.sync_failed.is_none()
    }

    /// Copies the runtime's figures for `/metrics` and the status line, about once a second.
    fn show_figures(&mut self) {
        if self.now - self.last_shown >= SHOW_EVERY_MS {
            self.last_shown = self.now;
            self.view.update_figures(Some(self.runtime.live_figures()));
            let stalled = self.runtime.stalled_shards();
            let rounds = if stalled > 0 { self.control.stalled_rounds.load(Ordering::Relaxed) + 1 } else { 0 };
            self.control.stalled_rounds.store(rounds, Ordering::Relaxed);
            self.control.journal_bytes.store(self.journal.queued_bytes(), Ordering::Relaxed);
            self.control.journal_dropped.store(self.journal.dropped(), Ordering::Relaxed);
        }
    }

    /// Answers `GET /journal`: one copy of the messages still held (the newest
    /// [`JOURNAL_COPY_BYTES`] of payloads) for everyone waiting, taken between two rounds.
    fn copy_journal_if_asked(&mut self) {
        if !self.control.journal_asked.swap(false, Ordering::AcqRel) {
            return;
        }
        let waiting =
            std::mem::take(&mut *self.control.journal_wanted.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        if waiting.is_empty() {
            return;
        }
        // The newest messages, back to the bound: a copy never holds the whole journal of a long
        // checkpoint failure (journal_bytes) in memory a second time.
        let mut newest = Vec::new();
        let mut bytes = 0;
        for position in self.journal.positions().rev() {
            let Some(entry) = self.journal.entry(position) else { continue };
            if let What::Message { payload, .. } = &entry.what {
                bytes += payload.len();
                if bytes > JOURNAL_COPY_BYTES {
                    break;
                }
                newest.push(entry);
            }
        }
        newest.reverse();
        let copy: JournalCopy = Arc::new(newest);
        for asker in waiting {
            // An asker that gave up has dropped its end: nothing to do.
            let _ = asker.send(Arc::clone(&copy));
        }
    }

    fn release_old_entries(&mut self) {
        if self.now - self.last_release >= RETENTION_EVERY_MS {
            self.last_release = self.now;
            self.journal.release_older_than_retention(self.now);
        }
    }

    /// Stops the shards without ending the input, after a last checkpoint (the next start
    /// goes on from it) and draining what they can finish within `grace`.
    pub fn stop(mut self, grace: Duration) -> Result<Outputs, ServiceError> {
        self.final_checkpoint(grace)?;
        let Intake { runtime, mut outputs, .. } = self;
        let result = runtime.stop(&mut outputs, grace);
        outputs.flush();
        result.map_err(ServiceError::from)?;
        Ok(outputs)
    }
}

impl From<RuntimeError> for ServiceError {
    fn from(error: RuntimeError) -> ServiceError {
        ServiceError::Runtime(error)
    }
}
