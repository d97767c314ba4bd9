use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::record::Value;
use crate::state::MemoryStore;

/// Small segments, so a few rows fill one and rollover and recycling happen often.
fn small() -> ArenaConfig {
    ArenaConfig { segment_bytes: 4096, spare_segments: 1, recoverable: true }
}

/// Keys 0..3 share one hash on purpose; 3 and 4 have their own.
const KEYS: usize = 5;
fn key(k: usize) -> (Key, u64) {
    match k {
        0 => (Key::Str("a".into()), 7),
        1 => (Key::Str("b".into()), 7),
        2 => (Key::Int(7), 7),
        3 => (Key::Str("dev-000003".into()), 9),
        _ => (Key::Broadcast, 0),
    }
}

fn row(k: usize, id: u64, text: usize) -> Row {
    let (key, key_hash) = key(k);
    let values = vec![Value::Str("x".repeat(text).into()), Value::Int(id as i64), Value::Float(0.5)];
    Row { ts: 1_700_000_000_000 + id as i64, key, key_hash, id, values: values.into() }
}

fn segment_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_str().is_some_and(|n| n.ends_with(".arena")))
        .count()
}

/// Every row of the store in index order: (key hash, [(handle, row, matched)]), by key hash.
type Snapshot = Vec<(u64, Vec<(RowHandle, Row, bool)>)>;
fn snapshot(store: &ArenaStore) -> Snapshot {
    let mut out: Snapshot = store
        .index
        .iter()
        .filter(|(_, entries)| !entries.is_empty()) // emptied keys wait for their next row
        .map(|(&hash, entries)| {
            let rows = entries
                .iter()
                .map(|e| {
                    let row = match &e.place {
                        Place::Memory { row, .. } => (**row).clone(),
                        &Place::Arena { slot, off, .. } => frame::to_row(store.segments.row(slot, off).unwrap()),
                    };
                    (e.handle, row, e.matched())
                })
                .collect();
            (hash, rows)
        })
        .collect();
    out.sort_by_key(|(hash, _)| *hash);
    out
}

/// What a snapshot lists from the index alone ([`KeyedStore::export_lens`]): (handle, matched
/// flag, archive length) of each row, in export order.
fn listed(store: &dyn KeyedStore) -> Vec<(RowHandle, bool, usize)> {
    let mut rows = Vec::new();
    store.export_lens(&mut |handle, matched, len| rows.push((handle, matched, len))).unwrap();
    rows
}

/// The same from the rows themselves ([`KeyedStore::export`]).
fn exported(store: &dyn KeyedStore) -> Vec<(RowHandle, bool, usize)> {
    let mut rows = Vec::new();
    store.export(&mut |handle, matched, archive| rows.push((handle, matched, archive.len()))).unwrap();
    rows
}

/// Scans every key of both stores, compares, then removes every row from both, comparing each
/// removed row and its matched flag.
fn drain_and_compare(arena: &mut ArenaStore, model: &mut MemoryStore) {
    for k in 0..KEYS {
        let (key, hash) = key(k);
        let (mut a, mut m) = (Vec::new(), Vec::new());
        arena.scan_handles(&key, hash, &mut |h, r| {
            a.push((h, r.clone()));
            true
        });
        model.scan_handles(&key, hash, &mut |h, r| {
            m.push((h, r.clone()));
            true
        });
        assert_eq!(a.iter().map(|p| &p.1).collect::<Vec<_>>(), m.iter().map(|p| &p.1).collect::<Vec<_>>());
        for ((ah, _), (mh, _)) in a.iter().zip(&m) {
            let (ar, mr) = (arena.remove(hash, *ah).unwrap(), model.remove(hash, *mh).unwrap());
            assert_eq!((ar.row, ar.matched), (mr.row, mr.matched));
        }
    }
    assert_eq!((arena.rows(), model.rows()), (0, 0));
    assert_eq!(arena.bytes(), 0);
}

#[derive(Clone, Debug)]
enum Op {
    Insert {
        key: usize,
        text: usize,
        matched: bool,
    },
    /// Visits a key's rows, marking those whose id is a multiple of `every`.
    Scan {
        key: usize,
        every: u64,
    },
    /// Visits a key's rows with handles, stopping after `stop`.
    ScanHandles {
        key: usize,
        stop: usize,
    },
    /// Removes (even picks) or discards (odd) a live row (or, for an index past the end, one
    /// already removed).
    Remove {
        pick: usize,
    },
    /// Drops the arena store without any flush and opens it again.
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let text = prop_oneof![8 => 0usize..200, 3 => 200usize..1500, 1 => Just(5000)];
    prop_oneof![
        5 => (0..KEYS, text, any::<bool>()).prop_map(|(key, text, matched)| Op::Insert { key, text, matched }),
        2 => (0..KEYS, 1u64..4).prop_map(|(key, every)| Op::Scan { key, every }),
        1 => (0..KEYS, 0usize..4).prop_map(|(key, stop)| Op::ScanHandles { key, stop }),
        3 => any::<usize>().prop_map(|pick| Op::Remove { pick }),
        1 => Just(Op::Reopen),
    ]
}

