//! The upstream MQTT sink: results are stored in a [`Spool`] and forwarded to the broker, and a
//! result leaves the spool only after the broker's PUBACK (DESIGN.md "Delivery").
//!
//! Two sides share an [`Uplink`]: the intake thread queues every result ([`Uplink::queue`]), and
//! [`run`] (a task on the tokio current-thread runtime that the same thread drives between its
//! steps, service/sources.rs) publishes what the spool holds. (The two sides may also run on two
//! threads: the push then waits for room on a condition variable, [`Meanwhile::Sleep`].)
//!
//! - **The spool is the only store.** The connection uses a clean session: with
//!   `session_present = false` rumqttc silently discards its own un-acked publishes (research
//!   §1.4), so nothing may depend on them. On every ConnAck, `run` rewinds to the spool's first
//!   unreleased record and sends again from there: a result may arrive twice (consumers dedupe
//!   by `_id`), never not at all — unless `overflow = "drop_oldest"` dropped it, which is counted.
//! - **In order.** Records are published in spool order, at most `max_inflight` (default 100,
//!   never more than rumqttc's own window, so packet ids never collide) unacknowledged at a
//!   time. PUBACKs release the acknowledged prefix of the window; QoS 0 releases a record once
//!   rumqttc wrote it.
//! - **Status.** The last will is a retained `offline` on the status topic (`status_topic`, by
//!   default `braid/<client id>/status`); after every ConnAck a retained `online` follows, and a
//!   clean shutdown publishes `offline` itself (a clean DISCONNECT suppresses the will).
//! - **Record format** in the spool: topic length u16 (little endian) | topic | payload.

mod forward;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::Notify;

pub use self::forward::run;
use crate::config::SinkDef;
use crate::mqtt::ConnError;
use crate::sink::{Meanwhile, Patience};
use crate::spool::{Spool, SpoolError, SpoolOptions};
use crate::storage::write_faults;

/// How long a blocked [`Uplink::push`] sleeps between looks at its `stop` flag.
const STOP_POLL: Duration = Duration::from_millis(50);
/// A round of a push's wait for room that runs the forwarding loop on the pushing thread: the
/// push looks for room that often (the loop sends and frees records all the while).
const RUN_STEP: Duration = Duration::from_millis(5);
/// What a sink does while its disk is full (storage/write_faults.rs).
const DISK_FULL_MEANWHILE: &str =
    "the sink's next result waits in memory and the intake with it; the brokers keep the devices' messages";

#[derive(Debug, Error)]
pub enum UplinkError {
    #[error("sink {sink}: {source}")]
    Spool { sink: String, source: SpoolError },
    /// The sink's connection settings are wrong; retrying will not help.
    #[error("sink {sink}: {source}")]
    Conn { sink: String, source: ConnError },
    #[error("sink {sink}: the url is missing")]
    NoUrl { sink: String },
    /// The result's topic is longer than MQTT allows (65 535 bytes).
    #[error("sink {sink}: topic of {len} bytes is longer than MQTT allows")]
    TopicTooLong { sink: String, len: usize },
    /// `push` gave up waiting for space because `stop` was set.
    #[error("sink {sink}: stopped while waiting for buffer space")]
    Stopped { sink: String },
}

impl UplinkError {
    /// A write that failed in the file system (a full disk making the buffer's head file).
    pub fn write_failure(&self) -> Option<(std::path::PathBuf, std::io::Error)> {
        match self {
            UplinkError::Spool { source, .. } => source.owned_write_failure(),
            _ => None,
        }
    }
}

/// The sink's figures (CONTRACT.md metrics `braid_sink_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UplinkStats {
    pub queued_bytes: u64,
    pub queued_rows: u64,
    /// Results the broker acknowledged (QoS 0: written), since this process started.
    pub sent_total: u64,
    /// Results dropped by `overflow = "drop_oldest"`, over the spool's life.
    pub dropped_total: u64,
    pub connected: bool,
    /// Connections made after the first.
    pub reconnects: u64,
}

