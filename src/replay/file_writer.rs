//! An output file written by a thread of its own.
//!
//! Replay's calling thread decodes every input line, feeds the shards and collects every result:
//! it is the busy one (BENCHMARKS.md). Writing a result as JSON and handing the text to the
//! kernel (`write`, the copy into the page cache, a file system's block allocation) need not be
//! on it. So each output file has a writer thread, and the calling thread only copies what is to
//! be written into a chunk of [`CHUNK`] bytes:
//!
//! - a result read in place from its frame goes as its archive bytes, and the writer thread
//!   writes its line (`json::write_result`, the file's schema);
//! - any other line (an input row, a late or expired row, a dead letter) goes as its text.
//!
//! Chunks go to the writer thread and come back emptied to be filled again, so the steady state
//! allocates nothing. At most [`IN_FLIGHT`] chunks wait: memory stays bounded, and a slow disk
//! holds the replay back instead of growing it.
//!
//! The writer thread also keeps the file's part in checkpoints (replay/output.rs): the bytes
//! written, the hashes of the lines written after a barrier, and, for a resumed file, the lines
//! already in it, which it does not write again. [`checkpoint`](FileWriter::checkpoint) waits
//! until every line given so far is written (and synced, when asked) and returns that state. The
//! first error is kept and returned by every later call; nothing after it is written.
//!
//! Chunk layout: records one after the other, each at a multiple of 16 bytes (the chunk is
//! 16-aligned, so an archive lies where rkyv can read it): a 16-byte header (kind u8 — 0 text,
//! 1 archived result; after-barrier u8; 6 zero bytes; length u64, little endian), then the bytes,
//! then zeros to the next multiple of 16.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};
use rkyv::util::AlignedVec;

use crate::record::schema::Schema;
use crate::record::view::RowView;
use crate::record::{frame, json};

use super::output::FileState;

/// Bytes gathered before a chunk goes to the writer thread.
pub const CHUNK: usize = 256 << 10;
/// Chunks handed over and not yet written back.
const IN_FLIGHT: usize = 4;
/// How often a checkpoint waiting for its answer looks whether the writer thread stopped.
const ANSWER_POLL: std::time::Duration = std::time::Duration::from_millis(50);

const RECORD_HEADER: usize = 16;
const TEXT: u8 = 0;
const ARCHIVED_RESULT: u8 = 1;

type Chunk = AlignedVec<16>;

enum Order {
    Write(Chunk),
    /// Everything before is written; sync the file's data first when `true`; answer with the
    /// file's state for a checkpoint.
    Checkpoint(bool, Sender<io::Result<FileState>>),
}

/// What the writer thread keeps of its file.
pub struct Lines {
    file: BufWriter<File>,
    /// Bytes in the file.
    written: u64,
    /// Hashes of the lines written since the barrier of the checkpoint under way.
    early: Vec<u64>,
    /// Resumed: lines already in the file, by hash, with how many times each is still to come.
    skip: HashMap<u64, u32>,
    /// The schema archived results are written with (the file of an operator's results).
    schema: Option<Schema>,
    line: Vec<u8>,
}

impl Lines {
    /// `file` at its end, `written` bytes long; `skip`: lines not to write again (a resumed file).
    pub fn new(file: File, written: u64, skip: HashMap<u64, u32>, schema: Option<Schema>) -> Lines {
        Lines {
            file: BufWriter::with_capacity(CHUNK, file),
            written,
            early: Vec::new(),
            skip,
            schema,
            line: Vec::new(),
        }
    }

