//! The SPSC frame ring alone (`src/ring/`): frames of 64 and 256 payload bytes, from a payload
//! buffer into the mapped ring and out again as borrowed slices.
//!
//! - `single_thread/…`: one thread pushes a batch of 256 frames, commits, then reads the batch.
//!   `push_commit` times only the pushes and the commit, `read_batch` only the read (the other
//!   half runs untimed in the same iteration), `round_trip` both.
//! - `two_threads/…`: a producer thread pushes frames (committing every 64 and whenever the ring
//!   is full) while the bench thread reads them as they come, for `iters × 256` frames per sample;
//!   the time runs from the producer's start to the consumer's last frame. Neither side blocks:
//!   an empty or full side yields (`std::thread::yield_now`), as a shard would go back to its
//!   event loop (CRATES.md: shards must not block on a queue).
//!
//! The consumer touches each payload's first byte and length. Baselines in the same run, over the
//! same payloads: a `crossbeam-channel` bounded channel of `Vec<u8>` (`try_send` / `try_recv`,
//! a `Vec` allocated per frame by the producer and freed by the consumer, as an owned message
//! must be) and `std::sync::mpsc::sync_channel` the same way. The two-thread channels hold as
//! many messages as the ring holds frames (64 KiB of frames); the single-thread ones hold a batch.
//!
//! `single_thread/crc32c_only` is the frame checksum alone (`crc32c` of each payload, which
//! [`Producer::push`] computes for every frame of a checksummed ring): the part of `push_commit`
//! that is not copying. `…/ring_no_crc/…` is the same ring made with [`Checksums::Off`], as the
//! shard runtime makes its rings (nothing recovers them).
//!
//! `two_threads/ring_give_back/…` is a 1 MiB ring without crc on `/dev/shm` (as `braid run`
//! makes them) whose producer keeps to its first eighth while the consumer keeps up and gives
//! back the pages of the rest ([`Producer::give_back_pages`]), beside `two_threads/ring_no_crc_shm`,
//! the same ring without: what the early wraps and the occasional excursion cost at full speed.
//!
//! `wake_up/…`: what waking a sleeping thread costs, the work that [`Doorbell`]s do when an
//! owner sleeps: two threads take turns, each blocked in a read until the other writes, over the
//! doorbell's kind of wire (`socket_pair`, a Unix stream pair, the only one a shard's monoio
//! runtime can wait on under both its drivers, DESIGN.md "Hard facts") and, for comparison, a
//! pipe and an eventfd. One element is one round trip: two wake-ups.
//!
//! Throughput is declared as frames (elements) and payload bytes.
//!
//! [`Doorbell`]: braid::shard::wake::Doorbell

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::mpsc::{self, TrySendError};
use std::thread;
use std::time::{Duration, Instant};

use braid::ring::{Checksums, Consumer, FRAME_HEADER, FrameKind, Producer, PushError, Ring};
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main, measurement::WallTime};

const PAYLOADS: [usize; 2] = [64, 256];
/// Frames per iteration.
const BATCH: usize = 256;
/// Frames between two commits of the two-thread producer.
const COMMIT_EVERY: usize = 64;
const SINGLE_RING: usize = 256 << 10;
const TWO_THREAD_RING: usize = 64 << 10;
/// The shard runtime's ring size (`FEED_RING_BYTES`), for the give-back pair.
const SHARD_RING: usize = 1 << 20;

#[allow(clippy::disallowed_methods, reason = "a bench times itself (iter_custom)")]
fn now() -> Instant {
    Instant::now()
}

/// The producer side of a queue under test.
trait Tx: Send + 'static {
    /// Appends one frame, waiting (yielding) while the queue is full.
    fn send(&mut self, payload: &[u8]);
    /// Makes everything sent visible (the ring's commit).
    fn flush(&mut self) {}
}

/// The consumer side: visits every frame available now; returns how many.
trait Rx {
    fn drain(&mut self, sum: &mut u64) -> usize;
}

impl Tx for Producer {
    fn send(&mut self, payload: &[u8]) {
        loop {
            match self.push(FrameKind::Row, payload) {
                Ok(()) => return,
                Err(PushError::Full) => {
                    self.commit();
                    thread::yield_now();
                }
                Err(PushError::TooLarge) => panic!("payload of {} bytes does not fit", payload.len()),
                Err(PushError::NoSpace(errno)) => panic!("the ring gives back no pages here ({errno})"),
            }
        }
    }

    fn flush(&mut self) {
        self.commit();
    }
}

impl Rx for Consumer {
    fn drain(&mut self, sum: &mut u64) -> usize {
        self.read_batch(|f| *sum += u64::from(f.payload[0]) + f.payload.len() as u64)
    }
}