/// With `compact`, mostly-dead segments are compacted: only for scripts without `Reopen` (a
/// compacted store reopened from its files names moved rows by their new places; module doc).
fn run_against_model(ops: &[Op], compact: bool) {
    run_against_model_with(ops, compact, small());
}

fn run_against_model_with(ops: &[Op], compact: bool, config: ArenaConfig) {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), config).unwrap();
    arena.set_compaction(compact);
    let mut model = MemoryStore::default();
    // (model handle, arena handle, key hash) of live rows; removed ones kept to remove again.
    let mut live: Vec<(RowHandle, RowHandle, u64)> = Vec::new();
    let mut removed: Vec<(RowHandle, RowHandle, u64)> = Vec::new();
    let mut next_id = 0;
    for op in ops {
        match *op {
            Op::Insert { key, text, matched } => {
                let r = row(key, next_id, text);
                next_id += 1;
                let hash = r.key_hash;
                let ah = arena.insert(r.clone(), matched);
                let mh = model.insert(r, matched);
                assert!(live.iter().chain(&removed).all(|p| p.1 != ah), "handle {ah:#x} reused");
                live.push((mh, ah, hash));
            }
            Op::Scan { key: k, every } => {
                let (key, hash) = key(k);
                let (mut a, mut m) = (Vec::new(), Vec::new());
                arena.scan(&key, hash, &mut |r| {
                    a.push(r.to_row().into_owned());
                    r.id().is_multiple_of(every)
                });
                model.scan(&key, hash, &mut |r| {
                    m.push(r.to_row().into_owned());
                    r.id().is_multiple_of(every)
                });
                assert_eq!(a, m);
                assert!(a.iter().all(|r| r.key == key));
            }
            Op::ScanHandles { key: k, stop } => {
                let (key, hash) = key(k);
                let (mut a, mut m) = (Vec::new(), Vec::new());
                arena.scan_handles(&key, hash, &mut |h, r| {
                    a.push((h, r.clone()));
                    a.len() < stop
                });
                model.scan_handles(&key, hash, &mut |h, r| {
                    m.push((h, r.clone()));
                    m.len() < stop
                });
                assert_eq!(a.len(), m.len());
                for ((ah, ar), (mh, mr)) in a.iter().zip(&m) {
                    assert_eq!(ar, mr);
                    assert!(live.iter().any(|p| p.0 == *mh && p.1 == *ah), "handles correspond");
                }
            }
            Op::Remove { pick } => {
                let i = pick % (live.len() + 1);
                if i < live.len() {
                    let (mh, ah, hash) = live.remove(i);
                    if pick % 2 == 1 {
                        // Discarded: gone without being copied out, matched flag returned.
                        assert_eq!(arena.discard(hash, ah), model.discard(hash, mh));
                    } else {
                        let (ar, mr) = (arena.remove(hash, ah).unwrap(), model.remove(hash, mh).unwrap());
                        assert_eq!((ar.row, ar.matched), (mr.row, mr.matched));
                    }
                    removed.push((mh, ah, hash));
                } else if let Some(&(mh, ah, hash)) = removed.get(pick % (removed.len() + 1)) {
                    assert!(arena.remove(hash, ah).is_none() && model.remove(hash, mh).is_none());
                }
            }
            Op::Reopen => {
                let unsaved = arena.unsaved_rows();
                drop(arena);
                arena = ArenaStore::open_with(dir.path(), small()).unwrap();
                arena.set_compaction(compact);
                assert_eq!(arena.recovery().damaged_records + arena.recovery().damaged_segments, 0);
                // Rows kept in memory (larger than a segment) do not survive, as documented.
                let lost: Vec<_> = live.iter().filter(|p| p.1 & MEMORY_HANDLE != 0).copied().collect();
                assert_eq!(lost.len(), unsaved);
                for (mh, _, hash) in lost {
                    model.remove(hash, mh).unwrap();
                }
                live.retain(|p| p.1 & MEMORY_HANDLE == 0);
                // Their handles die with them: memory handles are unique only until a reopen.
                removed.retain(|p| p.1 & MEMORY_HANDLE == 0);
            }
        }
        assert_eq!(arena.rows(), model.rows());
        assert_eq!(arena.bytes() == 0, arena.rows() == 0);
        assert_eq!(listed(&arena), exported(&arena));
    }
    drain_and_compare(&mut arena, &mut model);
    assert!(segment_files(dir.path()) <= 2, "only the active segment and one spare are left");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn behaves_like_the_memory_store(ops in proptest::collection::vec(op(), 1..80)) {
        run_against_model(&ops, false);
    }

    #[test]
    fn compacting_behaves_like_the_memory_store(ops in proptest::collection::vec(op(), 1..80)) {
        let ops: Vec<Op> = ops.into_iter().filter(|op| !matches!(op, Op::Reopen)).collect();
        run_against_model(&ops, true);
    }

    #[test]
    fn a_scratch_store_behaves_like_the_memory_store(ops in proptest::collection::vec(op(), 1..80)) {
        let ops: Vec<Op> = ops.into_iter().filter(|op| !matches!(op, Op::Reopen)).collect();
        run_against_model_with(&ops, true, ArenaConfig { recoverable: false, ..small() });
    }
}

