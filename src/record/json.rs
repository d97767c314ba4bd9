//! Rows → JSON lines, as replay writes them and sinks send them (CONTRACT.md "Replay").
//!
//! Written by hand into a reused buffer rather than through `serde_json::Value`: one allocation
//! per output file, none per row. Strings and floats go through serde_json's own formatters, so
//! escaping and number formatting are serde_json's.

use super::view::{RowView, ValueRef};
use super::{Row, Schema};

/// Appends `{"f1":v1,...` (no closing brace) with the schema's field names. An empty id list
/// (`_supersedes`) is left out: it is present only when not empty.
fn open_object(out: &mut Vec<u8>, schema: &Schema, row: RowView<'_>) {
    out.push(b'{');
    for (member, value) in schema.json_members.iter().zip(row.values()) {
        if matches!(value, ValueRef::IdList(ids) if ids.is_empty()) {
            continue;
        }
        comma(out);
        out.extend_from_slice(member);
        write_value(out, value);
    }
}

/// `"name":`, the start of an object member: a schema keeps one per field
/// ([`Schema::json_members`](super::Schema::json_members)).
pub fn member_text(name: &str) -> Box<[u8]> {
    let mut text = Vec::with_capacity(name.len() + 3);
    write_str(&mut text, name);
    text.push(b':');
    text.into()
}

fn member(out: &mut Vec<u8>, name: &str) {
    comma(out);
    write_str(out, name);
    out.push(b':');
}

/// The comma before a member that is not the object's first.
fn comma(out: &mut Vec<u8>) {
    if out.last() != Some(&b'{') {
        out.push(b',');
    }
}

/// A row of an input stream: its declared fields plus `_stream` and `_ts`.
pub fn write_input_row(out: &mut Vec<u8>, schema: &Schema, stream: &str, row: RowView<'_>) {
    open_object(out, schema, row);
    member(out, "_stream");
    write_str(out, stream);
    member(out, "_ts");
    write_int(out, row.ts());
    out.extend_from_slice(b"}\n");
}

/// An operator's result: its output fields (key, selected fields, `_kind`, …), `_ts` and `_id`.
/// Read where it lies: on the heap, or archived in a result frame.
pub fn write_result(out: &mut Vec<u8>, schema: &Schema, row: RowView<'_>) {
    open_object(out, schema, row);
    member(out, "_ts");
    write_int(out, row.ts());
    member(out, "_id");
    write_id(out, row.id());
    out.extend_from_slice(b"}\n");
}

/// A late row: the row's fields (an upstream result keeps its `_id`), `_stream` naming the input
/// it came on, and `_ts`.
pub fn write_late(out: &mut Vec<u8>, schema: &Schema, from_operator: bool, input: &str, row: &Row) {
    write_side_row(out, schema, from_operator, input, row, None);
}

/// A row of `OPERATOR.expired`: as a late row (`stream`: the input it came on, or the operator
/// for a result it would have emitted), with `_reason`.
pub fn write_expired(out: &mut Vec<u8>, schema: &Schema, with_id: bool, stream: &str, row: &Row, reason: &str) {
    write_side_row(out, schema, with_id, stream, row, Some(reason));
}

fn write_side_row(out: &mut Vec<u8>, schema: &Schema, with_id: bool, stream: &str, row: &Row, reason: Option<&str>) {
    open_object(out, schema, RowView::Heap(row));
    if with_id {
        member(out, "_id");
        write_id(out, row.id);
    }
    member(out, "_stream");
    write_str(out, stream);
    member(out, "_ts");
    write_int(out, row.ts);
    if let Some(reason) = reason {
        member(out, "_reason");
        write_str(out, reason);
    }
    out.extend_from_slice(b"}\n");
}

/// A `dead_letter` row.
pub fn write_dead_letter(out: &mut Vec<u8>, stream: &str, raw: &str, reason: &str) {
    out.push(b'{');
    member(out, "_stream");
    write_str(out, stream);
    member(out, "raw");
    write_str(out, raw);
    member(out, "_reason");
    write_str(out, reason);
    out.extend_from_slice(b"}\n");
}

fn write_value(out: &mut Vec<u8>, value: ValueRef<'_>) {
    match value {
        ValueRef::Null => out.extend_from_slice(b"null"),
        ValueRef::Bool(true) => out.extend_from_slice(b"true"),
        ValueRef::Bool(false) => out.extend_from_slice(b"false"),
        ValueRef::Int(i) => write_int(out, i),
        ValueRef::Float(f) => write_json(out, &f),
        ValueRef::Str(s) => write_str(out, s),
        ValueRef::IdList(ids) => {
            out.push(b'[');
            for (i, id) in ids.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_id(out, id);
            }
            out.push(b']');
        }
    }
}

/// An id as a JSON string of 16 lowercase hex digits, written in place (no formatter: this
/// is on every result line).
fn write_id(out: &mut Vec<u8>, id: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [b'"'; 18];
    for (i, digit) in text[1..17].iter_mut().enumerate() {
        *digit = HEX[((id >> (60 - 4 * i)) & 0xf) as usize];
    }
    out.extend_from_slice(&text);
}

fn write_int(out: &mut Vec<u8>, i: i64) {
    // serde_json writes integers with itoa too: the same text, without a serializer around it.
    out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
}

/// Bytes JSON escapes (serde_json's rule: control characters, `"` and `\`): a string without them
/// is written as it is, and one read without them needs no unescaping.
pub(crate) const ESCAPED: [bool; 256] = {
    let mut escaped = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        escaped[b] = true;
        b += 1;
    }
    escaped[b'"' as usize] = true;
    escaped[b'\\' as usize] = true;
    escaped
};

