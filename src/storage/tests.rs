//! The fault backend under the spool and the arena: every fault is an error or a reported skip,
//! never a panic or a silent loss.

use std::path::Path;

use super::faulty::{Fault, Faulty};
use super::{HEADER_LEN, MappedFile};
use crate::config::Overflow;
use crate::record::{Key, Row, Value};
use crate::spool::{Spool, SpoolError, SpoolOptions};
use crate::state::KeyedStore;
use crate::state::arena::{ArenaConfig, ArenaError, ArenaStore};

fn options() -> SpoolOptions {
    SpoolOptions { max_bytes: 1 << 20, segment_bytes: 8 << 10, overflow: Overflow::Block, roll_after: None }
}

fn payload(i: u64) -> Vec<u8> {
    (0..40 + i as usize % 7).map(|j| (i as usize * 13 + j) as u8).collect()
}

/// Appends records `0..n` on `storage`.
fn fill(storage: &std::sync::Arc<Faulty>, dir: &Path, n: u64) -> Spool {
    let mut spool = Spool::open_on(storage.clone(), dir, options()).unwrap();
    for i in 0..n {
        assert_eq!(spool.append(&payload(i)).unwrap(), i);
    }
    spool
}

/// Reopens on the plain mmap backend and checks that the records `0..end` are there, but for
/// `missing`, and nothing else.
fn check_reopened(dir: &Path, end: u64, missing: &[u64]) -> Spool {
    let spool = Spool::open(dir, options()).unwrap();
    assert_eq!(spool.end(), end);
    for i in 0..end {
        if missing.contains(&i) {
            assert_eq!(spool.get(i), None, "record {i}");
        } else {
            assert_eq!(spool.get(i).unwrap(), payload(i).as_slice(), "record {i}");
        }
    }
    spool
}

#[test]
fn spool_enospc_and_eio_on_a_write_are_errors_and_change_nothing() {
    for fault in [Fault::Enospc, Fault::Eio] {
        // An append is three writes (payload, padding with the end mark, header): fail each.
        for call in 1..=3 {
            let dir = tempfile::tempdir().unwrap();
            let storage = Faulty::mmap();
            let mut spool = fill(&storage, dir.path(), 5);
            storage.fail_at(call, fault);
            let err = spool.append(&payload(5)).unwrap_err();
            assert!(matches!(err, SpoolError::File(_)), "{fault:?} at {call}: {err}");
            assert_eq!((spool.end(), spool.get(4).unwrap()), (5, payload(4).as_slice()));
            assert_eq!(spool.append(&payload(5)).unwrap(), 5, "{fault:?} at {call}: the seq is still free");
            drop(spool);
            check_reopened(dir.path(), 6, &[]);
        }
    }
}

#[test]
fn spool_enospc_at_a_new_segment_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Faulty::mmap();
    let mut spool = fill(&storage, dir.path(), 1);
    storage.fail_at(1, Fault::Enospc);
    let mut appended = 1;
    let err = loop {
        match spool.append(&payload(appended)) {
            Ok(_) => appended += 1,
            Err(e) => break e,
        }
    };
    assert!(!storage.pending(), "the fault happened");
    assert!(err.to_string().contains("No space left on device") || matches!(err, SpoolError::File(_)), "{err}");
    assert_eq!(spool.end(), appended);
    drop(spool);
    check_reopened(dir.path(), appended, &[]);
}

#[test]
fn spool_eio_on_sync_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Faulty::mmap();
    let mut spool = fill(&storage, dir.path(), 3);
    storage.fail_at(1, Fault::Eio);
    assert!(spool.sync().is_err());
    assert!(spool.sync().is_ok());
}

#[test]
fn spool_a_torn_write_is_cut_on_reopen_never_invented() {
    // An append is three writes (payload, padding with the end mark, header): tear each, and
    // the call after.
    for call in 1..=4 {
        let dir = tempfile::tempdir().unwrap();
        let storage = Faulty::mmap();
        let mut spool = fill(&storage, dir.path(), 5);
        storage.fail_at(call, Fault::Torn);
        let torn = spool.append(&payload(5));
        drop(spool); // the "crash": whatever reached the mapping stays
        let spool = check_reopened(dir.path(), if torn.is_ok() { 6 } else { 5 }, &[]);
        assert_eq!(spool.damaged(), 0, "a torn tail is cut, not reported as damage in the middle");
    }
}