/// A scratch store's records carry no crc, its files a magic of their own that a recovering open
/// refuses, and opening it again starts empty, its old files gone.
#[test]
fn a_scratch_store_writes_no_crc_and_is_never_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = || ArenaConfig { recoverable: false, ..small() };
    let mut arena = ArenaStore::open_with(dir.path(), scratch()).unwrap();
    scripted(&mut arena);
    assert!(arena.rows() > 0);
    drop(arena);
    let files = segment_files(dir.path());
    assert!(files > 3, "the script spans several segments");
    let first = std::fs::read(dir.path().join("seg-000001.arena")).unwrap();
    assert_eq!(&first[..8], b"braidars", "its own magic");
    let data = &first[HEADER_LEN..];
    assert_ne!(u32::from_le_bytes(data[SEGMENT_HEADER..SEGMENT_HEADER + 4].try_into().unwrap()), 0, "a record");
    assert_eq!(&data[SEGMENT_HEADER + 4..SEGMENT_HEADER + 8], &[0; 4], "no crc");

    assert!(ArenaStore::open_with(dir.path(), small()).is_err(), "a recovering open refuses scratch files");
    let arena = ArenaStore::open_with(dir.path(), scratch()).unwrap();
    assert_eq!(arena.rows(), 0);
    assert_eq!(segment_files(dir.path()), 1, "the old files deleted, one new segment");
}

/// Inserts, marks and removes rows of every key (the same on any store); rows of ~300 bytes, so
/// small segments roll over.
fn scripted(store: &mut dyn KeyedStore) {
    let mut handles = Vec::new();
    for id in 0..60 {
        let r = row(id as usize % KEYS, id, 250);
        handles.push((r.key_hash, store.insert(r, id % 7 == 0)));
    }
    for k in 0..KEYS {
        let (key, hash) = key(k);
        store.scan(&key, hash, &mut |r| r.id() % 3 == 0);
    }
    for (i, (hash, handle)) in handles.into_iter().enumerate() {
        if i % 4 == 1 {
            store.remove(hash, handle).unwrap();
        }
    }
}

#[test]
fn reopen_restores_rows_keys_handles_and_matched_flags() {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    scripted(&mut arena);
    let (before, rows, bytes, high) = (snapshot(&arena), arena.rows(), arena.bytes(), arena.high_water());
    assert!(segment_files(dir.path()) > 3, "the script spans several segments");
    drop(arena); // no flush, no sync: only the page cache holds the state

    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    assert_eq!(snapshot(&arena), before);
    assert_eq!((arena.rows(), arena.bytes(), arena.high_water()), (rows, bytes, high));
    let recovery = arena.recovery().clone();
    assert_eq!((recovery.rows, recovery.damaged_records, recovery.damaged_segments), (rows, 0, 0));

    // It goes on where it stopped: new rows get new handles, and the whole matches the model.
    let mut model = MemoryStore::default();
    scripted(&mut model);
    let extra = row(0, 1000, 10);
    let handle = arena.insert(extra.clone(), true);
    model.insert(extra, true);
    assert!(before.iter().flat_map(|(_, rows)| rows).all(|(h, _, _)| *h != handle));
    assert!(arena.high_water() > high);
    drain_and_compare(&mut arena, &mut model);
}

/// Data offset of each record of the first segment file, with its row.
fn first_records(dir: &Path) -> (std::path::PathBuf, Vec<(usize, Row)>) {
    let arena = ArenaStore::open_with(dir, small()).unwrap();
    let mut records: Vec<(usize, Row)> = snapshot(&arena)
        .into_iter()
        .flat_map(|(_, rows)| rows)
        .filter(|(h, _, _)| h >> 32 == 1)
        .map(|(h, r, _)| ((h & 0xffff_ffff) as usize, r))
        .collect();
    records.sort_by_key(|(off, _)| *off);
    (dir.join(file_name(1)), records)
}

fn rows_of(arena: &ArenaStore) -> Vec<Row> {
    let mut rows: Vec<Row> = snapshot(arena).into_iter().flat_map(|(_, rows)| rows).map(|(_, r, _)| r).collect();
    rows.sort_by_key(|r| r.id);
    rows
}

#[test]
fn a_damaged_record_is_dropped_and_the_others_kept() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
        for id in 0..3 {
            arena.insert(row(id as usize, id, 40), false);
        }
    }
    let (path, records) = first_records(dir.path());
    assert_eq!(records.len(), 3);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[HEADER_LEN + records[1].0 + RECORD_HEADER + 5] ^= 0x40; // inside the middle row's payload
    std::fs::write(&path, &bytes).unwrap();

    let arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    assert_eq!(arena.recovery().damaged_records, 1);
    assert_eq!(rows_of(&arena), [records[0].1.clone(), records[2].1.clone()]);
}

