//! A single-producer single-consumer ring of frames in a memory-mapped file.
//!
//! One ring carries rows (and control frames: watermark ticks, idleness, end of input) from one
//! producer to one shard. It lives in a [`MappedFile`], so a crash loses nothing the producer had
//! committed and a restart resumes from the consumer's position.
//!
//! Layout of the file's data region:
//!
//! ```text
//! 0    tail: u64  bytes ever committed by the producer (written only by the producer)
//! 64   head: u64  bytes ever released by the consumer (written only by the consumer)
//! 128  capacity: u64
//! 136  flags: u64  bit 0: frames carry no crc ([`Checksums::Off`]); zero in files made before it
//! 144  room wanted: u64  1 while the producer waits for the consumer to release space
//! 192  frames, `capacity` bytes
//! ```
//!
//! `tail` and `head` sit on their own cache lines so producer and consumer do not bounce one
//! line between cores. Both only grow; a frame's position in the frame area is its offset modulo
//! `capacity`. Invariant: `head ≤ tail ≤ head + capacity`.
//!
//! A frame is a 16-byte header — payload length u32, kind u32, crc32c u32 (of kind, length and
//! payload; 0 in a ring made with [`Checksums::Off`]), reserved u32 — then the payload, padded to 16 bytes, so every frame and payload
//! starts 16-byte aligned (what rkyv's archived rows need). A frame never wraps: when it does not
//! fit before the end of the area, the producer writes a `WRAP` header there (the rest of the
//! area is skipped) and puts the frame at the start. A frame that exactly fills the end needs no
//! wrap.
//!
//! Publication: the producer writes frames, then stores `tail` with Release ordering (once per
//! batch); the consumer loads `tail` with Acquire, reads every frame up to it, and stores `head`
//! with Release once it is done with the batch, which is when the producer may overwrite those
//! bytes (it loads `head` with Acquire). A full ring is backpressure: [`Producer::push`] returns
//! [`PushError::Full`] and the caller waits — nothing is dropped.
//!
//! Asking for room: a producer that finds the ring full and is about to sleep raises "room
//! wanted" ([`Producer::want_room`], a swap to 1), then tries once more; a consumer that released
//! frames swaps the flag back to 0 ([`Consumer::room_wanted`]) and wakes the producer only when
//! it was up. Both are AcqRel read-modify-writes of one word, so one of them comes first in its
//! modification order: either the consumer's swap reads the 1 (and wakes the producer), or the
//! producer's swap reads the consumer's 0 and acquires its release of `head`, so the retry sees
//! the space. No wake-up is lost, and a consumer wakes its producer only when it waits for room,
//! never after every batch. (Read-modify-writes rather than a Dekker pair of SeqCst fences: loom
//! models SeqCst as AcqRel, so only this form can be model-checked; `loom_tests.rs` does. On
//! x86 a swap costs what the fence did.)
//!
//! Giving pages back ([`Producer::give_back_pages`], the shard runtime's rings under `braid run`):
//! a ring cycles through its whole area, so once it has wrapped every page is resident, though
//! at a gateway's rate it holds a few KiB of frames. A producer that gives pages back splits the
//! area into chunks (64 KiB of a 1 MiB ring) and keeps its frames in the first two, the window,
//! while the consumer keeps up: a frame that would end past the window goes to the start instead
//! (an early wrap marker, read as any other) when at most half a window of frames waits and the
//! start has room. The chunks beyond the window hold frames only while the consumer lags; whenever
//! a write reaches a new chunk, the producer punches a hole in every chunk beyond the window that
//! lies wholly in free space — positions from the end of that write to `head + capacity`, with
//! `head` loaded afresh (Acquire, so the consumer's reads of those bytes come before the hole) —
//! and before it writes into a chunk it gave back, it allocates the chunk again, so a full tmpfs
//! is [`PushError::NoSpace`], never SIGBUS (storage/mapped_file.rs point 2). Only the producer
//! touches free space, so neither step needs the consumer, which is unchanged. A ring that keeps
//! up thus holds its window (and the pages at chunk borders) and makes no system call; one that
//! lags takes back what it needs and gives it back once drained. The loom model covers a
//! producer giving pages back.
//!
//! Recovery ([`Ring::open`]): frames between `head` and `tail` are checked against their crc; a
//! torn frame (a crash in the middle of a batch cannot leave one, as `tail` moves after the
//! bytes, but a damaged disk can) ends the ring there: `tail` is cut back to the last good frame.
//!
//! Checksums are chosen when a ring is created ([`Checksums`]): a ring that is opened again after
//! a restart keeps them; a ring that only hands frames between threads of one run (the shard
//! runtime's rings, created afresh by every run and never opened again) skips the crc32c on push,
//! where it was 22–52 % of a push (BENCHMARKS.md "The ring alone"). Reads never check it: frames
//! this process committed are trusted (STYLE.md 8), and `open` of such a ring checks only the
//! frames' layout.
//!
//! Model checking: every counter and frame byte is reached through [`sync`]'s `Region`, which is
//! the mapping in real builds and loom atomics plus tracked heap bytes in a loom test build;
//! `loom_tests.rs` runs a producer and a consumer through wraps and a full ring under loom
//! (`RUSTFLAGS="--cfg braid_loom" cargo test --release --lib ring::loom`, README.md
//! "Development"), which reports any access to frame bytes that the Release/Acquire pairs above do
//! not order.

