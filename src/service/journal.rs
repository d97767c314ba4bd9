//! The ingest journal: every message the service accepts, with the processing time it was taken
//! at, appended to a durable [`Spool`] before the source acknowledges it.
//!
//! The journal is what makes an acknowledged message survive `kill -9`; checkpoints
//! (service/checkpoints.rs) are what make a restart short and exact. At the next start the
//! service restores the last checkpoint and replays only the journal entries after its barrier
//! through the runtime exactly as `braid replay` would (same processing times, so the same ticks,
//! lateness and `_id`s), then goes on with live input; the sinks skip the rows they had taken
//! already (service/taken.rs). A committed checkpoint releases the entries before the barrier of the
//! checkpoint before it (kept so that a start that finds the newest one damaged falls back to
//! that one without losing input, storage/quarantine.rs), so the journal holds about two
//! checkpoint intervals; `runtime.journal_retention` and
//! `journal_bytes` bound it only while checkpoints fail (and then a start without a checkpoint
//! rebuilds only what the journal still holds).
//!
//! Besides messages the journal records when the service started and when a source lost or
//! regained its broker ([`Event`]): idleness depends on them (a stream does not turn idle while
//! braid cannot see its input, `StreamClock::suspend`), so a replayed journal ticks as the first
//! run did.
//!
//! Record layout (little endian): kind (u8: `1` message, `2` event), arrival ms (i64), then for a
//! message: source name length (u8), source name, topic length (u16), topic, payload; for an
//! event: what happened (u8: `1` start, `2` source disconnected, `3` source connected), source
//! name length (u8), source name (empty for a start). The source goes by name so that a reload
//! that adds or reorders sources still replays every entry into the right one. A payload above the stream's `max_payload` is kept only up to
//! `max_payload + 1` bytes: enough to be dead-lettered as `oversized` again, with the same first
//! KiB as `raw`.

use std::path::Path;

use bytes::Bytes;
use thiserror::Error;

use crate::config::Overflow;
use crate::source::Delivery;
use crate::spool::{Spool, SpoolError, SpoolOptions};

const MESSAGE: u8 = 1;
const EVENT: u8 = 2;
/// Kind and arrival.
const HEADER: usize = 1 + 8;

#[derive(Debug, Error)]
pub enum JournalError {
    #[error("journal {path}: {error}")]
    Open { path: String, error: SpoolError },
    #[error("journal: {0}")]
    Append(SpoolError),
    #[error("journal: cannot sync: {0}")]
    Sync(std::io::Error),
}

impl JournalError {
    /// A write the file system refused (a full disk, EIO): nothing was journaled, and the same
    /// entry may be tried again. The path and the system's error.
    pub fn write_failure(&self) -> Option<(&Path, &std::io::Error)> {
        match self {
            JournalError::Append(error) => error.write_failure(),
            JournalError::Open { .. } | JournalError::Sync(_) => None,
        }
    }

    /// An open that failed in the file system (a full disk making the head file): path and error.
    pub fn open_write_failure(&self) -> Option<(std::path::PathBuf, std::io::Error)> {
        match self {
            JournalError::Open { error, .. } => error.owned_write_failure(),
            JournalError::Append(_) | JournalError::Sync(_) => None,
        }
    }
}

/// One journaled entry: what happened at processing time `arrival`.
pub struct Entry {
    /// The source's name (empty for [`What::Start`]).
    pub source: String,
    pub arrival: i128,
    pub what: What,
}

#[derive(Debug, PartialEq, Eq)]
pub enum What {
    Message {
        topic: String,
        payload: Bytes,
    },
    /// The service started (after a stop or a crash), or its intake goes on after a full sink
    /// buffer held it: every stream's idleness counts from here.
    Start,
    /// The source lost its broker: its streams stop counting towards idleness.
    Disconnected,
    /// The source is connected again: its streams' idleness counts from here.
    Connected,
}

pub struct Journal {
    spool: Spool,
    retention_ms: i64,
}

