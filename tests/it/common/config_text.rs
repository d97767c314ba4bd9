//! Pieces of configuration text for generated workloads.

use std::fmt::Write as _;

/// A `[streams.NAME]` section (after a blank line): keyed by `key` (`"*"`: broadcast), event time
/// in the field `ts` in ms, `max_out_of_orderness` and `idle_timeout` as given (None: left out,
/// for their defaults), and `fields` (name, type) in declaration order.
pub fn stream_section(name: &str, key: &str, ooo: Option<&str>, idle: Option<&str>, fields: &[(&str, &str)]) -> String {
    let mut s = format!("\n[streams.{name}]\nkey = \"{key}\"\ntime = {{ field = \"ts\", unit = \"ms\" }}\n");
    if let Some(t) = ooo {
        writeln!(s, "max_out_of_orderness = \"{t}\"").unwrap();
    }
    if let Some(t) = idle {
        writeln!(s, "idle_timeout = \"{t}\"").unwrap();
    }
    let fields: Vec<String> = fields.iter().map(|(n, t)| format!("{n} = \"{t}\"")).collect();
    writeln!(s, "fields = {{ {} }}", fields.join(", ")).unwrap();
    s
}

/// [`stream_section`] with both durations in ms.
pub fn stream_section_ms(name: &str, key: &str, ooo_ms: i64, idle_ms: i64, fields: &[(&str, &str)]) -> String {
    stream_section(name, key, Some(&format!("{ooo_ms}ms")), Some(&format!("{idle_ms}ms")), fields)
}

/// The stream of the hand-written tick tests: key `k` (string), `ts` (int, ms), `v` (int).
pub fn kv_stream(name: &str, ooo: &str, idle: &str) -> String {
    stream_section(name, "k", Some(ooo), Some(idle), &[("k", "string"), ("ts", "int"), ("v", "int")])
}

/// One item of a `select` list, unquoted: `left.FIELD`, or `right.FIELD AS ALIAS` (side 0 is
/// left, 1 right; the alias is left out when it is the field's name).
pub fn select_item(side: usize, field: &str, alias: &str) -> String {
    let side = if side == 0 { "left" } else { "right" };
    if field == alias { format!("{side}.{field}") } else { format!("{side}.{field} AS {alias}") }
}
