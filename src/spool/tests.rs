use std::collections::VecDeque;

use proptest::prelude::*;

use super::*;

fn options(max_bytes: u64, overflow: Overflow) -> SpoolOptions {
    SpoolOptions { max_bytes, segment_bytes: 8 << 10, overflow, roll_after: None }
}

/// A record whose content and length follow from its number.
fn payload(i: u64) -> Vec<u8> {
    let len = (i * 37 % 300) as usize;
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

fn segment_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().filter(|e| segment_number(&e.as_ref().unwrap().path()).is_some()).count()
}

#[test]
fn records_round_trip_in_order_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!((spool.first(), spool.end(), spool.queued_bytes()), (0, 0, 0));
    for i in 0..500 {
        assert_eq!(spool.append(&payload(i)).unwrap(), i);
    }
    assert!(segment_files(dir.path()) > 5, "8 KiB segments roll over");
    for i in 0..500 {
        assert_eq!(spool.get(i).unwrap(), payload(i).as_slice(), "record {i}");
    }
    assert_eq!(spool.get(500), None);
    let expected: u64 = (0..500).map(|i| record_size(payload(i).len()) as u64).sum();
    assert_eq!(spool.queued_bytes(), expected);
    assert!(spool.append(&[]).is_ok(), "an empty record is a record");
    assert_eq!(spool.get(500), Some(&[][..]));
    assert_eq!(spool.append_parts(&[b"ab", b"", b"cde"]).unwrap(), 501);
    assert_eq!(spool.get(501), Some(&b"abcde"[..]));
}

#[test]
fn a_record_larger_than_a_segment_gets_a_segment_of_its_own_size() {
    let dir = tempfile::tempdir().unwrap();
    let large: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    {
        let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
        assert!(spool.max_record() > large.len(), "limited by the buffer, not by 8 KiB segments");
        assert_eq!(spool.append(b"small").unwrap(), 0);
        assert_eq!(spool.append(&large).unwrap(), 1);
        assert_eq!(spool.append(b"after").unwrap(), 2);
        assert_eq!(spool.get(1), Some(large.as_slice()));
        let sizes: Vec<u64> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| segment_number(p).is_some())
            .map(|p| std::fs::metadata(p).unwrap().len())
            .collect();
        assert!(sizes.contains(&(8 << 10)) && sizes.iter().any(|&s| s > 20_000 && s % 4096 == 0), "{sizes:?}");
        spool.sync().unwrap();
    }
    let spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!(spool.end(), 3);
    assert_eq!(spool.get(0), Some(&b"small"[..]));
    assert_eq!(spool.get(1), Some(large.as_slice()));
    assert_eq!(spool.get(2), Some(&b"after"[..]));
}

#[test]
fn records_and_sequence_numbers_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let queued = {
        let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
        for i in 0..300 {
            spool.append(&payload(i)).unwrap();
        }
        spool.sync().unwrap();
        spool.queued_bytes()
    };
    let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!((spool.first(), spool.end(), spool.queued_bytes()), (0, 300, queued));
    for i in 0..300 {
        assert_eq!(spool.get(i).unwrap(), payload(i).as_slice());
    }
    assert_eq!(spool.append(b"next").unwrap(), 300);
}

#[test]
fn a_second_opener_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _held = Spool::open(dir.path(), SpoolOptions::default()).unwrap();
    let second = Spool::open(dir.path(), SpoolOptions::default());
    assert!(matches!(second, Err(SpoolError::File(MappedFileError::Locked(_)))));
}

