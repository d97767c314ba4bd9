// File-backed rings cannot run in a loom build (sync.rs); `loom_tests.rs` runs there instead.
#![cfg(not(braid_loom))]

use super::*;

fn ring(capacity: usize) -> (tempfile::TempDir, Producer, Consumer) {
    let dir = tempfile::tempdir().unwrap();
    let (p, c) = Ring::create(&dir.path().join("r"), capacity).unwrap();
    (dir, p, c)
}

fn drain(c: &mut Consumer) -> Vec<(FrameKind, Vec<u8>)> {
    let mut out = Vec::new();
    c.read_batch(|f| out.push((f.kind, f.payload.to_vec())));
    out
}

#[test]
fn frames_are_read_in_order_only_after_commit() {
    let (_dir, mut p, mut c) = ring(256);
    p.push(FrameKind::Row, b"hello").unwrap();
    p.push(FrameKind::Tick, &[]).unwrap();
    assert!(drain(&mut c).is_empty(), "nothing before commit");
    p.commit();
    assert_eq!(drain(&mut c), [(FrameKind::Row, b"hello".to_vec()), (FrameKind::Tick, vec![])]);
    assert_eq!(p.used_bytes(), 0);
}

#[test]
fn a_full_ring_refuses_until_the_consumer_releases() {
    let (_dir, mut p, mut c) = ring(128);
    let payload = [7u8; 40]; // 16 + 48 = 64 bytes per frame
    p.push(FrameKind::Row, &payload).unwrap();
    p.push(FrameKind::Row, &payload).unwrap();
    assert_eq!(p.push(FrameKind::Row, &payload), Err(PushError::Full));
    assert_eq!(p.push(FrameKind::Row, &[0; 49]), Err(PushError::TooLarge));
    p.commit();
    assert_eq!(drain(&mut c).len(), 2);
    p.push(FrameKind::Row, &payload).unwrap();
}

#[test]
fn a_frame_that_does_not_fit_before_the_end_wraps() {
    let (_dir, mut p, mut c) = ring(128);
    p.push(FrameKind::Row, &[1; 16]).unwrap(); // 32 bytes: [0, 32)
    p.push(FrameKind::Row, &[2; 48]).unwrap(); // 64 bytes: [32, 96)
    p.commit();
    assert_eq!(drain(&mut c).len(), 2);
    // 48 bytes: only 32 remain before the end, so a wrap marker fills them.
    p.push(FrameKind::Row, &[3; 32]).unwrap();
    p.commit();
    assert_eq!(drain(&mut c), [(FrameKind::Row, vec![3; 32])]);
    assert_eq!(p.tail, 128 + 48);
}

#[test]
fn a_frame_exactly_filling_the_end_needs_no_wrap() {
    let (_dir, mut p, mut c) = ring(128);
    p.push(FrameKind::Row, &[1; 48]).unwrap(); // [0, 64)
    p.commit();
    drain(&mut c);
    p.push(FrameKind::Row, &[2; 48]).unwrap(); // [64, 128): exactly to the end
    p.push(FrameKind::Row, &[3; 48]).unwrap(); // [128, 192) = [0, 64) again
    p.commit();
    assert_eq!(drain(&mut c), [(FrameKind::Row, vec![2; 48]), (FrameKind::Row, vec![3; 48])]);
    assert_eq!(p.tail, 192, "no bytes skipped");
}

#[test]
fn reopening_resumes_after_what_was_consumed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    {
        let (mut p, mut c) = Ring::create(&path, 256).unwrap();
        p.push(FrameKind::Row, b"one").unwrap();
        p.push(FrameKind::Row, b"two").unwrap();
        p.commit();
        c.read_batch(|_| {});
        p.push(FrameKind::Row, b"three").unwrap();
        p.push(FrameKind::EndOfInput, b"").unwrap();
        p.commit();
        p.push(FrameKind::Row, b"never committed").unwrap();
    }
    let (_p, mut c) = Ring::open(&path).unwrap();
    assert_eq!(drain(&mut c), [(FrameKind::Row, b"three".to_vec()), (FrameKind::EndOfInput, vec![])]);
}

