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
        let bytes = &self.files[flag][range];
        let bytes = if reason == Reason::Oversized { &bytes[..bytes.len().min(OVERSIZED_RAW_BYTES)] } else { bytes };
        String::from_utf8_lossy(bytes)
    }
}

const OVERSIZED_RAW_BYTES: usize = 1024;

/// Decodes every line of `bytes` (the file of `--input` flag number `flag`, stream `stream`).
pub fn decode_file(bytes: &[u8], flag: usize, stream: usize, def: &StreamDef) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut arrivals = Vec::new();
    let mut start = 0;
    for (line_no, line) in bytes.split(|&b| b == b'\n').enumerate() {
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
    fill_arrivals(&mut arrivals);
    for (line, arrival) in lines.iter_mut().zip(arrivals) {
        line.arrival = arrival.unwrap_or(0);
    }
    lines
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
    fn arrivals_fill_from_neighbours() {
        let mut a = [None, Some(5), None, None, Some(9), None];
        fill_arrivals(&mut a);
        assert_eq!(a, [Some(5), Some(5), Some(5), Some(5), Some(9), Some(9)]);
        let mut none: [Option<i64>; 2] = [None, None];
        fill_arrivals(&mut none);
        assert_eq!(none, [None, None]);
    }
}
