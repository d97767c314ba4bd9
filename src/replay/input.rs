//! Reading replay inputs and merging them into processing order (CONTRACT.md rule 1).
//!
//! Every non-blank line gets an arrival: its `arrival` field, else its event time when that can
//! be read (even from a line dead-lettered for another field), else the arrival of the nearest
//! earlier line of the same file, else the nearest later one, else 0. Lines of all inputs are
//! processed in order of (arrival, position of the `--input` flag, line number).

use std::path::Path;

use crate::config::StreamDef;
use crate::record::Value;
use crate::record::decode::{Reason, decode_line};

/// What a line holds once decoded.
#[derive(Debug)]
pub enum Content {
    Row { values: Vec<Value>, ts: Option<i64> },
    DeadLetter(Reason),
}

#[derive(Debug)]
pub struct Line {
    pub arrival: i64,
    pub flag: usize,
    pub line_no: usize,
    pub stream: usize,
    /// Byte range of the line (without its CR) in its file.
    pub range: std::ops::Range<usize>,
    pub content: Content,
}

/// Every input file and its decoded lines in processing order.
pub struct Inputs {
    pub files: Vec<Vec<u8>>,
    pub lines: Vec<Line>,
}

impl Inputs {
    /// The line as text for `dead_letter` (invalid UTF-8 replaced; an oversized line's first 1 KiB).
    pub fn raw(&self, flag: usize, range: std::ops::Range<usize>, reason: Reason) -> std::borrow::Cow<'_, str> {
        crate::record::decode::dead_letter_raw(&self.files[flag][range], reason)
    }
}

/// Files smaller than this are decoded on the calling thread alone.
const PARALLEL_BYTES: usize = 1 << 20;