use std::path::Path;

use thiserror::Error;

use crate::storage::mapped_file::{MappedFile, MappedFileError};
use sync::{Arc, AtomicU64, Ordering, Region};

mod sync;

const MAGIC: [u8; 8] = *b"braidrng";
const VERSION: u32 = 1;
const TAIL_AT: usize = 0;
const HEAD_AT: usize = 64;
const CAPACITY_AT: usize = 128;
const FLAGS_AT: usize = 136;
const ROOM_WANTED_AT: usize = 144;
const FRAMES_AT: usize = 192;
/// [`FLAGS_AT`] bit: the frames carry no crc.
const FLAG_NO_CRC: u64 = 1;
/// Frame header bytes; also the alignment of frames and payloads.
pub const FRAME_HEADER: usize = 16;
const WRAP: u32 = u32::MAX;

/// What a frame carries. Values are stored in the file: never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Row = 1,
    /// A watermark tick (payload: the tick's processing time and the watermarks it carries).
    Tick = 2,
    /// Idleness changed.
    Idle = 3,
    EndOfInput = 4,
    /// Processing time moved (payload: event sequence and time).
    ProcessingTime = 5,
    /// The producer has sent every event up to a sequence number.
    Progress = 6,
    /// A row for an operator on another shard, with its [`Tag`](crate::shard::tag::Tag).
    Exchange = 7,
    /// An operator instance will send nothing before a tag (the exchange's progress).
    Frontier = 8,
    /// An operator instance ran a tick (payload: its output watermark then).
    TickDone = 9,
    /// A result or late row of an operator, for the sinks.
    Output = 10,
    /// A checkpoint barrier from the feeder (payload: event sequence and checkpoint epoch).
    Barrier = 11,
    /// To the collector: an operator instance passed a checkpoint barrier, or (operator
    /// `u32::MAX`) the shard wrote its snapshot.
    Passed = 12,
}

impl FrameKind {
    fn from_u32(v: u32) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Row,
            2 => FrameKind::Tick,
            3 => FrameKind::Idle,
            4 => FrameKind::EndOfInput,
            5 => FrameKind::ProcessingTime,
            6 => FrameKind::Progress,
            7 => FrameKind::Exchange,
            8 => FrameKind::Frontier,
            9 => FrameKind::TickDone,
            10 => FrameKind::Output,
            11 => FrameKind::Barrier,
            12 => FrameKind::Passed,
            _ => return None,
        })
    }
}

#[derive(Debug, Error)]
pub enum RingError {
    #[error(transparent)]
    File(#[from] MappedFileError),
    #[error("ring capacity {0} must be a positive multiple of {FRAME_HEADER}")]
    BadCapacity(usize),
    #[error("ring {path}: damaged ({reason})")]
    Damaged { path: String, reason: String },
}

/// Why a frame was not appended.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError {
    /// No room now: retry once the consumer has released some (backpressure, nothing dropped).
    Full,
    /// Larger than [`Producer::max_payload`]: it will never fit this ring.
    TooLarge,
    /// The frame goes where the ring gave its pages back ([`Producer::give_back_pages`]) and the
    /// file system could not allocate them again (a full tmpfs or disk): the errno. Nothing was
    /// written; the ring stays as it was.
    NoSpace(i32),
}