#[test]
fn a_torn_last_record_ends_its_segment_and_is_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
        for id in 0..3 {
            arena.insert(row(0, id, 100), false);
        }
    }
    // A crash in the middle of the third append: its payload's end never reached the file.
    let (path, records) = first_records(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let last = HEADER_LEN + records[2].0 + record_size(frame_len(&records[2].1));
    bytes[last - 16..last].fill(0);
    std::fs::write(&path, &bytes).unwrap();

    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    assert_eq!(arena.recovery().damaged_records, 1);
    assert_eq!(rows_of(&arena), [records[0].1.clone(), records[1].1.clone()]);
    let handle = arena.insert(row(0, 9, 10), false);
    assert_eq!(handle, 1 << 32 | records[2].0 as u64, "the torn record's place is reused");
    drop(arena);
    let arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    assert_eq!(arena.recovery().damaged_records, 0, "the end mark hides the rest of the torn record");
    assert_eq!(rows_of(&arena), [records[0].1.clone(), records[1].1.clone(), row(0, 9, 10)]);
}

fn frame_len(r: &Row) -> usize {
    RowEncoder::new().encode(r).unwrap().len()
}

#[test]
fn any_flipped_byte_loses_at_most_rows_never_invents_or_panics() {
    let dir = tempfile::tempdir().unwrap();
    let mut originals = Vec::new();
    {
        let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
        for id in 0..8 {
            let r = row(id as usize % KEYS, id, 200);
            originals.push(r.clone());
            let handle = arena.insert(r, false);
            assert_eq!(handle >> 32, 1, "one segment");
        }
    }
    let path = dir.path().join(file_name(1));
    let good = std::fs::read(&path).unwrap();
    // File offsets of the records: a flipped length field may hide the records after it.
    let mut starts = vec![HEADER_LEN + SEGMENT_HEADER];
    for r in &originals {
        starts.push(starts[starts.len() - 1] + record_size(frame_len(r)));
    }
    let used = starts.pop().unwrap();
    for at in 0..used + 32 {
        for flip in [0x01u8, 0x80] {
            let mut bad = good.clone();
            bad[at] ^= flip;
            std::fs::write(&path, &bad).unwrap();
            match ArenaStore::open_with(dir.path(), small()) {
                Ok(arena) => {
                    let rows = rows_of(&arena);
                    assert!(rows.iter().all(|r| originals.contains(r)), "byte {at}: a row that was never written");
                    let in_length = starts.iter().any(|&s| (s..s + 4).contains(&at));
                    if at >= HEADER_LEN + SEGMENT_HEADER && !in_length {
                        assert!(rows.len() + 1 >= originals.len(), "byte {at}: one flip, at most one row");
                    }
                }
                Err(e) => assert!(at < HEADER_LEN, "byte {at}: {e}"),
            }
        }
    }
}

#[test]
fn dead_segments_are_recycled() {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    let mut handles: Vec<_> = (0..100).map(|id| (7, arena.insert(row(0, id, 300), false))).collect();
    let spread = segment_files(dir.path());
    assert!(spread >= 10, "{spread} segments");
    for (hash, handle) in handles.drain(..) {
        arena.remove(hash, handle).unwrap();
    }
    assert_eq!(segment_files(dir.path()), 2, "the active segment and one spare");
    assert_eq!((arena.rows(), arena.bytes()), (0, 0));

    // The spare is reused, and none of its old records comes back.
    let fresh: Vec<Row> = (100..130).map(|id| row(1, id, 300)).collect();
    for r in &fresh {
        arena.insert(r.clone(), false);
    }
    assert!(segment_files(dir.path()) < spread);
    drop(arena);
    let arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    assert_eq!(rows_of(&arena), fresh);
    assert_eq!(arena.recovery().damaged_records, 0);

    // Without spares, an all-dead segment's file is deleted.
    let dir = tempfile::tempdir().unwrap();
    let config = ArenaConfig { spare_segments: 0, ..small() };
    let mut arena = ArenaStore::open_with(dir.path(), config.clone()).unwrap();
    let handles: Vec<_> = (0..50).map(|id| arena.insert(row(0, id, 300), false)).collect();
    for handle in handles {
        arena.remove(7, handle).unwrap();
    }
    assert_eq!(segment_files(dir.path()), 1);
    drop(arena);
    assert_eq!(ArenaStore::open_with(dir.path(), config).unwrap().rows(), 0);
}

#[test]
fn keys_with_the_same_hash_never_see_each_others_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    let mut broadcast = row(4, 99, 5);
    broadcast.key_hash = 7;
    arena.insert(broadcast, false);
    for id in 0..12 {
        arena.insert(row(id as usize % 3, id, 20), false); // "a", "b" and Int(7), all hash 7
    }
    let (a, _) = key(0);
    arena.scan(&a, 7, &mut |_| true);
    for reopen in [false, true] {
        if reopen {
            drop(arena);
            arena = ArenaStore::open_with(dir.path(), small()).unwrap();
        }
        for k in [0, 1, 2, 4] {
            let (key, _) = key(k);
            let mut seen = Vec::new();
            arena.scan_handles(&key, 7, &mut |_, r| {
                seen.push(r.key.clone());
                true
            });
            assert_eq!(seen.len(), if k == 4 { 1 } else { 4 }, "key {key:?}");
            assert!(seen.iter().all(|s| *s == key));
        }
        let matched: Vec<(Key, bool)> =
            snapshot(&arena).into_iter().flat_map(|(_, rows)| rows).map(|(_, r, m)| (r.key, m)).collect();
        assert!(matched.iter().all(|(k, m)| *m == (*k == a)), "only key a's rows are marked");
    }
}

