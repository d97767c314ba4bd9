//! The spool's head file: where the unreleased records start, and how many were dropped.
//!
//! Two 32-byte slots written in turn (first u64 | dropped u64 | counter u64 | zero u32 |
//! crc32c of 0..28 u32); open takes the intact slot with the higher counter. A crash in the middle
//! of a write tears at most the slot being written, and the other one still holds the previous
//! state.

use std::path::Path;

use crate::storage::log::{dword, word};
use crate::storage::mapped_file::{MappedFile, MappedFileError};

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
    /// Opens `path`, or creates it holding `HeadState::default()` when it does not exist.
    pub(super) fn open(path: &Path) -> Result<(Head, HeadState), MappedFileError> {
        if !path.exists() {
            let mut head = Head { file: MappedFile::create(path, MAGIC, VERSION, 2 * SLOT)?, counter: 0 };
            head.write(HeadState::default());
            head.file.flush_data(0, 2 * SLOT)?;
            return Ok((head, HeadState::default()));
        }
        let file = MappedFile::open(path, MAGIC, VERSION)?;
        let mut head = Head { file, counter: 0 };
        let best = (0..2).filter_map(|i| head.read(i)).max_by_key(|&(counter, _)| counter);
        let (counter, state) = best.unwrap_or_default();
        head.counter = counter;
        Ok((head, state))
    }

    fn read(&self, slot: usize) -> Option<(u64, HeadState)> {
        let bytes = self.file.data().get(slot * SLOT..(slot + 1) * SLOT)?;
        let crc = u32::from_le_bytes(word(bytes, CRC_AT));
        if crc32c::crc32c(&bytes[..CRC_AT]) != crc {
            return None;
        }
        let state =
            HeadState { first: u64::from_le_bytes(dword(bytes, 0)), dropped: u64::from_le_bytes(dword(bytes, 8)) };
        Some((u64::from_le_bytes(dword(bytes, 16)), state))
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
