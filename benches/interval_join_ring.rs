//! The interval join over rkyv row frames read from a pre-filled ring, one thread.
//!
//! Workload: the gateway join of benches/interval_join.rs, the same rows and the same driver
//! (`benches/common/join.rs`; BENCHMARKS.md "interval_join"): `command` ⋈ `status` on `device`,
//! [−3 s, +5 s], inner, rows in event-time order, a watermark `tick − 501 ms` at every 200 ms
//! event-time tick.
//!
//! Setup (not timed) archives every row ([`frame::RowEncoder`]) once; before each iteration it
//! pushes those payloads into an empty ring in a tempdir and commits them, so the ring holds the
//! whole workload. The ring carries no stream tag yet, so which input a frame belongs to comes
//! from a side vector of one byte per frame, read in step with the frames.
//!
//! - `ring_join`: `read_batch` over the ring; per frame `access_unchecked`, the tick check on the
//!   archived `ts`, `to_row`, `IntervalJoin::on_row`; output counted and cleared as in
//!   benches/interval_join.rs.
//! - `ring_join_in_place`: the shard's path — per frame `IntervalJoin::on_frame`, which matches
//!   the archived row against stored rows read in place and stores its archive bytes as they are,
//!   with the join's state in scratch mmap arenas (a fresh tempdir per iteration, untimed), as on
//!   a shard.
//! - `vec_join` (baseline i): the same operator over pre-built `Row`s from a `Vec` — what
//!   benches/interval_join.rs `inner` measures.
//! - `ring_read_access` (baseline ii): `read_batch` + `access_unchecked`, reading `ts`,
//!   `key_hash` and the number of values of each frame; no operator.
//! - `ring_read_access_checked`: the same with validating `access` (the recovery path).
//! - `ring_read_to_row`: `read_batch` + `access_unchecked` + `to_row` (rows dropped): the price of
//!   handing operators heap rows.
//! - `encode`: `Row` → frame bytes (`RowEncoder::encode`) only.
//! - `encode_push`: `Row` → frame bytes → `Producer::push`, `commit` every 256 frames (the ring
//!   is drained, untimed, before each iteration).

#![allow(clippy::unwrap_used)]

mod common;

use std::hint::black_box;
use std::ops::Range;
use std::time::Duration;

use braid::operator::interval_join::{IntervalJoin, JoinType};
use braid::record::Row;
use braid::record::frame::{self, RowEncoder};
use braid::ring::{Consumer, FRAME_HEADER, FrameKind, Producer, Ring};
use braid::state::arena::{ArenaConfig, ArenaStore};
use common::join::{Driver, Total};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

/// Frames pushed between two commits in `encode_push`.
const COMMIT_EVERY: usize = 256;

/// The workload archived once: payloads back to back, their spans, and each frame's input.
struct Frames {
    bytes: Vec<u8>,
    spans: Vec<Range<usize>>,
    inputs: Vec<u8>,
}

impl Frames {
    fn new(rows: &[(usize, Row)]) -> Frames {
        let mut enc = RowEncoder::new();
        let mut frames = Frames { bytes: Vec::new(), spans: Vec::new(), inputs: Vec::new() };
        for (input, row) in rows {
            let payload = enc.encode(row).unwrap();
            let start = frames.bytes.len();
            frames.bytes.extend_from_slice(payload);
            frames.spans.push(start..frames.bytes.len());
            frames.inputs.push(*input as u8);
        }
        frames
    }

    /// Ring bytes the frames take (header + payload padded to 16).
    fn ring_bytes(&self) -> usize {
        self.spans.iter().map(|s| FRAME_HEADER + s.len().next_multiple_of(FRAME_HEADER)).sum()
    }

    /// Pushes every frame into `producer`'s (empty) ring and commits.
    fn fill(&self, producer: &mut Producer) {
        for span in &self.spans {
            producer.push(FrameKind::Row, &self.bytes[span.clone()]).unwrap();
        }
        producer.commit();
    }
}

fn ring_join(consumer: &mut Consumer, inputs: &[u8]) -> u64 {
    let mut driver = Driver::new(JoinType::Inner, Total::default());
    let mut i = 0;
    consumer.read_batch(|f| {
        // SAFETY: every frame in this ring was pushed by this process from `RowEncoder::encode`.
        let archived = unsafe { frame::access_unchecked(f.payload) };
        driver.before(archived.ts.to_native());
        driver.on_row(usize::from(inputs[i]), frame::to_row(archived));
        i += 1;
    });
    driver.finish().0
}

fn ring_join_in_place(consumer: &mut Consumer, inputs: &[u8], state: &std::path::Path) -> u64 {
    let spec = common::join::gateway_join(JoinType::Inner).spec().clone();
    let left = ArenaStore::open_with(&state.join("left"), ArenaConfig::scratch()).unwrap();
    let right = ArenaStore::open_with(&state.join("right"), ArenaConfig::scratch()).unwrap();
    let op = IntervalJoin::with_state(spec, [Box::new(left), Box::new(right)]);
    let mut driver = Driver::new(JoinType::Inner, Total::default()).with_op(op);
    let mut i = 0;
    consumer.read_batch(|f| {
        // SAFETY: every frame in this ring was pushed by this process from `RowEncoder::encode`.
        let archived = unsafe { frame::access_unchecked(f.payload) };
        driver.before(archived.ts.to_native());
        driver.on_frame(usize::from(inputs[i]), archived, f.payload);
        i += 1;
    });
    driver.finish().0
}