#[test]
fn a_row_larger_than_a_segment_gets_a_segment_of_its_own_which_is_never_a_spare() {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    let (small_row, huge, after) = (row(0, 1, 10), row(0, 2, 5000), row(0, 3, 3000));
    let handles: Vec<RowHandle> =
        [&small_row, &huge, &after].into_iter().map(|r| arena.try_insert(r, false).unwrap()).collect();
    assert_eq!(arena.unsaved_rows(), 0);
    assert_eq!(segment_files(dir.path()), 3, "the first segment, the huge row's own, the next");
    let own_segment_bytes =
        |dir: &Path| std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).max().unwrap();
    assert_eq!(own_segment_bytes(dir.path()), 8192, "the huge row's segment, rounded up to a page");
    let mut seen = Vec::new();
    arena.scan(&small_row.key, 7, &mut |r| {
        seen.push(r.to_row().into_owned());
        true
    });
    assert_eq!(seen, [small_row.clone(), huge.clone(), after.clone()], "insertion order across segments");
    drop(arena);

    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    assert_eq!(rows_of(&arena), [small_row, huge, after], "the huge row survives a restart");
    assert!(arena.remove(7, handles[1]).is_some());
    assert_eq!(segment_files(dir.path()), 2, "its segment, all dead, is deleted, not kept as the spare");
    assert_eq!(own_segment_bytes(dir.path()), 4096);
}

#[test]
fn a_row_larger_than_the_largest_segment_is_an_error() {
    let config = ArenaConfig::default();
    assert_eq!(config.data_len_for(1 << 20).unwrap(), (1 << 20) + 4096 - HEADER_LEN, "its own size");
    let err = config.data_len_for(1 << 30).unwrap_err();
    assert!(matches!(err, ArenaError::RowTooLarge { bytes: 1_073_741_824, .. }), "{err}");
    assert!(err.to_string().contains("larger than an arena segment holds"));
}

#[test]
fn a_second_store_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _held = ArenaStore::open_with(dir.path(), small()).unwrap();
    let err = ArenaStore::open_with(dir.path(), small()).err().unwrap();
    assert!(matches!(err, ArenaError::File(MappedFileError::Locked(_))), "{err}");
}

#[test]
fn bad_configs_and_foreign_files_are_refused_other_files_ignored() {
    let dir = tempfile::tempdir().unwrap();
    for segment_bytes in [0, 4000, 2048, (1 << 30) + 4096] {
        let config = ArenaConfig { segment_bytes, spare_segments: 0, recoverable: true };
        assert!(matches!(ArenaStore::open_with(dir.path(), config), Err(ArenaError::BadConfig(_))));
    }
    std::fs::write(dir.path().join("notes.txt"), b"not a segment").unwrap();
    std::fs::write(dir.path().join("seg-x.arena"), b"not a segment name").unwrap();
    drop(ArenaStore::open_with(dir.path(), small()).unwrap());
    std::fs::write(dir.path().join("seg-000009.arena"), vec![0u8; 4096]).unwrap();
    assert!(matches!(ArenaStore::open_with(dir.path(), small()), Err(ArenaError::File(_))));
}

#[test]
fn layout_is_as_documented() {
    // The gateway `command` row of frame.rs: a 184-byte payload, a 224-byte record.
    let command = Row {
        ts: 1_700_000_000_123,
        key: Key::Str("dev-000042".into()),
        key_hash: 42,
        id: 0xdead_beef_0bad_f00d,
        values: vec![
            Value::Str("dev-000042".into()),
            Value::Int(1_700_000_000_123),
            Value::Str("set_mode".into()),
            Value::Str("v=42".into()),
            Value::Str("c-0123456789abcdef".into()),
        ]
        .into(),
    };
    assert_eq!(record_size(frame_len(&command)), 224);
    let config = ArenaConfig::default();
    assert_eq!(config.max_record() / 224, 1169);
    assert_eq!(config.max_record() - RECORD_HEADER, config.segment_bytes - 160);

    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open(dir.path()).unwrap();
    let first = arena.insert(command.clone(), false);
    let second = arena.insert(command.clone(), true);
    assert_eq!((first, second), (1 << 32 | 64, 1 << 32 | (64 + 224)));
    arena.scan(&command.key, 42, &mut |_| true);
    arena.remove(42, second).unwrap();
    let high = arena.high_water();
    assert_eq!(arena.bytes(), 224);
    drop(arena);

    let bytes = std::fs::read(dir.path().join("seg-000001.arena")).unwrap();
    assert_eq!(bytes.len(), 256 << 10);
    let data = &bytes[HEADER_LEN..];
    assert_eq!(&data[..8], &1u64.to_le_bytes(), "segment sequence number");
    let u32_at = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
    assert_eq!(u32_at(60), crc32c::crc32c(&data[..60]));
    let record = &data[64..64 + 224];
    assert_eq!(u32_at(64), 184);
    assert_eq!((record[8], record[9]), (1, 0), "matched by the scan, alive");
    assert_eq!(&record[16..24], &42u64.to_le_bytes());
    assert_eq!(&record[24..32], &command.ts.to_le_bytes());
    assert_eq!(&data[64 + 224 + 8..64 + 224 + 10], &[1, 1], "the second: matched, then removed");
    assert!(data[64 + 448..64 + 448 + 16].iter().all(|&b| b == 0), "end mark");
    assert_eq!(high, HighWater { seq: 1, offset: 64 + 448 });

    // A scratch store writes no flag into a record once it is stored: only a reopen reads them
    // (the index holds them while the store lives), and a scratch store is never reopened.
    let dir = tempfile::tempdir().unwrap();
    let mut scratch = ArenaStore::open_with(dir.path(), ArenaConfig::scratch()).unwrap();
    scratch.insert(command.clone(), false);
    let second = scratch.insert(command.clone(), true);
    scratch.scan(&command.key, 42, &mut |_| true);
    scratch.remove(42, second).unwrap();
    drop(scratch);
    let bytes = std::fs::read(dir.path().join("seg-000001.arena")).unwrap();
    let data = &bytes[HEADER_LEN..];
    assert_eq!(&data[64 + 8..64 + 10], &[0, 0], "the first: matched by the scan, flag not written");
    assert_eq!(&data[64 + 224 + 8..64 + 224 + 10], &[1, 0], "the second: matched when stored, removed unmarked");
}