impl Journal {
    /// Opens (recovers) the journal in `dir`, holding at most `max_bytes`: beyond that the oldest
    /// entries are released early (counted by [`dropped`](Self::dropped)) rather than refusing
    /// input — the journal bounds how much a restart can rebuild, never what braid accepts.
    pub fn open(dir: &Path, max_bytes: u64, retention_ms: i64) -> Result<Journal, JournalError> {
        Journal::open_on(crate::storage::Mmap::shared(), dir, max_bytes, retention_ms)
    }

    /// [`open`](Self::open) with the segment files on `storage` (tests inject faults with it).
    pub fn open_on(
        storage: std::sync::Arc<dyn crate::storage::Storage>,
        dir: &Path,
        max_bytes: u64,
        retention_ms: i64,
    ) -> Result<Journal, JournalError> {
        let options = SpoolOptions { max_bytes, overflow: Overflow::DropOldest, ..SpoolOptions::default() };
        let spool = Spool::open_on(storage, dir, options)
            .map_err(|error| JournalError::Open { path: dir.display().to_string(), error })?;
        Ok(Journal { spool, retention_ms })
    }

    /// Appends a delivery of source `source` taken at processing time `now`; `keep` bytes of its
    /// payload at most.
    pub fn append(&mut self, source: &str, delivery: &Delivery, now: i128, keep: usize) -> Result<(), JournalError> {
        // MQTT topics hold at most 65 535 bytes; config names are short (cut defensively).
        let topic = delivery.topic.as_bytes();
        let topic = &topic[..topic.len().min(u16::MAX as usize)];
        let source = &source.as_bytes()[..source.len().min(u8::MAX as usize)];
        let payload = &delivery.payload[..delivery.payload.len().min(keep)];
        let head = header(MESSAGE, now);
        let lens = [source.len() as u8];
        let topic_len = (topic.len() as u16).to_le_bytes();
        // Written into the spool in place: no copy of the payload.
        let parts: [&[u8]; 6] = [&head, &lens, source, &topic_len, topic, payload];
        self.spool.append_parts(&parts).map(|_| ()).map_err(JournalError::Append)
    }

    /// Makes sure that a start and then `delivery` of `source` (`keep` bytes of its payload at
    /// most) can be appended without a new file: starts the next segment now if needed. An error
    /// (a full disk) changes nothing.
    pub fn make_room_for(&mut self, source: &str, delivery: &Delivery, keep: usize) -> Result<(), JournalError> {
        let message = HEADER
            + 1
            + source.len().min(u8::MAX as usize)
            + 2
            + delivery.topic.len().min(u16::MAX as usize)
            + delivery.payload.len().min(keep);
        // A start takes 32 bytes as a record; 64 more bytes of payload round up to at least that.
        let len = (message + 64).min(self.spool.max_record());
        self.spool.make_room(len).map_err(JournalError::Append)
    }

    /// Records a start or a source's connection change at processing time `now`.
    pub fn append_event(&mut self, what: &What, source: &str, now: i128) -> Result<(), JournalError> {
        let code = match what {
            What::Start => 1,
            What::Disconnected => 2,
            What::Connected => 3,
            What::Message { .. } => return Ok(()),
        };
        let source = &source.as_bytes()[..source.len().min(u8::MAX as usize)];
        let head = header(EVENT, now);
        let parts: [&[u8]; 3] = [&head, &[code, source.len() as u8], source];
        self.spool.append_parts(&parts).map(|_| ()).map_err(JournalError::Append)
    }

    /// Forces appended entries to the disk (`durability = "power"`).
    pub fn sync(&mut self) -> Result<(), JournalError> {
        self.spool.sync().map_err(JournalError::Sync)
    }

    /// The positions of the entries still held, oldest first (read at start, before live input).
    pub fn positions(&self) -> std::ops::Range<u64> {
        self.spool.first()..self.spool.end()
    }

    /// The entry at `position` (`None`: released, or unreadable — the spool cut damage at open).
    pub fn entry(&self, position: u64) -> Option<Entry> {
        self.spool.get(position).and_then(decode)
    }

