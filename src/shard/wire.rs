//! Frame payloads between the feeder, the shards and the collector.
//!
//! Every payload starts with a fixed header whose length is a multiple of 16, so a row archive
//! after it starts 16-byte aligned (what [`access_unchecked`] needs). Integers are little endian.
//!
//! | kind | header | then |
//! |---|---|---|
//! | `Row` | seq u64, stream u32, pad | archived row |
//! | `Tick` | seq u64, pad, t i128, n streams u32, n operators u32, pad; per stream watermark i128; per stream and operator idle u8 | |
//! | `ProcessingTime` | seq u64, downtime u8 (1: braid was down until `now`: it moves no `ttl` clock), pad, now i128 | |
//! | `EndOfInput`, `Progress` | seq u64, pad | |
//! | `Exchange` | operator u32, input u32, pad, tag | archived row |
//! | `Frontier` | operator u32, pad, tag | |
//! | `TickDone` | operator u32, pad, seq u64, watermark i128 | |
//! | `Output` | operator u32, side u32 ([`Side::code`](crate::operator::Side): a result, a late or expired row, a too-large stand-in), pad | archived row |
//! | `Barrier` | seq u64, epoch u64, base u64 (the checkpoint a snapshot may be a delta of; 0: none) | |
//! | `Passed` | operator u32 ([`SHARD_DONE`]: the whole shard), pad, epoch u64 | |
//!
//! Reading is unchecked (no crc, no bytecheck: STYLE.md 8), so [`read`] is an `unsafe fn`: its
//! callers state, in a `SAFETY:` comment, that the bytes come from a ring the runtime created in
//! this run and that only a [`Writer`] filled.

use crate::operator::Side;
use crate::record::frame::{FrameError, RowEncoder, access_unchecked};
use crate::record::view::RowView;
use crate::record::{ArchivedRow, Row};
use crate::ring::FrameKind;
use crate::time::clock::InputTime;
use crate::time::{Tick, Time};

use super::tag::{TAG_BYTES, Tag};

/// `Passed` frames of a whole shard (its snapshot is written) carry this instead of an operator.
pub const SHARD_DONE: u32 = u32::MAX;
/// `Passed` frames of a shard that could not write its snapshot carry this.
pub const SHARD_FAILED: u32 = u32::MAX - 1;

/// The longest header before a row archive in any frame (`Exchange`: 8 bytes and a tag, padded):
/// an archive of at most a ring's largest payload minus this fits every frame kind.
pub const ROW_HEADER_MAX: usize = (8 + TAG_BYTES).next_multiple_of(16);

/// Builds payloads in one buffer it keeps.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
    /// Bytes of the last row archived (checked against the rings' limit).
    pub row_len: usize,
    rows: RowEncoder,
}

impl Writer {
    fn start(&mut self) -> &mut Vec<u8> {
        self.buf.clear();
        &mut self.buf
    }

    fn pad16(&mut self) {
        let padded = self.buf.len().next_multiple_of(16);
        self.buf.resize(padded, 0);
    }

    fn row(&mut self, row: RowView<'_>) -> Result<(), FrameError> {
        self.pad16();
        let archived = self.rows.encode(row)?;
        self.row_len = archived.len();
        self.buf.extend_from_slice(archived);
        Ok(())
    }