/// A sync writes the head file after a release and flushes the directory after a segment file
/// was made or deleted, and skips both when the records appended since are all that changed.
#[test]
fn a_sync_writes_the_head_and_the_directory_only_when_they_changed() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!(spool.unsynced(), (true, true), "an opened spool syncs everything first");
    spool.append(&payload(0)).unwrap();
    spool.sync().unwrap();
    assert_eq!(spool.unsynced(), (false, false));
    spool.append(&payload(1)).unwrap();
    assert_eq!(spool.unsynced(), (false, false), "an append within the segment changes neither");
    // Appends until a segment file is made; the seq of the last append.
    let mut next = 2;
    let mut fill_one = |spool: &mut Spool| {
        let files = segment_files(dir.path());
        while segment_files(dir.path()) == files {
            spool.append(&payload(next)).unwrap();
            next += 1;
        }
        next - 1
    };
    let second_starts = fill_one(&mut spool);
    assert_eq!(spool.unsynced(), (false, true), "a new segment file");
    spool.sync().unwrap();
    let third_starts = fill_one(&mut spool);
    spool.sync().unwrap();
    spool.release_through(0);
    assert_eq!(spool.unsynced(), (true, false), "a release within the first segment");
    spool.sync().unwrap();
    spool.release_through(second_starts - 1);
    assert_eq!(spool.unsynced(), (true, false), "the first segment released: kept as the spare, no file deleted");
    spool.sync().unwrap();
    spool.release_through(third_starts - 1);
    assert_eq!(spool.unsynced(), (true, true), "the second released too: its file deleted");
    spool.sync().unwrap();
    assert_eq!(spool.unsynced(), (false, false));
}

#[test]
fn releases_persist_and_recycle_segments() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
        for i in 0..400 {
            spool.append(&payload(i)).unwrap();
        }
        let files = segment_files(dir.path());
        spool.release_through(349);
        assert_eq!(spool.first(), 350);
        assert_eq!(spool.get(349), None);
        let expected: u64 = (350..400).map(|i| record_size(payload(i).len()) as u64).sum();
        assert_eq!(spool.queued_bytes(), expected);
        assert!(segment_files(dir.path()) < files, "released segments are deleted (one kept spare)");
        spool.release_through(10); // already released: nothing happens
        assert_eq!(spool.first(), 350);
    }
    let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!((spool.first(), spool.end()), (350, 400));
    assert_eq!(spool.get(350).unwrap(), payload(350).as_slice());
    spool.release_through(u64::MAX);
    assert_eq!((spool.first(), spool.end(), spool.queued_bytes()), (400, 400, 0));
    drop(spool);
    let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!((spool.first(), spool.end()), (400, 400), "seqs are never reused, even when all are released");
    assert_eq!(spool.append(b"x").unwrap(), 400);
    assert!(segment_files(dir.path()) <= 2);
}

#[test]
fn block_refuses_and_writes_nothing_when_full() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), options(960, Overflow::Block)).unwrap();
    let record = [7u8; 80]; // 96 bytes with its header
    for i in 0..10 {
        assert_eq!(spool.append(&record).unwrap(), i);
    }
    assert_eq!(spool.queued_bytes(), 960);
    assert!(matches!(spool.append(&record), Err(SpoolError::Full)));
    assert!(matches!(spool.append(&[]), Err(SpoolError::Full)));
    assert_eq!((spool.end(), spool.queued_bytes(), spool.dropped()), (10, 960, 0));
    spool.release_through(0);
    assert_eq!(spool.append(&record).unwrap(), 10);
    assert!(matches!(spool.append(&[0; 2000]), Err(SpoolError::TooLarge { len: 2000, max: 944 })));
}

#[test]
fn drop_oldest_makes_room_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut spool = Spool::open(dir.path(), options(960, Overflow::DropOldest)).unwrap();
        for i in 0..25u8 {
            spool.append(&[i; 80]).unwrap();
        }
        assert_eq!((spool.first(), spool.end(), spool.dropped()), (15, 25, 15));
        assert_eq!(spool.get(15).unwrap(), &[15u8; 80][..]);
        spool.append(&[99; 272]).unwrap(); // 288 bytes: three records go
        assert_eq!((spool.first(), spool.dropped(), spool.queued_bytes()), (18, 18, 960));
    }
    let spool = Spool::open(dir.path(), options(960, Overflow::DropOldest)).unwrap();
    assert_eq!((spool.first(), spool.end(), spool.dropped()), (18, 26, 18), "drops persist");
}

