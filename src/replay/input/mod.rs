//! Reading replay inputs and merging them into processing order (CONTRACT.md rule 1), in memory
//! bounded by buffers, never by the size of the inputs.
//!
//! Every non-blank line gets an arrival: its `arrival` field, else its event time when that can
//! be read (even from a line dead-lettered for another field), else the arrival of the nearest
//! earlier line of the same file, else the nearest later one, else 0. Lines of all inputs are
//! processed in order of (arrival, position of the `--input` flag, line number).
//!
//! # Design
//!
//! - **Reading.** A file is read through a [`BufReader`] of [`READ_BUFFER`] bytes, line by line,
//!   into one reused line buffer (not mmap: touched file pages would count in RSS). A line keeps
//!   at most `max(max_payload + 2, 1025)` bytes (and at most 4 GiB): anything longer is
//!   `oversized` whatever follows, and its dead letter holds only its first KiB, so a giant line
//!   costs no memory either.
//! - **First pass** ([`scan`]): every file is read once before the replay starts, decoding each
//!   line for its arrival only, to learn (a) the first arrival of the file, which the lines before
//!   it take (the "nearest later one"), and (b) whether the arrivals never decrease. Lines without
//!   an arrival copy a neighbour's, so the file is in order exactly when the arrivals it does carry
//!   never decrease. Up to a chunk's first arrival a line is read as the decoder reads it
//!   (`arrival_of_line`); after it only the arrival is read (`ordering_arrival`, the rest of the
//!   line unchecked), so a line the decoder refuses may count as carrying one: that can only
//!   send a file in order to be sorted, which leaves its order as it is. The pass keeps three
//!   numbers per file; large files are scanned in [`SCAN_CHUNK`]-byte chunks of whole lines, one
//!   thread per core. It scans every line a second time, on all cores before the shards start:
//!   the price of knowing, without holding the file, that nothing later in it comes first.
//! - **Order taken on trust** ([`Order::Trust`], a plain `braid replay` whose inputs and outputs
//!   are regular files and that takes no checkpoints): no first pass. A file is streamed from the
//!   start, its first arrival read ahead (the lines before it take it), and the first line whose
//!   arrival is below the one before it stops the reading with [`InputError::OutOfOrder`]; the
//!   replay then starts again from nothing with [`Order::Scan`] (replay/mod.rs). Files in order,
//!   the usual case, are read once; a file out of order costs the replay up to where it shows.
//! - **A pipe** (anything but a regular file) can be read only once: it is first copied to a
//!   file in the replay's private directory, whose name is removed as soon as it is open.
//! - **A file in order** is then streamed: each line decoded as it is read, its arrival the line's
//!   own, else the previous line's, else the first pass's first arrival, else 0.
//! - **A file out of order** is sorted externally: its lines (arrival filled in as above, line
//!   number, text) are collected into runs of at most `run_bytes` bytes of text
//!   ([`SORT_RUN_BYTES`], 8 MiB, unless a test asks for less), each run sorted by (arrival, line
//!   number) and appended to one unlinked temporary file in the replay's private directory (so
//!   nothing is left behind, whatever ends the process); then the runs are merged with a binary
//!   heap of their next records' (arrival, line number), each run read back through its own
//!   [`RUN_READ_BUFFER`]-byte buffer, a record's text only when the merge takes it, and decoded
//!   again then. Memory: one run and its index (8 MiB + 40 bytes a line) while sorting;
//!   `runs × RUN_READ_BUFFER` while merging (a 10 GB file: 1 280 runs, 10 MiB).
//! - **Merge of the files**: each file offers its next line (its "head"); the smallest head by
//!   (arrival, flag, line number) is processed next. Files are few, so a linear scan picks it.
//!
//! Spilled record layout (little endian): arrival `i64`, line number `u64`, length `u32`,
//! oversized `u8`, then the line's bytes (CR removed; of an oversized line, the bytes kept).

use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::config::StreamDef;
use crate::record::decode::{Fields, Reason, arrival_of_line, dead_letter_raw, decode_line, ordering_arrival};