impl Tx for crossbeam_channel::Sender<Vec<u8>> {
    fn send(&mut self, payload: &[u8]) {
        let mut message = payload.to_vec();
        loop {
            match self.try_send(message) {
                Ok(()) => return,
                Err(crossbeam_channel::TrySendError::Full(m)) => {
                    message = m;
                    thread::yield_now();
                }
                Err(crossbeam_channel::TrySendError::Disconnected(_)) => panic!("receiver gone"),
            }
        }
    }
}

impl Rx for crossbeam_channel::Receiver<Vec<u8>> {
    fn drain(&mut self, sum: &mut u64) -> usize {
        let mut n = 0;
        while let Ok(m) = self.try_recv() {
            *sum += u64::from(m[0]) + m.len() as u64;
            n += 1;
        }
        n
    }
}

impl Tx for mpsc::SyncSender<Vec<u8>> {
    fn send(&mut self, payload: &[u8]) {
        let mut message = payload.to_vec();
        loop {
            match self.try_send(message) {
                Ok(()) => return,
                Err(TrySendError::Full(m)) => {
                    message = m;
                    thread::yield_now();
                }
                Err(TrySendError::Disconnected(_)) => panic!("receiver gone"),
            }
        }
    }
}

impl Rx for mpsc::Receiver<Vec<u8>> {
    fn drain(&mut self, sum: &mut u64) -> usize {
        let mut n = 0;
        while let Ok(m) = self.try_recv() {
            *sum += u64::from(m[0]) + m.len() as u64;
            n += 1;
        }
        n
    }
}

fn ring(dir: &Path, name: &str, capacity: usize) -> (Producer, Consumer) {
    Ring::create(&dir.join(name), capacity).unwrap()
}

fn ring_no_crc(dir: &Path, name: &str, capacity: usize) -> (Producer, Consumer) {
    Ring::create_with(&dir.join(name), capacity, Checksums::Off).unwrap()
}

/// How many frames of `payload` bytes fill a ring of `capacity` bytes.
fn frames_in(capacity: usize, payload: usize) -> usize {
    capacity / (FRAME_HEADER + payload.next_multiple_of(FRAME_HEADER))
}

fn send_batch(tx: &mut impl Tx, payload: &[u8]) {
    for _ in 0..BATCH {
        tx.send(payload);
    }
    tx.flush();
}

fn drain_batch(rx: &mut impl Rx) -> u64 {
    let mut sum = 0;
    let mut got = 0;
    while got < BATCH {
        got += rx.drain(&mut sum);
    }
    sum
}

/// `push_commit`, `read_batch` and `round_trip` of one queue, single-threaded.
fn single_thread(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    payload: &[u8],
    tx: &mut impl Tx,
    rx: &mut impl Rx,
) {
    let size = payload.len();
    group.bench_function(format!("push_commit/{name}/{size}"), |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let start = now();
                send_batch(tx, black_box(payload));
                timed += start.elapsed();
                black_box(drain_batch(rx));
            }
            timed
        })
    });
    group.bench_function(format!("read_batch/{name}/{size}"), |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                send_batch(tx, black_box(payload));
                let start = now();
                black_box(drain_batch(rx));
                timed += start.elapsed();
            }
            timed
        })
    });
    group.bench_function(format!("round_trip/{name}/{size}"), |b| {
        b.iter(|| {
            send_batch(tx, black_box(payload));
            black_box(drain_batch(rx))
        })
    });
}