/// Whether a ring's frames carry a crc32c, chosen at [`Ring::create_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checksums {
    /// Every frame's crc is written on push and checked when the ring is opened again: for a
    /// ring that outlives its process and is recovered.
    Crc32c,
    /// No crc: for a ring that lives only as long as one run (memory, not durability).
    Off,
}

/// The shared mapping; the producer and the consumer each hold one.
pub struct Ring {
    region: Region,
    capacity: u64,
    checksums: Checksums,
}

// SAFETY: `Ring` is a mapping (heap bytes in a loom build, sync.rs) plus a length. The only bytes written through it from two threads
// are the frame area and the two counters, and the protocol in the module doc keeps them apart:
// the producer writes only frame bytes in [tail, head + capacity) and `tail`; the consumer reads
// only frame bytes in [head, tail) and writes only `head`; the counters are atomics.
unsafe impl Send for Ring {}
// SAFETY: see `Send`.
unsafe impl Sync for Ring {}

impl Ring {
    /// A ring in a heap buffer with loom's atomics, for the model-checking tests.
    #[cfg(all(test, braid_loom))]
    fn in_memory(capacity: usize) -> (Producer, Consumer) {
        assert!(capacity > 0 && capacity.is_multiple_of(FRAME_HEADER));
        let ring = Ring { region: Region::heap(capacity), capacity: capacity as u64, checksums: Checksums::Crc32c };
        ring.counter(CAPACITY_AT).store(capacity as u64, Ordering::Relaxed);
        ring.split()
    }

    /// Creates a new ring file with room for `capacity` bytes of frames, every frame with its
    /// crc ([`Checksums::Crc32c`]).
    pub fn create(path: &Path, capacity: usize) -> Result<(Producer, Consumer), RingError> {
        Ring::create_with(path, capacity, Checksums::Crc32c)
    }

    /// Creates a new ring file with room for `capacity` bytes of frames.
    pub fn create_with(path: &Path, capacity: usize, checksums: Checksums) -> Result<(Producer, Consumer), RingError> {
        if capacity == 0 || !capacity.is_multiple_of(FRAME_HEADER) {
            return Err(RingError::BadCapacity(capacity));
        }
        let file = MappedFile::create(path, MAGIC, VERSION, FRAMES_AT + capacity)?;
        let ring = Ring { region: Region::new(file), capacity: capacity as u64, checksums };
        ring.counter(CAPACITY_AT).store(capacity as u64, Ordering::Relaxed);
        let flags = if checksums == Checksums::Off { FLAG_NO_CRC } else { 0 };
        ring.counter(FLAGS_AT).store(flags, Ordering::Relaxed);
        ring.region.file().flush_data(0, FRAMES_AT)?;
        Ok(ring.split())
    }

    /// Opens a ring after a restart: checks its frames and resumes from the consumer's position.
    pub fn open(path: &Path) -> Result<(Producer, Consumer), RingError> {
        let file = MappedFile::open(path, MAGIC, VERSION)?;
        let damaged = |reason: String| RingError::Damaged { path: path.display().to_string(), reason };
        if file.data_len() < FRAMES_AT {
            return Err(damaged("shorter than its header".into()));
        }
        let mut ring = Ring { region: Region::new(file), capacity: 0, checksums: Checksums::Crc32c };
        let capacity = ring.counter(CAPACITY_AT).load(Ordering::Relaxed);
        let flags = ring.counter(FLAGS_AT).load(Ordering::Relaxed);
        if flags & !FLAG_NO_CRC != 0 {
            return Err(damaged(format!("unknown flags {flags:#x}")));
        }
        if flags & FLAG_NO_CRC != 0 {
            ring.checksums = Checksums::Off;
        }
        if capacity == 0
            || capacity as usize != ring.region.file().data_len() - FRAMES_AT
            || !capacity.is_multiple_of(FRAME_HEADER as u64)
        {
            return Err(damaged(format!("capacity {capacity} does not match the file")));
        }
        ring.capacity = capacity;
        let (head, tail) =
            (ring.counter(HEAD_AT).load(Ordering::Relaxed), ring.counter(TAIL_AT).load(Ordering::Relaxed));
        if head > tail
            || tail - head > capacity
            || !head.is_multiple_of(FRAME_HEADER as u64)
            || !tail.is_multiple_of(FRAME_HEADER as u64)
        {
            return Err(damaged(format!("head {head} and tail {tail} are inconsistent")));
        }
        let good = ring.last_good_frame_end(head, tail);
        ring.counter(TAIL_AT).store(good, Ordering::Relaxed);
        Ok(ring.split())
    }