#[test]
fn spool_a_flipped_bit_in_the_middle_is_skipped_and_reported() {
    for call in 1..=3 {
        let dir = tempfile::tempdir().unwrap();
        let storage = Faulty::mmap();
        let mut spool = fill(&storage, dir.path(), 5);
        storage.fail_at(call, Fault::CrcFlip);
        spool.append(&payload(5)).unwrap();
        for i in 6..10 {
            spool.append(&payload(i)).unwrap();
        }
        drop(spool);
        // The flip hit the payload (call 1), the padding and end mark (2: harmless) or the
        // header (3): either way record 5 alone may go, reported.
        let spool = Spool::open(dir.path(), options()).unwrap();
        let missing: Vec<u64> = if spool.get(5).is_none() { vec![5] } else { vec![] };
        assert_eq!(spool.damaged(), missing.len() as u64, "call {call}");
        drop(spool);
        check_reopened(dir.path(), 10, &missing);
    }
}

fn row(id: u64) -> Row {
    let values = vec![Value::Str("x".repeat(40).into()), Value::Int(id as i64)];
    Row { ts: 1_700_000_000_000 + id as i64, key: Key::Str("k".into()), key_hash: 7, id, values: values.into() }
}

fn ids(arena: &ArenaStore) -> Vec<u64> {
    let mut out = Vec::new();
    arena.scan_handles(&Key::Str("k".into()), 7, &mut |_, r| {
        out.push(r.id);
        true
    });
    out
}

#[test]
fn arena_enospc_on_a_write_keeps_the_row_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Faulty::mmap();
    let config = ArenaConfig { segment_bytes: 4096, spare_segments: 0, recoverable: true };
    let mut arena = ArenaStore::open_on(storage.clone(), dir.path(), config.clone()).unwrap();
    storage.fail_at(1, Fault::Enospc);
    let mut id = 0;
    while storage.pending() {
        arena.insert(row(id), false);
        id += 1;
    }
    assert_eq!(arena.unsaved_rows(), 1, "the row that met the full disk");
    assert_eq!(ids(&arena), (0..id).collect::<Vec<_>>(), "no row lost while running");
    assert!(arena.try_insert(&row(id), false).is_ok(), "the next write goes through");
    drop(arena);
    let arena = ArenaStore::open_with(dir.path(), config).unwrap();
    assert_eq!(arena.rows(), id as usize, "all but the unsaved row survive");
}

#[test]
fn arena_a_flipped_bit_is_a_reported_damaged_record() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Faulty::mmap();
    let mut arena = ArenaStore::open_on(storage.clone(), dir.path(), ArenaConfig::default()).unwrap();
    arena.insert(row(0), false);
    storage.fail_at(1, Fault::CrcFlip); // the payload write of row 1
    arena.insert(row(1), false);
    arena.insert(row(2), false);
    drop(arena);
    let arena = ArenaStore::open_with(dir.path(), ArenaConfig::default()).unwrap();
    assert_eq!(arena.recovery().damaged_records, 1);
    assert_eq!(ids(&arena), [0, 2]);
}

#[test]
fn arena_a_failed_write_is_an_error_of_try_insert() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Faulty::mmap();
    let mut arena = ArenaStore::open_on(storage.clone(), dir.path(), ArenaConfig::default()).unwrap();
    storage.fail_at(1, Fault::Eio);
    assert!(matches!(arena.try_insert(&row(0), false), Err(ArenaError::File(_))));
    assert_eq!(arena.rows(), 0);
    arena.try_insert(&row(1), false).unwrap();
    assert_eq!(ids(&arena), [1]);
}

/// A spool segment built byte for byte from the layout today's braid writes (spool/mod.rs and
/// mapped_file.rs docs), not with this code: an upgraded gateway reads its buffer as it was.
#[test]
fn todays_spool_segment_is_read_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let len = 8 << 10;
    let mut file = vec![0u8; len];
    file[..8].copy_from_slice(b"braidspl");
    file[8..12].copy_from_slice(&1u32.to_le_bytes());
    file[16..24].copy_from_slice(&(len as u64).to_le_bytes());
    let crc = crc32c::crc32c(&file[..60]);
    file[60..64].copy_from_slice(&crc.to_le_bytes());
    let data = &mut file[HEADER_LEN..];
    let base = 1000u64;
    data[..8].copy_from_slice(&base.to_le_bytes());
    let crc = crc32c::crc32c(&data[..28]);
    data[28..32].copy_from_slice(&crc.to_le_bytes());
    let records: [&[u8]; 4] = [b"first", b"", b"a result of 27 bytes, say..", &[7u8; 8]];
    let mut off = 32;
    for (i, record) in records.iter().enumerate() {
        let seq = base + i as u64;
        let rlen = record.len() as u32;
        let crc = crc32c::crc32c_append(
            crc32c::crc32c_append(crc32c::crc32c(&seq.to_le_bytes()), &rlen.to_le_bytes()),
            record,
        );
        data[off..off + 4].copy_from_slice(&rlen.to_le_bytes());
        data[off + 4..off + 8].copy_from_slice(&crc.to_le_bytes());
        data[off + 8..off + 16].copy_from_slice(&seq.to_le_bytes());
        data[off + 16..off + 16 + record.len()].copy_from_slice(record);
        off += 16 + record.len().next_multiple_of(8);
    }
    std::fs::write(dir.path().join("0000000003.spool"), &file).unwrap();
    // The head file as today's braid leaves it: `first` = 1001, nothing dropped (slot 1, counter 1).
    let mut head = MappedFile::create(&dir.path().join("head"), *b"braidsph", 1, 64).unwrap();
    let mut slot = [0u8; 32];
    slot[..8].copy_from_slice(&1001u64.to_le_bytes());
    slot[16..24].copy_from_slice(&1u64.to_le_bytes());
    let crc = crc32c::crc32c(&slot[..28]);
    slot[28..].copy_from_slice(&crc.to_le_bytes());
    head.data_mut()[32..64].copy_from_slice(&slot);
    drop(head);

    let options = SpoolOptions { segment_bytes: len, ..options() };
    let mut spool = Spool::open(dir.path(), options).unwrap();
    assert_eq!((spool.first(), spool.end(), spool.damaged()), (1001, 1004, 0));
    for (i, record) in records.iter().enumerate().skip(1) {
        assert_eq!(spool.get(base + i as u64), Some(*record));
    }
    assert_eq!(spool.append(b"next").unwrap(), 1004);
    spool.release_through(1003);
    assert_eq!(spool.get(1004), Some(&b"next"[..]));
}

