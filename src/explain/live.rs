//! `braid explain --live`: what the running service's journal still holds, fetched from its ops
//! endpoint (`GET /journal`, loopback only) and explained as a replay of those lines with the
//! config given.
//!
//! The journal holds the messages taken since the last committed checkpoint (about one
//! `checkpoint_interval`; while checkpoints fail, up to `journal_retention` / `journal_bytes`).
//! So the replay starts from empty state at the first message still held: a row whose partner
//! came before that shows as unmatched here, though the service may have joined it.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use thiserror::Error;

use crate::ops::http::JOURNAL_PATH;
use crate::ops::status::fetch::{self, FetchError};

#[derive(Debug, Error)]
pub enum LiveError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("{addr}{JOURNAL_PATH}: HTTP {status}: {body}")]
    Refused { addr: SocketAddr, status: u16, body: String },
    #[error("{addr}{JOURNAL_PATH}: line {line}: {what}")]
    BadLine { addr: SocketAddr, line: usize, what: String },
    #[error("writing the fetched journal: {0}")]
    Write(std::io::Error),
}

/// The journal's lines, one replay input file per stream, in a temporary directory (removed on
/// drop).
pub struct LiveInputs {
    _dir: tempfile::TempDir,
    pub inputs: Vec<(String, PathBuf)>,
    pub lines: usize,
}

/// Fetches `GET /journal` from the ops endpoint at `addr`.
pub fn fetch(addr: SocketAddr) -> Result<LiveInputs, LiveError> {
    let (status, body) = fetch::get_bounded(addr, JOURNAL_PATH, JOURNAL_ANSWER)?;
    if status != 200 {
        return Err(LiveError::Refused { addr, status, body: body.trim_end().to_owned() });
    }
    let dir = tempfile::Builder::new().prefix("braid-explain-live-").tempdir().map_err(LiveError::Write)?;
    let mut files: BTreeMap<String, (PathBuf, std::io::BufWriter<std::fs::File>)> = BTreeMap::new();
    let mut lines = 0;
    for (i, text) in body.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |what: String| LiveError::BadLine { addr, line: i + 1, what };
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let (Some(stream), Some(line)) = (value["stream"].as_str(), value.get("line")) else {
            return Err(bad("expected {\"stream\":NAME,\"line\":LINE}".into()));
        };
        if !files.contains_key(stream) {
            let path = dir.path().join(format!("{}.jsonl", files.len()));
            let file = std::fs::File::create(&path).map_err(LiveError::Write)?;
            files.insert(stream.to_owned(), (path, std::io::BufWriter::new(file)));
        }
        let Some((_, file)) = files.get_mut(stream) else { continue };
        writeln!(file, "{line}").map_err(LiveError::Write)?;
        lines += 1;
    }
    let mut inputs = Vec::new();
    for (stream, (path, mut file)) in files {
        file.flush().map_err(LiveError::Write)?;
        inputs.push((stream, path));
    }
    Ok(LiveInputs { _dir: dir, inputs, lines })
}

/// The most `GET /journal` may answer: the service copies at most 64 MiB of payloads
/// (`JOURNAL_COPY_BYTES`), each line adds the JSON around it.
const JOURNAL_ANSWER: u64 = 256 << 20;