    pub fn row_event<'r>(&mut self, seq: u64, stream: usize, row: impl Into<RowView<'r>>) -> Result<&[u8], FrameError> {
        let b = self.start();
        b.extend_from_slice(&seq.to_le_bytes());
        b.extend_from_slice(&(stream as u32).to_le_bytes());
        self.row(row.into())?;
        Ok(&self.buf)
    }

    pub fn tick(&mut self, event: &TickEvent) -> &[u8] {
        let tick = &event.tick;
        let b = self.start();
        b.extend_from_slice(&event.seq.to_le_bytes());
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&tick.t.to_le_bytes());
        b.extend_from_slice(&(tick.streams.len() as u32).to_le_bytes());
        b.extend_from_slice(&(tick.op_idle.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0; 8]);
        for s in &tick.streams {
            b.extend_from_slice(&s.watermark.raw().to_le_bytes());
        }
        b.extend(tick.streams.iter().map(|s| u8::from(s.idle)));
        b.extend(tick.op_idle.iter().map(|&i| u8::from(i)));
        &self.buf
    }

    /// `ProcessingTime` (`now`), or `EndOfInput` and `Progress` (`None`).
    pub fn event(&mut self, seq: u64, now: Option<i128>) -> &[u8] {
        let b = self.start();
        b.extend_from_slice(&seq.to_le_bytes());
        b.extend_from_slice(&[0; 8]);
        if let Some(now) = now {
            b.extend_from_slice(&now.to_le_bytes());
        }
        &self.buf
    }

    /// A `ProcessingTime` frame saying braid was down until `now` (the service's start).
    pub fn downtime_ends(&mut self, seq: u64, now: i128) -> &[u8] {
        self.event(seq, Some(now));
        self.buf[8] = 1;
        &self.buf
    }

    pub fn barrier(&mut self, seq: u64, epoch: u64, base: u64) -> &[u8] {
        let b = self.start();
        b.extend_from_slice(&seq.to_le_bytes());
        b.extend_from_slice(&epoch.to_le_bytes());
        b.extend_from_slice(&base.to_le_bytes());
        &self.buf
    }

    /// Operator `op` ([`SHARD_DONE`]: the shard) passed the barrier of checkpoint `epoch`.
    pub fn passed(&mut self, op: u32, epoch: u64) -> &[u8] {
        let b = self.start();
        b.extend_from_slice(&u64::from(op).to_le_bytes());
        b.extend_from_slice(&epoch.to_le_bytes());
        &self.buf
    }

    pub fn exchange(&mut self, op: usize, input: usize, tag: &Tag, row: &Row) -> Result<&[u8], FrameError> {
        let b = self.start();
        b.extend_from_slice(&(op as u32).to_le_bytes());
        b.extend_from_slice(&(input as u32).to_le_bytes());
        tag.encode(b);
        self.row(row.into())?;
        Ok(&self.buf)
    }

    pub fn frontier(&mut self, op: usize, tag: &Tag) -> &[u8] {
        let b = self.start();
        b.extend_from_slice(&(op as u64).to_le_bytes());
        tag.encode(b);
        &self.buf
    }

    pub fn tick_done(&mut self, op: usize, seq: u64, watermark: Time) -> &[u8] {
        let b = self.start();
        b.extend_from_slice(&(op as u64).to_le_bytes());
        b.extend_from_slice(&seq.to_le_bytes());
        b.extend_from_slice(&watermark.raw().to_le_bytes());
        &self.buf
    }

    /// A row of `op`'s output `side`.
    pub fn output(&mut self, op: usize, side: Side, row: &Row) -> Result<&[u8], FrameError> {
        let b = self.start();
        b.extend_from_slice(&(op as u32).to_le_bytes());
        b.extend_from_slice(&side.code().to_le_bytes());
        self.row(row.into())?;
        Ok(&self.buf)
    }

    /// [`output`](Self::output) of a row already archived (`archive`: what [`RowEncoder`] or
    /// [`RowArchives`](crate::record::archiver::RowArchives) wrote).
    pub fn output_archive(&mut self, op: usize, side: Side, archive: &[u8]) -> &[u8] {
        let b = self.start();
        b.extend_from_slice(&(op as u32).to_le_bytes());
        b.extend_from_slice(&side.code().to_le_bytes());
        self.pad16();
        self.row_len = archive.len();
        self.buf.extend_from_slice(archive);
        &self.buf
    }
}

/// A watermark tick as every shard sees it: what the tick planner decided, with the feeder's
/// sequence number.
#[derive(Clone, Debug, PartialEq)]
pub struct TickEvent {
    pub seq: u64,
    pub tick: Tick,
}

/// A frame read back. Rows borrow the ring.
pub enum Frame<'a> {
    /// `bytes`: the row's archive (what an arena stores as it is).
    Row {
        seq: u64,
        stream: usize,
        row: &'a ArchivedRow,
        bytes: &'a [u8],
    },
    Tick(TickEvent),
    ProcessingTime {
        seq: u64,
        now: i128,
        /// Braid was down until `now` ([`Writer::downtime_ends`]).
        downtime: bool,
    },
    End {
        seq: u64,
    },
    Progress {
        seq: u64,
    },
    Exchange {
        op: usize,
        input: usize,
        tag: Tag,
        row: &'a ArchivedRow,
    },
    Frontier {
        op: usize,
        tag: Tag,
    },
    TickDone {
        op: usize,
        seq: u64,
        watermark: Time,
    },
    Output {
        op: usize,
        side: Side,
        row: &'a ArchivedRow,
        /// The row's archive, as the frame holds it.
        archive: &'a [u8],
    },
    Barrier {
        seq: u64,
        epoch: u64,
        base: u64,
    },
    Passed {
        op: u32,
        epoch: u64,
    },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn i128_at(b: &[u8], at: usize) -> i128 {
    let mut w = [0; 16];
    w.copy_from_slice(&b[at..at + 16]);
    i128::from_le_bytes(w)
}

