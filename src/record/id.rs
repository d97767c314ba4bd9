//! Stable ids and key hashes (CONTRACT.md rule 10).
//!
//! Ids are persisted by consumers (they deduplicate and upsert by `_id`) and key hashes decide
//! the shard, so both must be the same on every run, version and platform: xxh3-64 with seed 0
//! over a canonical byte encoding (every value tagged with its type, strings length-prefixed,
//! integers little-endian), never a std or foldhash hasher.

use super::{Key, Value};

/// Builds the canonical bytes of an id's parts, then hashes them. Reuse one per thread of work.
#[derive(Default)]
pub struct IdHasher {
    buf: Vec<u8>,
    /// Length of the operator's part `buf` starts with after [`pair`](Self::pair) (0: none):
    /// the next pair of the same operator writes only its ids.
    pair_prefix: usize,
}

/// Bytes of a pair's prefix besides the operator's name: two string tags and lengths, "match".
const PAIR_PREFIX_FIXED: usize = 2 * (1 + 8) + "match".len();
/// Where the operator's name starts in a pair's prefix (after its tag and length).
const PAIR_NAME_AT: usize = 1 + 8;

impl IdHasher {
    pub fn begin(&mut self) -> &mut Self {
        self.buf.clear();
        self.pair_prefix = 0;
        self
    }

    pub fn str(&mut self, s: &str) -> &mut Self {
        self.buf.push(b's');
        self.buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
        self.buf.extend_from_slice(s.as_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.push(b'u');
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn value(&mut self, v: &Value) -> &mut Self {
        self.value_ref(super::view::ValueRef::of(v))
    }

    pub fn value_ref(&mut self, v: super::view::ValueRef<'_>) -> &mut Self {
        use super::view::ValueRef;
        match v {
            ValueRef::Null => self.buf.push(b'n'),
            ValueRef::Bool(b) => self.buf.extend_from_slice(&[b'b', b as u8]),
            ValueRef::Int(i) => {
                self.buf.push(b'i');
                self.buf.extend_from_slice(&i.to_le_bytes());
            }
            ValueRef::Float(f) => {
                self.buf.push(b'f');
                // -0.0 and 0.0 are the same number in JSON: one id.
                let f = if f == 0.0 { 0.0 } else { f };
                self.buf.extend_from_slice(&f.to_bits().to_le_bytes());
            }
            ValueRef::Str(s) => {
                self.str(s);
            }
            ValueRef::IdList(ids) => {
                self.buf.push(b'l');
                self.buf.extend_from_slice(&(ids.len() as u64).to_le_bytes());
                for id in ids.iter() {
                    self.buf.extend_from_slice(&id.to_le_bytes());
                }
            }
        }
        self
    }

    /// A key's values, in the key's order (a one-field key: its value; broadcast: null). A
    /// composite key's bytes are already its parts' encodings ([`super::key`]).
    pub fn key(&mut self, key: super::view::KeyRef<'_>) -> &mut Self {
        use super::view::KeyRef;
        match key {
            KeyRef::Broadcast => self.value(&Value::Null),
            KeyRef::Int(i) => self.value(&Value::Int(i)),
            KeyRef::Str(s) => self.str(s),
            KeyRef::Composite(bytes) => {
                self.buf.extend_from_slice(bytes);
                self
            }
        }
    }

    /// Begins the id of a join pair of operator `operator` (`_kind` `match`): its left and right
    /// rows' ids (a window join adds the window bounds). One formula for the operators that emit
    /// pairs and for `braid explain`, which finds a row's partners by it.
    pub fn pair(&mut self, operator: &str, left: u64, right: u64) -> &mut Self {
        // The same bytes as `begin().str(operator).str("match")`, kept from the last pair when
        // it was the same operator's (a join makes its pairs one after another).
        let prefix = PAIR_PREFIX_FIXED + operator.len();
        let name = PAIR_NAME_AT..PAIR_NAME_AT + operator.len();
        if self.pair_prefix == prefix && self.buf.get(name) == Some(operator.as_bytes()) {
            self.buf.truncate(prefix);
        } else {
            self.begin().str(operator).str("match");
            self.pair_prefix = prefix;
        }
        push_pair_ids(&mut self.buf, left, right);
        self
    }

    pub fn finish(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&self.buf)
    }
}

/// The bytes of `.u64(left).u64(right)` in one piece: one capacity check, not four.
fn push_pair_ids(buf: &mut Vec<u8>, left: u64, right: u64) {
    let mut ids = [b'u'; 18];
    ids[1..9].copy_from_slice(&left.to_le_bytes());
    ids[10..].copy_from_slice(&right.to_le_bytes());
    buf.extend_from_slice(&ids);
}

/// The ids of one operator's join pairs: [`IdHasher::pair`]'s bytes with the operator's part
/// written once, when it is made. A join that owns one writes only the two ids per pair, where a
/// shared hasher compares the operator's name at every pair to know its part is still there.
#[derive(Clone, Debug)]
pub struct PairIds {
    buf: Vec<u8>,
    /// Bytes of the operator's part at the start of `buf`.
    prefix: usize,
}

impl PairIds {
    pub fn new(operator: &str) -> PairIds {
        let mut ids = IdHasher::default();
        ids.begin().str(operator).str("match");
        let prefix = ids.buf.len();
        PairIds { buf: ids.buf, prefix }
    }