    /// Every entry still held, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        self.positions().filter_map(|seq| self.entry(seq))
    }

    /// Releases every entry before `position` (a checkpoint holds what they did).
    pub fn release_before(&mut self, position: u64) {
        if position > self.spool.first() {
            self.spool.release_through(position - 1);
        }
    }

    /// Releases the entries older than the retention at processing time `now`.
    pub fn release_older_than_retention(&mut self, now: i128) {
        let horizon = now - i128::from(self.retention_ms);
        let mut last = None;
        for seq in self.spool.first()..self.spool.end() {
            match self.spool.get(seq).and_then(arrival_of) {
                Some(arrival) if arrival < horizon => last = Some(seq),
                // Unreadable entries were cut at open; an entry inside retention ends the scan.
                _ => break,
            }
        }
        if let Some(seq) = last {
            self.spool.release_through(seq);
        }
    }

    pub fn queued_bytes(&self) -> u64 {
        self.spool.queued_bytes()
    }

    /// The journal's directory.
    pub fn dir(&self) -> &Path {
        self.spool.dir()
    }

    /// Entries released early because the journal was full.
    pub fn dropped(&self) -> u64 {
        self.spool.dropped()
    }
}

/// Kind and arrival: how every record starts.
fn header(kind: u8, arrival: i128) -> [u8; HEADER] {
    let mut head = [0; HEADER];
    head[0] = kind;
    head[1..].copy_from_slice(&(arrival as i64).to_le_bytes());
    head
}

fn arrival_of(record: &[u8]) -> Option<i128> {
    if record.len() < HEADER || !matches!(record[0], MESSAGE | EVENT) {
        return None;
    }
    Some(i128::from(i64::from_le_bytes(record[1..HEADER].try_into().ok()?)))
}