/// Bytes of a file read at a time.
pub const READ_BUFFER: usize = 64 << 10;
/// Line text per sorted run of a file that is not in arrival order.
pub const SORT_RUN_BYTES: usize = 8 << 20;
/// Read-back buffer of each spilled run during the merge.
pub const RUN_READ_BUFFER: usize = 8 << 10;
/// Files larger than this are scanned in chunks of this size, one per core at a time.
const SCAN_CHUNK: u64 = 8 << 20;
/// Bytes kept of an oversized line: its dead letter's `raw` holds the first KiB.
const OVERSIZED_KEEP: usize = 1025;
const RECORD_HEADER: usize = 8 + 8 + 4 + 1;

/// What a line holds once decoded.
#[derive(Debug)]
pub enum Content {
    /// Its values, strings read in the line's bytes.
    Row(Fields),
    DeadLetter(Reason),
}

/// One line in processing order; `bytes` is the line's text (CR removed) as read.
#[derive(Debug)]
pub struct Line<'a> {
    pub arrival: i64,
    pub flag: usize,
    pub line_no: usize,
    pub stream: usize,
    pub bytes: &'a [u8],
    pub content: Content,
}

impl Line<'_> {
    /// The line as text for `dead_letter` (invalid UTF-8 replaced; an oversized line's first 1 KiB).
    pub fn raw(&self, reason: Reason) -> std::borrow::Cow<'_, str> {
        dead_letter_raw(self.bytes, reason)
    }
}

/// How [`Inputs::open`] learns whether a file is in arrival order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// A first pass over every file before the first line is offered.
    Scan,
    /// No first pass: a file is taken to be in order, and its first line that is not stops the
    /// reading ([`InputError::OutOfOrder`]). Only for a caller that can start again.
    Trust,
}

#[derive(Debug, Error)]
pub enum InputError {
    /// Reading `--input` number `flag` failed.
    #[error("{1}")]
    Read(usize, std::io::Error),
    /// `--input` number `flag`, opened with [`Order::Trust`], holds a line whose arrival is below
    /// the one before it.
    #[error("input {0} is not in arrival order")]
    OutOfOrder(usize),
    /// Spilling a sorted run failed.
    #[error("spilling sorted runs to {0}: {1}")]
    Spill(PathBuf, std::io::Error),
}

/// Reads one file's non-blank lines through a bounded buffer.
struct LineReader {
    reader: BufReader<File>,
    /// Bytes kept of a line; a longer line is oversized.
    keep: usize,
    line: Vec<u8>,
    next_no: usize,
    /// Bytes taken from the reader so far.
    consumed: u64,
    /// Where the line in `line` starts, in bytes taken from the reader.
    line_start: u64,
}

impl LineReader {
    fn new(file: File, max_payload: u64) -> LineReader {
        // At most 4 GiB: a spilled record's length is a u32.
        let keep = max_payload.saturating_add(2).min(u64::from(u32::MAX)) as usize;
        let keep = keep.max(OVERSIZED_KEEP);
        LineReader {
            reader: BufReader::with_capacity(READ_BUFFER, file),
            keep,
            line: Vec::new(),
            next_no: 0,
            consumed: 0,
            line_start: 0,
        }
    }

    /// The next non-blank line into `self.line` (CR removed): its line number and whether it was
    /// cut (oversized); `None` at the end of the file.
    fn next(&mut self) -> std::io::Result<Option<(usize, bool)>> {
        loop {
            self.line_start = self.consumed;
            self.line.clear();
            let (mut total, mut blank, mut newline) = (0, true, false);
            loop {
                let buf = self.reader.fill_buf()?;
                if buf.is_empty() {
                    break;
                }
                let (used, part) = match memchr::memchr(b'\n', buf) {
                    Some(p) => (p + 1, &buf[..p]),
                    None => (buf.len(), buf),
                };
                blank &= part.iter().all(u8::is_ascii_whitespace);
                let room = self.keep.saturating_sub(self.line.len());
                self.line.extend_from_slice(&part[..part.len().min(room)]);
                total += part.len();
                let ended = used > part.len();
                self.reader.consume(used);
                self.consumed += used as u64;
                if ended {
                    newline = true;
                    break;
                }
            }
            if total == 0 && !newline {
                return Ok(None);
            }
            let line_no = self.next_no;
            self.next_no += 1;
            if blank {
                continue;
            }
            let cut = total > self.line.len();
            if !cut && self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            return Ok(Some((line_no, cut)));
        }
    }
}

