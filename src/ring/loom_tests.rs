//! Loom model of the ring's publication protocol (module doc "Publication").
//!
//! Run with `RUSTFLAGS="--cfg braid_loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib
//! ring::loom`. Loom runs every interleaving of the producer's and the consumer's atomic
//! operations, up to `LOOM_MAX_PREEMPTIONS` forced thread switches, and lets each Acquire or
//! Relaxed load return any value the memory model allows. The bound is [`PREEMPTIONS`] (3)
//! unless the variable says otherwise: 1 300 + 3 537 executions in 0.3 s on the 2-vCPU machine;
//! `LOOM_MAX_PREEMPTIONS=100` (no bound in effect) explores all 38 524 + 245 546 in about 20 s.
//! The frame bytes are tracked per 16-byte block (`sync.rs`), so a frame read before its bytes
//! are ordered after the producer's writes, or overwritten before the consumer's reads are
//! ordered before the overwrite, fails the model with "Causality violation". Weakening the tail
//! store in `commit` or the head load in `push` to Relaxed makes both tests fail that way.

use loom::thread;

use super::*;

/// 128 bytes: a 48-byte and a 64-byte frame, then a wrap marker, so the third and fourth frames
/// land at the start again and must wait for the consumer to release the first two.
const CAPACITY: usize = 128;

/// Forced thread switches per execution unless `LOOM_MAX_PREEMPTIONS` says otherwise.
const PREEMPTIONS: usize = 3;

/// Kinds and payload lengths: frames of 48, 64, 32 (after a 16-byte wrap) and 64 bytes.
const FRAMES: [(FrameKind, usize); 4] =
    [(FrameKind::Row, 20), (FrameKind::Tick, 40), (FrameKind::Idle, 8), (FrameKind::EndOfInput, 33)];

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 64 + j) as u8).collect()
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(PREEMPTIONS);
    }
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = executions.clone();
    builder.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f()
    });
    eprintln!(
        "loom: {} executions, preemption bound {:?}",
        executions.load(std::sync::atomic::Ordering::Relaxed),
        builder.preemption_bound
    );
}

/// Pushes every frame, committing after the second and the last and whenever the ring is full.
fn produce(mut p: Producer) {
    for (i, &(kind, len)) in FRAMES.iter().enumerate() {
        let bytes = payload(i, len);
        loop {
            match p.push(kind, &bytes) {
                Ok(()) => break,
                Err(PushError::Full) => {
                    p.commit();
                    thread::yield_now();
                }
                Err(PushError::TooLarge) => panic!("frame {i} cannot fit a {CAPACITY}-byte ring"),
                Err(PushError::NoSpace(errno)) => panic!("heap bytes cannot run out ({errno})"),
            }
        }
        if i == 1 {
            p.commit();
        }
    }
    p.commit();
}

#[test]
fn frames_cross_threads_in_order_through_wraps_and_a_full_ring() {
    model(|| cross_threads(None));
}

/// The same with the producer giving back chunks of 32 bytes (module doc "Giving pages back"):
/// a hole punched where the consumer may still read is a causality violation, and one punched
/// where a frame still waits reads back as zeros.
#[test]
fn frames_cross_threads_in_order_while_the_producer_gives_pages_back() {
    model(|| cross_threads(Some(32)));
}

fn cross_threads(give_back: Option<usize>) {
    let (mut p, mut c) = Ring::in_memory(CAPACITY);
    if let Some(chunk) = give_back {
        p.give_back_pages(chunk).unwrap();
    }
    let producer = thread::spawn(move || produce(p));
    let mut got = Vec::new();
    while got.len() < FRAMES.len() {
        c.read_batch(|f| got.push((f.kind, f.payload.to_vec())));
        if got.len() < FRAMES.len() {
            thread::yield_now();
        }
    }
    producer.join().unwrap();
    let want: Vec<_> = FRAMES.iter().enumerate().map(|(i, &(kind, len))| (kind, payload(i, len))).collect();
    assert_eq!(got, want);
    assert!(!c.has_frames());
}

#[test]
fn a_frame_exactly_filling_the_end_is_read_after_the_wrap() {
    // 64 bytes: frames of 32, 32 (exactly to the end, no wrap marker), then 32 at position 0.
    model(|| {
        let (mut p, mut c) = Ring::in_memory(64);
        let producer = thread::spawn(move || {
            for i in 0..3 {
                while p.push(FrameKind::Row, &payload(i, 16)).is_err() {
                    p.commit();
                    thread::yield_now();
                }
                p.commit();
            }
            p
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            c.read_batch(|f| got.push(f.payload.to_vec()));
            if got.len() < 3 {
                thread::yield_now();
            }
        }
        let p = producer.join().unwrap();
        assert_eq!(got, (0..3).map(|i| payload(i, 16)).collect::<Vec<_>>());
        assert_eq!(p.used_bytes(), 0);
    });
}

/// "Asking for room" (module doc): a producer that finds the ring full raises the flag, tries
/// once more, and only then sleeps until the consumer wakes it; the consumer wakes it only when
/// the flag is up after a read that released frames. A lost wake-up leaves the producer asleep
/// with the ring full and the consumer waiting for frames that never come: loom reports the spin
/// that never ends. Weakening either swap (in `want_room` or `room_wanted`) to a Relaxed one, or
/// the producer's to a plain store, lets that happen.
#[test]
fn a_producer_waiting_for_room_is_always_woken() {
    model(|| {
        // 64 bytes: two 32-byte frames fill it; the third must wait for a release.
        let (mut p, mut c) = Ring::in_memory(64);
        let bell = std::sync::Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let rung = bell.clone();
        let producer = thread::spawn(move || {
            for i in 0..3 {
                let bytes = payload(i, 16);
                while p.push(FrameKind::Row, &bytes).is_err() {
                    p.commit();
                    p.want_room();
                    if p.push(FrameKind::Row, &bytes).is_ok() {
                        break;
                    }
                    // Asleep until rung (the doorbell's own Dekker pair is not modelled here).
                    while !rung.load(Ordering::Acquire) {
                        thread::yield_now();
                    }
                    rung.store(false, Ordering::Relaxed);
                }
            }
            p.commit();
        });
        let mut got = 0;
        while got < 3 {
            let frames = c.read_batch(|_| {});
            got += frames;
            if frames > 0 && c.room_wanted() {
                bell.store(true, Ordering::Release);
            }
            if got < 3 {
                thread::yield_now();
            }
        }
        producer.join().unwrap();
    });
}
