//! The spool's head file: where the unreleased records start, and how many were dropped.
//!
//! Two 32-byte slots written in turn (first u64 | dropped u64 | counter u64 | zero u32 |
//! crc32c of 0..28 u32); open takes the intact slot with the higher counter. A crash in the middle
//! of a write tears at most the slot being written, and the other one still holds the previous
//! state.

use std::path::Path;

use crate::storage::log::{dword, word};
use crate::storage::mapped_file::{MappedFile, MappedFileError};
use crate::storage::quarantine::{Action, Lost, quarantine};

const MAGIC: [u8; 8] = *b"braidsph";
const VERSION: u32 = 1;
const SLOT: usize = 32;
const CRC_AT: usize = 28;

/// What the head file says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct HeadState {
    /// The oldest unreleased sequence number.
    pub(super) first: u64,
    pub(super) dropped: u64,
}

pub(super) struct Head {
    file: MappedFile,
    counter: u64,
}

impl Head {
    /// Opens `path`, or creates it holding `HeadState::default()` when it does not exist. The
    /// flag: the head was damaged (a bad file header, both slots failing their crc, an unreadable
    /// block) and was quarantined and made anew — where the unreleased records start is lost.
    pub(super) fn open(path: &Path) -> Result<(Head, HeadState, bool), MappedFileError> {
        if !path.exists() {
            return Ok((Head::create(path)?, HeadState::default(), false));
        }
        let reason = match MappedFile::open(path, MAGIC, VERSION) {
            Ok(file) => {
                let mut head = Head { file, counter: 0 };
                let best = (0..2).filter_map(|i| head.read(i)).max_by_key(|&(counter, _)| counter);
                if let Some((counter, state)) = best {
                    head.counter = counter;
                    return Ok((head, state, false));
                }
                "both slots fail their crc (or are unreadable)".to_owned()
            }
            Err(MappedFileError::Invalid { reason, .. }) => format!("file header: {reason}"),
            Err(MappedFileError::Io { source, .. }) if source.raw_os_error() == Some(libc::EIO) => {
                "file header unreadable (EIO)".to_owned()
            }
            Err(e) => return Err(e),
        };
        let lost = Lost {
            records: 0,
            detail: "where the unreleased records start: the spool starts at its oldest segment, released records may come again".into(),
        };
        quarantine(path, "spool head", &reason, &lost, Action::Move);
        Ok((Head::create(path)?, HeadState::default(), true))
    }

    fn create(path: &Path) -> Result<Head, MappedFileError> {
        let mut head = Head { file: MappedFile::create(path, MAGIC, VERSION, 2 * SLOT)?, counter: 0 };
        head.write(HeadState::default());
        head.file.flush_data(0, 2 * SLOT)?;
        Ok(head)
    }

    /// Slot `slot`, read with `pread` (an unreadable one counts as damaged).
    fn read(&self, slot: usize) -> Option<(u64, HeadState)> {
        let mut bytes = [0u8; SLOT];
        self.file.read_data_at(slot * SLOT, &mut bytes).ok()?;
        let crc = u32::from_le_bytes(word(&bytes, CRC_AT));
        if crc32c::crc32c(&bytes[..CRC_AT]) != crc {
            return None;
        }
        let state =
            HeadState { first: u64::from_le_bytes(dword(&bytes, 0)), dropped: u64::from_le_bytes(dword(&bytes, 8)) };
        Some((u64::from_le_bytes(dword(&bytes, 16)), state))
    }

    /// Records `state` in the slot not holding the latest one.
    pub(super) fn write(&mut self, state: HeadState) {
        self.counter += 1;
        let mut slot = [0u8; SLOT];
        slot[..8].copy_from_slice(&state.first.to_le_bytes());
        slot[8..16].copy_from_slice(&state.dropped.to_le_bytes());
        slot[16..24].copy_from_slice(&self.counter.to_le_bytes());
        let crc = crc32c::crc32c(&slot[..CRC_AT]);
        slot[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        let at = (self.counter % 2) as usize * SLOT;
        if let Some(target) = self.file.data_mut().get_mut(at..at + SLOT) {
            target.copy_from_slice(&slot);
        }
    }

    pub(super) fn flush(&self) -> Result<(), MappedFileError> {
        self.file.flush_data(0, self.file.data_len())
    }
}