/// Decodes a line read by [`LineReader`]: its arrival as read and its content.
fn decode(def: &StreamDef, bytes: &[u8], cut: bool) -> (Option<i64>, Content) {
    if cut {
        return (None, Content::DeadLetter(Reason::Oversized));
    }
    let decoded = decode_line(&def.schema, bytes, def.max_payload);
    let content = match decoded.outcome {
        Ok(fields) => Content::Row(fields),
        Err(reason) => Content::DeadLetter(reason),
    };
    (decoded.arrival, content)
}

/// What the first pass learns of a file (or of a chunk of it).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Scan {
    first: Option<i64>,
    last: Option<i64>,
    ordered: bool,
}

impl Scan {
    /// The scan of a chunk followed by `next`.
    fn then(self, next: Scan) -> Scan {
        let joined = match (self.last, next.first) {
            (Some(a), Some(b)) => a <= b,
            _ => true,
        };
        Scan {
            first: self.first.or(next.first),
            last: next.last.or(self.last),
            ordered: self.ordered && next.ordered && joined,
        }
    }
}

/// The first pass over a file: its first arrival and whether its arrivals never decrease.
fn scan(path: &Path, def: &StreamDef, chunk: u64) -> std::io::Result<Scan> {
    let len = std::fs::metadata(path)?.len();
    let chunks = len.div_ceil(chunk).max(1);
    let threads = std::thread::available_parallelism().map_or(1, usize::from) as u64;
    let mut whole = Scan { first: None, last: None, ordered: true };
    let mut next = 0;
    while next < chunks {
        let batch = next..(next + threads).min(chunks);
        next = batch.end;
        let scans: Vec<std::io::Result<Scan>> = std::thread::scope(|scope| {
            let handles: Vec<_> =
                batch.map(|c| scope.spawn(move || scan_chunk(path, def, c * chunk, (c + 1) * chunk))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
        });
        for s in scans {
            whole = whole.then(s?);
        }
    }
    Ok(whole)
}

/// Scans the lines that start in bytes `from..to` of the file (a line starts at 0 or just after
/// a newline), so that consecutive chunks cover every line exactly once.
fn scan_chunk(path: &Path, def: &StreamDef, from: u64, to: u64) -> std::io::Result<Scan> {
    let mut file = File::open(path)?;
    let start = from.saturating_sub(1);
    file.seek(SeekFrom::Start(start))?;
    let mut lines = LineReader::new(file, def.max_payload);
    if from > 0 {
        // Skip to just after the first newline at or after `from - 1`: a line starting at `from`
        // belongs here, one that started earlier to the chunk before.
        lines.skip_past_newline()?;
    }
    let mut scan = Scan { first: None, last: None, ordered: true };
    let timing = def.schema.time_only();
    while let Some((_, cut)) = lines.next()? {
        if start + lines.line_start >= to {
            break;
        }
        let arrival = match (cut, scan.first) {
            (true, _) => None,
            // The chunk's first arrival may be the file's, which the lines before it take: exact.
            (false, None) => arrival_of_line(&timing, &lines.line, def.max_payload),
            (false, Some(_)) => ordering_arrival(&timing, &lines.line, def.max_payload),
        };
        if let Some(a) = arrival {
            scan = scan.then(Scan { first: Some(a), last: Some(a), ordered: true });
        }
    }
    Ok(scan)
}

/// The first arrival of a file, the one the lines before it take, read ahead (as the decoder
/// reads it) from the file's start.
fn first_arrival(path: &Path, def: &StreamDef) -> std::io::Result<Option<i64>> {
    let mut lines = LineReader::new(File::open(path)?, def.max_payload);
    let timing = def.schema.time_only();
    while let Some((_, cut)) = lines.next()? {
        if let Some(arrival) = (!cut).then(|| arrival_of_line(&timing, &lines.line, def.max_payload)).flatten() {
            return Ok(Some(arrival));
        }
    }
    Ok(None)
}

impl LineReader {
    /// Consumes bytes up to and including the next newline.
    fn skip_past_newline(&mut self) -> std::io::Result<()> {
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                return Ok(());
            }
            let (used, found) = buf.iter().position(|&b| b == b'\n').map_or((buf.len(), false), |p| (p + 1, true));
            self.reader.consume(used);
            self.consumed += used as u64;
            if found {
                return Ok(());
            }
        }
    }
}