/// A snapshot's rows go to a fresh arena under their own handles, a row larger than a segment
/// too; handles made afterwards are past every handle the snapshotted store had made, also of
/// rows removed before it.
#[test]
fn restored_rows_keep_their_handles_and_later_handles_are_new() {
    use crate::state::snapshot::{check_store, load_store, save_store};
    let dir = tempfile::tempdir().unwrap();
    let mut source = ArenaStore::open_with(&dir.path().join("source"), small()).unwrap();
    // Three segments' worth, then a row larger than a segment, then one removed.
    let mut handles: Vec<RowHandle> = (0..60).map(|i| source.insert(row(i % 3, i as u64, 100), i % 4 == 0)).collect();
    handles.push(source.insert(row(1, 100, 5000), true));
    let removed = source.insert(row(2, 101, 10), false);
    source.discard(key(2).1, removed);
    let saved = save_store(&source).unwrap();
    let mut restored = ArenaStore::open_with(&dir.path().join("restored"), small()).unwrap();
    check_store(&restored, &saved).unwrap();
    load_store(&mut restored, &saved).unwrap();
    assert_eq!(snapshot(&restored), snapshot(&source), "rows, handles, flags and order per key");
    assert_eq!((restored.rows(), restored.unsaved_rows()), (61, 0));
    let later = [restored.insert(row(2, 102, 10), false), restored.insert(row(2, 103, 5000), false)];
    for handle in later {
        assert!(
            handles.iter().chain([&removed]).all(|&h| (h & MEMORY_HANDLE == handle & MEMORY_HANDLE) <= (handle > h)),
            "{handle:#x} is not past the handles of its kind"
        );
        assert!(handles.iter().chain([&removed]).all(|&h| h != handle));
    }
    // Reopened from its files alone, the arena names restored rows by their places.
    drop(restored);
    let reopened = ArenaStore::open_with(&dir.path().join("restored"), small()).unwrap();
    assert_eq!(reopened.rows(), 63, "61 restored rows and the two later ones");
}

/// A key that stays while others come and go pins no segment: once a segment is under a quarter
/// live its rows move to the active one, keeping handles, order and matched flags, and the
/// segment is recycled; a snapshot taken after the move restores every row under its handle.
/// Rows leaving in the order they came (time-ordered expiry) are never moved: the segment at the
/// front of the expiry is sparse only on its way to empty.
#[test]
fn rows_leaving_in_arrival_order_are_never_moved() {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    let mut live = std::collections::VecDeque::new();
    for id in 0..600u64 {
        let r = row(id as usize % KEYS, id, 250);
        live.push_back((r.key_hash, arena.insert(r, false)));
        if live.len() > 30 {
            let (hash, handle) = live.pop_front().unwrap();
            assert!(arena.remove(hash, handle).is_some());
        }
    }
    assert_eq!(arena.compaction_counts(), (0, 0));
    assert!(segment_files(dir.path()) <= 30 * 330 / (4096 - HEADER_LEN) + 2 + SPARSE_KEPT);
}