    fn split(self) -> (Producer, Consumer) {
        let ring = Arc::new(self);
        let tail = ring.counter(TAIL_AT).load(Ordering::Relaxed);
        let head = ring.counter(HEAD_AT).load(Ordering::Relaxed);
        (
            Producer { ring: ring.clone(), tail, head_seen: head, committed: tail, pages: None },
            Consumer { ring, head, tail_seen: head },
        )
    }

    #[inline]
    fn counter(&self, at: usize) -> &AtomicU64 {
        self.region.counter(at)
    }

    /// Offset in the frame area of ring position `pos` (taken modulo the capacity).
    #[inline]
    fn at(&self, pos: u64) -> usize {
        (pos % self.capacity) as usize
    }

    /// Bytes from `pos` to the end of the frame area.
    fn room_to_end(&self, pos: u64) -> u64 {
        self.capacity - pos % self.capacity
    }

    fn read_header(&self, pos: u64) -> [u32; 4] {
        self.read_header_at(self.at(pos))
    }

    /// [`read_header`](Self::read_header) at offset `at` of the frame area (a position's, [`at`](Self::at)).
    #[inline]
    fn read_header_at(&self, at: usize) -> [u32; 4] {
        let mut header = [0u8; FRAME_HEADER];
        // SAFETY: positions are multiples of 16 and the area is a multiple of 16, so a header at
        // `at` (a position's offset) lies wholly before the end; the caller owns those 16 bytes by
        // the protocol.
        unsafe { self.region.read(at, &mut header) };
        let word = |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        [word(0), word(4), word(8), word(12)]
    }

    /// Walks the frames in [head, tail) checking crcs (only their layout without checksums); the
    /// end of the last good one.
    fn last_good_frame_end(&self, head: u64, tail: u64) -> u64 {
        let mut pos = head;
        while pos < tail {
            let [len, kind, crc, _] = self.read_header(pos);
            if kind == WRAP {
                pos += self.room_to_end(pos);
                continue;
            }
            let size = frame_size(len as usize) as u64;
            if FrameKind::from_u32(kind).is_none() || size > self.room_to_end(pos) || pos + size > tail {
                return pos;
            }
            if self.checksums == Checksums::Off {
                pos += size;
                continue;
            }
            // SAFETY: the payload lies within [pos + 16, pos + size), inside the area (checked
            // against room_to_end), and nothing else runs during recovery.
            let good = unsafe {
                self.region.with_slice(self.at(pos + FRAME_HEADER as u64), len as usize, |payload| {
                    frame_crc(kind, len, payload) == crc
                })
            };
            if !good {
                return pos;
            }
            pos += size;
        }
        pos
    }
}

fn frame_size(payload: usize) -> usize {
    FRAME_HEADER + payload.next_multiple_of(FRAME_HEADER)
}

fn frame_crc(kind: u32, len: u32, payload: &[u8]) -> u32 {
    let mut header = [0u8; 8];
    header[..4].copy_from_slice(&len.to_le_bytes());
    header[4..].copy_from_slice(&kind.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&header), payload)
}

/// The largest payload a frame can carry in a ring of `capacity` bytes
/// ([`Producer::max_payload`]; configuration checks use it before any ring exists).
pub const fn max_payload(capacity: usize) -> usize {
    (capacity / 2 / FRAME_HEADER * FRAME_HEADER).saturating_sub(FRAME_HEADER)
}

/// The writing end. Frames become visible to the consumer at [`commit`](Producer::commit).
pub struct Producer {
    ring: Arc<Ring>,
    /// Where the next frame goes.
    tail: u64,
    /// The consumer's head as last loaded (a lower bound of the real one).
    head_seen: u64,
    /// The tail the consumer has been shown.
    committed: u64,
    /// Set by [`give_back_pages`](Producer::give_back_pages).
    pages: Option<GivenBack>,
}

/// The chunks of the frame area whose pages a producer gave back (module doc "Giving pages
/// back").
struct GivenBack {
    /// Bytes of a chunk: a multiple of [`FRAME_HEADER`] that divides the capacity.
    chunk: u64,
    /// Bit i: chunk i (area bytes `[i × chunk, (i + 1) × chunk)`) is given back.
    away: u64,
    /// The chunk of positions (position / chunk) the last write reached; a write that reaches
    /// another one looks for chunks to give back first.
    reached: u64,
    /// The chunk of positions at which an early wrap last looked at the consumer's head.
    looked: u64,
    /// The last early wrap: its marker's position and the bytes it skipped ([`Producer::used_bytes`]
    /// does not count them). One at most can wait: the next needs the consumer past this one.
    early_wrap: Option<(u64, u64)>,
    /// The file system refused a hole: nothing more is given back.
    refused: bool,
}