/// Decodes every line of `bytes` (the file of `--input` flag number `flag`, stream `stream`):
/// large files in chunks of whole lines, one per core, before the shards start (lines decode
/// independently; arrivals are filled in afterwards, over the whole file in order).
pub fn decode_file(bytes: &[u8], flag: usize, stream: usize, def: &StreamDef) -> Vec<Line> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let chunks = if bytes.len() < PARALLEL_BYTES { 1 } else { threads };
    let mut bounds = vec![0];
    for i in 1..chunks {
        let from = (bytes.len() * i / chunks).max(*bounds.last().unwrap_or(&0));
        // A chunk ends just after a newline (or at the end of the file).
        let end = bytes[from..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |p| from + p + 1);
        bounds.push(end);
    }
    bounds.push(bytes.len());
    bounds.dedup();
    let parts: Vec<(Vec<Line>, Vec<Option<i64>>, usize)> = std::thread::scope(|scope| {
        let handles: Vec<_> = bounds
            .windows(2)
            .map(|w| {
                let (start, end) = (w[0], w[1]);
                scope.spawn(move || decode_chunk(&bytes[start..end], start, flag, stream, def))
            })
            .collect();
        // A decoder panic (there is none: tests/it/robustness.rs) would surface, not drop a chunk.
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    let mut lines = Vec::new();
    let mut arrivals = Vec::new();
    let mut line_offset = 0;
    for (mut chunk_lines, chunk_arrivals, newlines) in parts {
        for line in &mut chunk_lines {
            line.line_no += line_offset;
        }
        line_offset += newlines;
        lines.extend(chunk_lines);
        arrivals.extend(chunk_arrivals);
    }
    fill_arrivals(&mut arrivals);
    for (line, arrival) in lines.iter_mut().zip(arrivals) {
        line.arrival = arrival.unwrap_or(0);
    }
    lines
}

/// Decodes the lines of one chunk, which starts at byte `offset` of its file: the lines (line
/// numbers counted from the chunk's start), their arrivals as read, and the chunk's newlines.
fn decode_chunk(
    chunk: &[u8],
    offset: usize,
    flag: usize,
    stream: usize,
    def: &StreamDef,
) -> (Vec<Line>, Vec<Option<i64>>, usize) {
    let mut lines = Vec::new();
    let mut arrivals = Vec::new();
    let mut start = offset;
    let mut newlines = 0;
    for (line_no, line) in chunk.split(|&b| b == b'\n').enumerate() {
        newlines = line_no;
        let range = start..start + line.len();
        start = range.end + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let decoded = decode_line(&def.schema, line, def.max_payload);
        let content = match decoded.outcome {
            Ok(fields) => Content::Row { values: fields.values, ts: fields.ts },
            Err(reason) => Content::DeadLetter(reason),
        };
        arrivals.push(decoded.arrival);
        lines.push(Line { arrival: 0, flag, line_no, stream, range: range.start..range.start + line.len(), content });
    }
    (lines, arrivals, newlines)
}

/// Lines without an arrival take the nearest earlier one's, else the nearest later one's.
fn fill_arrivals(arrivals: &mut [Option<i64>]) {
    let mut previous = None;
    for a in arrivals.iter_mut() {
        *a = a.or(previous);
        previous = *a;
    }
    let mut next = None;
    for a in arrivals.iter_mut().rev() {
        *a = a.or(next);
        next = *a;
    }
}

/// Reads and decodes every input, merged into processing order.
pub fn read_inputs(inputs: &[(usize, &Path)], streams: &[StreamDef]) -> Result<Inputs, (usize, std::io::Error)> {
    let mut files = Vec::new();
    let mut lines = Vec::new();
    for (flag, &(stream, path)) in inputs.iter().enumerate() {
        let bytes = std::fs::read(path).map_err(|e| (flag, e))?;
        lines.extend(decode_file(&bytes, flag, stream, &streams[stream]));
        files.push(bytes);
    }
    lines.sort_by_key(|l| (l.arrival, l.flag, l.line_no));
    Ok(Inputs { files, lines })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_file_decodes_in_chunks_exactly_as_in_one_pass() {
        let plan = crate::config::parse(
            "t.toml",
            "[streams.s]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\nfields = { k = \"string\", ts = \"int\" }\n",
        )
        .unwrap();
        let def = &plan.streams[0];
        let mut text = String::new();
        for i in 0..150_000 {
            text += &match i % 7 {
                0 => "\n".to_owned(),
                1 => format!("{{\"k\":\"d{i}\",\"ts\":{i}}}\r\n"),
                2 => "not json\n".to_owned(),
                3 => format!("{{\"k\":\"d{i}\",\"ts\":{i},\"arrival\":{}}}\n", i + 5),
                _ => format!("{{\"k\":\"d{i}\",\"ts\":{i}}}\n"),
            };
        }
        text += "{\"k\":\"last\",\"ts\":1}";
        assert!(text.len() > 2 * PARALLEL_BYTES);
        let chunked = decode_file(text.as_bytes(), 3, 0, def);
        let (mut whole, mut arrivals, _) = decode_chunk(text.as_bytes(), 0, 3, 0, def);
        fill_arrivals(&mut arrivals);
        for (line, arrival) in whole.iter_mut().zip(arrivals) {
            line.arrival = arrival.unwrap_or(0);
        }
        let key = |l: &Line| (l.arrival, l.flag, l.line_no, l.stream, l.range.clone(), format!("{:?}", l.content));
        assert_eq!(chunked.iter().map(key).collect::<Vec<_>>(), whole.iter().map(key).collect::<Vec<_>>());
    }

    #[test]
    fn arrivals_fill_from_neighbours() {
        let mut a = [None, Some(5), None, None, Some(9), None];
        fill_arrivals(&mut a);
        assert_eq!(a, [Some(5), Some(5), Some(5), Some(5), Some(9), Some(9)]);
        let mut none: [Option<i64>; 2] = [None, None];
        fill_arrivals(&mut none);
        assert_eq!(none, [None, None]);
    }
}