/// A producer thread and a consumer (this thread) moving `iters × BATCH` frames.
fn two_threads<T: Tx, R: Rx>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    payload: &[u8],
    make: impl Fn() -> (T, R),
) {
    group.bench_function(format!("{name}/{}", payload.len()), |b| {
        b.iter_custom(|iters| {
            let frames = iters as usize * BATCH;
            let (mut tx, mut rx) = make();
            let payload = payload.to_vec();
            let start = now();
            let producer = thread::spawn(move || {
                for i in 1..=frames {
                    tx.send(black_box(&payload));
                    if i % COMMIT_EVERY == 0 {
                        tx.flush();
                    }
                }
                tx.flush();
            });
            let (mut got, mut sum) = (0, 0);
            while got < frames {
                match rx.drain(&mut sum) {
                    0 => thread::yield_now(),
                    n => got += n,
                }
            }
            let elapsed = start.elapsed();
            black_box(sum);
            producer.join().unwrap();
            elapsed
        })
    });
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    for size in PAYLOADS {
        let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let throughput = Throughput::ElementsAndBytes { elements: BATCH as u64, bytes: (BATCH * size) as u64 };

        let mut group = c.benchmark_group("single_thread");
        group.throughput(throughput.clone());
        let (mut p, mut r) = ring(dir.path(), "single", SINGLE_RING);
        single_thread(&mut group, "ring", &payload, &mut p, &mut r);
        let (mut p, mut r) = ring_no_crc(dir.path(), "single_no_crc", SINGLE_RING);
        single_thread(&mut group, "ring_no_crc", &payload, &mut p, &mut r);
        let (mut s, mut r) = crossbeam_channel::bounded(BATCH);
        single_thread(&mut group, "crossbeam", &payload, &mut s, &mut r);
        let (mut s, mut r) = mpsc::sync_channel(BATCH);
        single_thread(&mut group, "std_mpsc", &payload, &mut s, &mut r);
        group.bench_function(format!("crc32c_only/{size}"), |b| {
            b.iter(|| (0..BATCH).fold(0, |acc, _| acc ^ crc32c::crc32c(black_box(&payload))))
        });
        group.finish();

        let mut group = c.benchmark_group("two_threads");
        group.throughput(throughput);
        let messages = frames_in(TWO_THREAD_RING, size);
        two_threads(&mut group, "ring", &payload, || ring(dir.path(), "two", TWO_THREAD_RING));
        two_threads(&mut group, "ring_no_crc", &payload, || ring_no_crc(dir.path(), "two_no_crc", TWO_THREAD_RING));
        let shm = tempfile::tempdir_in(braid::storage::mapped_file::scratch_base()).unwrap();
        two_threads(&mut group, "ring_no_crc_shm", &payload, || ring_no_crc(shm.path(), "shm", SHARD_RING));
        two_threads(&mut group, "ring_give_back", &payload, || {
            let (mut p, c) = ring_no_crc(shm.path(), "give_back", SHARD_RING);
            p.give_back_pages(SHARD_RING / 16).unwrap();
            (p, c)
        });
        two_threads(&mut group, "crossbeam", &payload, || crossbeam_channel::bounded(messages));
        two_threads(&mut group, "std_mpsc", &payload, || mpsc::sync_channel(messages));
        group.finish();
    }
}

/// One end of a wire a thread sleeps on until the other end writes.
trait Wire: Send + 'static {
    /// Blocks until the other end wrote, and takes what it wrote.
    fn wait(&mut self);
    fn wake_other(&mut self);
}

/// Each end reads its own stream and writes the other's.
struct Pair<R, W>(R, W);

impl<R: Read + Send + 'static, W: Write + Send + 'static> Wire for Pair<R, W> {
    fn wait(&mut self) {
        // 8 bytes: what an eventfd reads at once; the others read the 8 written.
        let mut counter = [0u8; 8];
        self.0.read_exact(&mut counter).unwrap();
    }

    fn wake_other(&mut self) {
        self.1.write_all(&1u64.to_ne_bytes()).unwrap();
    }
}

fn socket_pairs() -> (impl Wire, impl Wire) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let (c, d) = std::os::unix::net::UnixStream::pair().unwrap();
    (Pair(a, d), Pair(c, b))
}

fn pipes() -> (impl Wire, impl Wire) {
    let (a_reads, b_writes) = std::io::pipe().unwrap();
    let (b_reads, a_writes) = std::io::pipe().unwrap();
    (Pair(a_reads, a_writes), Pair(b_reads, b_writes))
}

fn eventfd() -> std::fs::File {
    use std::os::fd::FromRawFd;
    // Blocking, so a read sleeps until a write makes the counter non-zero.
    // SAFETY: a system call with no pointers; its result is checked below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a descriptor eventfd just opened, owned by nothing else.
    unsafe { std::fs::File::from_raw_fd(fd) }
}

fn eventfds() -> (impl Wire, impl Wire) {
    let (a, b) = (eventfd(), eventfd());
    let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
    (Pair(a, b), Pair(b2, a2))
}

/// `iters` round trips between this thread and one it starts, each sleeping until woken.
fn wake_up<A: Wire, B: Wire>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, make: impl Fn() -> (A, B)) {
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let (mut mine, mut theirs) = make();
            let other = thread::spawn(move || {
                for _ in 0..iters {
                    theirs.wait();
                    theirs.wake_other();
                }
            });
            let start = now();
            for _ in 0..iters {
                mine.wake_other();
                mine.wait();
            }
            let elapsed = start.elapsed();
            other.join().unwrap();
            elapsed
        })
    });
}

fn bench_wake_up(c: &mut Criterion) {
    let mut group = c.benchmark_group("wake_up");
    group.throughput(Throughput::Elements(1));
    wake_up(&mut group, "socket_pair", socket_pairs);
    wake_up(&mut group, "pipe", pipes);
    wake_up(&mut group, "eventfd", eventfds);
    group.finish();
}

criterion_group!(benches, bench, bench_wake_up);
criterion_main!(benches);
