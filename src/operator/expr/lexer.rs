//! The tokenizer: condition text → tokens, read like the model's `TOKEN` regex, with `left.x` /
//! `right.x` (or, over one input, a plain field name) resolved to a position in their schema.

use std::fmt::Write as _;

use super::{Arith, Cmp, Side};
use crate::record::{FieldType, Schema, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Or,
    And,
    Not,
    Cmp(Cmp),
    Arith(Arith),
    Open,
    Close,
    Comma,
    Case,
    When,
    Then,
    Else,
    End,
    Coalesce,
}

#[derive(Debug)]
pub(super) enum TokKind {
    Lit(Value),
    Field(Side, usize, FieldType),
    Op(Op),
}

#[derive(Debug)]
pub(super) struct Tok {
    pub(super) kind: TokKind,
    /// Byte offsets of the token in the condition.
    pub(super) start: usize,
    pub(super) end: usize,
}

/// 1-based character column of byte offset `at`.
pub(super) fn column(text: &str, at: usize) -> usize {
    text.get(..at).map_or(0, |s| s.chars().count()) + 1
}

/// `s` quoted like Python's `repr` of a string (the model's messages use `!r`).
pub(super) fn quoted(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// Python's `\w` (close enough: Unicode letters and digits, and `_`).
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// What a condition's field names refer to.
#[derive(Clone, Copy)]
pub(super) enum Fields<'s> {
    /// A pair's two rows: `left.x` and `right.x`.
    Pair([&'s Schema; 2]),
    /// One row (window_aggregate's `where`): a plain `x`, read as the left side; a keyword wins
    /// over a field of the same name.
    One(&'s Schema),
}

pub(super) fn tokenize(text: &str, fields: Fields<'_>) -> Result<Vec<Tok>, String> {
    let mut toks = Vec::new();
    let mut pos = 0;
    loop {
        let rest = &text[pos..];
        let trimmed = rest.trim_start();
        pos += rest.len() - trimmed.len();
        let Some(c) = trimmed.chars().next() else { return Ok(toks) };
        let next = trimmed[c.len_utf8()..].chars().next();
        let start = pos;
        let (kind, len) = if c.is_ascii_digit() || (c == '.' && next.is_some_and(|n| n.is_ascii_digit())) {
            number(trimmed, text, start)?
        } else if c == '\'' || c == '"' {
            string(trimmed, text, start)?
        } else if c.is_ascii_alphabetic() || c == '_' {
            word(trimmed, fields)?
        } else {
            match operator(trimmed) {
                Some((op, len)) => (TokKind::Op(op), len),
                None => return Err(format!("cannot parse {} at column {}", quoted(trimmed), column(text, start))),
            }
        };
        pos += len;
        toks.push(Tok { kind, start, end: pos });
    }
}

/// `digit+ "." digit* | "." digit+ | digit+` at the start of `s`.
fn number(s: &str, text: &str, start: usize) -> Result<(TokKind, usize), String> {
    let digits = |from: usize| s[from..].bytes().take_while(u8::is_ascii_digit).count();
    let int_len = digits(0);
    let (is_float, len) = if s.as_bytes().get(int_len) == Some(&b'.') {
        (true, int_len + 1 + digits(int_len + 1))
    } else {
        (false, int_len)
    };
    let lit = &s[..len];
    let value = if is_float {
        // Rust's parser accepts "1." and ".5" and rounds correctly, like Python's float().
        lit.parse::<f64>().map(Value::Float).map_err(|e| format!("bad number {lit}: {e}"))?
    } else {
        lit.parse::<i64>().map(Value::Int).map_err(|_| {
            format!(
                "integer {lit} at column {} is out of range (-9223372036854775808 to 9223372036854775807)",
                column(text, start)
            )
        })?
    };
    Ok((TokKind::Lit(value), len))
}

/// A quoted string at the start of `s` (which starts with `'` or `"`).
fn string(s: &str, text: &str, start: usize) -> Result<(TokKind, usize), String> {
    let mut chars = s.char_indices();
    let Some((_, quote)) = chars.next() else { return Err("empty string literal".into()) };
    let at = |offset: usize| column(text, start + offset);
    let mut out = String::new();
    while let Some((i, c)) = chars.next() {
        if c == quote {
            return Ok((TokKind::Lit(Value::Str(out.into())), i + 1));
        }
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some((_, e)) = chars.next() else { break };
        out.push(match e {
            '"' | '\'' | '\\' | '/' => e,
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => {
                let hex4 = |chars: &mut std::str::CharIndices<'_>| -> Result<u32, String> {
                    let h: String = chars.take(4).map(|(_, c)| c).collect();
                    match u32::from_str_radix(&h, 16) {
                        Ok(v) if h.len() == 4 && h.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(v),
                        _ => Err(format!("bad escape \\u{h} in the string at column {}: want 4 hex digits", at(0))),
                    }
                };
                let hi = hex4(&mut chars)?;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    // A surrogate pair, as JSON writes characters beyond the BMP.
                    let rest = chars.as_str();
                    if !rest.starts_with("\\u") {
                        return Err(format!("lone surrogate \\u{hi:04X} in the string at column {}", at(0)));
                    }
                    chars.next();
                    chars.next();
                    let lo = hex4(&mut chars)?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return Err(format!("lone surrogate \\u{hi:04X} in the string at column {}", at(0)));
                    }
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else {
                    hi
                };
                match char::from_u32(code) {
                    Some(c) => c,
                    None => return Err(format!("lone surrogate \\u{code:04X} in the string at column {}", at(0))),
                }
            }
            other => {
                return Err(format!(
                    "bad escape \\{other} in the string at column {} (escapes: \\\" \\' \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)",
                    at(0)
                ));
            }
        });
    }
    Err(format!("unterminated string {} at column {}", quoted(s), at(0)))
}

/// A word at the start of `s`: a field (`left.x`, or `x` over one input), a keyword or a
/// literal word.
fn word(s: &str, fields: Fields<'_>) -> Result<(TokKind, usize), String> {
    let word_len = |s: &str| s.find(|c: char| !is_word(c)).unwrap_or(s.len());
    let len = word_len(s);
    let w = &s[..len];
    let schemas = match fields {
        Fields::Pair(schemas) => schemas,
        Fields::One(schema) => return one_word(w, schema).map(|kind| (kind, len)),
    };
    let side = match w {
        "left" => Some(Side::Left),
        "right" => Some(Side::Right),
        _ => None,
    };
    if let Some(side) = side {
        let after = &s[len..];
        if let Some(name) =
            after.strip_prefix('.').filter(|n| n.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
        {
            let name = &name[..word_len(name)];
            let schema = schemas[side as usize];
            let Some(pos) = schema.position(name) else {
                let known: Vec<&str> = schema.fields.iter().map(|f| f.name.as_str()).collect();
                return Err(format!("unknown field {w}.{name} ({w} has: {})", known.join(", ")));
            };
            return Ok((TokKind::Field(side, pos, schema.fields[pos].ty), len + 1 + name.len()));
        }
    }
    let kind = keyword(w).ok_or_else(|| format!("unknown word {} (fields are left.x / right.x)", quoted(w)))?;
    Ok((kind, len))
}

/// A word of a condition over one row: a keyword, else a field of `schema`.
fn one_word(w: &str, schema: &Schema) -> Result<TokKind, String> {
    if let Some(kind) = keyword(w) {
        return Ok(kind);
    }
    match schema.position(w) {
        Some(pos) => Ok(TokKind::Field(Side::Left, pos, schema.fields[pos].ty)),
        None => {
            let known: Vec<&str> = schema.fields.iter().map(|f| f.name.as_str()).collect();
            Err(format!("unknown field {} (fields: {})", quoted(w), known.join(", ")))
        }
    }
}

/// The words of the language (case-insensitive).
fn keyword(w: &str) -> Option<TokKind> {
    Some(match w.to_ascii_lowercase().as_str() {
        "and" => TokKind::Op(Op::And),
        "or" => TokKind::Op(Op::Or),
        "not" => TokKind::Op(Op::Not),
        "true" => TokKind::Lit(Value::Bool(true)),
        "false" => TokKind::Lit(Value::Bool(false)),
        "null" => TokKind::Lit(Value::Null),
        "case" => TokKind::Op(Op::Case),
        "when" => TokKind::Op(Op::When),
        "then" => TokKind::Op(Op::Then),
        "else" => TokKind::Op(Op::Else),
        "end" => TokKind::Op(Op::End),
        "coalesce" => TokKind::Op(Op::Coalesce),
        _ => return None,
    })
}

fn operator(s: &str) -> Option<(Op, usize)> {
    let two = match s.get(..2) {
        Some("==") => Some(Op::Cmp(Cmp::Eq)),
        Some("!=") => Some(Op::Cmp(Cmp::Ne)),
        Some("<=") => Some(Op::Cmp(Cmp::Le)),
        Some(">=") => Some(Op::Cmp(Cmp::Ge)),
        Some("&&") => Some(Op::And),
        Some("||") => Some(Op::Or),
        _ => None,
    };
    if let Some(op) = two {
        return Some((op, 2));
    }
    let op = match s.as_bytes().first()? {
        b'-' => Op::Arith(Arith::Sub),
        b'+' => Op::Arith(Arith::Add),
        b'*' => Op::Arith(Arith::Mul),
        b'/' => Op::Arith(Arith::Div),
        b'%' => Op::Arith(Arith::Rem),
        b'<' => Op::Cmp(Cmp::Lt),
        b'>' => Op::Cmp(Cmp::Gt),
        b'=' => Op::Cmp(Cmp::Eq),
        b'!' => Op::Not,
        b'(' => Op::Open,
        b')' => Op::Close,
        b',' => Op::Comma,
        _ => return None,
    };
    Some((op, 1))
}