fn decode(record: &[u8]) -> Option<Entry> {
    let arrival = arrival_of(record)?;
    let mut rest = &record[HEADER..];
    let event = if record[0] == EVENT {
        let (&code, after) = rest.split_first()?;
        rest = after;
        Some(code)
    } else {
        None
    };
    let (&source_len, rest) = rest.split_first()?;
    let (source, rest) = rest.split_at_checked(usize::from(source_len))?;
    let source = String::from_utf8_lossy(source).into_owned();
    let what = match event {
        Some(1) => What::Start,
        Some(2) => What::Disconnected,
        Some(3) => What::Connected,
        Some(_) => return None,
        None => {
            let (topic_len, rest) = rest.split_at_checked(2)?;
            let (topic, payload) =
                rest.split_at_checked(usize::from(u16::from_le_bytes([topic_len[0], topic_len[1]])))?;
            What::Message {
                topic: String::from_utf8_lossy(topic).into_owned(),
                payload: Bytes::copy_from_slice(payload),
            }
        }
    };
    Some(Entry { source, arrival, what })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(topic: &str, payload: &[u8]) -> Delivery {
        Delivery {
            source: 0,
            seq: 1,
            topic: topic.into(),
            payload: Bytes::copy_from_slice(payload),
            arrival: 0,
            redelivered: false,
        }
    }

    #[test]
    fn entries_survive_a_reopen_with_source_arrival_topic_and_cut_payload() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), 1 << 20, 60_000).unwrap();
        journal.append("devices", &delivery("devices/d1/status", b"{\"ts\":1}"), 1_000, 100).unwrap();
        journal.append("other", &delivery("a/b", b"0123456789"), 1_500, 4).unwrap();
        drop(journal);
        let journal = Journal::open(dir.path(), 1 << 20, 60_000).unwrap();
        let entries: Vec<Entry> = journal.entries().collect();
        assert_eq!(entries.len(), 2);
        assert_eq!((entries[0].source.as_str(), entries[0].arrival), ("devices", 1_000));
        let message = |topic: &str, payload: &[u8]| What::Message {
            topic: topic.into(),
            payload: Bytes::copy_from_slice(payload),
        };
        assert_eq!(entries[0].what, message("devices/d1/status", b"{\"ts\":1}"));
        assert_eq!((entries[1].source.as_str(), entries[1].arrival), ("other", 1_500));
        assert_eq!(entries[1].what, message("a/b", b"0123"));
    }

    #[test]
    fn starts_and_connection_changes_are_journaled_between_messages() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), 1 << 20, 60_000).unwrap();
        journal.append_event(&What::Start, "", 100).unwrap();
        journal.append_event(&What::Connected, "devices", 150).unwrap();
        journal.append("devices", &delivery("t", b"x"), 200, 10).unwrap();
        journal.append_event(&What::Disconnected, "devices", 300).unwrap();
        drop(journal);
        let journal = Journal::open(dir.path(), 1 << 20, 60_000).unwrap();
        let got: Vec<(String, i128, What)> = journal.entries().map(|e| (e.source, e.arrival, e.what)).collect();
        let message = What::Message { topic: "t".into(), payload: Bytes::from_static(b"x") };
        assert_eq!(
            got,
            [
                (String::new(), 100, What::Start),
                ("devices".into(), 150, What::Connected),
                ("devices".into(), 200, message),
                ("devices".into(), 300, What::Disconnected),
            ]
        );
    }

    /// Expected: a full disk (ENOSPC at the new segment) or EIO on a write is an append error the
    /// intake can tell from the others (`write_failure`: it then holds the delivery and retries),
    /// the journal unchanged; once the disk takes writes again the same entry goes in, and every
    /// entry is there after a reopen.
    #[test]
    fn a_refused_write_changes_nothing_and_the_same_entry_goes_in_later() {
        use crate::storage::faulty::{Fault, Faulty};
        for fault in [Fault::Enospc, Fault::Eio] {
            let dir = tempfile::tempdir().unwrap();
            let storage = Faulty::mmap();
            let mut journal = Journal::open_on(storage.clone(), dir.path(), 1 << 20, 60_000).unwrap();
            journal.append("devices", &delivery("t", b"first"), 1, 100).unwrap();
            storage.fail_at(1, fault);
            let error = journal.append("devices", &delivery("t", b"held"), 2, 100).unwrap_err();
            let (_, io) = error.write_failure().expect("a write failure");
            assert_eq!(crate::storage::write_faults::is_disk_full(io), fault == Fault::Enospc);
            assert_eq!(journal.positions(), 0..1, "{fault:?}: nothing journaled");
            journal.make_room_for("devices", &delivery("t", b"held"), 100).unwrap();
            journal.append_event(&What::Start, "", 3).unwrap();
            journal.append("devices", &delivery("t", b"held"), 3, 100).unwrap();
            drop(journal);
            let journal = Journal::open(dir.path(), 1 << 20, 60_000).unwrap();
            let got: Vec<(i128, What)> = journal.entries().map(|e| (e.arrival, e.what)).collect();
            let message = |p: &'static [u8]| What::Message { topic: "t".into(), payload: Bytes::from_static(p) };
            assert_eq!(got, [(1, message(b"first")), (3, What::Start), (3, message(b"held"))], "{fault:?}");
        }
    }

    #[test]
    fn entries_older_than_the_retention_are_released_and_stay_released() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), 1 << 20, 1_000).unwrap();
        for t in [0, 500, 1_000, 1_500, 2_000] {
            journal.append("s", &delivery("t", b"x"), t, 10).unwrap();
        }
        // At 2 100 the horizon is 1 100: entries at 0, 500 and 1 000 go.
        journal.release_older_than_retention(2_100);
        let left: Vec<i128> = journal.entries().map(|e| e.arrival).collect();
        assert_eq!(left, [1_500, 2_000]);
        drop(journal);
        let journal = Journal::open(dir.path(), 1 << 20, 1_000).unwrap();
        assert_eq!(journal.entries().map(|e| e.arrival).collect::<Vec<_>>(), [1_500, 2_000]);
    }
}
