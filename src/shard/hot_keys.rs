//! Which key carries most of a shard's rows: a space-saving sketch (Metwally et al.) of
//! [`SLOTS`] counters per shard, fed by the feeder as it routes rows, over windows of
//! [`WINDOW_ROWS`] rows. A key with more than `1/SLOTS` of a window's rows is certain to hold a
//! slot, and its count overestimates it by at most the smallest count, so the share reported for a
//! hot key (over 1/2 of the rows, the warning's threshold) is tight. Per row: a scan of eight
//! hashes, no allocation (a key's name is copied once, when its count first reaches [`NAMED_AT`]).

use crate::record::Key;
use crate::record::view::RowView;

const SLOTS: usize = 8;
/// Rows per window; the last full window is kept for reports while the next one fills.
pub const WINDOW_ROWS: u64 = 10_000;
/// Rows of its own at which a slot's key's name is copied (the key's own row then).
const NAMED_AT: u64 = 16;

#[derive(Clone, Default)]
struct Slot {
    hash: u64,
    /// Rows counted for the slot's key: its own and those it inherited with the slot.
    count: u64,
    /// Rows of the key itself since it took the slot.
    own: u64,
    key: Option<Key>,
}

/// One shard's sketch.
#[derive(Clone, Default)]
pub struct HotKeys {
    slots: Vec<Slot>,
    rows: u64,
    last: Option<HotKey>,
}

/// The key with most rows of a window of one shard.
#[derive(Clone, Debug, PartialEq)]
pub struct HotKey {
    /// The key as text (a string key as it is, an int in decimal).
    pub key: String,
    /// Its share of the window's rows, 0..=1 (an upper bound, see the module doc).
    pub share: f64,
    /// Rows in the window.
    pub rows: u64,
    /// More than one key was seen in the window (one key alone is a fleet of one, not skew).
    pub many_keys: bool,
}

impl HotKeys {
    pub fn count(&mut self, row: RowView<'_>) {
        self.rows += 1;
        let hash = row.key_hash();
        let slot = match self.slots.iter().position(|s| s.hash == hash && s.count > 0) {
            Some(i) => &mut self.slots[i],
            None if self.slots.len() < SLOTS => {
                self.slots.push(Slot { hash, count: 0, own: 0, key: None });
                self.slots.last_mut().expect("a slot was just pushed")
            }
            None => {
                let min = self.slots.iter_mut().min_by_key(|s| s.count).expect("SLOTS > 0");
                *min = Slot { hash, count: min.count, own: 0, key: None };
                min
            }
        };
        slot.count += 1;
        slot.own += 1;
        if slot.key.is_none() && slot.own >= NAMED_AT {
            slot.key = Some(row.key().to_key());
        }
        if self.rows >= WINDOW_ROWS {
            self.last = self.current();
            self.slots.clear();
            self.rows = 0;
        }
    }

    fn current(&self) -> Option<HotKey> {
        let top = self.slots.iter().filter(|s| s.key.is_some()).max_by_key(|s| s.count)?;
        let key = match top.key.as_ref()? {
            Key::Broadcast => return None,
            key => key.key_ref().text(),
        };
        Some(HotKey {
            key,
            share: top.count as f64 / self.rows as f64,
            rows: self.rows,
            many_keys: self.slots.len() > 1,
        })
    }

    /// The current window once it holds at least `min_rows` rows, else the last full one.
    pub fn report(&self, min_rows: u64) -> Option<HotKey> {
        if self.rows >= min_rows { self.current() } else { self.last.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Row;
    use crate::record::id::key_hash;

    fn row(key: &str) -> Row {
        let key = Key::Str(key.into());
        Row { ts: 0, key_hash: key_hash(&key), key, id: 0, values: vec![].into() }
    }

    #[test]
    fn a_key_with_most_rows_is_named_with_its_share() {
        let mut hot = HotKeys::default();
        for i in 0..1000 {
            hot.count(RowView::Heap(&row(if i % 4 == 0 { "other" } else { "hot" })));
            hot.count(RowView::Heap(&row(&format!("k{i}"))));
        }
        let top = hot.report(100).unwrap();
        assert_eq!(top.key, "hot");
        assert!(top.many_keys);
        // 750 of 2000 rows, overestimated by at most the smallest count.
        assert!((0.375..0.40).contains(&top.share), "{top:?}");
    }

    #[test]
    fn windows_roll_and_the_last_full_one_is_kept() {
        let mut hot = HotKeys::default();
        for _ in 0..WINDOW_ROWS {
            hot.count(RowView::Heap(&row("a")));
        }
        assert_eq!(hot.report(100).map(|h| (h.key, h.many_keys)), Some(("a".into(), false)));
        hot.count(RowView::Heap(&row("b")));
        assert_eq!(hot.report(100).map(|h| h.key), Some("a".into()), "one row is too few: the last window");
    }
}