/// What the feeder (producer) and [`run`] (consumer) share.
pub struct Uplink {
    name: String,
    spool: Mutex<Spool>,
    /// Signalled when records are released: a `push` blocked on a full spool retries.
    space: Condvar,
    /// Signalled after a batch of pushes ([`Uplink::wake`]): `run` waiting for data looks again.
    data: Arc<Notify>,
    /// Results queued since the last [`Uplink::wake`]: a wake with none wakes nobody.
    unannounced: AtomicBool,
    sent: AtomicU64,
    connected: AtomicBool,
    reconnects: AtomicU64,
    /// Backpressure on purpose: a [`Uplink::push`] waits for room (`overflow = "block"`).
    waiting: AtomicBool,
    /// Rounds of that wait (one per [`STOP_POLL`] or release): they prove the waiting thread is
    /// alive and waiting here, not stuck elsewhere (the watchdog keeps pinging while they move).
    wait_rounds: AtomicU64,
    /// A push waits because the disk refused the buffer's next segment (storage/write_faults.rs).
    disk_full: AtomicBool,
    /// `sink NAME`: how the buffer's write failures are reported.
    site: String,
}

/// A push waiting for room in a full buffer (`overflow = "block"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// Rounds waited so far; moving while the waiting thread is alive.
    pub rounds: u64,
    pub queued_bytes: u64,
    pub buffer_bytes: u64,
    pub connected: bool,
    /// The disk refuses the buffer's next segment (not the `buffer` bound).
    pub disk_full: bool,
}

impl Uplink {
    /// Opens (recovers) the sink's spool in `dir` (the service passes `STATE_DIR/sinks/NAME`),
    /// bounded by the sink's `buffer`, full by its `overflow` policy.
    pub fn open(def: &SinkDef, dir: &Path) -> Result<Arc<Uplink>, UplinkError> {
        Uplink::open_on(crate::storage::Mmap::shared(), def, dir)
    }

    /// [`open`](Self::open) with the buffer's files on `storage` (tests inject faults with it).
    pub fn open_on(
        storage: Arc<dyn crate::storage::Storage>,
        def: &SinkDef,
        dir: &Path,
    ) -> Result<Arc<Uplink>, UplinkError> {
        let options = SpoolOptions { max_bytes: def.buffer, overflow: def.overflow, ..SpoolOptions::default() };
        let spool = Spool::open_on(storage, dir, options)
            .map_err(|source| UplinkError::Spool { sink: def.name.clone(), source })?;
        Ok(Arc::new(Uplink {
            name: def.name.clone(),
            spool: Mutex::new(spool),
            space: Condvar::new(),
            data: Arc::new(Notify::new()),
            unannounced: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            connected: AtomicBool::new(false),
            reconnects: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            wait_rounds: AtomicU64::new(0),
            disk_full: AtomicBool::new(false),
            site: format!("sink {}", def.name),
        }))
    }

    /// Queues one result and wakes the forwarding loop: [`queue`](Self::queue), then
    /// [`wake`](Self::wake).
    pub fn push(&self, topic: &str, payload: &[u8], stop: &AtomicBool) -> Result<bool, UplinkError> {
        let outcome = self.queue(topic, payload, Patience::idle(stop));
        self.wake();
        outcome
    }

    /// Wakes the forwarding loop for the results queued since the last wake, if any. The intake
    /// queues a round's results and wakes it once, at the end of the round: a wake-up of the io
    /// thread per result was an eventfd write each and as many rounds of the loop, and a round
    /// that queued nothing wakes nobody.
    pub fn wake(&self) {
        if self.unannounced.swap(false, Ordering::AcqRel) {
            crate::mqtt::wake::wake(&self.data);
        }
    }