/// Reads a frame back without checking it (STYLE.md 8: frames this process wrote are trusted).
///
/// # Safety
///
/// `p` must be, unchanged, a payload that a [`Writer`] of this build wrote for a frame of kind
/// `kind` in this run — in practice a frame read from a ring this process created
/// (`Ring::create`) and filled only with [`Writer`] payloads, never one from a ring file of an
/// earlier run or from anywhere else — and `p` must start 16-byte aligned (ring payloads do).
/// Row archives inside it are accessed without validation: other bytes are undefined behaviour,
/// not an error.
pub unsafe fn read(kind: FrameKind, p: &[u8]) -> Frame<'_> {
    // A row's archive follows a header of `at` bytes, padded to a multiple of 16 (`pad16`).
    let archive = |at: usize| &p[usize::next_multiple_of(at, 16)..];
    let row = |at: usize| {
        // SAFETY: the caller guarantees (`# Safety`) the bytes after the header are exactly what
        // `Writer::row` archived (this build, this run), unchanged, with `p` 16-byte aligned;
        // every header is padded to a multiple of 16, so the archive is aligned too.
        unsafe { access_unchecked(archive(at)) }
    };
    match kind {
        FrameKind::Row => {
            Frame::Row { seq: u64_at(p, 0), stream: u32_at(p, 8) as usize, row: row(12), bytes: &p[16..] }
        }
        FrameKind::Tick => {
            let (streams, ops) = (u32_at(p, 32) as usize, u32_at(p, 36) as usize);
            let idle_at = 48 + 16 * streams;
            Frame::Tick(TickEvent {
                seq: u64_at(p, 0),
                tick: Tick {
                    t: i128_at(p, 16),
                    streams: (0..streams)
                        .map(|s| InputTime {
                            watermark: Time::from_i128(i128_at(p, 48 + 16 * s)),
                            idle: p[idle_at + s] != 0,
                        })
                        .collect(),
                    op_idle: (0..ops).map(|o| p[idle_at + streams + o] != 0).collect(),
                },
            })
        }
        FrameKind::ProcessingTime => Frame::ProcessingTime {
            seq: u64_at(p, 0),
            now: i128_at(p, 16),
            downtime: p.get(8).is_some_and(|&b| b == 1),
        },
        FrameKind::EndOfInput => Frame::End { seq: u64_at(p, 0) },
        FrameKind::Progress | FrameKind::Idle => Frame::Progress { seq: u64_at(p, 0) },
        FrameKind::Exchange => Frame::Exchange {
            op: u32_at(p, 0) as usize,
            input: u32_at(p, 4) as usize,
            tag: Tag::decode(&p[8..]),
            row: row(8 + TAG_BYTES),
        },
        FrameKind::Frontier => Frame::Frontier { op: u64_at(p, 0) as usize, tag: Tag::decode(&p[8..]) },
        FrameKind::TickDone => {
            Frame::TickDone { op: u64_at(p, 0) as usize, seq: u64_at(p, 8), watermark: Time::from_i128(i128_at(p, 16)) }
        }
        FrameKind::Output => {
            Frame::Output { op: u32_at(p, 0) as usize, side: Side::of(u32_at(p, 4)), row: row(8), archive: archive(8) }
        }
        FrameKind::Barrier => Frame::Barrier { seq: u64_at(p, 0), epoch: u64_at(p, 8), base: u64_at(p, 16) },
        FrameKind::Passed => Frame::Passed { op: u64_at(p, 0) as u32, epoch: u64_at(p, 8) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::frame::to_row;
    use crate::record::{Key, Value};
    use rkyv::util::AlignedVec;

    fn row() -> Row {
        Row { ts: 5, key: Key::Str("dev-1".into()), key_hash: 9, id: 11, values: vec![Value::Int(3)].into() }
    }

    fn aligned(bytes: &[u8]) -> AlignedVec<16> {
        let mut words = AlignedVec::new();
        words.extend_from_slice(bytes);
        words
    }

    /// Reads back a payload `Writer` just wrote, copied to a 16-aligned buffer.
    fn read_back(kind: FrameKind, words: &AlignedVec<16>, len: usize) -> Frame<'_> {
        // SAFETY: `words` holds, unchanged and 16-aligned, a payload of kind `kind` that a
        // `Writer` wrote in this test.
        unsafe { read(kind, &words[..len]) }
    }

    #[test]
    fn frames_round_trip() {
        let mut w = Writer::default();
        let tag = Tag::event(3).child(2, 1, 0, 4, Some(7)).unwrap();
        let p = w.exchange(2, 1, &tag, &row()).unwrap().to_vec();
        let words = aligned(&p);
        match read_back(FrameKind::Exchange, &words, p.len()) {
            Frame::Exchange { op: 2, input: 1, tag: t, row: r } => {
                assert_eq!(t, tag);
                assert_eq!(to_row(r), row());
            }
            _ => panic!("not an exchange frame"),
        }
        let tick = TickEvent {
            seq: 8,
            tick: Tick {
                t: 1_000,
                streams: vec![
                    InputTime { watermark: Time::NEG_INF, idle: true },
                    InputTime { watermark: Time::ms(5), idle: false },
                ],
                op_idle: vec![false, true, true],
            },
        };
        let p = w.tick(&tick).to_vec();
        let words = aligned(&p);
        assert!(matches!(read_back(FrameKind::Tick, &words, p.len()), Frame::Tick(t) if t == tick));
        let p = w.output(4, Side::Result, &row()).unwrap().to_vec();
        let words = aligned(&p);
        assert!(
            matches!(read_back(FrameKind::Output, &words, p.len()), Frame::Output { op: 4, side: Side::Result, row: r, .. } if to_row(r) == row())
        );
    }
}
