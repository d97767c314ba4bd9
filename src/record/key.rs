//! Composite keys (`key = ["site", "device"]`): several fields hashed and matched as one key.
//!
//! A composite key is held as one byte string, the canonical encoding of its parts in the key's
//! field order — the encoding [`IdHasher`](super::id::IdHasher) gives the same values (an int:
//! `i` + 8 bytes little-endian; a string: `s` + its length as 8 bytes little-endian + its UTF-8
//! bytes). The encoding is injective, so two composite keys are equal exactly when their bytes
//! are: stores, windows and timers compare and hash them as they do a one-field key, and a
//! result's `_id` hashes the bytes as the parts' own encodings (one formula, [`IdHasher::key`]).
//! One-field keys stay [`Key::Int`]/[`Key::Str`]: their hashes and `_id`s do not change.
//!
//! [`Key::Int`]: super::Key::Int
//! [`Key::Str`]: super::Key::Str
//! [`IdHasher::key`]: super::id::IdHasher::key

use super::view::{KeyRef, ValueRef};

const INT: u8 = b'i';
const STR: u8 = b's';

/// Appends one part (a string or an int) of a composite key; a broadcast or composite part is
/// not a field value and is left out (callers build parts from [`KeyRef::from_value`]).
pub fn push_part(bytes: &mut Vec<u8>, part: KeyRef<'_>) {
    match part {
        KeyRef::Int(i) => {
            bytes.push(INT);
            bytes.extend_from_slice(&i.to_le_bytes());
        }
        KeyRef::Str(s) => {
            bytes.push(STR);
            bytes.extend_from_slice(&(s.len() as u64).to_le_bytes());
            bytes.extend_from_slice(s.as_bytes());
        }
        KeyRef::Broadcast | KeyRef::Composite(_) => {}
    }
}

/// The key of a row whose field `pos` holds `value(pos)`, for a stream keyed by `fields`: a
/// one-field key is that field's value; a composite key its parts, encoded into `bytes`. `None`
/// when a key field holds neither a string nor an int, or when there is no key field.
pub fn key_of<'a>(
    fields: &[usize],
    value: impl Fn(usize) -> ValueRef<'a>,
    bytes: &'a mut Vec<u8>,
) -> Option<KeyRef<'a>> {
    match fields {
        [] => None,
        [pos] => KeyRef::from_value_ref(value(*pos)),
        _ => {
            bytes.clear();
            for &pos in fields {
                push_part(bytes, KeyRef::from_value_ref(value(pos))?);
            }
            Some(KeyRef::Composite(bytes))
        }
    }
}

/// The parts of an encoded composite key, in order. Bytes that do not decode (never written by
/// [`push_part`]) end the iteration.
pub struct Parts<'a> {
    rest: &'a [u8],
}

impl<'a> Parts<'a> {
    pub fn new(bytes: &'a [u8]) -> Parts<'a> {
        Parts { rest: bytes }
    }
}

impl<'a> Iterator for Parts<'a> {
    type Item = KeyRef<'a>;

    fn next(&mut self) -> Option<KeyRef<'a>> {
        let bytes: &'a [u8] = std::mem::take(&mut self.rest);
        let (&tag, rest) = bytes.split_first()?;
        let (word, rest) = rest.split_first_chunk::<8>()?;
        let (part, rest) = match tag {
            INT => (KeyRef::Int(i64::from_le_bytes(*word)), rest),
            STR => {
                let len = usize::try_from(u64::from_le_bytes(*word)).ok()?;
                let text = std::str::from_utf8(rest.get(..len)?).ok()?;
                (KeyRef::Str(text), &rest[len..])
            }
            _ => return None,
        };
        self.rest = rest;
        Some(part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Key, Value, id};

    #[test]
    fn parts_round_trip_and_compare_as_tuples() {
        let values = [Value::Str("site-1".into()), Value::Int(-7), Value::Str("".into())];
        let key = Key::from_values(&values, &[0, 1, 2]).expect("string and int parts");
        let parts: Vec<KeyRef<'_>> = key.key_ref().parts().collect();
        assert_eq!(parts, [KeyRef::Str("site-1"), KeyRef::Int(-7), KeyRef::Str("")]);
        // Delimited: ("ab", "c") and ("a", "bc") are different keys with different hashes.
        let ab_c = Key::from_values(&[Value::Str("ab".into()), Value::Str("c".into())], &[0, 1]);
        let a_bc = Key::from_values(&[Value::Str("a".into()), Value::Str("bc".into())], &[0, 1]);
        assert_ne!(ab_c, a_bc);
        let hashes = [ab_c, a_bc].map(|k| id::key_hash(&k.expect("two strings")));
        assert_ne!(hashes[0], hashes[1]);
        // Per field: an int part never equals a string part.
        let int = Key::from_values(&[Value::Int(1), Value::Int(2)], &[0, 1]);
        let text = Key::from_values(&[Value::Str("1".into()), Value::Int(2)], &[0, 1]);
        assert_ne!(int, text);
        // A one-field key stays what it was (its hash and ids are pinned elsewhere).
        assert_eq!(Key::from_values(&values, &[1]), Some(Key::Int(-7)));
        assert_eq!(Key::from_values(&[Value::Null, Value::Int(1)], &[0, 1]), None);
        assert_eq!(Key::from_values(&values, &[]), None);
    }

    #[test]
    fn garbage_bytes_end_the_parts() {
        for bytes in [&b"i12"[..], b"s\xff\xff\xff\xff\xff\xff\xff\xffab", b"x", b"s\x01\0\0\0\0\0\0\0\xff"] {
            assert_eq!(Parts::new(bytes).count(), 0, "{bytes:?}");
        }
    }
}