    fn record(&mut self, kind: u8, after_barrier: bool, bytes: &[u8]) -> io::Result<()> {
        if kind == TEXT {
            return self.write(bytes, after_barrier);
        }
        let (Some(schema), Ok(row)) = (&self.schema, frame::access(bytes)) else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a result the output file cannot read"));
        };
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        json::write_result(&mut line, schema, RowView::Archived(row));
        let written = self.write(&line, after_barrier);
        self.line = line;
        written
    }

    fn write(&mut self, line: &[u8], after_barrier: bool) -> io::Result<()> {
        // A line's hash matters only to a resumed file and to a checkpoint under way.
        if self.skip.is_empty() && !after_barrier {
            self.written += line.len() as u64;
            return self.file.write_all(line);
        }
        let hash = xxhash_rust::xxh3::xxh3_64(line);
        if let Some(count) = self.skip.get_mut(&hash).filter(|c| **c > 0) {
            // Written before the replay stopped: written again now, it would be there twice.
            *count -= 1;
        } else {
            self.file.write_all(line)?;
            self.written += line.len() as u64;
        }
        if after_barrier {
            self.early.push(hash);
        }
        Ok(())
    }

    /// Flushes (and syncs) the file; its length and the lines a restart from now must not write
    /// again: those written after the barrier, and those still to be skipped (they are in the
    /// file and still to come).
    fn checkpoint(&mut self, sync: bool) -> io::Result<FileState> {
        self.file.flush()?;
        if sync {
            self.file.get_ref().sync_data()?;
        }
        let mut early = std::mem::take(&mut self.early);
        for (&hash, &count) in &self.skip {
            early.extend(std::iter::repeat_n(hash, count as usize));
        }
        Ok(FileState { len: self.written, early })
    }
}

pub struct FileWriter {
    chunk: Chunk,
    orders: Option<Sender<Order>>,
    /// Written chunks, emptied, to be filled again.
    empties: Receiver<Chunk>,
    thread: Option<JoinHandle<io::Result<()>>>,
    /// Chunks made so far (at most [`IN_FLIGHT`] + 1).
    made: usize,
}

impl FileWriter {
    pub fn new(lines: Lines) -> io::Result<FileWriter> {
        let (orders, inbox) = bounded::<Order>(IN_FLIGHT);
        let (give_back, empties) = bounded::<Chunk>(IN_FLIGHT + 1);
        let thread = std::thread::Builder::new()
            .name("braid-output".into())
            .spawn(move || write_orders(lines, &inbox, &give_back))?;
        let chunk = Chunk::with_capacity(CHUNK);
        Ok(FileWriter { chunk, orders: Some(orders), empties, thread: Some(thread), made: 1 })
    }

    /// A line of text (ending in a newline).
    pub fn text(&mut self, line: &[u8], after_barrier: bool) -> io::Result<()> {
        self.record(TEXT, after_barrier, line)
    }

    /// A result as its archive (a result frame's row, as [`frame::RowEncoder`] wrote it): its
    /// line is written by the writer thread with the file's schema.
    pub fn archived_result(&mut self, archive: &[u8], after_barrier: bool) -> io::Result<()> {
        self.record(ARCHIVED_RESULT, after_barrier, archive)
    }

    fn record(&mut self, kind: u8, after_barrier: bool, bytes: &[u8]) -> io::Result<()> {
        let mut header = [0u8; RECORD_HEADER];
        header[0] = kind;
        header[1] = u8::from(after_barrier);
        header[8..].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
        self.chunk.extend_from_slice(&header);
        self.chunk.extend_from_slice(bytes);
        let padding = bytes.len().next_multiple_of(RECORD_HEADER) - bytes.len();
        self.chunk.extend_from_slice(&[0; RECORD_HEADER][..padding]);
        if self.chunk.len() >= CHUNK { self.hand_over() } else { Ok(()) }
    }

    /// Writes every line given so far (syncing the file's data when `sync`); the file's state for
    /// a checkpoint, or the first error the writer met.
    pub fn checkpoint(&mut self, sync: bool) -> io::Result<FileState> {
        self.hand_over()?;
        let (answer, answered) = bounded(1);
        self.send(Order::Checkpoint(sync, answer))?;
        loop {
            match answered.recv_timeout(ANSWER_POLL) {
                Ok(state) => return state,
                // A writer that stopped at an error before it read the order never answers, and a
                // channel whose receiver is gone keeps the orders queued in it (the answer's sender
                // with them): so the wait also watches the thread.
                Err(RecvTimeoutError::Timeout) if self.thread.as_ref().is_some_and(|t| !t.is_finished()) => {}
                Err(_) => return Err(self.failure()),
            }
        }
    }