/// Chunks at the start of the area a producer keeps its frames in while the consumer keeps up:
/// never given back.
const WINDOW_CHUNKS: u64 = 2;

impl GivenBack {
    fn window(&self) -> u64 {
        WINDOW_CHUNKS * self.chunk
    }

    /// The bits of every chunk beyond the window: all given back, there is nothing to look for.
    fn beyond_window(&self, chunks: u64) -> u64 {
        let all = if chunks == 64 { u64::MAX } else { (1 << chunks) - 1 };
        all & !((1 << WINDOW_CHUNKS) - 1)
    }
}

/// The most chunks [`Producer::give_back_pages`] tracks (one bit each).
pub const MAX_GIVE_BACK_CHUNKS: u64 = 64;

impl Producer {
    /// The largest payload a frame can carry in this ring: a frame of at most half the capacity
    /// always fits an empty ring, wrap included (if it does not fit before the end, more than
    /// half the area lies before its position).
    pub fn max_payload(&self) -> usize {
        max_payload(self.ring.capacity as usize)
    }

    /// Appends a frame; it is published at the next [`commit`](Self::commit).
    pub fn push(&mut self, kind: FrameKind, payload: &[u8]) -> Result<(), PushError> {
        if payload.len() > self.max_payload() {
            return Err(PushError::TooLarge);
        }
        let size = frame_size(payload.len()) as u64;
        let to_end = self.ring.room_to_end(self.tail);
        // A ring that gives no pages back pays one test for the early wrap, not a call.
        let wraps = size > to_end || (self.pages.is_some() && self.wraps_early(size, to_end));
        let need = if wraps { size + to_end } else { size };
        if self.tail + need - self.head_seen > self.ring.capacity {
            self.head_seen = self.ring.counter(HEAD_AT).load(Ordering::Acquire);
            if self.tail + need - self.head_seen > self.ring.capacity {
                return Err(PushError::Full);
            }
        }
        if self.pages.is_some() {
            let skip = if wraps { to_end } else { 0 };
            self.pages_for(skip, size).map_err(PushError::NoSpace)?;
        }
        if wraps {
            if let Some(pages) = self.pages.as_mut().filter(|_| size <= to_end) {
                pages.early_wrap = Some((self.tail, to_end));
            }
            self.write_header(WRAP, 0, 0);
            self.tail += to_end;
        }
        let len = payload.len() as u32;
        let crc = match self.ring.checksums {
            Checksums::Crc32c => frame_crc(kind as u32, len, payload),
            Checksums::Off => 0,
        };
        self.write_header(kind as u32, len, crc);
        // SAFETY: [tail + 16, tail + size) is inside the area (size ≤ room to the end, ensured
        // by the wrap above; an early wrap only moves the frame to the start) and free: tail +
        // size ≤ head + capacity, checked above, so the consumer has released these bytes and
        // will not read them before the next commit. With pages given back, `pages_for` took
        // back every chunk the header and the payload touch: no byte is written into a hole.
        unsafe { self.ring.region.write(self.ring.at(self.tail + FRAME_HEADER as u64), payload) };
        self.tail += size;
        Ok(())
    }