/// Flips a payload byte of the record `at_from_end` records before the end of the newest
/// segment file (1: the last record).
fn corrupt(dir: &Path, at_from_end: usize) {
    let newest = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| segment_number(p).is_some())
        .max_by_key(|p| segment_number(p))
        .unwrap();
    let mut bytes = std::fs::read(&newest).unwrap();
    // The end mark is the first 16 zero bytes after data: find the last record's end by walking.
    let mut off = HEADER_LEN + SEGMENT_HEADER;
    let mut starts = Vec::new();
    loop {
        let len = u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap()) as usize;
        if bytes[off + 4..off + 16].iter().all(|&b| b == 0) {
            break;
        }
        starts.push(off);
        off += record_size(len);
    }
    let target = starts[starts.len() - at_from_end];
    bytes[target + RECORD_HEADER] ^= 0xff; // a payload byte: the crc no longer matches
    std::fs::write(&newest, &bytes).unwrap();
}

#[test]
fn a_torn_or_corrupt_tail_is_cut_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let record = [5u8; 40];
    {
        let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
        for _ in 0..20 {
            spool.append(&record).unwrap();
        }
    }
    corrupt(dir.path(), 1);
    {
        let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
        assert_eq!((spool.first(), spool.end()), (0, 19), "the damaged last record is cut");
        assert_eq!(spool.queued_bytes(), 19 * record_size(40) as u64);
        assert_eq!(spool.append(b"after").unwrap(), 19, "the next append takes its place");
    }
    corrupt(dir.path(), 3); // record 17 of 0..=19: skipped and reported, the ones after it stay
    let spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!((spool.end(), spool.damaged()), (20, 1));
    assert_eq!(spool.get(16).unwrap(), &record[..]);
    assert_eq!(spool.get(17), None, "the damaged record is never handed out");
    assert_eq!((spool.get(18).unwrap(), spool.get(19).unwrap()), (&record[..], &b"after"[..]));
}

#[test]
fn a_damaged_segment_file_is_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
        spool.append(b"a").unwrap();
    }
    let path = dir.path().join("0000000000.spool");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[3] ^= 1; // the MappedFile header
    std::fs::write(&path, &bytes).unwrap();
    let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!((spool.first(), spool.end(), spool.damaged()), (0, 0, 1));
    assert!(!path.exists(), "moved out of the spool");
    assert_eq!(quarantined(dir.path()), [".0000000000.spool"], "kept for inspection");
    assert_eq!(spool.append(b"b").unwrap(), 0, "the lost record was never released: its seq is free");
}

#[test]
fn bad_options_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad = SpoolOptions { segment_bytes: 5000, ..SpoolOptions::default() };
    assert!(matches!(Spool::open(dir.path(), bad), Err(SpoolError::BadOptions(_))));
}

#[derive(Debug, Clone)]
enum Op {
    Append(u16),
    Release(u16),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u16..600).prop_map(Op::Append),
        2 => (0u16..40).prop_map(Op::Release),
        1 => Just(Op::Reopen),
    ]
}

/// The model: a VecDeque of (seq, payload), a next seq and a drop count.
#[derive(Default)]
struct Model {
    records: VecDeque<(u64, Vec<u8>)>,
    end: u64,
    dropped: u64,
}

impl Model {
    fn bytes(&self) -> u64 {
        self.records.iter().map(|(_, p)| record_size(p.len()) as u64).sum()
    }

