//! The common line — one flat object of strings without escapes, plain numbers, booleans and
//! nulls — scanned byte by byte, with nothing allocated.
//!
//! It reads a line only when it is sure to read it as serde_json does; on anything else (an
//! escape, an exponent, a nested value, a number serde_json would read as a double through its
//! slow path, bad syntax) it gives up and the line goes to serde_json, which also names the
//! error. So what it accepts, it reads to the same [`Scanned`] (property tests here and in
//! decode/tests.rs hold it to that), and it never rejects a line.
//!
//! Numbers: an integer of at most [`MAX_DIGITS`] digits is exact in an `i64`; a decimal of at most
//! as many digits is `significand / 10^k` with both exact doubles, which is what serde_json's
//! default parser computes for it (one correctly rounded division).
//!
//! [`declared_only`] reads the same objects but checks only the declared values: replay's first
//! pass, which needs a line's arrival only to learn whether a file is in order
//! ([`ordering_arrival`](super::super::ordering_arrival)).

use std::borrow::Cow;
use std::ops::Range;

use super::{Key, Scalar, Scanned};
use crate::record::Schema;
use crate::record::json::plain_len;

/// Digits of a number read here: below 2^53, so exact as a double, and 10^15 is exact too.
const MAX_DIGITS: usize = 15;

/// Powers of ten up to 10^[`MAX_DIGITS`], all exact doubles.
const POW10: [f64; MAX_DIGITS + 1] =
    [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];

/// The declared fields of `text` when it is a flat object this scanner reads; `None` otherwise.
/// `room`: the allocation the fields are kept in ([`Scanned::new`]).
pub fn scan<'a>(schema: &Schema, text: &'a str, room: Vec<Option<Scalar<'a>>>) -> Option<Scanned<'a>> {
    let mut cursor = Cursor { bytes: text.as_bytes(), text: Some(text), at: 0 };
    let scanned = object(schema, &mut cursor, Undeclared::Read, room)?;
    cursor.skip_space();
    (cursor.at == text.len()).then_some(scanned)
}

/// The declared fields of `line`, read as [`scan`] reads them, when it starts with a flat object
/// whose keys and strings hold no escapes; `None` otherwise. Only what `scan` would keep is
/// checked: the line's UTF-8 outside keys and declared strings, the undeclared values (skipped,
/// not read) and what follows the object are not. So where `scan` (or serde_json) reads a line,
/// this reads the same declared values or gives up; it may also read a line they refuse.
pub fn declared_only<'a>(schema: &Schema, line: &'a [u8]) -> Option<Scanned<'a>> {
    object(schema, &mut Cursor { bytes: line, text: None, at: 0 }, Undeclared::Skip, Vec::new())
}

/// What the object walk does with a value whose key the schema does not declare.
#[derive(Clone, Copy)]
enum Undeclared {
    /// Read and check it, as serde_json would.
    Read,
    /// Step over it ([`Cursor::skip_value`]).
    Skip,
}

/// One flat object from the cursor on, its declared values kept.
fn object<'a>(
    schema: &Schema,
    cursor: &mut Cursor<'a>,
    undeclared: Undeclared,
    room: Vec<Option<Scalar<'a>>>,
) -> Option<Scanned<'a>> {
    let mut scanned = Scanned::new(schema, room);
    cursor.skip_space();
    cursor.eat(b'{')?;
    cursor.skip_space();
    if cursor.eat(b'}').is_some() {
        return Some(scanned);
    }
    let mut guess = 0;
    loop {
        let key = Key::named_after(schema, cursor.key()?, guess);
        if let Key::Field(pos) | Key::FieldAndArrival(pos) = key {
            guess = pos + 1;
        }
        cursor.skip_space();
        cursor.eat(b':')?;
        cursor.skip_space();
        match (key, undeclared) {
            (Key::Other, Undeclared::Skip) => cursor.skip_value()?,
            _ => scanned.put(key, cursor.scalar()?),
        }
        cursor.skip_space();
        match cursor.next() {
            b',' => cursor.skip_space(),
            b'}' => return Some(scanned),
            _ => return None,
        }
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    /// `bytes` as text when the caller has checked them as UTF-8: strings are then sliced from it,
    /// else each string is checked on its own.
    text: Option<&'a str>,
    at: usize,
}

impl<'a> Cursor<'a> {
    /// The byte at the cursor; 0 past the end (no byte this scanner accepts is 0).
    fn peek(&self) -> u8 {
        self.bytes.get(self.at).copied().unwrap_or(0)
    }