    /// Hands the gathered records to the writer thread and takes an empty chunk.
    fn hand_over(&mut self) -> io::Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let next = match self.empties.try_recv() {
            Ok(empty) => empty,
            Err(_) if self.made <= IN_FLIGHT => {
                self.made += 1;
                Chunk::with_capacity(CHUNK)
            }
            // Every chunk is in flight: wait for the writer to give one back.
            Err(_) => self.empties.recv().map_err(|_| self.failure())?,
        };
        let full = std::mem::replace(&mut self.chunk, next);
        self.send(Order::Write(full))
    }

    fn send(&mut self, order: Order) -> io::Result<()> {
        let sent = self.orders.as_ref().map(|orders| orders.send(order).is_ok());
        if sent == Some(true) { Ok(()) } else { Err(self.failure()) }
    }

    /// The writer thread stopped: its error (it stops only at one, or at a panic).
    fn failure(&mut self) -> io::Error {
        self.orders = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Err(error))) => error,
            _ => io::Error::other("the output writer thread stopped"),
        }
    }
}

impl Drop for FileWriter {
    /// Writes what is left, best effort (a caller that needs the error calls `checkpoint` first).
    fn drop(&mut self) {
        let _ = self.hand_over();
        self.orders = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer thread: writes each chunk's records and gives the chunk back emptied; stops at the
/// first error (returned by `join`) or when the orders end, flushing what it wrote.
fn write_orders(mut lines: Lines, orders: &Receiver<Order>, give_back: &Sender<Chunk>) -> io::Result<()> {
    for order in orders {
        match order {
            Order::Write(mut chunk) => {
                write_records(&mut lines, &chunk)?;
                chunk.clear();
                // The owner may have gone (dropped): the chunk is then freed here.
                let _ = give_back.try_send(chunk);
            }
            Order::Checkpoint(sync, answer) => {
                let state = lines.checkpoint(sync);
                let failed = state.as_ref().err().map(|e| io::Error::new(e.kind(), e.to_string()));
                let _ = answer.send(state);
                if let Some(error) = failed {
                    return Err(error);
                }
            }
        }
    }
    lines.file.flush()
}

fn write_records(lines: &mut Lines, chunk: &[u8]) -> io::Result<()> {
    let mut at = 0;
    while let Some(header) = chunk.get(at..at + RECORD_HEADER) {
        let mut len = [0u8; 8];
        len.copy_from_slice(&header[8..]);
        let len = u64::from_le_bytes(len) as usize;
        let start = at + RECORD_HEADER;
        let Some(bytes) = chunk.get(start..start + len) else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a torn output record"));
        };
        lines.record(header[0], header[1] == 1, bytes)?;
        at = start + len.next_multiple_of(RECORD_HEADER);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::record::frame::RowEncoder;
    use crate::record::schema::{Field, FieldType, TimeSpec};
    use crate::record::{Key, Row, Value};

    fn schema() -> Schema {
        let field = |name: &str, ty| Field { name: name.into(), ty, nullable: false };
        Schema::new(vec![field("device", FieldType::String), field("n", FieldType::Int)], Some(0), TimeSpec::Ingest)
    }

    fn read(path: &std::path::Path) -> Vec<u8> {
        let mut got = Vec::new();
        File::open(path).unwrap().read_to_end(&mut got).unwrap();
        got
    }

    /// Text lines and archived results, interleaved over many chunks, land in order, each result
    /// as `json::write_result` writes it; a checkpoint finds every byte on file.
    #[test]
    fn writes_text_and_archived_results_in_order_through_many_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let lines = Lines::new(File::create(&path).unwrap(), 0, HashMap::new(), Some(schema()));
        let mut writer = FileWriter::new(lines).unwrap();
        let mut encoder = RowEncoder::new();
        let mut expected = Vec::new();
        for i in 0..60_000i64 {
            if i % 3 == 0 {
                let line = format!("{{\"text\":{i}}}\n");
                writer.text(line.as_bytes(), false).unwrap();
                expected.extend_from_slice(line.as_bytes());
            } else {
                let values = vec![Value::Str(format!("dev-{i}").into()), Value::Int(i)];
                let row = Row { ts: i, key: Key::Int(i), key_hash: 7, id: i as u64, values: values.into() };
                writer.archived_result(encoder.encode(&row).unwrap(), false).unwrap();
                json::write_result(&mut expected, &schema(), RowView::Heap(&row));
            }
            if i == 30_000 {
                let state = writer.checkpoint(true).unwrap();
                assert_eq!(read(&path).len() as u64, state.len, "checkpointed: all on file");
                assert!(state.early.is_empty());
            }
        }
        assert!(expected.len() > 4 * CHUNK, "more chunks than may be in flight");
        let state = writer.checkpoint(false).unwrap();
        assert_eq!(state.len, expected.len() as u64);
        drop(writer);
        assert!(read(&path) == expected);
    }

    /// Lines after a barrier are noted by hash; lines a resumed file holds are not written again,
    /// and those still to come are named by the next checkpoint.
    #[test]
    fn notes_lines_after_the_barrier_and_skips_those_already_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let hash = |line: &str| xxhash_rust::xxh3::xxh3_64(line.as_bytes());
        let skip = HashMap::from([(hash("b\n"), 1), (hash("z\n"), 2)]);
        let mut writer = FileWriter::new(Lines::new(File::create(&path).unwrap(), 0, skip, None)).unwrap();
        for (line, early) in [("a\n", false), ("b\n", true), ("b\n", false), ("c\n", true)] {
            writer.text(line.as_bytes(), early).unwrap();
        }
        let mut state = writer.checkpoint(false).unwrap();
        state.early.sort_unstable();
        let mut expected = vec![hash("b\n"), hash("c\n"), hash("z\n"), hash("z\n")];
        expected.sort_unstable();
        assert_eq!(state.early, expected);
        assert_eq!(state.len, 6);
        drop(writer);
        assert_eq!(read(&path), b"a\nb\nc\n", "the first b was in the file already");
    }