    fn append(&mut self, record: Vec<u8>, max: u64, overflow: Overflow) -> Option<u64> {
        let size = record_size(record.len()) as u64;
        if size + self.bytes() > max {
            if overflow == Overflow::Block {
                return None;
            }
            while size + self.bytes() > max {
                self.records.pop_front();
                self.dropped += 1;
            }
        }
        self.records.push_back((self.end, record));
        self.end += 1;
        Some(self.end - 1)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn spool_behaves_like_a_deque(ops in prop::collection::vec(op(), 1..120), drop_oldest: bool) {
        let dir = tempfile::tempdir().unwrap();
        let overflow = if drop_oldest { Overflow::DropOldest } else { Overflow::Block };
        let opts = SpoolOptions { max_bytes: 12_000, segment_bytes: 8 << 10, overflow, roll_after: None };
        let mut spool = Spool::open(dir.path(), opts).unwrap();
        let mut model = Model::default();
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Append(len) => {
                    let record: Vec<u8> = (0..len).map(|j| (n + j as usize) as u8).collect();
                    let got = spool.append(&record);
                    match model.append(record, opts.max_bytes, overflow) {
                        Some(seq) => prop_assert_eq!(got.unwrap(), seq),
                        None => prop_assert!(matches!(got, Err(SpoolError::Full))),
                    }
                }
                Op::Release(k) => {
                    let through = spool.first() + u64::from(k);
                    spool.release_through(through);
                    while model.records.front().is_some_and(|(s, _)| *s <= through) {
                        model.records.pop_front();
                    }
                }
                Op::Reopen => {
                    drop(spool);
                    spool = Spool::open(dir.path(), opts).unwrap();
                }
            }
            let first = model.records.front().map_or(model.end, |(s, _)| *s);
            prop_assert_eq!((spool.first(), spool.end()), (first, model.end));
            prop_assert_eq!(spool.queued_bytes(), model.bytes());
            prop_assert_eq!(spool.dropped(), model.dropped);
            for (seq, record) in &model.records {
                prop_assert_eq!(spool.get(*seq), Some(record.as_slice()));
            }
            prop_assert!(segment_files(dir.path()) <= 5, "files stay bounded by max_bytes");
        }
    }
}

#[test]
fn segments_roll_by_age_and_released_ones_are_deleted_but_32_spares() {
    let dir = tempfile::tempdir().unwrap();
    let rolling = SpoolOptions { roll_after: Some(Duration::ZERO), ..options(1 << 20, Overflow::Block) };
    let mut spool = Spool::open(dir.path(), rolling).unwrap();
    for i in 0..40 {
        spool.append(&payload(i)).unwrap();
    }
    // Every segment is already "old" after its first record: one file a record.
    assert_eq!(segment_files(dir.path()), 40);
    spool.release_through(38);
    assert_eq!(segment_files(dir.path()), 1 + 32, "released segments are deleted but for 32 spares");
    drop(spool);
    let mut spool = Spool::open(dir.path(), rolling).unwrap();
    assert_eq!((spool.first(), spool.end()), (39, 40));
    assert_eq!(spool.get(39).unwrap(), payload(39).as_slice());
    assert_eq!(spool.append(b"next").unwrap(), 40);
    assert_eq!(segment_files(dir.path()), 1 + 32, "the next segment is a spare");

    let dir = tempfile::tempdir().unwrap();
    let slow = SpoolOptions { roll_after: Some(Duration::from_secs(3600)), ..rolling };
    let mut spool = Spool::open(dir.path(), slow).unwrap();
    for i in 0..4 {
        spool.append(&payload(i)).unwrap();
    }
    assert_eq!(segment_files(dir.path()), 1, "a young segment takes the appends until it is full");
}

/// A spool that rolls by age keeps released segments as spares with their pages given back (no
/// dirty page of their first life is written back, no file is made per roll), reads them as
/// empty after a restart and takes them into use again.
#[test]
fn a_rolling_spools_spare_holds_only_its_header_page_and_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let segment_bytes = 64 << 10;
    let rolling = SpoolOptions { segment_bytes, roll_after: Some(Duration::ZERO), ..options(1 << 20, Overflow::Block) };
    let mut spool = Spool::open(dir.path(), rolling).unwrap();
    let record = vec![7u8; 20_000];
    for _ in 0..3 {
        spool.append(&record).unwrap();
    }
    spool.release_through(1);
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| segment_number(p).is_some())
        .collect();
    assert_eq!(files.len(), 3, "the segment appended to and two spares");
    let blocks = |path: &Path| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(path).unwrap()) * 512;
    let allocated: Vec<u64> = files.iter().map(|p| blocks(p)).collect();
    let emptied = allocated.iter().filter(|&&b| b <= 4096).count();
    assert_eq!(emptied, 2, "each spare keeps only its first page: {allocated:?}");
    drop(spool);

    let mut spool = Spool::open(dir.path(), rolling).unwrap();
    assert_eq!((spool.first(), spool.end()), (2, 3), "the spare holds no records after a restart");
    assert_eq!(spool.damaged(), 0);
    for seq in 3..10 {
        assert_eq!(spool.append(&record).unwrap(), seq);
        spool.release_through(seq - 1);
        assert!(segment_files(dir.path()) <= 3, "a roll takes a spare, never a new file");
    }
    assert_eq!(spool.get(9).unwrap(), record.as_slice());
    drop(spool);
    let spool = Spool::open(dir.path(), rolling).unwrap();
    assert_eq!((spool.first(), spool.end()), (9, 10));
    assert_eq!(spool.get(9).unwrap(), record.as_slice());
}

