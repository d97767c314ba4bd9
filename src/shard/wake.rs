//! Waking a thread that sleeps because its rings are empty (or full), without polling.
//!
//! A [`Doorbell`] is a socket pair and a `sleeping` flag. The sleeper sets the flag, looks at its
//! rings once more, and only then waits for a byte; whoever commits frames (or frees space) for
//! it afterwards sees the flag and writes one byte. Both sides order their flag and ring accesses
//! with SeqCst fences (a Dekker pair: "I published, then looked at the flag" against "I raised the
//! flag, then looked at the rings"), so either the sleeper sees the new frames or the waker sees
//! the flag — a wake-up is never lost, and a byte written to a sleeper that had found work anyway
//! only costs one spurious round. Shards wait with monoio (the socket works under io_uring and
//! under the legacy epoll driver alike, DESIGN.md "Hard facts"); the feeder waits on a plain
//! blocking read.
//!
//! Fewer wake-ups (BENCHMARKS.md "Fewer wake-ups"):
//! - **One ring per batch.** Producers commit a batch of frames and ring once ([`Outbox::flush`],
//!   the feeder's publication); the bell writes a byte only when its owner sleeps.
//! - **Released space wakes only a producer that waits for it.** A consumer rings its producer
//!   after a read only when the producer asked for room (the ring's "room wanted" flag,
//!   `ring/mod.rs`), not after every batch it takes: before, a shard taking the feeder's frames
//!   woke a feeder that slept waiting for input, and the collector taking results woke the shard.
//! - **A short spin before sleeping** ([`Doorbell::spin`]): an owner out of work looks at its
//!   rings for a few µs before it raises its flag; work that arrives meanwhile costs no sleep,
//!   no wake-up byte and no context switch.
//! - **Shards linger under fast network input** ([`Linger`], `Pacing::NETWORK`): live input comes
//!   in many small publications; while frames come faster than one per [`LINGER_PACE`], a shard
//!   that ran out of work sleeps a fixed time without raising its flag, so the feeder's
//!   publications meanwhile ring nobody, and it takes them in one round.
//! - Each bell counts the wake-up bytes written to it, its owner's sleeps and the spins that found
//!   work ([`BellCounts`]; `braid bench` prints them per input row).
//!
//! A guard besides the proof: the calling thread never sleeps without bound on a wait that only
//! the shards can end. After [`NUDGE_AFTER`] without a wake-up it [nudges](Doorbell::nudge) the
//! shards it waits for (a byte whatever their flags say), so a wake-up lost to a fault not found
//! yet costs a fraction of a second instead of a run that never ends (one was seen: a 4-shard
//! replay whose calling thread and one shard both slept at the end of input). The service
//! nudges a shard whose feed ring has not moved for a second (`Runtime::stalled_shards`). Nudges
//! are counted ([`BellCounts::nudged`]).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::time::Duration;

use crate::ring::{Consumer, FrameKind, Producer, PushError};

/// Rounds of [`Doorbell::spin`]: each looks for work, then pauses [`SPIN_PAUSES`] times. About
/// 3–10 µs in all (a pause is 10–50 ns, by CPU), a small part of what a sleep and a wake-up cost
/// (a context switch each way, and the waker's system call).
const SPIN_ROUNDS: u32 = 64;
const SPIN_PAUSES: u32 = 4;

/// How long the calling thread sleeps, in a wait only the shards can end (the end of input, a
/// full feed ring), before it nudges them: far above any wake-up's latency, short enough that a
/// lost one is a hiccup.
pub const NUDGE_AFTER: Duration = Duration::from_millis(200);

pub struct Doorbell {
    sleeping: AtomicBool,
    /// Non-blocking: a full socket means a wake-up is pending anyway.
    waker: UnixStream,
    /// Wake-up bytes written, sleeps, spins that found work, nudges (relaxed: figures only).
    rung: AtomicU64,
    parked: AtomicU64,
    spun: AtomicU64,
    nudged: AtomicU64,
}

/// What a bell counted since it was made (its owner is one thread: the feeder or a shard).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BellCounts {
    /// Wake-up bytes written to the owner (it slept, or was about to).
    pub rung: u64,
    /// Times the owner went to sleep on the bell.
    pub parked: u64,
    /// Times the owner's spin found work and it did not sleep.
    pub spun: u64,
    /// Wake-up bytes written by [`Doorbell::nudge`] (not in `rung`).
    pub nudged: u64,
}

impl std::ops::AddAssign for BellCounts {
    fn add_assign(&mut self, other: BellCounts) {
        self.rung += other.rung;
        self.parked += other.parked;
        self.spun += other.spun;
        self.nudged += other.nudged;
    }
}