    /// From now on, keeps its frames in the first two `chunk`s of the area while the consumer
    /// keeps up, gives back the pages of the chunks beyond them that hold no frame, and takes
    /// those back before writing there (module doc "Giving pages back"). `chunk` must be a
    /// multiple of [`FRAME_HEADER`] dividing the capacity into at most [`MAX_GIVE_BACK_CHUNKS`],
    /// and at least four. Every page of the area is taken back first, so a ring reopened after a
    /// run that gave pages back has no hole left.
    pub fn give_back_pages(&mut self, chunk: usize) -> std::io::Result<()> {
        let (capacity, chunk) = (self.ring.capacity, chunk as u64);
        if chunk == 0
            || !chunk.is_multiple_of(FRAME_HEADER as u64)
            || !capacity.is_multiple_of(chunk)
            || capacity / chunk > MAX_GIVE_BACK_CHUNKS
            || capacity / chunk < 4
        {
            let reason = format!("chunks of {chunk} bytes do not divide a {capacity}-byte ring into 4 to 64");
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, reason));
        }
        self.ring.region.take_back(0, capacity as usize)?;
        let pages = GivenBack { chunk, away: 0, reached: u64::MAX, looked: u64::MAX, early_wrap: None, refused: false };
        self.pages = Some(pages);
        Ok(())
    }

    /// Whether a frame of `size` bytes that fits before the end of the area goes to its start
    /// instead: it would end past the window while the consumer keeps up (at most half a window
    /// of frames wait, and the frame fits at the start). The consumer's head is looked at afresh
    /// at most once per chunk of positions, so a ring with a backlog pays no atomic per frame.
    fn wraps_early(&mut self, size: u64, to_end: u64) -> bool {
        let Some(pages) = &mut self.pages else { return false };
        let (window, at) = (pages.window(), self.ring.capacity - to_end);
        if at + size <= window {
            return false;
        }
        let chunk = self.tail / pages.chunk;
        if self.tail - self.head_seen > window / 2 && pages.looked != chunk {
            pages.looked = chunk;
            self.head_seen = self.ring.counter(HEAD_AT).load(Ordering::Acquire);
        }
        let waiting = self.tail - self.head_seen;
        waiting <= window / 2 && waiting + size <= at
    }

    /// Before a frame of `size` bytes is written `skip` bytes after the tail (a wrap marker at the
    /// tail when `skip` is not 0): when it reaches a chunk the last write did not, the chunks
    /// beyond the window that lie wholly in free space are given back; then the chunks the marker
    /// and the frame touch are taken back (not the ones skipped). Err: the errno of a failed
    /// take-back.
    fn pages_for(&mut self, skip: u64, size: u64) -> Result<(), i32> {
        let Some(pages) = &mut self.pages else { return Ok(()) };
        let chunks = self.ring.capacity / pages.chunk;
        let (start, end) = (self.tail + skip, self.tail + skip + size);
        if (end - 1) / pages.chunk != pages.reached && !pages.refused && pages.away != pages.beyond_window(chunks) {
            pages.reached = (end - 1) / pages.chunk;
            // Acquire: the consumer's reads of the bytes given back happen before the hole.
            self.head_seen = self.ring.counter(HEAD_AT).load(Ordering::Acquire);
            give_back_free(&self.ring, pages, end, self.head_seen + self.ring.capacity);
        }
        let marker = (skip > 0).then_some(self.tail / pages.chunk);
        for chunk in marker.into_iter().chain(start / pages.chunk..=(end - 1) / pages.chunk) {
            let bit = 1 << (chunk % chunks);
            if pages.away & bit != 0 {
                let at = ((chunk % chunks) * pages.chunk) as usize;
                self.ring.region.take_back(at, pages.chunk as usize).map_err(|e| e.raw_os_error().unwrap_or(0))?;
                pages.away &= !bit;
            }
        }
        Ok(())
    }

    fn write_header(&self, kind: u32, len: u32, crc: u32) {
        let mut header = [0u8; FRAME_HEADER];
        header[..4].copy_from_slice(&len.to_le_bytes());
        header[4..8].copy_from_slice(&kind.to_le_bytes());
        header[8..12].copy_from_slice(&crc.to_le_bytes());
        // SAFETY: [tail, tail + 16) is inside the area (positions and the area are multiples of
        // 16) and free, as argued in `push`.
        unsafe { self.ring.region.write(self.ring.at(self.tail), &header) };
    }

    /// Publishes every frame pushed so far. Returns whether there were any.
    pub fn commit(&mut self) -> bool {
        if self.tail == self.committed {
            return false;
        }
        self.ring.counter(TAIL_AT).store(self.tail, Ordering::Release);
        self.committed = self.tail;
        true
    }

    /// How far the consumer has released (a position that only grows): a consumer that keeps
    /// it still while frames wait is not making progress.
    pub fn released(&self) -> u64 {
        self.ring.counter(HEAD_AT).load(Ordering::Acquire)
    }

    /// The caller is about to wait for room (a push found the ring full): asks the consumer to
    /// wake it when it releases space. Try the push (or look at [`used_bytes`](Self::used_bytes))
    /// once more after this and before sleeping: space released before the flag was seen is
    /// found then (module doc "Asking for room").
    pub fn want_room(&self) {
        self.ring.counter(ROOM_WANTED_AT).swap(1, Ordering::AcqRel);
    }

    /// Bytes committed and not yet released by the consumer, but for the area an early wrap
    /// skipped (it holds no frame, and the consumer jumps it as soon as it reads the marker).
    pub fn used_bytes(&self) -> u64 {
        let head = self.ring.counter(HEAD_AT).load(Ordering::Acquire);
        let skipped = match self.pages.as_ref().and_then(|pages| pages.early_wrap) {
            // Committed and not passed yet: committed ≥ at + skip + a frame, so no underflow.
            Some((at, skip)) if head <= at && self.committed > at => skip,
            _ => 0,
        };
        self.committed - head - skipped
    }
}