/// Opens on `storage` and checks that every record is either lost or what was appended; the
/// seqs lost.
fn lost_on_reopen(storage: std::sync::Arc<Faulty>, dir: &Path, end: u64) -> Vec<u64> {
    let spool = Spool::open_on(storage, dir, options()).unwrap();
    assert_eq!(spool.end(), end);
    let lost: Vec<u64> = (0..end).filter(|&i| spool.get(i).is_none()).collect();
    for i in (0..end).filter(|i| !lost.contains(i)) {
        assert_eq!(spool.get(i).unwrap(), payload(i).as_slice(), "record {i}");
    }
    lost
}

fn quarantined(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("quarantine")).map_or(0, |entries| entries.count())
}

#[test]
fn spool_an_unreadable_block_at_recovery_quarantines_the_segment_never_sigbus() {
    let dir = tempfile::tempdir().unwrap();
    drop(fill(&Faulty::mmap(), dir.path(), 400));
    let is_segment =
        |e: &std::io::Result<std::fs::DirEntry>| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "spool");
    let segments = std::fs::read_dir(dir.path()).unwrap().filter(is_segment).count();
    assert!(segments >= 3, "{segments} segments");
    // A bad block in the middle of segment 1: read with pread, so EIO, not SIGBUS.
    let storage = Faulty::mmap();
    storage.unreadable("0000000001.spool", 4096..4100);
    let lost = lost_on_reopen(storage, dir.path(), 400);
    assert!(!lost.is_empty() && lost.windows(2).all(|w| w[1] == w[0] + 1), "one segment's records: {lost:?}");
    assert!(lost[0] > 0 && *lost.last().unwrap() < 399);
    assert!(!dir.path().join("0000000001.spool").exists(), "moved, not mapped into use");
    assert_eq!(quarantined(dir.path()), 1);
    // The next start finds what is left as it was.
    assert_eq!(lost_on_reopen(Faulty::mmap(), dir.path(), 400), lost);
}

#[test]
fn spool_eio_opening_a_segment_quarantines_it_and_the_spool_starts() {
    let dir = tempfile::tempdir().unwrap();
    drop(fill(&Faulty::mmap(), dir.path(), 400));
    let storage = Faulty::mmap();
    storage.fail_at(1, Fault::Eio); // the first segment file opened
    let lost = lost_on_reopen(storage, dir.path(), 400);
    assert!(!lost.is_empty(), "the records of the segment that could not be read");
    assert_eq!(quarantined(dir.path()), 1);
}

#[test]
fn spool_a_flipped_bit_in_the_middle_is_copied_to_quarantine() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Faulty::mmap();
    let mut spool = fill(&storage, dir.path(), 5);
    storage.fail_at(1, Fault::CrcFlip); // the payload write of record 5
    for i in 5..10 {
        spool.append(&payload(i)).unwrap();
    }
    drop(spool);
    assert_eq!(lost_on_reopen(Faulty::mmap(), dir.path(), 10), [5]);
    assert_eq!(quarantined(dir.path()), 1, "a copy as found; the segment stays in use");
}

/// The file names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