    /// Queues one result without waking the forwarding loop (call [`wake`](Self::wake) after a
    /// batch); whether it had to wait for room. `overflow = "block"`: waits while the buffer is
    /// full until space is freed, or until `stop` is set (then `Err(Stopped)`, nothing queued).
    /// `"drop_oldest"`: never waits; the oldest results make room (counted). Allocates nothing.
    pub fn queue(&self, topic: &str, payload: &[u8], patience: Patience<'_>) -> Result<bool, UplinkError> {
        let Ok(topic_len) = u16::try_from(topic.len()) else {
            return Err(UplinkError::TopicTooLong { sink: self.name.clone(), len: topic.len() });
        };
        let parts: [&[u8]; 3] = [&topic_len.to_le_bytes(), topic.as_bytes(), payload];
        let mut spool = self.lock();
        let mut waited = false;
        // Set while the disk refuses the buffer's next segment: the next attempt, unless records
        // are released first (their segment becomes the spare, no new file is needed).
        let mut retry_at: Option<Instant> = None;
        let outcome = loop {
            let stopping = patience.stop.load(Ordering::Relaxed);
            if !stopping && retry_at.is_some_and(|at| write_faults::now() < at) {
                let released;
                (spool, released) = self.wait_for_room(spool, &mut waited, patience.meanwhile);
                if released {
                    retry_at = None;
                }
                continue;
            }
            match spool.append_parts(&parts) {
                Ok(_) => break Ok(waited),
                Err(SpoolError::Full) if !stopping => {
                    spool = self.wait_for_room(spool, &mut waited, patience.meanwhile).0
                }
                Err(SpoolError::Full) => break Err(UplinkError::Stopped { sink: self.name.clone() }),
                Err(source) => match source.write_failure() {
                    Some((path, error)) if !stopping => {
                        write_faults::failed(&self.site, path, error, DISK_FULL_MEANWHILE);
                        self.disk_full.store(true, Ordering::Release);
                        retry_at = Some(write_faults::now() + write_faults::RETRY_EVERY);
                    }
                    Some(_) => break Err(UplinkError::Stopped { sink: self.name.clone() }),
                    None => break Err(UplinkError::Spool { sink: self.name.clone(), source }),
                },
            }
        };
        drop(spool);
        if self.disk_full.swap(false, Ordering::AcqRel) && outcome.is_ok() {
            write_faults::recovered(&self.site);
        }
        if waited {
            self.waiting.store(false, Ordering::Release);
        }
        if outcome.is_ok() {
            self.unannounced.store(true, Ordering::Release);
        }
        outcome
    }

