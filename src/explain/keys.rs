//! The key asked about, as each stream's key field reads it, and the keys that differ from it
//! only in type, case or whitespace — the silent killers of a join (`'DEV-1'` never meets
//! `'dev-1'`, nor the number `1` the string `"1"`).
//!
//! A composite key (`key = ["site", "device"]`) is asked and shown as its values joined by `,`
//! in the key's order (`--key site-1,dev-7`): a stream keyed by several fields splits the text
//! there, one value per field (so a part holding a `,` cannot be asked for); a stream keyed by
//! one field reads the whole text.

use std::collections::BTreeSet;

use crate::plan::Plan;
use crate::record::id::key_hash;
use crate::record::schema::Schema;
use crate::record::{FieldType, Key, Value};

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
                let fields: Vec<_> = s.schema.key_fields().collect();
                let parts: Vec<&str> = if fields.len() > 1 { text.split(',').collect() } else { vec![text] };
                if parts.len() != fields.len() {
                    return None;
                }
                let values: Option<Vec<Value>> = fields
                    .iter()
                    .zip(parts)
                    .map(|(field, part)| match field.ty {
                        FieldType::Int => part.trim().parse().ok().map(Value::Int),
                        _ => Some(Value::Str(part.into())),
                    })
                    .collect();
                Key::from_values(&values?, &(0..fields.len()).collect::<Vec<_>>())
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

/// A key as a person reads it: strings quoted, numbers bare with their type; a composite key's
/// parts in parentheses.
pub fn shown(key: &Key) -> String {
    use crate::record::view::KeyRef;
    let one = |part: KeyRef<'_>| match part {
        KeyRef::Str(s) => format!("'{s}'"),
        KeyRef::Int(i) => format!("{i} (a number)"),
        KeyRef::Broadcast | KeyRef::Composite(_) => "*".into(),
    };
    match key {
        Key::Composite(_) => format!("({})", key.key_ref().parts().map(one).collect::<Vec<_>>().join(", ")),
        key => one(key.key_ref()),
    }
}

/// The key's text for [`AskedKey::resembles`] and for comparing with the key asked about
/// (empty for broadcast).
pub fn text(key: &Key) -> String {
    if *key == Key::Broadcast { String::new() } else { key.key_ref().text() }
}

/// The key fields of a raw JSON line of `schema`, as a person reads them and as text
/// ([`shown_json`]; a composite key's parts in parentheses and joined by `,`); `None` when the
/// stream is broadcast or a key field is missing.
pub fn json_key(schema: &Schema, object: &serde_json::Map<String, serde_json::Value>) -> Option<(String, String)> {
    let parts: Option<Vec<(String, String)>> =
        schema.key_fields().map(|f| object.get(&f.name).map(shown_json)).collect();
    match parts?.as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        parts => {
            let shown: Vec<&str> = parts.iter().map(|(s, _)| s.as_str()).collect();
            let text: Vec<&str> = parts.iter().map(|(_, t)| t.as_str()).collect();
            Some((format!("({})", shown.join(", ")), text.join(",")))
        }
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
        let composite = Key::from_values(&[Value::Str("s1".into()), Value::Int(7)], &[0, 1]).expect("two parts");
        assert_eq!(shown(&composite), "('s1', 7 (a number))");
        assert_eq!(text(&composite), "s1,7");
    }
}