impl Doorbell {
    /// The bell and the socket its owner waits on.
    pub fn new() -> std::io::Result<(Arc<Doorbell>, UnixStream)> {
        let (waker, sleeper) = UnixStream::pair()?;
        waker.set_nonblocking(true)?;
        let zero = || AtomicU64::new(0);
        let bell = Doorbell {
            sleeping: AtomicBool::new(false),
            waker,
            rung: zero(),
            parked: zero(),
            spun: zero(),
            nudged: zero(),
        };
        Ok((Arc::new(bell), sleeper))
    }

    /// Wakes the owner if it sleeps. Call after committing frames (once per batch), or after
    /// releasing space that the owner asked for.
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            self.rung.fetch_add(1, Ordering::Relaxed);
            // A full socket already holds a wake-up; any other error leaves nothing to do.
            let _ = (&self.waker).write(&[1]);
        }
    }

    /// Writes a wake-up whatever the owner's flag says (module doc, "A guard besides the proof"):
    /// an owner that sleeps wakes and looks at its rings; one that is awake finds the byte at its
    /// next sleep and takes one spurious round.
    pub fn nudge(&self) {
        self.nudged.fetch_add(1, Ordering::Relaxed);
        // A full socket already holds a wake-up; any other error leaves nothing to do.
        let _ = (&self.waker).write(&[1]);
    }

    /// The owner found no work: looks again for up to [`SPIN_ROUNDS`] rounds, pausing in
    /// between, before it prepares to sleep. Returns whether `ready` said there is work.
    pub fn spin(&self, mut ready: impl FnMut() -> bool) -> bool {
        for _ in 0..SPIN_ROUNDS {
            for _ in 0..SPIN_PAUSES {
                std::hint::spin_loop();
            }
            if ready() {
                self.spun.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// The owner goes to sleep now (counted; call right before the wait).
    pub fn parking(&self) {
        self.parked.fetch_add(1, Ordering::Relaxed);
    }

    pub fn counts(&self) -> BellCounts {
        BellCounts {
            rung: self.rung.load(Ordering::Relaxed),
            parked: self.parked.load(Ordering::Relaxed),
            spun: self.spun.load(Ordering::Relaxed),
            nudged: self.nudged.load(Ordering::Relaxed),
        }
    }

    /// The owner is about to sleep: raise the flag, then look at the rings again.
    pub fn prepare_sleep(&self) {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// The waker end's descriptor: a byte written to it wakes the owner (a shard's checkpoint
    /// file write rings it from io_uring, shard/file_write.rs). Valid as long as the bell.
    pub fn waker_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.waker.as_raw_fd()
    }

    /// The owner found work after [`prepare_sleep`](Self::prepare_sleep), or woke up.
    pub fn awake(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Blocks the calling thread until rung or `timeout` passes (at least 1 ms). Returns whether
    /// it was rung (or the socket failed: either way the caller looks at its rings again).
    pub fn wait_blocking(&self, sleeper: &mut Sleeper, timeout: Duration) -> bool {
        let mut buf = [0u8; 64];
        self.parking();
        let rung = sleeper.read(&mut buf, timeout);
        self.awake();
        rung
    }
}

/// The socket a blocking owner (the calling thread) sleeps on, and the read timeout it has (set
/// again only when it changes: one system call less per sleep).
pub struct Sleeper {
    socket: UnixStream,
    timeout: Option<Duration>,
    /// Sleeps instead of the blocking read, running other work of the thread meanwhile.
    driver: Option<Box<dyn SleepDriver>>,
}

/// How an owner sleeps when its thread has other work to wait for too: the service's calling
/// thread runs its MQTT sources while it sleeps (service/sources.rs), so a message that arrives
/// wakes one thread, not a network thread and then the calling thread.
pub trait SleepDriver: Send {
    /// Waits until the bell's socket (its own handle on it, non-blocking) has wake-up bytes or
    /// `timeout` (at least 1 ms) passed, doing the thread's other work meanwhile; reads the bytes.
    /// Returns whether it was rung (or the socket failed: either way the owner looks again).
    fn sleep(&mut self, timeout: Duration) -> bool;
}

impl Sleeper {
    pub fn new(socket: UnixStream) -> Sleeper {
        Sleeper { socket, timeout: None, driver: None }
    }

    /// From now on sleeps through the driver `make` builds on a handle of the socket (the socket
    /// turns non-blocking: the blocking read is not used any more).
    pub fn drive_with(
        &mut self,
        make: impl FnOnce(UnixStream) -> std::io::Result<Box<dyn SleepDriver>>,
    ) -> std::io::Result<()> {
        let socket = self.socket.try_clone()?;
        socket.set_nonblocking(true)?;
        self.driver = Some(make(socket)?);
        Ok(())
    }

    /// Reads wake-up bytes, waiting up to `timeout`: false when it passed with none.
    fn read(&mut self, buf: &mut [u8], timeout: Duration) -> bool {
        // A zero timeout would mean "block forever" to the socket.
        let timeout = timeout.max(Duration::from_millis(1));
        if let Some(driver) = &mut self.driver {
            return driver.sleep(timeout);
        }
        if self.timeout != Some(timeout) {
            if self.socket.set_read_timeout(Some(timeout)).is_err() {
                return true;
            }
            self.timeout = Some(timeout);
        }
        // Any number of bytes is one wake-up; none (Ok(0), the waker end gone) ends the wait too.
        match (&self.socket).read(buf) {
            Ok(_bytes) => true,
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        }
    }
}

/// Whether a shard should linger before it looks at its rings again
/// ([`Pacing::shard_linger`](super::Pacing::shard_linger)): only while frames come faster than
/// one per [`LINGER_PACE`].
/// Then the shard sleeps `linger` without raising its flag, and takes what came meanwhile in one
/// round. Slower input keeps the doorbell: each frame is taken as it comes, with no added
/// latency.
pub struct Linger {
    linger: std::time::Duration,
    /// When the shard last ran out of work, and its input frames taken by then.
    idle_at: std::time::Instant,
    frames_at: u64,
}

/// The input rate above which a shard lingers: one frame per 100 µs (10 000 frames/s). A gateway's
/// usual few thousand messages per second stay below it.
pub const LINGER_PACE: std::time::Duration = std::time::Duration::from_micros(100);

impl Linger {
    pub fn new(linger: std::time::Duration, now: std::time::Instant) -> Linger {
        Linger { linger, idle_at: now, frames_at: 0 }
    }

    /// The shard ran out of work now (`now` reads the clock, only when the shard may linger),
    /// having taken `frames` input frames in all: how long to linger (none: sleep on the bell as
    /// usual).
    pub fn on_idle(&mut self, frames: u64, now: impl FnOnce() -> std::time::Instant) -> Option<std::time::Duration> {
        if self.linger.is_zero() {
            return None;
        }
        let now = now();
        let taken = frames - self.frames_at;
        let since = now.saturating_duration_since(self.idle_at);
        (self.idle_at, self.frames_at) = (now, frames);
        let busy = taken > 0 && LINGER_PACE.saturating_mul(u32::try_from(taken).unwrap_or(u32::MAX)) >= since;
        busy.then_some(self.linger)
    }
}

/// The producing end of a ring with the consumer's doorbell, and the frames that did not fit yet
/// (kept in order; the owner stops taking new input while any wait, so they stay few).
pub struct Outbox {
    ring: Producer,
    bell: Arc<Doorbell>,
    waiting: std::collections::VecDeque<(FrameKind, Vec<u8>)>,
}

/// Why an [`Outbox`] cannot take a frame.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// Larger than a ring can ever hold.
    #[error("a frame of {0} bytes does not fit the shard rings")]
    TooLarge(usize),
    /// The ring's file could not take back pages it gave back ([`PushError::NoSpace`]).
    #[error("a shard ring cannot allocate its pages again (its file system is full): {0}")]
    NoSpace(std::io::Error),
}

impl OutboxError {
    fn no_space(errno: i32) -> OutboxError {
        OutboxError::NoSpace(std::io::Error::from_raw_os_error(errno))
    }
}

impl Outbox {
    pub fn new(ring: Producer, bell: Arc<Doorbell>) -> Outbox {
        Outbox { ring, bell, waiting: Default::default() }
    }

    /// Queues a frame: into the ring when it has room and nothing waits, else in order behind.
    pub fn push(&mut self, kind: FrameKind, payload: &[u8]) -> Result<(), OutboxError> {
        if self.waiting.is_empty() {
            match self.ring.push(kind, payload) {
                Ok(()) => return Ok(()),
                Err(PushError::TooLarge) => return Err(OutboxError::TooLarge(payload.len())),
                Err(PushError::NoSpace(errno)) => return Err(OutboxError::no_space(errno)),
                Err(PushError::Full) => {
                    // Publish what fits so the consumer can make room.
                    if self.ring.commit() {
                        self.bell.ring();
                    }
                }
            }
        }
        if payload.len() > self.ring.max_payload() {
            return Err(OutboxError::TooLarge(payload.len()));
        }
        self.waiting.push_back((kind, payload.to_vec()));
        Ok(())
    }

    /// Moves waiting frames into the ring while they fit, publishes, and rings the consumer if
    /// anything was published (only then: two idle shards ringing each other would never sleep).
    /// Frames still waiting ask the consumer for room (it rings back when it releases some).
    /// Returns whether any waiting frame moved; an error when the ring could not take back its
    /// pages (what moved before it is published).
    pub fn flush(&mut self) -> Result<bool, OutboxError> {
        let mut moved = false;
        let mut failed = None;
        while let Some((kind, payload)) = self.waiting.front() {
            match self.ring.push(*kind, payload) {
                Ok(()) => {}
                Err(PushError::NoSpace(errno)) => {
                    failed = Some(OutboxError::no_space(errno));
                    break;
                }
                Err(PushError::Full | PushError::TooLarge) => break,
            }
            self.waiting.pop_front();
            moved = true;
        }
        if self.ring.commit() {
            self.bell.ring();
        }
        if !self.waiting.is_empty() {
            self.ring.want_room();
        }
        failed.map_or(Ok(moved), Err)
    }

    pub fn is_blocked(&self) -> bool {
        !self.waiting.is_empty()
    }

    pub fn used_bytes(&self) -> u64 {
        self.ring.used_bytes()
    }
}

/// The consuming end of a ring with the producer's doorbell (rung when space is released and
/// the producer asked for room).
///
/// Built only inside `shard/` (its fields are private to it), from a ring `Runtime::start`
/// created, which only the runtime's [`Writer`](super::wire::Writer) payloads fill: that is what
/// makes `read_frames` safe.
pub struct Inbox {
    pub(super) ring: Consumer,
    pub(super) bell: Arc<Doorbell>,
}

impl Inbox {
    /// Reads up to the committed frames, then wakes the producer if it waits for room.
    fn read(&mut self, visit: impl FnMut(crate::ring::Frame<'_>)) -> usize {
        let frames = self.ring.read_batch(visit);
        if frames > 0 && self.ring.room_wanted() {
            self.bell.ring();
        }
        frames
    }

    /// Reads up to the committed frames as the runtime's frames (see [`read`](Self::read)).
    pub(super) fn read_frames(&mut self, mut visit: impl FnMut(super::wire::Frame<'_>)) -> usize {
        self.read(|f| {
            // SAFETY: an inbox's ring was created by `Runtime::start` in this run and is filled
            // only with its `Writer` payloads (type doc), so every payload is, unchanged and
            // 16-byte aligned, one that `wire::read` may decode.
            visit(unsafe { super::wire::read(f.kind, f.payload) })
        })
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // an origin for the tests' instants; only differences count
mod tests {
    use std::time::{Duration, Instant};

    use super::{Doorbell, Linger, Sleeper};

    const LINGER: Duration = Duration::from_millis(1);

    #[test]
    fn a_shard_lingers_only_while_frames_come_faster_than_the_pace() {
        let start = Instant::now();
        let mut linger = Linger::new(LINGER, start);
        // 10 frames in 500 µs: one per 50 µs, faster than one per 100 µs.
        assert_eq!(linger.on_idle(10, || start + Duration::from_micros(500)), Some(LINGER));
        // 5 more in the next 1.5 ms: one per 300 µs.
        assert_eq!(linger.on_idle(15, || start + Duration::from_micros(2000)), None);
        // Exactly at the pace still counts as fast: 10 frames in 1 ms.
        assert_eq!(linger.on_idle(25, || start + Duration::from_micros(3000)), Some(LINGER));
        // Nothing came while it lingered: back to the bell.
        assert_eq!(linger.on_idle(25, || start + Duration::from_micros(4000)), None);
    }

    #[test]
    fn a_zero_linger_never_lingers() {
        let start = Instant::now();
        let mut linger = Linger::new(Duration::ZERO, start);
        assert_eq!(linger.on_idle(1000, || start + Duration::from_micros(10)), None);
    }

    #[test]
    fn a_nudge_wakes_an_owner_that_a_ring_would_not() {
        let (bell, socket) = Doorbell::new().unwrap();
        let mut sleeper = Sleeper::new(socket);
        // The flag is down: a ring writes nothing, and the wait times out.
        bell.ring();
        assert!(!bell.wait_blocking(&mut sleeper, Duration::from_millis(20)));
        bell.nudge();
        assert!(bell.wait_blocking(&mut sleeper, Duration::from_secs(5)));
        let counts = bell.counts();
        assert_eq!((counts.rung, counts.nudged, counts.parked), (0, 1, 2));
    }

    #[test]
    fn a_ring_wakes_an_owner_that_raised_its_flag() {
        let (bell, socket) = Doorbell::new().unwrap();
        let mut sleeper = Sleeper::new(socket);
        bell.prepare_sleep();
        bell.ring();
        assert!(bell.wait_blocking(&mut sleeper, Duration::from_secs(5)));
        // One byte, one wake-up: the next wait finds none.
        assert!(!bell.wait_blocking(&mut sleeper, Duration::from_millis(20)));
        assert_eq!(bell.counts().rung, 1);
    }
}
