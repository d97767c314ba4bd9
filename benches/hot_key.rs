//! Evicting a hot key (issue 13, item 4): a key's stored rows leave in arrival order, as an
//! interval join's timers remove them, and each removal must cost the same however many rows the
//! key still holds — evicting n rows of one key O(n), not O(n²) (the state index keeps a key's
//! rows in a deque; with a `Vec` every removal from the front shifted the rest).
//!
//! `hot_key/{arena,memory}/N`: N rows of one key inserted (untimed), then all discarded oldest
//! first (timed). Baseline in the same run, `spread/{arena,memory}/N`: N rows of N keys, one each,
//! discarded the same way. Throughput is in rows: a flat rate across N for `hot_key`, close to
//! `spread`'s, is the O(1) per row.
//!
//! `cargo bench --bench hot_key`

#![allow(clippy::unwrap_used)]

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

use braid::record::{Key, Row, Value, id::key_hash};
use braid::state::arena::ArenaStore;
use braid::state::{KeyedStore, MemoryStore, RowHandle};

const SIZES: [usize; 3] = [1_000, 10_000, 50_000];

fn row(key: &str, ts: i64) -> Row {
    let key = Key::Str(key.into());
    let key_hash = key_hash(&key);
    Row { ts, key, key_hash, id: ts as u64, values: Box::new([Value::Int(ts), Value::Str("on".into())]) }
}

/// A store holding `n` rows, of one key or of `n` keys, and their (key hash, handle) in arrival
/// order; the directory the arena lives in goes with it.
fn filled(arena: bool, n: usize, hot: bool) -> (Box<dyn KeyedStore>, Vec<(u64, RowHandle)>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut store: Box<dyn KeyedStore> =
        if arena { Box::new(ArenaStore::open(dir.path()).unwrap()) } else { Box::new(MemoryStore::default()) };
    let handles = (0..n)
        .map(|i| {
            let row = if hot { row("hot", i as i64) } else { row(&format!("k{i}"), i as i64) };
            let key_hash = row.key_hash;
            (key_hash, store.insert(row, false))
        })
        .collect();
    (store, handles, dir)
}

fn eviction(c: &mut Criterion) {
    for (name, hot) in [("hot_key", true), ("spread", false)] {
        let mut group = c.benchmark_group(name);
        group.sample_size(10);
        for arena in [true, false] {
            for n in SIZES {
                group.throughput(Throughput::Elements(n as u64));
                let id = format!("{}/{n}", if arena { "arena" } else { "memory" });
                group.bench_function(id, |b| {
                    b.iter_batched(
                        || filled(arena, n, hot),
                        |(mut store, handles, dir)| {
                            for (key_hash, handle) in handles {
                                store.discard(key_hash, handle);
                            }
                            (store, dir)
                        },
                        BatchSize::PerIteration,
                    );
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, eviction);
criterion_main!(benches);