#[test]
fn mostly_dead_segments_are_compacted_and_snapshots_still_name_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    let mut model = MemoryStore::default();
    let mut kept = Vec::new();
    // 12 rows of ~300 bytes a segment; every 6th row (key 3) stays, the rest (key 4) go.
    for id in 0..240u64 {
        let k = if id % 6 == 0 { 3 } else { 4 };
        let r = row(k, id, 250);
        let matched = id % 12 == 0;
        let handle = arena.insert(r.clone(), matched);
        let model_handle = model.insert(r, matched);
        if k == 3 {
            kept.push((handle, model_handle));
        } else {
            assert!(arena.remove(0, handle).is_some());
            assert!(model.remove(0, model_handle).is_some());
        }
    }
    let (compactions, moved) = arena.compaction_counts();
    assert!(compactions > 0 && moved > 0, "no compaction: {compactions} passes, {moved} rows");
    // Every segment but the active one, the spare and two left sparse is at least a quarter
    // live: 40 live rows of ~330 bytes need at most 4 × 13 KiB / 4 KiB + 2 + 2 = 17 files.
    // Without compaction every segment written stays pinned by its two kept rows (20 + the spare).
    let files = segment_files(dir.path());
    let bound = 4 * arena.bytes() / (4096 - HEADER_LEN) + 2 + SPARSE_KEPT;
    assert!(files <= bound, "{files} segment files, more than {bound}");
    let pinned = tempfile::tempdir().unwrap();
    let mut uncompacted = ArenaStore::open_with(pinned.path(), small()).unwrap();
    uncompacted.set_compaction(false);
    for id in 0..240u64 {
        let handle = uncompacted.insert(row(if id % 6 == 0 { 3 } else { 4 }, id, 250), false);
        if id % 6 != 0 {
            uncompacted.remove(0, handle).unwrap();
        }
    }
    assert!(segment_files(pinned.path()) >= 20 && files < segment_files(pinned.path()));
    // Two keys in the index: key 3's 40 rows, and key 4's emptied deque (kept for its next row).
    assert_eq!(arena.footprint(), files * 4096 + super::key_rows::index_bytes(2, 40));
    // Scans give the same rows in the same order, and every handle still names its row.
    let (key3, hash3) = key(3);
    let mut got = Vec::new();
    arena.scan_handles(&key3, hash3, &mut |h, r| {
        got.push((h, r.clone()));
        true
    });
    let mut want = Vec::new();
    model.scan_handles(&key3, hash3, &mut |h, r| {
        want.push((h, r.clone()));
        true
    });
    assert_eq!(got.iter().map(|p| &p.1).collect::<Vec<_>>(), want.iter().map(|p| &p.1).collect::<Vec<_>>());
    assert_eq!(got.iter().map(|p| p.0).collect::<Vec<_>>(), kept.iter().map(|p| p.0).collect::<Vec<_>>());
    // A checkpoint: what export names, import restores under the same handles, matched flags too.
    let saved = crate::state::snapshot::save_store(&arena).unwrap();
    let other = tempfile::tempdir().unwrap();
    let mut restored = ArenaStore::open_with(other.path(), small()).unwrap();
    restored.import(&saved).unwrap();
    assert_eq!(snapshot(&restored), snapshot(&arena));
    assert_eq!((listed(&arena), listed(&restored)), (exported(&arena), exported(&restored)));
    for &(handle, model_handle) in &kept {
        let (a, m) = (restored.remove(hash3, handle).unwrap(), model.remove(hash3, model_handle).unwrap());
        assert_eq!((a.row, a.matched), (m.row, m.matched));
    }
}

#[test]
fn footprint_counts_mapped_segments_and_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    assert_eq!(arena.footprint(), 4096, "an empty store maps its active segment");
    let handle = arena.insert(row(3, 1, 10), false);
    assert_eq!(arena.footprint(), 4096 + super::key_rows::index_bytes(1, 1));
    for id in 2..40 {
        arena.insert(row(3, id, 250), false);
    }
    let segments = segment_files(dir.path());
    assert!(segments >= 3);
    assert_eq!(arena.footprint(), segments * 4096 + super::key_rows::index_bytes(1, 39));
    arena.remove(9, handle).unwrap();
    let mut ages = Vec::new();
    arena.visit_ages(&mut |ts, id, key_hash, h| ages.push((ts, id, key_hash, h)));
    assert_eq!(ages.len(), 38);
    assert!(ages.iter().all(|&(ts, id, key_hash, h)| ts == 1_700_000_000_000 + id as i64
        && key_hash == 9
        && arena.contains(key_hash, h)));
    assert!(!arena.contains(9, handle));
}

/// Whether the count of emptied keys is the index's.
fn empty_keys_counted(arena: &ArenaStore) -> bool {
    arena.empty_keys == arena.index.values().filter(|entries| entries.is_empty()).count()
}

#[test]
fn emptied_keys_stay_for_their_next_row_until_they_outnumber_the_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), ArenaConfig::scratch()).unwrap();
    let keyed = |k: u64| Row { key: Key::Int(k as i64), key_hash: 1000 + k, ..row(0, k, 10) };
    // One key whose rows come and go keeps its place: no removal and insertion per row.
    for id in 0..50 {
        let handle = arena.insert(keyed(1), false);
        assert_eq!(arena.index.len(), 1);
        assert!(arena.discard(1001, handle).is_some(), "row {id}");
        assert_eq!((arena.index.len(), arena.empty_keys), (1, 1));
    }
    // A flood of keys, each gone at once: the emptied ones are dropped once they outnumber the
    // live keys by EMPTY_KEYS_KEPT, so the index stays bounded.
    let live: Vec<RowHandle> = (0..10).map(|k| arena.insert(keyed(k), false)).collect();
    for k in 10..5_000 {
        let handle = arena.insert(keyed(k), false);
        arena.discard(1000 + k, handle).unwrap();
        assert!(arena.index.len() <= 2 * 10 + EMPTY_KEYS_KEPT + 1, "{} keys", arena.index.len());
        assert!(empty_keys_counted(&arena));
    }
    // The live keys' rows are all there; an emptied key takes rows again.
    for (k, &handle) in live.iter().enumerate() {
        assert!(arena.contains(1000 + k as u64, handle));
    }
    arena.insert(keyed(4_999), false);
    assert!(empty_keys_counted(&arena));
    assert_eq!(arena.rows(), 11);
    // A hot key's deque is let go as soon as it is back to the rows its slot holds; the key
    // keeps its slot.
    let hot: Vec<RowHandle> = (0..100).map(|_| arena.insert(keyed(7_000), false)).collect();
    assert!(arena.index[&8_000].spilled_capacity() >= 98);
    hot[..98].iter().for_each(|&h| assert!(arena.discard(8_000, h).is_some()));
    assert_eq!(arena.index[&8_000].spilled_capacity(), 0);
    hot[98..].iter().for_each(|&h| assert!(arena.discard(8_000, h).is_some()));
    assert!(arena.index[&8_000].is_empty() && empty_keys_counted(&arena));
}