    /// The chunk a checkpoint hands over fails (its lines overflow the write buffer): the writer
    /// stops before it reads the checkpoint's order, and the checkpoint still returns the error.
    #[test]
    fn an_error_in_the_chunk_before_a_checkpoint_is_returned_not_waited_for() {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let mut writer = FileWriter::new(Lines::new(full, 0, HashMap::new(), None)).unwrap();
        // 300 lines: the first chunk (256 lines) fits the write buffer; the second, handed over
        // by the checkpoint, overflows it.
        let line = [b'x'; 1000];
        for _ in 0..300 {
            writer.text(&line, false).unwrap();
        }
        let error = writer.checkpoint(false).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(28), "ENOSPC: {error}");
    }

    /// Lines that fit the write buffer meet the full disk only when a checkpoint flushes them.
    #[test]
    fn a_flush_error_at_a_checkpoint_is_returned() {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let mut writer = FileWriter::new(Lines::new(full, 0, HashMap::new(), None)).unwrap();
        writer.text(b"{}\n", false).unwrap();
        let error = writer.checkpoint(false).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(28), "ENOSPC: {error}");
        assert!(writer.checkpoint(false).is_err(), "and stays failed");
    }

    #[test]
    fn a_write_error_is_returned_not_lost() {
        // /dev/full: every write fails with ENOSPC.
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let mut writer = FileWriter::new(Lines::new(full, 0, HashMap::new(), None)).unwrap();
        let line = [b'x'; 1000];
        let mut failed = None;
        for _ in 0..(CHUNK * (IN_FLIGHT + 3)) / line.len() {
            if let Err(error) = writer.text(&line, false) {
                failed = Some(error);
                break;
            }
        }
        let error = failed.unwrap_or_else(|| writer.checkpoint(false).unwrap_err());
        assert_eq!(error.raw_os_error(), Some(28), "ENOSPC: {error}");
        assert!(writer.checkpoint(false).is_err(), "and stays failed");
    }
}
