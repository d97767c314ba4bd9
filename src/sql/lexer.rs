//! SQL text → tokens, each with the byte offset where it starts (positions in errors).
//!
//! Flink's lexical rules, as far as the subset needs them: identifiers are case-preserving
//! (keywords are matched case-insensitively by the parser), `` `quoted` `` identifiers may hold
//! anything but a backtick (doubled to escape it), strings are `'…'` with `''` for a quote,
//! numbers are decimal (`3`, `0.5`), comments are `-- …` to the end of the line and `/* … */`.

use super::SqlError;

#[derive(Clone, Debug, PartialEq)]
pub enum TokKind {
    /// An unquoted word: a keyword or a name.
    Word(String),
    /// A `` `quoted` `` name: never a keyword.
    Quoted(String),
    Str(String),
    /// The digits as written (`0.5`), checked where they are used.
    Number(String),
    /// Punctuation and operators: `( ) , ; . * = <> != < <= > >= + - / % =>`.
    Punct(&'static str),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tok {
    pub kind: TokKind,
    pub at: usize,
}

const PUNCTS: [&str; 18] =
    ["<>", "!=", "<=", ">=", "=>", "||", "(", ")", ",", ";", ".", "*", "=", "<", ">", "+", "-", "/"];

pub fn tokenize(text: &str) -> Result<Vec<Tok>, SqlError> {
    let mut toks = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        if c.is_ascii_whitespace() || text[i..].starts_with('\u{feff}') {
            i += if c.is_ascii() { 1 } else { '\u{feff}'.len_utf8() };
        } else if text[i..].starts_with("--") {
            i = text[i..].find('\n').map_or(bytes.len(), |n| i + n);
        } else if text[i..].starts_with("/*") {
            match text[i + 2..].find("*/") {
                Some(n) => i += n + 4,
                None => return Err(SqlError::new(start, "unterminated comment /* …")),
            }
        } else if c == b'\'' {
            let (s, end) = quoted(text, i, '\'').ok_or_else(|| SqlError::new(start, "unterminated string '…"))?;
            toks.push(Tok { kind: TokKind::Str(s), at: start });
            i = end;
        } else if c == b'`' {
            let (s, end) = quoted(text, i, '`').ok_or_else(|| SqlError::new(start, "unterminated name `…"))?;
            toks.push(Tok { kind: TokKind::Quoted(s), at: start });
            i = end;
        } else if c == b'"' {
            return Err(SqlError::new(
                start,
                "\"…\" is not a string in Flink SQL: write strings as '…' and quote names with `…`",
            ));
        } else if c.is_ascii_digit() || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                i += 1;
            }
            toks.push(Tok { kind: TokKind::Number(text[start..i].to_owned()), at: start });
        } else if c.is_ascii_alphabetic() || c == b'_' || !c.is_ascii() {
            let end = text[i..]
                .char_indices()
                .find(|&(_, ch)| !(ch.is_alphanumeric() || ch == '_' || ch == '$'))
                .map_or(text.len(), |(n, _)| i + n);
            if end == i {
                let ch = text[i..].chars().next().unwrap_or('?');
                return Err(SqlError::new(start, format!("unexpected character {ch:?}")));
            }
            toks.push(Tok { kind: TokKind::Word(text[i..end].to_owned()), at: start });
            i = end;
        } else if let Some(p) = PUNCTS.iter().find(|p| text[i..].starts_with(**p)) {
            toks.push(Tok { kind: TokKind::Punct(p), at: start });
            i += p.len();
        } else if c == b'%' {
            toks.push(Tok { kind: TokKind::Punct("%"), at: start });
            i += 1;
        } else {
            let ch = text[i..].chars().next().unwrap_or('?');
            return Err(SqlError::new(start, format!("unexpected character {ch:?}")));
        }
    }
    Ok(toks)
}

/// The text of a quoted token starting at `start` (a doubled quote is one quote) and the offset
/// after its closing quote; `None` when it is not closed.
fn quoted(text: &str, start: usize, quote: char) -> Option<(String, usize)> {
    let mut out = String::new();
    let mut chars = text[start + 1..].char_indices().peekable();
    while let Some((n, ch)) = chars.next() {
        if ch == quote {
            if chars.peek().is_some_and(|&(_, next)| next == quote) {
                chars.next();
                out.push(quote);
            } else {
                return Some((out, start + 1 + n + 1));
            }
        } else {
            out.push(ch);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<TokKind> {
        tokenize(text).expect("tokenizes").into_iter().map(|t| t.kind).collect()
    }

    #[test]
    fn tokens_and_positions() {
        let toks = tokenize("SELECT a.b, 'it''s' -- note\n/* c */ <= 0.5 `x y`").expect("tokenizes");
        let at: Vec<usize> = toks.iter().map(|t| t.at).collect();
        assert_eq!(at, [0, 7, 8, 9, 10, 12, 36, 39, 43]);
        assert_eq!(toks[5].kind, TokKind::Str("it's".into()));
        assert_eq!(toks[6].kind, TokKind::Punct("<="));
        assert_eq!(toks[8].kind, TokKind::Quoted("x y".into()));
        assert_eq!(kinds("a<>b"), [TokKind::Word("a".into()), TokKind::Punct("<>"), TokKind::Word("b".into())]);
    }

    #[test]
    fn errors_say_where() {
        assert_eq!(tokenize("a 'b").unwrap_err(), SqlError::new(2, "unterminated string '…"));
        assert_eq!(tokenize("a /* b").unwrap_err().offset, 2);
        assert!(tokenize("a \"b\"").unwrap_err().message.contains("quote names with `"));
        assert_eq!(tokenize("a ? b").unwrap_err().offset, 2);
    }
}