/// Lines of one file in (arrival, line number) order, each decoded when it is offered.
enum Source {
    /// A file in arrival order, streamed; `trusted`: not scanned, so each arrival is checked
    /// against the one before it.
    Ordered { lines: LineReader, previous: Option<i64>, trusted: bool },
    /// A file out of arrival order: its sorted runs, merged.
    Sorted(Runs),
}

/// The line a source offers next; its bytes stay in the source until it is advanced.
struct Head {
    arrival: i64,
    line_no: usize,
    content: Content,
}

impl Source {
    /// The next line of `--input` number `flag`.
    fn advance(&mut self, def: &StreamDef, flag: usize) -> Result<Option<Head>, InputError> {
        let read = |e| InputError::Read(flag, e);
        match self {
            Source::Ordered { lines, previous, trusted } => {
                let Some((line_no, cut)) = lines.next().map_err(read)? else { return Ok(None) };
                let (arrival, content) = decode(def, &lines.line, cut);
                if *trusted && arrival.zip(*previous).is_some_and(|(now, before)| now < before) {
                    return Err(InputError::OutOfOrder(flag));
                }
                *previous = arrival.or(*previous);
                Ok(Some(Head { arrival: previous.unwrap_or(0), line_no, content }))
            }
            Source::Sorted(runs) => {
                let Some((arrival, line_no, cut)) = runs.next().map_err(read)? else { return Ok(None) };
                let (_, content) = decode(def, &runs.line, cut);
                Ok(Some(Head { arrival, line_no, content }))
            }
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Source::Ordered { lines, .. } => &lines.line,
            Source::Sorted(runs) => &runs.line,
        }
    }
}

/// A file's sorted runs in one unlinked temporary file, merged by (arrival, line number).
struct Runs {
    file: File,
    runs: Vec<RunReader>,
    /// The next record of each run: (arrival, line number, run); its text is still unread.
    heap: BinaryHeap<std::cmp::Reverse<(i64, usize, usize)>>,
    /// The text of the line offered last.
    line: Vec<u8>,
}

/// One spilled run being read back, record header first, its text when the merge takes it.
struct RunReader {
    /// Where the run's unread bytes start and end in the spill file.
    next: u64,
    end: u64,
    buf: Vec<u8>,
    at: usize,
    /// Records of the run whose header is not read yet.
    left: usize,
    /// Length of the text of the record whose header was read last, and whether it was cut.
    len: usize,
    cut: bool,
}

impl RunReader {
    /// Makes `n` unread bytes available in `buf[at..]` (`n` at most [`RUN_READ_BUFFER`]).
    fn fill(&mut self, file: &File, n: usize) -> std::io::Result<()> {
        if self.buf.len() - self.at >= n {
            return Ok(());
        }
        self.buf.drain(..self.at);
        self.at = 0;
        let want = (RUN_READ_BUFFER - self.buf.len()).min(usize::try_from(self.end - self.next).unwrap_or(usize::MAX));
        let old = self.buf.len();
        self.buf.resize(old + want, 0);
        file.read_exact_at(&mut self.buf[old..], self.next)?;
        self.next += want as u64;
        Ok(())
    }

    /// Reads the next record's header: its arrival and line number.
    fn header(&mut self, file: &File) -> std::io::Result<Option<(i64, usize)>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        self.fill(file, RECORD_HEADER)?;
        let h = &self.buf[self.at..self.at + RECORD_HEADER];
        let word = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or_default());
        let arrival = word(0) as i64;
        let line_no = usize::try_from(word(8)).unwrap_or(usize::MAX);
        self.len = u32::from_le_bytes(h[16..20].try_into().unwrap_or_default()) as usize;
        self.cut = h[20] != 0;
        self.at += RECORD_HEADER;
        Ok(Some((arrival, line_no)))
    }

    /// Reads the text of the record whose header was read last into `out`.
    fn text(&mut self, file: &File, out: &mut Vec<u8>) -> std::io::Result<()> {
        out.clear();
        while out.len() < self.len {
            self.fill(file, 1)?;
            let n = (self.len - out.len()).min(self.buf.len() - self.at);
            out.extend_from_slice(&self.buf[self.at..self.at + n]);
            self.at += n;
        }
        Ok(())
    }
}

