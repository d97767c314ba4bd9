//! Snapshots of in-memory state, for checkpoints (DESIGN.md "State", issue "Checkpoints").
//!
//! Everything an operator's output depends on — its stored rows with their handles and matched
//! flags, timers, open windows and aggregates, per-key state, its clock and counters — is written
//! into a snapshot when a checkpoint barrier passes it, and read back into a freshly built
//! instance of the same operator at a restart. A snapshot is an rkyv archive of a plain struct
//! (vectors, not maps or heaps: the containers rebuild their order on restore), checked with
//! bytecheck when it is read, so a damaged or foreign snapshot is an error, never a misread.

use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum SnapshotError {
    /// The bytes are not a snapshot of this kind (damaged, or written by another version).
    #[error("snapshot does not decode: {0}")]
    Decode(String),
    /// A snapshot of something else: another kind of operator, another number of inputs.
    #[error("snapshot is of {found}, expected {expected}")]
    Mismatch { expected: String, found: String },
    #[error("encoding a snapshot: {0}")]
    Encode(String),
}

/// Encodes `value` as an rkyv archive.
pub fn encode<T>(value: &T) -> Result<Vec<u8>, SnapshotError>
where
    T: for<'a> rkyv::Serialize<HighSerializer<AlignedVec, ArenaHandle<'a>, rancor::Error>>,
{
    rkyv::to_bytes::<rancor::Error>(value).map(|bytes| bytes.to_vec()).map_err(|e| SnapshotError::Encode(e.to_string()))
}

/// Decodes what [`encode`] wrote, checking it first (any alignment of `bytes`).
pub fn decode<T>(bytes: &[u8]) -> Result<T, SnapshotError>
where
    T: rkyv::Archive,
    T::Archived:
        for<'a> CheckBytes<HighValidator<'a, rancor::Error>> + rkyv::Deserialize<T, HighDeserializer<rancor::Error>>,
{
    let mut aligned = AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    rkyv::from_bytes::<T, rancor::Error>(&aligned).map_err(|e| SnapshotError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    struct Sample {
        a: u64,
        b: Vec<(i128, bool)>,
    }

    #[test]
    fn round_trip_and_damage_is_an_error() {
        let sample = Sample { a: 7, b: vec![(-3, true), (i128::MAX, false)] };
        let bytes = encode(&sample).unwrap();
        assert_eq!(decode::<Sample>(&bytes).unwrap(), sample);
        assert!(decode::<Sample>(&bytes[..bytes.len() - 4]).is_err());
    }
}