fn vec_join(rows: Vec<(usize, Row)>) -> u64 {
    Driver::run(JoinType::Inner, Total::default(), rows).0
}

fn bench_keys(c: &mut Criterion, devices: usize, seconds: i64) {
    let rows = common::join::rows(devices, seconds);
    let frames = Frames::new(&rows);
    let n = rows.len();
    let capacity = (frames.ring_bytes() + 64 * 1024).next_multiple_of(FRAME_HEADER);
    let dir = tempfile::tempdir().unwrap();
    let (mut producer, mut consumer) = Ring::create(&dir.path().join("ring"), capacity).unwrap();

    // Check once that both paths see the same results.
    let expected = vec_join(rows.clone());
    frames.fill(&mut producer);
    assert_eq!(ring_join(&mut consumer, &frames.inputs), expected);
    frames.fill(&mut producer);
    let state = tempfile::tempdir_in(braid::storage::mapped_file::scratch_base()).unwrap();
    assert_eq!(ring_join_in_place(&mut consumer, &frames.inputs, state.path()), expected);
    eprintln!(
        "workload {devices} keys, {seconds} s: {n} rows, {expected} results; payloads {} B ({:.0} B/row), ring {} B \
         ({:.0} B/row)",
        frames.bytes.len(),
        frames.bytes.len() as f64 / n as f64,
        frames.ring_bytes(),
        frames.ring_bytes() as f64 / n as f64,
    );

    let mut group = c.benchmark_group(format!("interval_join_ring/{}k_keys", devices / 1000));
    group.throughput(Throughput::Elements(n as u64));
    group.sample_size(10);
    group.bench_function("ring_join", |b| {
        b.iter_batched(
            || frames.fill(&mut producer),
            |()| black_box(ring_join(&mut consumer, &frames.inputs)),
            BatchSize::PerIteration,
        )
    });
    group.bench_function("ring_join_in_place", |b| {
        b.iter_batched(
            || {
                frames.fill(&mut producer);
                tempfile::tempdir_in(braid::storage::mapped_file::scratch_base()).unwrap()
            },
            |state| black_box(ring_join_in_place(&mut consumer, &frames.inputs, state.path())),
            BatchSize::PerIteration,
        )
    });
    group.bench_function("vec_join", |b| {
        b.iter_batched(|| rows.clone(), |rows| black_box(vec_join(rows)), BatchSize::LargeInput)
    });
    group.bench_function("ring_read_access", |b| {
        b.iter_batched(
            || frames.fill(&mut producer),
            |()| {
                let mut sum = 0u64;
                consumer.read_batch(|f| {
                    // SAFETY: every frame in this ring was pushed by this process from `RowEncoder::encode`.
                    let a = unsafe { frame::access_unchecked(f.payload) };
                    sum = sum.wrapping_add(a.ts.to_native() as u64 ^ a.key_hash.to_native()) + a.values.len() as u64;
                });
                black_box(sum)
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("ring_read_access_checked", |b| {
        b.iter_batched(
            || frames.fill(&mut producer),
            |()| {
                let mut sum = 0u64;
                consumer.read_batch(|f| {
                    let a = frame::access(f.payload).unwrap();
                    sum = sum.wrapping_add(a.ts.to_native() as u64 ^ a.key_hash.to_native()) + a.values.len() as u64;
                });
                black_box(sum)
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("ring_read_to_row", |b| {
        b.iter_batched(
            || frames.fill(&mut producer),
            |()| {
                let mut sum = 0u64;
                consumer.read_batch(|f| {
                    // SAFETY: every frame in this ring was pushed by this process from `RowEncoder::encode`.
                    let row = frame::to_row(unsafe { frame::access_unchecked(f.payload) });
                    sum = sum.wrapping_add(row.id);
                });
                black_box(sum)
            },
            BatchSize::PerIteration,
        )
    });
    let mut enc = RowEncoder::new();
    group.bench_function("encode", |b| {
        b.iter(|| {
            let mut bytes = 0usize;
            for (_, row) in &rows {
                bytes += enc.encode(row).unwrap().len();
            }
            black_box(bytes)
        })
    });
    group.bench_function("encode_push", |b| {
        b.iter_batched(
            || consumer.read_batch(|_| ()),
            |_| {
                for (i, (_, row)) in rows.iter().enumerate() {
                    producer.push(FrameKind::Row, enc.encode(row).unwrap()).unwrap();
                    if i % COMMIT_EVERY == COMMIT_EVERY - 1 {
                        producer.commit();
                    }
                }
                producer.commit();
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn interval_join_ring(c: &mut Criterion) {
    bench_keys(c, 1_000, 300);
    bench_keys(c, 10_000, 90);
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = interval_join_ring
}
criterion_main!(benches);