/// Expected: a full disk at a new segment is an error of `append` every time it is tried, leaves
/// no file and takes no file number (the 12 450 empty segment files); once space returns
/// the same append goes through, into the next number, and every record is there.
#[test]
fn spool_a_full_disk_at_a_new_segment_leaves_no_file_and_the_retry_goes_through() {
    // The first record that needs a second segment.
    let probe = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(probe.path(), options()).unwrap();
    let mut first_in_second = 0;
    while names(probe.path()).len() < 3 {
        spool.append(&payload(first_in_second)).unwrap();
        first_in_second += 1;
    }
    first_in_second -= 1;
    let dir = tempfile::tempdir().unwrap();
    let storage = Faulty::mmap();
    let mut spool = fill(&storage, dir.path(), first_in_second);
    let before = names(dir.path());
    assert_eq!(before, ["0000000000.spool", "head"]);
    let appended = first_in_second;
    storage.fail_at(1, Fault::Enospc);
    let error = spool.append(&payload(appended)).unwrap_err();
    assert!(error.write_failure().is_some_and(|(_, e)| super::write_faults::is_disk_full(e)), "{error}");
    // Tried again 50 times while the disk stays full.
    for _ in 0..50 {
        storage.fail_at(1, Fault::Enospc);
        assert!(spool.append(&payload(appended)).is_err());
    }
    assert_eq!(names(dir.path()), before, "failed creations leave nothing");
    assert_eq!(spool.append(&payload(appended)).unwrap(), appended, "space is back: the same seq");
    assert_eq!(names(dir.path()), ["0000000000.spool", "0000000001.spool", "head"]);
    drop(spool);
    check_reopened(dir.path(), appended + 1, &[]);
}

/// Expected: a segment whose header cannot be written after its file was made (ENOSPC, EIO) is
/// removed again — nothing half made stays — and the append is an error that changes nothing.
#[test]
fn spool_a_failed_segment_header_write_removes_the_new_file() {
    for fault in [Fault::Enospc, Fault::Eio, Fault::Torn] {
        let dir = tempfile::tempdir().unwrap();
        let storage = Faulty::mmap();
        let mut spool = Spool::open_on(storage.clone(), dir.path(), options()).unwrap();
        // Call 1 creates the first segment, call 2 writes its header.
        storage.fail_at(2, fault);
        assert!(spool.append(&payload(0)).is_err(), "{fault:?}");
        assert_eq!(names(dir.path()), ["head"], "{fault:?}: the new segment is gone");
        assert_eq!(spool.append(&payload(0)).unwrap(), 0);
        drop(spool);
        check_reopened(dir.path(), 1, &[]);
    }
}

/// Expected: a mapped file is built under a temporary name and appears under its own only whole
/// (header written and synced); a temporary one a crash left behind is removed when the spool
/// opens, and is never taken for a segment.
#[test]
fn a_half_made_segment_left_by_a_crash_is_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    drop(fill(&Faulty::mmap(), dir.path(), 3));
    let tmp = super::mapped_file::temporary_name(&dir.path().join("0000000001.spool"));
    std::fs::write(&tmp, b"half made").unwrap();
    let spool = check_reopened(dir.path(), 3, &[]);
    assert!(!tmp.exists(), "the temporary file is removed");
    drop(spool);
    assert_eq!(names(dir.path()), ["0000000000.spool", "head"]);
}

/// The mapped file's one-check `write_record` writes what the trait's default (a `write` per
/// piece, what the fault backend goes through) writes, and refuses a record that overruns the
/// file with an error, writing nothing.
#[test]
fn a_mapped_record_write_is_the_pieces_written_one_by_one() {
    use super::StoredFile;
    let dir = tempfile::tempdir().unwrap();
    let (header, parts, tail): (&[u8], [&[u8]; 3], &[u8]) = (b"head", [b"ab", b"", b"cde"], &[0; 3]);
    let mut whole = MappedFile::create(&dir.path().join("whole"), *b"braidtst", 1, 64).unwrap();
    let mut pieces = MappedFile::create(&dir.path().join("pieces"), *b"braidtst", 1, 64).unwrap();
    whole.data_mut().fill(7);
    pieces.data_mut().fill(7);
    StoredFile::write_record(&mut whole, 20, header, &parts, tail).unwrap();
    let mut at = 20 + header.len();
    for part in parts.iter().chain([&tail]) {
        StoredFile::write(&mut pieces, at, part).unwrap();
        at += part.len();
    }
    StoredFile::write(&mut pieces, 20, header).unwrap();
    assert_eq!(whole.data(), pieces.data());
    assert_eq!(&whole.data()[20..32], b"headabcde\0\0\0");

    let before = whole.data().to_vec();
    assert!(StoredFile::write_record(&mut whole, 60, header, &parts, tail).is_err());
    assert!(StoredFile::write_record(&mut whole, usize::MAX - 2, header, &parts, tail).is_err());
    assert_eq!(whole.data(), &before[..]);
}