/// Bytes of `bytes` before the first that JSON escapes ([`ESCAPED`]), eight at a time while eight
/// are left.
pub(crate) fn plain_len(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    // The high bit of each byte below `n`: exact for the lowest such byte, the only one read (a
    // borrow only runs upwards, from a byte that is itself below `n`).
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGHS;
    let mut at = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        // The slice is eight bytes long, so the conversion cannot fail.
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        let stops =
            below(word ^ (ONES * u64::from(b'"')), 1) | below(word ^ (ONES * u64::from(b'\\')), 1) | below(word, 0x20);
        if stops != 0 {
            return at + (stops.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + bytes[at..].iter().position(|&b| ESCAPED[usize::from(b)]).unwrap_or(bytes.len() - at)
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    // Most strings (field names, device ids, kinds) need no escape: copied as they are.
    if plain_len(s.as_bytes()) == s.len() {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        write_json(out, s);
    }
}

fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing into a Vec cannot fail, and strings, integers and finite floats always serialize
    // (decoding refuses non-finite numbers).
    let _ = serde_json::to_writer(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::frame::RowEncoder;
    use crate::record::schema::{Field, FieldType, TimeSpec};
    use crate::record::{Key, Value};

    /// Eight bytes at a time stop where one byte at a time does: every byte value, at every place
    /// in and after the first words, behind plain ASCII and UTF-8 bytes.
    #[test]
    fn plain_len_stops_at_the_first_stop_byte() {
        let one_at_a_time = |bytes: &[u8]| bytes.iter().position(|&b| ESCAPED[usize::from(b)]).unwrap_or(bytes.len());
        for filler in [b'a', 0x7f, 0x80, 0xc3, 0xff] {
            for stop in 0..=255u8 {
                for at in 0..24 {
                    let mut bytes = vec![filler; 30];
                    bytes[at] = stop;
                    assert_eq!(plain_len(&bytes), one_at_a_time(&bytes), "filler {filler:#x}, byte {stop:#x} at {at}");
                    assert_eq!(plain_len(&bytes[..at]), at);
                }
            }
        }
    }

    /// A result line, written from the heap row and from its archive: the same bytes.
    fn result_line(schema: &Schema, row: &Row) -> Vec<u8> {
        let mut heap = Vec::new();
        write_result(&mut heap, schema, RowView::Heap(row));
        let mut encoder = RowEncoder::new();
        let archived = crate::record::frame::access(encoder.encode(row).unwrap()).unwrap();
        let mut in_place = Vec::new();
        write_result(&mut in_place, schema, RowView::Archived(archived));
        assert_eq!(String::from_utf8_lossy(&in_place), String::from_utf8_lossy(&heap));
        heap
    }

    #[test]
    fn input_row_and_result_shapes() {
        let field = |name: &str, ty| Field { name: name.into(), ty, nullable: false };
        let schema = Schema::new(
            vec![field("device", FieldType::String), field("t", FieldType::Float)],
            Some(0),
            TimeSpec::Ingest,
        );
        let row = Row {
            ts: 5,
            key: Key::Str("d\"1".into()),
            key_hash: 0,
            id: 0xab,
            values: vec![Value::Str("d\"1".into()), Value::Float(20.0)].into(),
        };
        let mut out = Vec::new();
        write_input_row(&mut out, &schema, "status", RowView::Heap(&row));
        out.extend(result_line(&schema, &row));
        write_dead_letter(&mut out, "status", "x\u{fffd}", "invalid_utf8");
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines[0], serde_json::json!({"device": "d\"1", "t": 20.0, "_stream": "status", "_ts": 5}));
        assert_eq!(lines[1]["_id"], "00000000000000ab");
        assert_eq!(lines[2]["_reason"], "invalid_utf8");
    }

    #[test]
    fn id_lists_are_hex_strings_and_left_out_when_empty() {
        let field = |name: &str, ty| Field { name: name.into(), ty, nullable: false };
        let schema = Schema::new(
            vec![field("n", FieldType::Int), field("_supersedes", FieldType::IdList), field("m", FieldType::Int)],
            Some(0),
            TimeSpec::Ingest,
        );
        let row = |ids: &[u64]| Row {
            ts: 5,
            key: Key::Int(1),
            key_hash: 0,
            id: 1,
            values: vec![Value::Int(1), Value::IdList(ids.into()), Value::Int(2)].into(),
        };
        let mut out = Vec::new();
        out.extend(result_line(&schema, &row(&[])));
        out.extend(result_line(&schema, &row(&[0xab, 0x1_0000_0000])));
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines[0], serde_json::json!({"n": 1, "m": 2, "_ts": 5, "_id": "0000000000000001"}));
        assert_eq!(lines[1]["_supersedes"], serde_json::json!(["00000000000000ab", "0000000100000000"]));
    }

    /// The shortcuts write what serde_json writes.
    #[test]
    fn strings_and_ids_as_serde_json_writes_them() {
        let mut texts: Vec<String> = (0u8..0x80).map(|b| format!("a{}z", b as char)).collect();
        texts.extend(["", "dev-000042", "ünïcødé ✓", "\u{2028}", "q\"uote\\"].map(String::from));
        for text in texts {
            let mut ours = Vec::new();
            write_str(&mut ours, &text);
            assert_eq!(ours, serde_json::to_vec(&text).unwrap(), "{text:?}");
        }
        for id in [0, 1, 0xab, u64::MAX, 0x0123_4567_89ab_cdef] {
            let mut ours = Vec::new();
            write_id(&mut ours, id);
            assert_eq!(ours, format!("\"{id:016x}\"").into_bytes());
        }
    }
}