    /// One round of waiting for room; whether records were released meanwhile. Asleep until a
    /// release or [`STOP_POLL`] (`Meanwhile::Sleep`), or running the forwarding loop, when it
    /// runs on this thread, for [`RUN_STEP`] (`Meanwhile::Run`), with the buffer's lock let go
    /// (the loop takes it to release records).
    fn wait_for_room<'a>(
        &'a self,
        spool: MutexGuard<'a, Spool>,
        waited: &mut bool,
        meanwhile: Meanwhile<'_>,
    ) -> (MutexGuard<'a, Spool>, bool) {
        // What was queued without a wake-up is what frees the room: the loop must see it.
        self.wake();
        if !*waited {
            *waited = true;
            self.waiting.store(true, Ordering::Release);
            tracing::debug!(sink = %self.name, "Buffer full or its disk full: intake waits for room");
        }
        self.wait_rounds.fetch_add(1, Ordering::Relaxed);
        match meanwhile {
            Meanwhile::Sleep => {
                let (spool, timeout) =
                    self.space.wait_timeout(spool, STOP_POLL).unwrap_or_else(PoisonError::into_inner);
                (spool, !timeout.timed_out())
            }
            Meanwhile::Run(run) => {
                let sent = self.sent.load(Ordering::Relaxed);
                drop(spool);
                run(RUN_STEP);
                (self.lock(), self.sent.load(Ordering::Relaxed) != sent)
            }
        }
    }

    /// Whether a push waits for room now (backpressure on purpose), and how it stands.
    pub fn blocked(&self) -> Option<Blocked> {
        if !self.waiting.load(Ordering::Acquire) {
            return None;
        }
        let spool = self.lock();
        Some(Blocked {
            rounds: self.wait_rounds.load(Ordering::Relaxed),
            queued_bytes: spool.queued_bytes(),
            buffer_bytes: spool.max_bytes(),
            connected: self.connected.load(Ordering::Relaxed),
            disk_full: self.disk_full.load(Ordering::Acquire),
        })
    }

    /// Forces the queued results to the disk (`durability = "power"`, before a checkpoint lets
    /// the journal go of the input that produced them).
    pub fn sync(&self) -> std::io::Result<()> {
        self.lock().sync()
    }

    /// The sink's name (`[sinks.NAME]`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn stats(&self) -> UplinkStats {
        let spool = self.lock();
        UplinkStats {
            queued_bytes: spool.queued_bytes(),
            queued_rows: spool.end() - spool.first(),
            sent_total: self.sent.load(Ordering::Relaxed),
            dropped_total: spool.dropped(),
            connected: self.connected.load(Ordering::Relaxed),
            reconnects: self.reconnects.load(Ordering::Relaxed),
        }
    }

    /// The spool. A panic while it was held leaves it usable: every spool method keeps its
    /// invariants before it can panic, so the poison flag is ignored rather than spread.
    fn lock(&self) -> MutexGuard<'_, Spool> {
        self.spool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `..=seq` are done with; `count` of them were sent.
    fn release_through(&self, seq: u64, count: u64) {
        self.lock().release_through(seq);
        self.sent.fetch_add(count, Ordering::Relaxed);
        // Only a push that waits for room listens (std's Condvar makes a futex call per notify,
        // listened to or not: one per settled ack). A pusher raises `waiting` under the lock
        // before it waits, and this load comes after our release took that lock: a waiting
        // pusher is always seen, and one that came later found the room itself.
        if self.waiting.load(Ordering::Acquire) {
            self.space.notify_all();
        }
    }
}