#[test]
fn the_default_rolls_well_before_the_kernel_writes_dirty_pages_back() {
    let roll = SpoolOptions::default().roll_after.expect("the journal and the sinks roll by age");
    let expire = std::fs::read_to_string("/proc/sys/vm/dirty_expire_centisecs").unwrap();
    let expire = Duration::from_millis(expire.trim().parse::<u64>().unwrap() * 10);
    assert!(roll <= expire / 3 || roll == Duration::from_secs(1), "{roll:?} against {expire:?}");
}

/// The names in the quarantine beside a spool in `dir`, without their time stamps.
fn quarantined(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir.join("quarantine")) else { return Vec::new() };
    let mut names: Vec<String> = entries
        .map(|e| e.unwrap().file_name().to_string_lossy().trim_start_matches(|c: char| c != '.').to_owned())
        .collect();
    names.sort();
    names
}

/// Data offsets (in the file) of every record of the single segment file of a spool.
fn record_starts(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut off = HEADER_LEN + SEGMENT_HEADER;
    let mut out = Vec::new();
    while off + RECORD_HEADER <= bytes.len() && bytes[off..off + RECORD_HEADER].iter().any(|&b| b != 0) {
        let len = u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap()) as usize;
        out.push((off, len));
        off += record_size(len);
    }
    out
}

#[test]
fn a_damaged_length_in_the_middle_loses_that_record_alone() {
    let dir = tempfile::tempdir().unwrap();
    let segment_bytes = 64 << 10;
    let opts = SpoolOptions { max_bytes: 1 << 20, segment_bytes, overflow: Overflow::Block, roll_after: None };
    {
        let mut spool = Spool::open(dir.path(), opts).unwrap();
        for i in 0..100 {
            spool.append(&payload(i)).unwrap();
        }
    }
    let path = dir.path().join("0000000000.spool");
    let mut bytes = std::fs::read(&path).unwrap();
    let starts = record_starts(&bytes);
    assert_eq!(starts.len(), 100);
    // Before: a damaged length made the walk hop to a wrong place and cut everything after it.
    bytes[starts[40].0 + 1] ^= 0x5a;
    bytes[starts[41].0 + 2] ^= 0x5a;
    bytes[starts[70].0 + RECORD_HEADER] ^= 0x01; // a payload byte
    std::fs::write(&path, &bytes).unwrap();
    let spool = Spool::open(dir.path(), opts).unwrap();
    assert_eq!((spool.end(), spool.damaged()), (100, 3));
    for i in 0..100 {
        let expected = (![40, 41, 70].contains(&i)).then(|| payload(i));
        assert_eq!(spool.get(i).map(<[u8]>::to_vec), expected, "record {i}");
    }
    let expected: u64 = (0..100).map(|i| record_size(payload(i).len()) as u64).sum();
    assert_eq!(spool.queued_bytes(), expected, "the damaged stretches still count until released");
    assert_eq!(quarantined(dir.path()), [".0000000000.spool"], "a copy, as found");
    let copy = std::fs::read_dir(dir.path().join("quarantine")).unwrap().next().unwrap().unwrap().path();
    assert_eq!(std::fs::read(copy).unwrap(), bytes);
}