/// The index gives back the room a flood of keys left once they are gone.
#[test]
fn the_index_gives_back_room_left_by_a_flood_of_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), ArenaConfig::scratch()).unwrap();
    let rows: Vec<(RowHandle, u64)> = (0..50_000)
        .map(|i| {
            let row = Row { key_hash: i, ..row(0, i, 10) };
            (arena.insert(row, false), i)
        })
        .collect();
    let flooded = arena.index.capacity();
    assert!(flooded >= 50_000);
    for &(handle, hash) in &rows[..49_000] {
        assert!(arena.discard(hash, handle).is_some());
    }
    arena.release_spare_capacity();
    assert!(arena.index.capacity() < flooded / 4, "{} of {flooded}", arena.index.capacity());
    assert_eq!(arena.rows(), 1_000);
    for &(handle, hash) in &rows[49_000..] {
        assert!(arena.discard(hash, handle).is_some(), "the rows left are still found");
    }
}

/// A snapshot's list of rows, taken from the index without reading the rows, names the rows the
/// export then copies, in its order and with their lengths: rows in segments, rows compaction
/// moved, a row kept in memory because no segment could be made (a full disk), restored rows.
#[test]
fn a_snapshot_lists_every_row_with_its_length_from_the_index() {
    let storage = crate::storage::faulty::Faulty::mmap();
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_on(storage.clone(), dir.path(), small()).unwrap();
    let mut stored = Vec::new();
    let mut store = |arena: &mut ArenaStore, id: u64, text: usize, matched: bool| {
        let r = row(id as usize % KEYS, id, text);
        stored.push((r.key_hash, arena.insert(r, matched)));
    };
    for id in 0..30 {
        store(&mut arena, id, 10 + id as usize * 7, id % 3 == 0);
    }
    storage.fail_at(1, crate::storage::faulty::Fault::Enospc);
    let mut id = 30;
    while storage.pending() {
        store(&mut arena, id, 200, false);
        id += 1;
    }
    for id in id..id + 30 {
        store(&mut arena, id, 40, id % 2 == 0);
    }
    let in_memory = |&(_, handle): &(u64, RowHandle)| handle & MEMORY_HANDLE != 0;
    assert_eq!(stored.iter().filter(|r| in_memory(r)).count(), 1, "one row kept in memory");
    // Four rows in five go: segments fall under a quarter live and are compacted.
    for (_, &(key_hash, handle)) in stored.iter().enumerate().filter(|(i, r)| i % 5 != 0 && !in_memory(r)) {
        assert!(arena.discard(key_hash, handle).is_some());
    }
    assert!(arena.compaction_counts().1 > 0, "rows were moved");
    let listed_rows = listed(&arena);
    assert_eq!(listed_rows, exported(&arena));
    assert_eq!(listed_rows.len(), arena.rows());
    assert!(listed_rows.iter().any(|&(h, _, _)| h & MEMORY_HANDLE != 0), "the row in memory is listed");
    let saved = crate::state::snapshot::save_store(&arena).unwrap();
    let other = tempfile::tempdir().unwrap();
    let mut restored = ArenaStore::open_with(other.path(), small()).unwrap();
    restored.import(&saved).unwrap();
    assert_eq!((listed(&restored), snapshot(&restored)), (exported(&restored), snapshot(&arena)));
}

/// What a scan asks the CPU to fetch ahead, found from an index entry alone, is the record the
/// entry names: its header and then the row's archive, to the archive's last byte (where the
/// row's root lies).
#[test]
fn the_bytes_a_scan_prefetches_are_the_records_its_entries_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut arena = ArenaStore::open_with(dir.path(), small()).unwrap();
    scripted(&mut arena);
    let mut seen = 0;
    for entry in arena.index.values().flat_map(|entries| entries.iter()) {
        let &Place::Arena { slot, off, len, .. } = &entry.place else { continue };
        let segment = arena.segments.get(slot).unwrap();
        let payload = segment.payload(off as usize);
        let record = segment.record(off as usize, len as usize);
        assert_eq!(payload.len(), len as usize);
        assert!(record.ends_with(payload) && record.len() > payload.len(), "record at {off}");
        assert_eq!(record.as_ptr_range().end, payload.as_ptr_range().end);
        seen += 1;
    }
    assert!(seen > 10, "{seen} rows in arena segments");
}