#[test]
fn a_torn_frame_ends_the_ring_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    {
        let (mut p, _c) = Ring::create(&path, 256).unwrap();
        p.push(FrameKind::Row, b"good").unwrap();
        p.push(FrameKind::Row, b"torn").unwrap();
        p.push(FrameKind::Row, b"after").unwrap();
        p.commit();
    }
    let mut bytes = std::fs::read(&path).unwrap();
    let second_payload = crate::storage::mapped_file::HEADER_LEN + FRAMES_AT + 32 + FRAME_HEADER;
    assert_eq!(&bytes[second_payload..second_payload + 4], b"torn");
    bytes[second_payload] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let (mut p, mut c) = Ring::open(&path).unwrap();
    assert_eq!(drain(&mut c), [(FrameKind::Row, b"good".to_vec())]);
    p.push(FrameKind::Row, b"new").unwrap();
    p.commit();
    assert_eq!(drain(&mut c), [(FrameKind::Row, b"new".to_vec())], "the producer resumes at the cut");
}

/// The crc word of the frame at byte `at` of the frame area, as stored in the file.
fn stored_crc(path: &std::path::Path, at: usize) -> u32 {
    let bytes = std::fs::read(path).unwrap();
    let header = crate::storage::mapped_file::HEADER_LEN + FRAMES_AT + at;
    u32::from_le_bytes(bytes[header + 8..header + 12].try_into().unwrap())
}

#[test]
fn a_ring_without_checksums_skips_the_crc_and_reopens_by_layout_only() {
    let dir = tempfile::tempdir().unwrap();
    let (checked, unchecked) = (dir.path().join("checked"), dir.path().join("unchecked"));
    for (path, checksums) in [(&checked, Checksums::Crc32c), (&unchecked, Checksums::Off)] {
        let (mut p, mut c) = Ring::create_with(path, 256, checksums).unwrap();
        p.push(FrameKind::Row, b"good").unwrap();
        p.push(FrameKind::Row, b"flipped").unwrap();
        p.push(FrameKind::Row, b"after").unwrap();
        p.commit();
        assert_eq!(drain(&mut c).len(), 3, "both kinds read the same");
        p.push(FrameKind::Row, b"unread").unwrap();
        p.push(FrameKind::Row, b"bad kind").unwrap();
        p.commit();
    }
    assert_eq!(stored_crc(&checked, 0), frame_crc(FrameKind::Row as u32, 4, b"good"));
    assert_eq!(stored_crc(&unchecked, 0), 0, "no crc computed");
    // Damage the unread frames of the ring without checksums: a flipped payload byte goes
    // unnoticed (nothing to check it against), a kind that is no kind still ends the ring.
    let mut bytes = std::fs::read(&unchecked).unwrap();
    let area = crate::storage::mapped_file::HEADER_LEN + FRAMES_AT;
    let (unread, bad_kind) = (area + 96, area + 128);
    assert_eq!(&bytes[unread + FRAME_HEADER..unread + FRAME_HEADER + 6], b"unread");
    bytes[unread + FRAME_HEADER] ^= 0xff;
    bytes[bad_kind + 4] = 0x7f;
    std::fs::write(&unchecked, &bytes).unwrap();
    let (mut p, mut c) = Ring::open(&unchecked).unwrap();
    assert_eq!(drain(&mut c), [(FrameKind::Row, b"\x8anread".to_vec())]);
    p.push(FrameKind::Row, b"new").unwrap();
    p.commit();
    assert_eq!(drain(&mut c), [(FrameKind::Row, b"new".to_vec())]);
    assert_eq!(stored_crc(&unchecked, 128), 0, "reopened without checksums, it stays so");
}

#[test]
fn bad_capacities_and_foreign_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(Ring::create(&dir.path().join("a"), 100), Err(RingError::BadCapacity(100))));
    std::fs::write(dir.path().join("b"), [0u8; 300]).unwrap();
    assert!(Ring::open(&dir.path().join("b")).is_err());
}

#[test]
fn producer_and_consumer_on_two_threads_lose_and_reorder_nothing() {
    let (_dir, mut p, mut c) = ring(4096);
    const FRAMES: u64 = 50_000;
    let producer = std::thread::spawn(move || {
        let mut seed = 1u64;
        for i in 0..FRAMES {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let len = 8 + (seed >> 58) as usize * 3;
            let mut payload = vec![(i % 251) as u8; len];
            payload[..8].copy_from_slice(&i.to_le_bytes());
            while p.push(FrameKind::Row, &payload).is_err() {
                p.commit();
                std::thread::yield_now();
            }
            if i % 7 == 0 {
                p.commit();
            }
        }
        p.commit();
    });
    let mut next = 0u64;
    while next < FRAMES {
        c.read_batch(|f| {
            let i = u64::from_le_bytes(f.payload[..8].try_into().unwrap());
            assert_eq!(i, next, "frames arrive in order, none lost");
            assert!(f.payload[8..].iter().all(|&b| b == (i % 251) as u8), "payload intact");
            next += 1;
        });
        std::thread::yield_now();
    }
    producer.join().unwrap();
}