/// Gives back every chunk beyond the window not given back yet that lies wholly in positions
/// `[from, to)`: free space, which the consumer has released (or never held a frame in) and the
/// producer writes nothing to before a later write takes it back.
#[cold]
fn give_back_free(ring: &Ring, pages: &mut GivenBack, from: u64, to: u64) {
    let chunks = ring.capacity / pages.chunk;
    let mut start = from.next_multiple_of(pages.chunk);
    while start + pages.chunk <= to {
        let index = (start / pages.chunk) % chunks;
        if index >= WINDOW_CHUNKS && pages.away & (1 << index) == 0 {
            match ring.region.give_back((index * pages.chunk) as usize, pages.chunk as usize) {
                Ok(()) => pages.away |= 1 << index,
                Err(error) => {
                    tracing::debug!(%error, "a ring keeps its pages: the file system punches no holes");
                    pages.refused = true;
                    return;
                }
            }
        }
        start += pages.chunk;
    }
}

/// The reading end.
pub struct Consumer {
    ring: Arc<Ring>,
    /// Where the next unread frame starts.
    head: u64,
    /// The producer's tail as last loaded.
    tail_seen: u64,
}

/// One frame read from the ring; its payload borrows the ring until the batch is released.
pub struct Frame<'a> {
    pub kind: FrameKind,
    pub payload: &'a [u8],
}

impl Consumer {
    /// Reads every committed frame not read yet, in order, then releases their space to the
    /// producer. `visit` sees each payload in place (zero copy). Returns the number of frames.
    pub fn read_batch(&mut self, mut visit: impl FnMut(Frame<'_>)) -> usize {
        self.tail_seen = self.ring.counter(TAIL_AT).load(Ordering::Acquire);
        let start = self.head;
        let mut frames = 0;
        while self.head < self.tail_seen {
            // The frame's offset, taken once: frames never wrap, so its payload follows its
            // header in the area (a modulo, a division, per frame rather than two).
            let at = self.ring.at(self.head);
            let [len, kind, _crc, _] = self.ring.read_header_at(at);
            if kind == WRAP {
                self.head += self.ring.capacity - at as u64;
                continue;
            }
            // Frames this process committed are trusted (STYLE.md 8); `open` checked the rest.
            let Some(kind) = FrameKind::from_u32(kind) else { break };
            // SAFETY: [at + 16, at + 16 + len) — the ring positions [head + 16, head + 16 + len) —
            // lies inside the area (frames never wrap) and below the Acquire-loaded tail, so the
            // producer finished writing it and will not touch it before `head` moves past it (the
            // Release store below).
            unsafe {
                self.ring.region.with_slice(at + FRAME_HEADER, len as usize, |payload| visit(Frame { kind, payload }))
            };
            self.head += frame_size(len as usize) as u64;
            frames += 1;
        }
        // A poll of an empty ring writes nothing: the producer reads this cache line.
        if self.head != start {
            self.ring.counter(HEAD_AT).store(self.head, Ordering::Release);
        }
        frames
    }

    /// After a [`read_batch`](Self::read_batch) that released frames: whether the producer waits
    /// for room ([`Producer::want_room`]) and must be woken. Clears the request.
    pub fn room_wanted(&self) -> bool {
        self.ring.counter(ROOM_WANTED_AT).swap(0, Ordering::AcqRel) != 0
    }

    /// Whether committed frames are waiting.
    pub fn has_frames(&self) -> bool {
        self.ring.counter(TAIL_AT).load(Ordering::Acquire) > self.head
    }
}

#[cfg(all(test, braid_loom))]
mod loom_tests;
#[cfg(test)]
mod tests;