    /// The id of the pair of rows `left` and `right`: `IdHasher::pair(operator, left, right)`
    /// finished.
    pub fn id(&mut self, left: u64, right: u64) -> u64 {
        self.buf.truncate(self.prefix);
        push_pair_ids(&mut self.buf, left, right);
        xxhash_rust::xxh3::xxh3_64(&self.buf)
    }
}

/// The stable hash of a key value, used to route its rows to a shard.
pub fn key_hash(key: &Key) -> u64 {
    key_ref_hash(key.key_ref())
}

/// [`key_hash`] of a borrowed key (no allocation for a string key read in place).
pub fn key_ref_hash(key: super::view::KeyRef<'_>) -> u64 {
    use super::view::KeyRef;
    match key {
        KeyRef::Broadcast => 0,
        KeyRef::Int(i) => xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes()),
        KeyRef::Str(s) => xxhash_rust::xxh3::xxh3_64_with_seed(s.as_bytes(), 1),
        KeyRef::Composite(bytes) => xxhash_rust::xxh3::xxh3_64_with_seed(bytes, 2),
    }
}

/// `_id` as written: 16 lowercase hex digits.
pub fn hex(id: u64) -> String {
    format!("{id:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_the_same_bytes_whatever_came_before() {
        let spelled =
            |op: &str, l: u64, r: u64| IdHasher::default().begin().str(op).str("match").u64(l).u64(r).finish();
        let mut ids = IdHasher::default();
        let calls = [("effect", 1, 2), ("effect", 3, 4), ("effecu", 3, 4), ("eff", 5, 6), ("effect", 7, 8), ("", 9, 9)];
        for (op, l, r) in calls {
            assert_eq!(ids.pair(op, l, r).finish(), spelled(op, l, r), "{op} {l} {r}");
        }
        // Other ids in between start over.
        ids.begin().str("effect").str("left_only").u64(1).finish();
        assert_eq!(ids.pair("effect", 1, 2).finish(), spelled("effect", 1, 2));
        // One operator's own pair ids are the same bytes.
        for op in ["effect", "", "a longer operator name than most"] {
            let mut pairs = PairIds::new(op);
            for (l, r) in [(1, 2), (3, 4), (u64::MAX, 0)] {
                assert_eq!(pairs.id(l, r), spelled(op, l, r), "{op} {l} {r}");
            }
        }
    }

    #[test]
    fn ids_are_stable_across_versions() {
        // Pinned: changing the encoding or the hash changes every id consumers have stored.
        let mut h = IdHasher::default();
        let id = h.begin().str("status").value(&Value::Int(7)).value(&Value::Str("d1".into())).finish();
        assert_eq!(hex(id), hex(id));
        assert_eq!(id, 0x6bb0_2c6f_d66e_b05c, "id encoding changed: {}", hex(id));
        assert_eq!(key_hash(&Key::Str("d1".into())), key_hash(&Key::Str("d1".into())));
        assert_ne!(key_hash(&Key::Int(1)), key_hash(&Key::Str("1".into())));
    }

    #[test]
    fn parts_are_delimited() {
        let mut h = IdHasher::default();
        let a = h.begin().str("ab").str("c").finish();
        let b = h.begin().str("a").str("bc").finish();
        assert_ne!(a, b);
    }
}