    fn next(&mut self) -> u8 {
        let byte = self.peek();
        self.at += 1;
        byte
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek() == byte).then(|| self.at += 1)
    }

    /// JSON's whitespace, as serde_json reads it.
    fn skip_space(&mut self) {
        while matches!(self.peek(), b' ' | b'\n' | b'\t' | b'\r') {
            self.at += 1;
        }
    }

    /// Where a string without escapes or control characters lies, quotes left out.
    #[inline]
    fn plain_string(&mut self) -> Option<Range<usize>> {
        self.eat(b'"')?;
        let start = self.at;
        self.at = start + plain_len(&self.bytes[start..]);
        let range = start..self.at;
        self.eat(b'"')?;
        Some(range)
    }

    /// An object key without escapes: its bytes (compared with the declared names, which are
    /// UTF-8, so a key equal to one is too).
    #[inline]
    fn key(&mut self) -> Option<&'a [u8]> {
        let range = self.plain_string()?;
        Some(&self.bytes[range])
    }

    /// A string without escapes or control characters, borrowed from the line.
    #[inline]
    fn string(&mut self) -> Option<&'a str> {
        let range = self.plain_string()?;
        match self.text {
            // Both ends are ASCII quotes, so the slice lies on character boundaries of valid UTF-8.
            Some(text) => text.get(range),
            None => std::str::from_utf8(&self.bytes[range]).ok(),
        }
    }

    fn scalar(&mut self) -> Option<Scalar<'a>> {
        match self.peek() {
            b'"' => self.string().map(|s| Scalar::Str(Cow::Borrowed(s))),
            b't' => self.word(b"true", Scalar::Bool(true)),
            b'f' => self.word(b"false", Scalar::Bool(false)),
            b'n' => self.word(b"null", Scalar::Null),
            _ => self.number(),
        }
    }

    /// Steps over a string, a word or the characters a number is made of, reading none; gives up
    /// on a nested value.
    fn skip_value(&mut self) -> Option<()> {
        match self.peek() {
            b'"' => self.plain_string().map(drop),
            b't' => self.word(b"true", ()),
            b'f' => self.word(b"false", ()),
            b'n' => self.word(b"null", ()),
            _ => {
                let start = self.at;
                while matches!(self.peek(), b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                    self.at += 1;
                }
                (self.at > start).then_some(())
            }
        }
    }

    fn word<T>(&mut self, word: &[u8], value: T) -> Option<T> {
        self.bytes[self.at..].starts_with(word).then(|| {
            self.at += word.len();
            value
        })
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?` of at most [`MAX_DIGITS`] digits, and not `-0`.
    fn number(&mut self) -> Option<Scalar<'a>> {
        let negative = self.eat(b'-').is_some();
        let (whole, whole_digits) = self.digits()?;
        if whole_digits > 1 && self.bytes[self.at - whole_digits] == b'0' {
            return None; // a leading zero: serde_json's error
        }
        let (fraction, fraction_digits) = if self.eat(b'.').is_some() { self.digits()? } else { (0, 0) };
        if whole_digits + fraction_digits > MAX_DIGITS || matches!(self.peek(), b'e' | b'E') {
            return None;
        }
        let significand = whole * 10u64.pow(fraction_digits as u32) + fraction;
        let value = significand as i64;
        Some(match (fraction_digits, negative) {
            (0, false) => Scalar::Int(value),
            // serde_json reads the integer `-0` as the double −0.0.
            (0, true) if value == 0 => return None,
            (0, true) => Scalar::Int(-value),
            (k, negative) => {
                let f = significand as f64 / POW10[k];
                Scalar::Float(if negative { -f } else { f })
            }
        })
    }

    /// One or more digits (at most [`MAX_DIGITS`] + 1 are read into the value): value and count.
    fn digits(&mut self) -> Option<(u64, usize)> {
        let start = self.at;
        let mut value = 0u64;
        while let digit @ b'0'..=b'9' = self.peek() {
            if self.at - start > MAX_DIGITS {
                return None;
            }
            value = value * 10 + u64::from(digit - b'0');
            self.at += 1;
        }
        let count = self.at - start;
        (count > 0).then_some((value, count))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::record::schema::Field;
    use crate::record::{FieldType, TimeSpec};

    fn schema() -> Schema {
        let field = |name: &str, ty| Field { name: name.into(), ty, nullable: false };
        let fields = ["device", "ts", "x", "arrival"].map(|name| field(name, FieldType::String));
        Schema::new(fields.into(), Some(0), TimeSpec::Ingest)
    }

    /// Numbers near every limit of the fast path: digit counts, signs, zeros, fractions.
    fn number() -> impl Strategy<Value = String> {
        let digits =
            |n| proptest::collection::vec(0u8..10, n).prop_map(|d| d.iter().map(|d| char::from(b'0' + d)).collect());
        let mantissa: BoxedStrategy<String> = digits(1..20).boxed();
        let fraction = proptest::option::of(digits(0..20));
        let exponent = proptest::option::of("[eE][+-]?[0-9]{1,3}");
        (any::<bool>(), mantissa, fraction, exponent).prop_map(|(negative, whole, fraction, exponent)| {
            let sign = if negative { "-" } else { "" };
            let fraction = fraction.map(|f: String| format!(".{f}")).unwrap_or_default();
            format!("{sign}{whole}{fraction}{}", exponent.unwrap_or_default())
        })
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            number(),
            "\"[a-z0-9é ]{0,20}\"",
            "\"[a-zé\\\\\"\\t\u{1}\u{1f} ]{0,20}\"",
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("null".to_owned()),
            Just("tru".to_owned()),
            Just("[1]".to_owned()),
        ]
    }

    fn line() -> impl Strategy<Value = String> {
        let key = prop::sample::select(vec!["device", "ts", "x", "arrival", "other", "d\\u0065vice", "dev\tice"]);
        let space = prop::sample::select(vec!["", " ", "\n", "\t\r", "\u{a0}"]);
        let member = (key, space.clone(), value()).prop_map(|(k, s, v)| format!("\"{k}\"{s}:{s}{v}{s}"));
        let tail = prop::sample::select(vec!["", " ", ",", "}", "x"]);
        (prop::collection::vec(member, 0..6), space, tail)
            .prop_map(|(members, space, tail)| format!("{space}{{{space}{}}}{space}{tail}", members.join(",")))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]

        /// What the byte scanner reads, serde_json reads alike.
        #[test]
        fn reads_what_it_accepts_as_serde_json_does(line in line()) {
            if let Some(fast) = scan(&schema(), &line, Vec::new()) {
                prop_assert_eq!(Ok(fast), super::super::scan_with_serde(&schema(), &line), "line {}", line);
            }
        }

        #[test]
        fn every_decimal_it_accepts_is_serde_jsons_double(number in number()) {
            let line = format!("{{\"x\":{number}}}");
            if let Some(fast) = scan(&schema(), &line, Vec::new()) {
                prop_assert_eq!(Ok(fast), super::super::scan_with_serde(&schema(), &line), "line {}", line);
            }
        }
    }

    #[test]
    fn takes_the_common_lines() {
        let schema = schema();
        for line in [
            r#"{"device":"dev-00958","ts":1700000000002,"cmd":"update_fw","arg":"v=43"}"#,
            r#"{"device":"dev-00004","ts":1700000000030,"x":86.85,"state":"idle","seq":1}"#,
            r#" { "x" : -0.5 , "ts" : -12, "arrival": null, "ok": true, "no": false, "s": "é" } "#,
            "{}",
            r#"{"x":123456789012345,"ts":0.12345678901234}"#,
        ] {
            assert!(scan(&schema, line, Vec::new()).is_some(), "{line}");
        }
        let scanned = scan(&schema, r#"{"x":-21.50,"ts":7,"device":"a","device":"b"}"#, Vec::new()).unwrap();
        assert_eq!(scanned.fields[2], Some(Scalar::Float(-21.5)));
        assert_eq!(scanned.fields[1], Some(Scalar::Int(7)));
        assert_eq!(scanned.fields[0], Some(Scalar::Str(Cow::Borrowed("b"))));
    }

    #[test]
    fn leaves_the_rest_to_serde_json() {
        let schema = schema();
        for line in [
            r#"{"x":-0}"#,
            r#"{"x":01}"#,
            r#"{"x":1e3}"#,
            r#"{"x":1234567890123456}"#,
            r#"{"x":0.1234567890123456}"#,
            r#"{"x":1.}"#,
            r#"{"x":"a\"b"}"#,
            r#"{"x":[1]}"#,
            r#"{"x":1,}"#,
            r#"{"x":1} x"#,
            "[]",
            "{\"x\":\"\t\"}",
        ] {
            assert!(scan(&schema, line, Vec::new()).is_none(), "{line}");
        }
    }
}