impl Runs {
    /// Reads every line of a file that is not in arrival order (`lead`: its first arrival) into
    /// sorted runs of at most `run_bytes` bytes of text, spilled to an unlinked file in `dir`.
    fn spill(
        lines: &mut LineReader,
        def: &StreamDef,
        lead: Option<i64>,
        dir: &Path,
        run_bytes: usize,
    ) -> Result<Runs, SpillError> {
        let file = tempfile::tempfile_in(dir).map_err(SpillError::Spill)?;
        let mut out = BufWriter::with_capacity(READ_BUFFER, &file);
        let mut text: Vec<u8> = Vec::new();
        // (arrival, line number, start in `text`, length, cut)
        let mut index: Vec<(i64, usize, usize, usize, bool)> = Vec::new();
        let mut runs = Vec::new();
        let mut written = 0u64;
        let mut previous = lead;
        let mut flush = |text: &mut Vec<u8>,
                         index: &mut Vec<(i64, usize, usize, usize, bool)>,
                         out: &mut BufWriter<&File>|
         -> std::io::Result<()> {
            if index.is_empty() {
                return Ok(());
            }
            // Line numbers were pushed in order: a stable sort by arrival orders by both.
            index.sort_by_key(|r| r.0);
            let start = written;
            for &(arrival, line_no, at, len, cut) in index.iter() {
                out.write_all(&arrival.to_le_bytes())?;
                out.write_all(&(line_no as u64).to_le_bytes())?;
                out.write_all(&(len as u32).to_le_bytes())?;
                out.write_all(&[u8::from(cut)])?;
                out.write_all(&text[at..at + len])?;
                written += (RECORD_HEADER + len) as u64;
            }
            runs.push(RunReader {
                next: start,
                end: written,
                buf: Vec::new(),
                at: 0,
                left: index.len(),
                len: 0,
                cut: false,
            });
            text.clear();
            index.clear();
            Ok(())
        };
        while let Some((line_no, cut)) = lines.next().map_err(SpillError::Read)? {
            let (arrival, _) = decode(def, &lines.line, cut);
            previous = arrival.or(previous);
            index.push((previous.unwrap_or(0), line_no, text.len(), lines.line.len(), cut));
            text.extend_from_slice(&lines.line);
            if text.len() >= run_bytes {
                flush(&mut text, &mut index, &mut out).map_err(SpillError::Spill)?;
            }
        }
        flush(&mut text, &mut index, &mut out).map_err(SpillError::Spill)?;
        out.flush().map_err(SpillError::Spill)?;
        drop(out);
        let mut runs = Runs { file, runs, heap: BinaryHeap::new(), line: Vec::new() };
        for r in 0..runs.runs.len() {
            runs.advance_run(r).map_err(SpillError::Spill)?;
        }
        Ok(runs)
    }

    /// Reads the header of run `r`'s next record onto the heap.
    fn advance_run(&mut self, r: usize) -> std::io::Result<()> {
        if let Some((arrival, line_no)) = self.runs[r].header(&self.file)? {
            self.heap.push(std::cmp::Reverse((arrival, line_no, r)));
        }
        Ok(())
    }

    /// The next line of the file in (arrival, line number) order: arrival, line number and
    /// whether it was cut, its text in `self.line`.
    fn next(&mut self) -> std::io::Result<Option<(i64, usize, bool)>> {
        let Some(std::cmp::Reverse((arrival, line_no, r))) = self.heap.pop() else { return Ok(None) };
        self.runs[r].text(&self.file, &mut self.line)?;
        let cut = self.runs[r].cut;
        self.advance_run(r)?;
        Ok(Some((arrival, line_no, cut)))
    }
}

enum SpillError {
    Read(std::io::Error),
    Spill(std::io::Error),
}

