//! Outputs compared as multisets: rows as canonical JSON texts, counted, and the difference of
//! two such counts as readable text.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde_json::Value;

/// Items (canonical rows, or descriptions of results) with how often each occurs.
pub type Multiset = BTreeMap<String, usize>;

/// Counts one more `item`.
pub fn add(m: &mut Multiset, item: String) {
    *m.entry(item).or_insert(0) += 1;
}

/// The multiset of `items`.
pub fn count(items: impl IntoIterator<Item = String>) -> Multiset {
    let mut m = Multiset::new();
    for item in items {
        add(&mut m, item);
    }
    m
}

/// A JSON value as text with object keys sorted (at every level): equal values, equal text.
/// Numbers stay as written (20 and 20.0 differ): for comparing braid's outputs with each other.
pub fn canonical(v: &Value) -> String {
    let mut s = String::new();
    write_canonical(v, false, &mut s);
    s
}

/// As [`canonical`], but numbers by their value as f64 (20 and 20.0 are one number): for
/// comparing braid's outputs with values a reference computed.
pub fn canonical_by_value(v: &Value) -> String {
    let mut s = String::new();
    write_canonical(v, true, &mut s);
    s
}

fn write_canonical(v: &Value, by_value: bool, out: &mut String) {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, &Value> = m.iter().collect();
            out.push('{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, by_value, out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, by_value, out);
            }
            out.push(']');
        }
        Value::Number(n) if by_value => write!(out, "{:?}", n.as_f64().unwrap()).unwrap(),
        _ => out.push_str(&v.to_string()),
    }
}

/// Rows as a multiset of [`canonical`] texts.
pub fn multiset(rows: &[Value]) -> Multiset {
    count(rows.iter().map(canonical))
}

/// Rows as a multiset of [`canonical_by_value`] texts.
pub fn multiset_by_value(rows: &[Value]) -> Multiset {
    count(rows.iter().map(canonical_by_value))
}

/// A readable difference of two multisets, one line per item counted differently (the first
/// 20); "" when they are equal.
pub fn multiset_diff(a_name: &str, a: &Multiset, b_name: &str, b: &Multiset) -> String {
    let mut s = String::new();
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut n = 0;
    for k in keys {
        let (x, y) = (a.get(k).copied().unwrap_or(0), b.get(k).copied().unwrap_or(0));
        if x != y {
            n += 1;
            if n <= 20 {
                writeln!(s, "  {a_name} ×{x} vs {b_name} ×{y}: {k}").unwrap();
            }
        }
    }
    if n > 20 {
        writeln!(s, "  ... {} more differences", n - 20).unwrap();
    }
    s
}

/// An `_id` as braid writes it: 16 lowercase hex digits.
pub fn is_id(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// [`is_id`] of a JSON value (false when it is no string).
pub fn is_id_value(v: &Value) -> bool {
    v.as_str().is_some_and(is_id)
}
