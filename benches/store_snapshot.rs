//! What a checkpoint costs a shard per stored row (issue 13; BENCHMARKS.md "A shard's checkpoint
//! with fewer passes over its state"): a scratch [`ArenaStore`] holding the gateway join's rows of
//! 50 000 devices, serialized as a snapshot ([`StoreView`]) into a checkpoint buffer, as a shard
//! does when a barrier passes its interval join.
//!
//! `snapshot/arena/N`: N rows over up to 50 000 keys, in arrival order, as the join stored them;
//! `copy/N`: the same bytes copied in one `extend_from_slice` (the floor: what a snapshot would
//! cost were it only its bytes), in the same run. Throughput is in rows.
//!
//! `cargo bench --bench store_snapshot`

#![allow(clippy::unwrap_used)]

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use braid::state::KeyedStore;
use braid::state::arena::{ArenaConfig, ArenaStore};
use braid::state::snapshot::{SnapshotBuffer, StoreView};

const DEVICES: usize = 50_000;
const SIZES: [usize; 2] = [20_000, 100_000];

fn filled(n: usize) -> (ArenaStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = ArenaStore::open_with(dir.path(), ArenaConfig::scratch()).unwrap();
    for (_, row) in common::join::rows(DEVICES, 8).into_iter().take(n) {
        store.insert(row, false);
    }
    assert_eq!(store.rows(), n, "the generator gives fewer rows than asked");
    (store, dir)
}

fn snapshot(c: &mut Criterion) {
    let mut group = c.benchmark_group("store_snapshot");
    group.sample_size(20);
    for n in SIZES {
        let (store, _dir) = filled(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(format!("snapshot/arena/{n}"), |b| {
            b.iter(|| {
                let mut buffer = SnapshotBuffer::with_header(32);
                let view = StoreView::of(&store).unwrap();
                buffer.write(&view).unwrap().len
            })
        });
        let bytes = {
            let mut buffer = SnapshotBuffer::with_header(32);
            let level = buffer.write(&StoreView::of(&store).unwrap()).unwrap();
            buffer.bytes(level).to_vec()
        };
        group.bench_function(format!("copy/{n}"), |b| {
            b.iter(|| {
                let mut copy = Vec::new();
                copy.extend_from_slice(&bytes);
                copy.len()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, snapshot);
criterion_main!(benches);