/// Every input, merged into processing order as it is read.
pub struct Inputs<'p> {
    streams: &'p [StreamDef],
    /// Per `--input` flag: its stream, its source and the line it offers next.
    files: Vec<(usize, Source, Option<Head>)>,
    /// The flag whose head was returned last, to be advanced before the next line is chosen.
    taken: Option<usize>,
}

impl<'p> Inputs<'p> {
    /// Opens every input (`(stream, path)` per `--input` flag). With [`Order::Scan`]: the first
    /// pass over each file, then, for a file out of arrival order, its sorted runs spilled into
    /// `spill_dir`, in runs of `run_bytes` bytes of text ([`SORT_RUN_BYTES`] outside tests).
    /// With [`Order::Trust`]: every file streamed, checked as it is read.
    pub fn open(
        inputs: &[(usize, &Path)],
        streams: &'p [StreamDef],
        spill_dir: &Path,
        run_bytes: usize,
        order: Order,
    ) -> Result<Inputs<'p>, InputError> {
        let mut files = Vec::new();
        for (flag, &(stream, path)) in inputs.iter().enumerate() {
            let def = &streams[stream];
            let read = |e| InputError::Read(flag, e);
            // A pipe can be read only once: it is copied to a file first, read from there, and
            // that file's name removed once it is open.
            let copy = if std::fs::metadata(path).map_err(read)?.is_file() {
                None
            } else {
                let spill = |e| InputError::Spill(spill_dir.to_owned(), e);
                let mut copy = tempfile::NamedTempFile::new_in(spill_dir).map_err(spill)?;
                std::io::copy(&mut File::open(path).map_err(read)?, copy.as_file_mut()).map_err(read)?;
                Some(copy)
            };
            let path = copy.as_ref().map_or(path, |c| c.path());
            // Taken on trust, a file is in order, and only its first arrival is read ahead.
            let (first, ordered) = match order {
                Order::Scan => scan(path, def, SCAN_CHUNK).map(|s| (s.first, s.ordered)).map_err(read)?,
                Order::Trust => (first_arrival(path, def).map_err(read)?, true),
            };
            let mut lines = LineReader::new(File::open(path).map_err(read)?, def.max_payload);
            drop(copy);
            let mut source = if ordered {
                Source::Ordered { lines, previous: first, trusted: order == Order::Trust }
            } else {
                Source::Sorted(Runs::spill(&mut lines, def, first, spill_dir, run_bytes.max(1)).map_err(
                    |e| match e {
                        SpillError::Read(e) => InputError::Read(flag, e),
                        SpillError::Spill(e) => InputError::Spill(spill_dir.to_owned(), e),
                    },
                )?)
            };
            let head = source.advance(def, flag)?;
            files.push((stream, source, head));
        }
        Ok(Inputs { streams, files, taken: None })
    }

    /// Advances the file whose line was returned last.
    fn settle(&mut self) -> Result<(), InputError> {
        if let Some(flag) = self.taken.take() {
            let (stream, source, head) = &mut self.files[flag];
            *head = source.advance(&self.streams[*stream], flag)?;
        }
        Ok(())
    }

    /// The flag of the file whose head comes first.
    fn first(&self) -> Option<usize> {
        self.files
            .iter()
            .enumerate()
            .filter_map(|(flag, (_, _, head))| head.as_ref().map(|h| (h.arrival, flag, h.line_no)))
            .min()
            .map(|(_, flag, _)| flag)
    }

    /// The arrival of the next line, if any.
    pub fn peek_arrival(&mut self) -> Result<Option<i64>, InputError> {
        self.settle()?;
        Ok(self.first().and_then(|flag| self.files[flag].2.as_ref()).map(|h| h.arrival))
    }

    /// The next line in processing order.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Line<'_>>, InputError> {
        self.settle()?;
        let Some(flag) = self.first() else { return Ok(None) };
        self.taken = Some(flag);
        let (stream, source, head) = &mut self.files[flag];
        let Some(head) = head.take() else { return Ok(None) };
        Ok(Some(Line {
            arrival: head.arrival,
            flag,
            line_no: head.line_no,
            stream: *stream,
            bytes: source.bytes(),
            content: head.content,
        }))
    }
}

#[cfg(test)]
mod tests;