#[test]
fn a_torn_append_is_cut_quietly_and_garbage_after_the_last_record_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
        for i in 0..10 {
            spool.append(&payload(i)).unwrap();
        }
    }
    let path = dir.path().join("0000000000.spool");
    let clean = std::fs::read(&path).unwrap();
    let starts = record_starts(&clean);
    // A torn append: the last record's payload half written (zeros), its end mark there.
    let mut torn = clean.clone();
    let (off, len) = starts[9];
    torn[off + RECORD_HEADER + len / 2..off + RECORD_HEADER + len].fill(0);
    std::fs::write(&path, &torn).unwrap();
    let spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!((spool.end(), spool.damaged()), (9, 0));
    assert!(quarantined(dir.path()).is_empty(), "a torn tail is no damage");
    drop(spool);
    // Non-zero bytes where the end mark after the last record must be: damage, reported.
    let mut bytes = std::fs::read(&path).unwrap();
    let after = starts[9].0;
    bytes[after + 3] = 0x77;
    std::fs::write(&path, &bytes).unwrap();
    let spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!(spool.end(), 9);
    assert_eq!(quarantined(dir.path()), [".0000000000.spool"]);
}

#[test]
fn a_damaged_head_is_quarantined_and_the_spool_starts_at_its_oldest_record() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
        for i in 0..10 {
            spool.append(&payload(i)).unwrap();
        }
        spool.release_through(3);
    }
    let head = dir.path().join("head");
    let mut bytes = std::fs::read(&head).unwrap();
    bytes[HEADER_LEN + 5] ^= 0x10;
    bytes[HEADER_LEN + 32 + 5] ^= 0x10;
    std::fs::write(&head, &bytes).unwrap();
    // Before: exit 1 at every start. Now: the released records come again, nothing is lost.
    let mut spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!((spool.first(), spool.end()), (0, 10));
    assert_eq!(quarantined(dir.path()), [".head"]);
    spool.release_through(5);
    drop(spool);
    let spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!((spool.first(), spool.end()), (6, 10), "the new head works");
    // A head whose file header is damaged: the same.
    drop(spool);
    let mut bytes = std::fs::read(&head).unwrap();
    bytes[2] ^= 1;
    std::fs::write(&head, &bytes).unwrap();
    let spool = Spool::open(dir.path(), options(1 << 20, Overflow::Block)).unwrap();
    assert_eq!((spool.first(), spool.end()), (0, 10));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Random byte flips anywhere in a segment's records: the spool opens, hands out no record
    /// that differs from what was appended, and keeps every record no flip touched.
    #[test]
    fn random_flips_never_invent_and_lose_only_what_they_touch(
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..12)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let opts = SpoolOptions { max_bytes: 1 << 20, segment_bytes: 64 << 10, overflow: Overflow::Block, roll_after: None };
        {
            let mut spool = Spool::open(dir.path(), opts).unwrap();
            for i in 0..150 {
                spool.append(&payload(i)).unwrap();
            }
        }
        let path = dir.path().join("0000000000.spool");
        let mut bytes = std::fs::read(&path).unwrap();
        let starts = record_starts(&bytes);
        let data_start = HEADER_LEN + SEGMENT_HEADER;
        let used = starts.last().map(|&(off, len)| off + record_size(len) + 32).unwrap();
        let mut touched = [false; 150];
        for (index, mask) in &flips {
            let at = data_start + index.index(used - data_start);
            bytes[at] ^= mask;
            if let Some(i) = starts.iter().position(|&(off, len)| (off..off + RECORD_HEADER + len).contains(&at)) {
                touched[i] = true;
            }
        }
        std::fs::write(&path, &bytes).unwrap();
        let spool = Spool::open(dir.path(), opts).unwrap();
        for i in 0..150u64 {
            match spool.get(i) {
                Some(got) => prop_assert_eq!(got.to_vec(), payload(i), "record {} invented", i),
                None => prop_assert!(touched[i as usize], "record {} lost though untouched", i),
            }
        }
        prop_assert!(spool.damaged() <= touched.iter().filter(|t| **t).count() as u64 + 1);
    }
}