/// Splits a spool record into topic and payload; `None` for a record not in the format.
fn split_record(record: &[u8]) -> Option<(&str, &[u8])> {
    let (len, rest) = record.split_first_chunk::<2>()?;
    let len = usize::from(u16::from_le_bytes(*len));
    let (topic, payload) = rest.split_at_checked(len)?;
    Some((std::str::from_utf8(topic).ok()?, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::{MqttConn, Overflow, SinkKind};
    use crate::storage::faulty::{Fault, Faulty};
    use crate::storage::write_faults;

    /// An MQTT sink `name` to a local broker, `overflow = "block"` with a buffer of `buffer` bytes.
    pub(super) fn blocking_sink(name: &str, buffer: u64) -> SinkDef {
        SinkDef {
            name: name.into(),
            kind: SinkKind::Mqtt,
            inputs: vec!["effect".into()],
            url: Some("mqtt://127.0.0.1:1883".into()),
            topic: Some("up".into()),
            qos: 1,
            buffer,
            overflow: Overflow::Block,
            path: None,
            conn: MqttConn::default(),
            status_topic: None,
        }
    }

    /// Expected: while the disk refuses the buffer's first segment, `push` waits — reported as
    /// backpressure from a full disk and as a failing write site, tried again every second — and
    /// queues the result once the disk takes it: no result is dropped. Set `stop` while it waits
    /// and it gives up with `Stopped`, having queued nothing (the caller retracts the row).
    #[test]
    fn a_push_waits_while_the_disk_is_full_and_queues_the_result_once_it_is_not() {
        let def = blocking_sink("diskfull-test", 1 << 20);
        let dir = tempfile::tempdir().unwrap();
        let storage = Faulty::mmap();
        let uplink = Uplink::open_on(storage.clone(), &def, dir.path()).unwrap();
        let stop = AtomicBool::new(false);
        storage.fail_at(1, Fault::Enospc);
        let started = write_faults::now();
        std::thread::scope(|s| {
            let pushing = s.spawn(|| uplink.push("up/a", b"{\"x\":1}", &stop));
            let shown = (0..100).any(|_| {
                std::thread::sleep(Duration::from_millis(10));
                uplink.blocked().is_some_and(|b| b.disk_full) && write_faults::is_failing("sink diskfull-test")
            });
            assert!(shown, "the wait is shown as a full disk");
            assert!(pushing.join().unwrap().unwrap(), "queued after waiting");
        });
        assert!(started.elapsed() >= write_faults::RETRY_EVERY, "tried again after a second");
        assert!(!write_faults::is_failing("sink diskfull-test"), "resumed");
        assert_eq!(uplink.stats().queued_rows, 1);
        // Stopping while the disk is full: nothing queued, an error for the caller.
        let full = Faulty::mmap();
        let dir = tempfile::tempdir().unwrap();
        let uplink = Uplink::open_on(full.clone(), &def, dir.path()).unwrap();
        full.fail_at(1, Fault::Enospc);
        stop.store(true, Ordering::Relaxed);
        assert!(matches!(uplink.push("up/a", b"{}", &stop), Err(UplinkError::Stopped { .. })));
        assert_eq!(uplink.stats().queued_rows, 0);
    }

    /// A push that waits for room in a full buffer spends its rounds running what it is given (the
    /// service runs its sources and sinks there: the sink that frees the room, and the sources'
    /// connections through backpressure), with the buffer's lock let go, and stops waiting once
    /// that sets the stop.
    #[test]
    fn a_push_waiting_for_room_runs_meanwhile_between_its_rounds() {
        let def = blocking_sink("meanwhile-test", 64 << 10);
        let dir = tempfile::tempdir().unwrap();
        let uplink = Uplink::open(&def, dir.path()).unwrap();
        let stop = AtomicBool::new(false);
        let rounds = std::cell::Cell::new(0);
        let meanwhile = |step: Duration| {
            assert_eq!(step, RUN_STEP);
            assert!(uplink.spool.try_lock().is_ok(), "the buffer's lock is let go meanwhile");
            rounds.set(rounds.get() + 1);
            if rounds.get() == 3 {
                stop.store(true, Ordering::Relaxed);
            }
        };
        let payload = vec![b'x'; 1000];
        let mut queued = 0;
        // Should `meanwhile` never run, the wait would never end: stopped after 5 s instead.
        let refused = crate::sink::stopped_after(&stop, Duration::from_secs(5), || {
            loop {
                match uplink.queue("up/a", &payload, Patience { stop: &stop, meanwhile: Meanwhile::Run(&meanwhile) }) {
                    Ok(waited) => {
                        assert!(!waited, "no wait while there is room");
                        queued += 1;
                    }
                    Err(error) => break error,
                }
                assert!(queued < 1000, "a 64 KiB buffer took {queued} results of 1 KB");
            }
        });
        assert!(matches!(refused, UplinkError::Stopped { .. }), "{refused:?}");
        assert!(queued > 0);
        assert_eq!(rounds.get(), 3, "one `meanwhile` per round of the wait until it stopped it");
    }

    #[test]
    fn records_split_into_topic_and_payload() {
        assert_eq!(split_record(b"\x03\x00a/b{\"x\":1}"), Some(("a/b", &b"{\"x\":1}"[..])));
        assert_eq!(split_record(b"\x00\x00"), Some(("", &b""[..])));
        assert_eq!(split_record(b"\x09\x00a/b"), None, "topic cut short");
        assert_eq!(split_record(b"\x01"), None);
        assert_eq!(split_record(b"\x01\x00\xff"), None, "not UTF-8");
    }
}
