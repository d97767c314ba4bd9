//! The key asked about, as each stream's key field reads it, and the keys that differ from it
//! only in type, case or whitespace — the silent killers of a join (`'DEV-1'` never meets
//! `'dev-1'`, nor the number `1` the string `"1"`).

use std::collections::BTreeSet;

use crate::plan::Plan;
use crate::record::id::key_hash;
use crate::record::{FieldType, Key};

/// The key as the user typed it, read by every stream.
pub struct AskedKey {
    pub text: String,
    /// Per stream: the key its key field reads (`None`: broadcast, or an int stream and `text` is
    /// no integer).
    pub per_stream: Vec<Option<Key>>,
}

impl AskedKey {
    pub fn new(plan: &Plan, text: &str) -> AskedKey {
        let per_stream = plan
            .streams
            .iter()
            .map(|s| {
                let field = &s.schema.fields[s.schema.key?];
                match field.ty {
                    FieldType::Int => text.trim().parse().ok().map(Key::Int),
                    _ => Some(Key::Str(text.into())),
                }
            })
            .collect();
        AskedKey { text: text.to_owned(), per_stream }
    }

    /// The key hashes to follow through the operators: every reading of the key.
    pub fn hashes(&self) -> Vec<u64> {
        let keys: BTreeSet<&Key> = self.per_stream.iter().flatten().collect();
        keys.into_iter().map(key_hash).collect()
    }

    /// Whether `key` (of `stream`) is the key asked about.
    pub fn is(&self, stream: usize, key: &Key) -> bool {
        self.per_stream[stream].as_ref() == Some(key)
    }

    /// Whether `shown` (a key's text) differs from the key asked about only in case or
    /// whitespace (or not at all).
    pub fn resembles(&self, shown: &str) -> bool {
        folded(shown) == folded(&self.text)
    }
}

fn folded(text: &str) -> String {
    text.split_whitespace().collect::<String>().to_lowercase()
}

/// A key as a person reads it: strings quoted, numbers bare with their type.
pub fn shown(key: &Key) -> String {
    match key {
        Key::Str(s) => format!("'{s}'"),
        Key::Int(i) => format!("{i} (a number)"),
        Key::Broadcast => "*".into(),
    }
}

/// A key field's raw JSON value as a person reads it, and its text for [`AskedKey::resembles`].
pub fn shown_json(value: &serde_json::Value) -> (String, String) {
    match value {
        serde_json::Value::String(s) => (format!("'{s}'"), s.clone()),
        serde_json::Value::Number(n) => (format!("{n} (a number)"), n.to_string()),
        serde_json::Value::Bool(b) => (format!("{b} (a boolean)"), b.to_string()),
        serde_json::Value::Null => ("null".into(), "null".into()),
        other => (format!("{other} (not a key)"), other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_and_whitespace_do_not_matter_to_resemblance() {
        let key = AskedKey { text: "dev-1".into(), per_stream: vec![] };
        assert!(key.resembles("DEV-1"));
        assert!(key.resembles(" dev-1 "));
        assert!(!key.resembles("dev-2"));
        assert_eq!(shown(&Key::Int(1)), "1 (a number)");
        assert_eq!(shown(&Key::Str("1".into())), "'1'");
    }
}