/// Bytes of `path` the file system holds (blocks allocated), which a punched hole gives back.
fn allocated(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// Frames of sizes that vary (so frames wrap at every offset) with contents naming their index.
fn numbered(i: u64) -> Vec<u8> {
    let len = 40 + (i * 7919 % 3000) as usize;
    (0..len).map(|j| (i as usize).wrapping_mul(31).wrapping_add(j) as u8).collect()
}

#[test]
fn a_producer_giving_pages_back_keeps_only_the_chunks_in_use() {
    // Where rings live in a run (/dev/shm when there is one): a file system that punches holes.
    let dir = tempfile::tempdir_in(crate::storage::mapped_file::scratch_base()).unwrap();
    let path = dir.path().join("r");
    let capacity = 1 << 20;
    let (mut p, mut c) = Ring::create_with(&path, capacity, Checksums::Off).unwrap();
    assert!(allocated(&path) >= capacity as u64, "created whole");
    p.give_back_pages(capacity / 16).unwrap();
    // Three laps, the consumer keeping up a commit behind: every frame read back as written.
    let (mut sent, mut read) = (0u64, 0u64);
    while sent < 2_000 {
        for _ in 0..4 {
            p.push(FrameKind::Row, &numbered(sent)).unwrap();
            sent += 1;
        }
        p.commit();
        c.read_batch(|f| {
            assert_eq!(f.payload, numbered(read), "frame {read}");
            read += 1;
        });
    }
    assert_eq!(read, sent);
    // Held: the window (two chunks) and the pages at chunk borders.
    let held = allocated(&path);
    assert!(held <= 2 * (capacity as u64 / 16) + 17 * 4096, "{held} bytes still allocated");
}

#[test]
fn a_lagging_consumer_reads_every_frame_while_pages_are_given_back() {
    let dir = tempfile::tempdir_in(crate::storage::mapped_file::scratch_base()).unwrap();
    let (mut p, mut c) = Ring::create_with(&dir.path().join("r"), 256 << 10, Checksums::Off).unwrap();
    p.give_back_pages(16 << 10).unwrap();
    let (mut sent, mut read) = (0u64, 0u64);
    // Fill until full, then read only half of what waits: the producer gives chunks back right
    // behind frames that still wait, and takes them back as it reaches them.
    for round in 0..40 {
        while p.push(FrameKind::Row, &numbered(sent)).is_ok() {
            sent += 1;
        }
        p.commit();
        let stop = read + (sent - read).div_ceil(2).max(if round % 5 == 4 { sent - read } else { 0 });
        while read < stop {
            let frames = c.read_batch(|f| {
                assert_eq!(f.payload, numbered(read), "frame {read}");
                read += 1;
            });
            assert!(frames > 0, "frame {read} cannot be read (a hole where it waited?)");
        }
    }
    c.read_batch(|f| {
        assert_eq!(f.payload, numbered(read), "frame {read}");
        read += 1;
    });
    assert_eq!(read, sent);
}

#[test]
fn chunks_that_do_not_divide_the_ring_are_refused() {
    let (_dir, mut p, _c) = ring(4096);
    for chunk in [0, 8, 1000, 4096 / 128, 2048] {
        let refused = p.give_back_pages(chunk).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput, "chunk {chunk}");
    }
    p.give_back_pages(256).unwrap();
}

#[test]
fn bytes_waiting_leave_out_what_an_early_wrap_skipped() {
    let dir = tempfile::tempdir_in(crate::storage::mapped_file::scratch_base()).unwrap();
    let capacity = 256 << 10;
    let (mut p, mut c) = Ring::create_with(&dir.path().join("r"), capacity, Checksums::Off).unwrap();
    p.give_back_pages(capacity / 16).unwrap();
    // Frame by frame over four laps, each read after it is counted: the ring holds one frame
    // whenever it is looked at, early wraps (one a lap) included.
    for i in 0..(4 * capacity as u64 / 1024) {
        let payload = numbered(i);
        p.push(FrameKind::Row, &payload).unwrap();
        p.commit();
        assert_eq!(p.used_bytes(), frame_size(payload.len()) as u64, "frame {i}");
        assert_eq!(drain(&mut c), [(FrameKind::Row, payload)]);
        assert_eq!(p.used_bytes(), 0, "frame {i} read");
    }
}
