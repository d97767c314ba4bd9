//! The `where` condition of `window_join` (CONTRACT.md: `where = "right.amount > 100"`): a small
//! expression language, parsed and type-checked once when the configuration is checked, then
//! evaluated for every pair without allocating (STYLE.md 7).
//!
//! # Grammar
//!
//! ```text
//! condition  = or
//! or         = and { ("or" | "||") and }
//! and        = not { ("and" | "&&") not }
//! not        = ("not" | "!") not | comparison
//! comparison = sum [ ("==" | "=" | "!=" | "<" | "<=" | ">" | ">=") sum ]    (does not chain)
//! sum        = product { ("+" | "-") product }
//! product    = unary { ("*" | "/" | "%") unary }
//! unary      = "-" unary | "(" or ")" | literal | field
//! field      = ("left" | "right") "." NAME            resolved to a position at parse time
//! literal    = INTEGER | DECIMAL | STRING | "true" | "false" | "null"
//! INTEGER    = digit+                                 must fit an i64
//! DECIMAL    = digit+ "." digit* | "." digit+         no exponent (as in the model)
//! STRING     = '…' | "…"                              escapes: \" \' \\ \/ \b \f \n \r \t \uXXXX
//! ```
//!
//! So the precedence, loosest first: `or` < `and` < `not` < comparison < `+ -` < `* / %` < unary
//! minus; binary operators group to the left. The words `and or not true false null` are
//! case-insensitive, `left`/`right` are not. Tokens are read like the model's `TOKEN` regex: a
//! number first, then a string, a field, a word, an operator (two-character operators before
//! one-character ones, so `!==` is `!=` `=`). The whole text is tokenized before it is parsed, so
//! an unknown word or field is reported before a misplaced parenthesis, as in the model.
//!
//! # Evaluation (Python's semantics, as `braid_model.py`'s `Expr.eval`)
//!
//! - A field holds its row's value; a field past the end of a row (never produced by the decoder)
//!   is null. The condition holds when its value is truthy: null, false, 0, 0.0 and "" are false
//!   (NaN is true, as in Python).
//! - Comparisons: any null operand → false (also for `!=`). Numbers compare by value, int and
//!   float exactly (`9007199254740993 > 9007199254740992.0` holds, as in Python; no rounding of
//!   the int to a double); NaN compares false except `!=`. Strings compare with strings by code
//!   point (= UTF-8 byte order). A bool is the number 0 or 1 (Python's `bool` is an `int`).
//!   A string against a non-string: `==` false, `!=` true, an ordering null (Python's TypeError,
//!   which the model turns into None) — but see the parse-time checks below, which refuse these.
//! - Arithmetic: a null operand → null. int (or bool) with int stays int, checked: an overflow is
//!   null. A float on either side makes both floats (IEEE: overflow gives ±inf, as in Python).
//!   `/` is Python's true division: always a float, for two ints the correctly rounded quotient
//!   (as `int.__truediv__`, exact also beyond 2^53). `%` follows Python: the result has the sign of
//!   the divisor (`-7 % 3 == 2`, `7 % -3 == -2`, `7.5 % -2 == -0.5`; floats as CPython's
//!   `float_rem`). Division or remainder by zero (int or float) → null. Unary minus: of an int is
//!   checked (`-(-2^63)` is null), of a bool is an int.
//! - `and`, `or`, `not` give a bool from the truthiness of their operands (`and`/`or`
//!   short-circuit; nothing has side effects, so this only saves work).
//!
//! # Parse-time checks
//!
//! Field types are known when the condition is parsed, so every type error that Python would
//! raise at evaluation (and the model would turn into a silent null) is refused with a message
//! naming the operator and the operand as written:
//! - arithmetic or unary minus with a string operand (a field of type `string` or `bytes`, or a
//!   string literal): `cannot apply * to string left.name`. `+` on strings would concatenate,
//!   which needs an allocation per pair;
//! - a comparison of a string with an int, float or bool: `cannot compare string left.name with
//!   int 5`. Comparing with `null` is allowed (always false);
//! - a field of type id list (`_supersedes` of a cogroup output), which has no value a condition
//!   could use.
//!
//! Type errors are reported only when the text has no syntax error (a syntax error anywhere comes
//! first, as the model reports only those), the first one found, and an operand in error does not
//! cause more (its type becomes "null").
//!
//! Other errors: `cannot parse '…'` (the rest of the text from the first character no token
//! matches), `unterminated string …`, `bad escape …`, `unknown field left.x`, `unknown word 'foo'
//! (fields are left.x / right.x)`, `unexpected ')'`, `missing )`, chained comparisons, an empty
//! condition, an integer literal outside i64, nesting deeper than [`MAX_DEPTH`]. Each message
//! says where: the 1-based character column in the condition.
//!
//! # Deviations from the model
//!
//! - Refused at parse time (the model accepts them and evaluates to null / false, or, for `str +
//!   str`, `str * int` and `str % x`, to Python's string concatenation, repetition and formatting):
//!   arithmetic on strings and comparisons of a string with a non-string — see above.
//! - Ints are i64: an overflowing `+ - *` or negation is null where Python's big ints keep going;
//!   an integer literal beyond i64 is refused (so `-9223372036854775808` cannot be written).
//! - String escapes: the model feeds the literal to `json.loads`, so `\'` (and `\"` inside
//!   '…', and raw control characters) raise an uncaught exception there; here `\'` and `\"` are
//!   accepted in both kinds of quotes and raw control characters are kept. A lone surrogate
//!   `\uD800` is refused (a Rust string cannot hold it). Digits are ASCII only (Python's `\d`
//!   also matches other scripts' digits).
//! - An id-list field is refused (the model has no such field type).
//! - Nesting is limited to [`MAX_DEPTH`] levels (the model hits Python's recursion limit, 1000).
//! - Messages quote the token as written (`unexpected '&&'`, the model: `unexpected 'and'`) and
//!   add the column.
//!
//! # Design
//!
//! The compiled form is an arena: a `Vec<Node>` where every node refers to its operands by index
//! and operands come before the nodes that use them. Evaluation walks it recursively from the
//! root; the values in flight are `Val`, a `Copy` enum whose strings borrow from the rows or from
//! the literals in the arena, so evaluating allocates nothing. Recursion depth is bounded by the
//! tree depth, which parsing caps at [`MAX_DEPTH`] (a left-deep chain like `a or b or …` counts one
//! level per operator). Every index in the arena is produced by the parser; `eval` still uses
//! checked access (`get`), so a row shorter than its schema reads null instead of panicking.

use std::cmp::Ordering;
use std::fmt::{self, Write as _};

use crate::record::{FieldType, Row, Schema, Value};

/// The deepest tree (and the deepest nesting of parentheses, `not` and unary minus) a condition
/// may have. Bounds the recursion of parsing and of [`Expr::eval`].
pub const MAX_DEPTH: usize = 128;

/// A parsed and type-checked `where` condition.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    /// Operands before the nodes that use them.
    nodes: Vec<Node>,
    root: usize,
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Lit(Value),
    Field(Side, usize),
    Neg(usize),
    Not(usize),
    And(usize, usize),
    Or(usize, usize),
    Arith(Arith, usize, usize),
    Cmp(Cmp, usize, usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Expr {
    /// Parses `text` against the schemas of the two inputs: `left.x` / `right.x` become positions
    /// in `left` / `right`. The error says what is wrong and where (a 1-based column).
    pub fn parse(text: &str, left: &Schema, right: &Schema) -> Result<Expr, String> {
        let toks = tokenize(text, [left, right])?;
        if toks.is_empty() {
            return Err("empty condition".into());
        }
        let mut parser =
            Parser { text, toks, i: 0, nodes: Vec::new(), depths: Vec::new(), nesting: 0, type_error: None };
        let root = parser.or()?;
        if let Some(tok) = parser.toks.get(parser.i) {
            return Err(format!("unexpected {} at column {}", parser.quoted_tok(tok), column(text, tok.start)));
        }
        if let Some(e) = parser.type_error {
            return Err(e);
        }
        Ok(Expr { nodes: parser.nodes, root: root.at })
    }

    /// Whether the pair satisfies the condition. Never allocates, never panics.
    pub fn eval(&self, left: &Row, right: &Row) -> bool {
        self.value(self.root, left, right).truthy()
    }

    fn value<'a>(&'a self, at: usize, left: &'a Row, right: &'a Row) -> Val<'a> {
        let Some(node) = self.nodes.get(at) else { return Val::Null };
        match node {
            Node::Lit(v) => Val::of(v),
            Node::Field(Side::Left, pos) => left.values.get(*pos).map_or(Val::Null, Val::of),
            Node::Field(Side::Right, pos) => right.values.get(*pos).map_or(Val::Null, Val::of),
            Node::Neg(a) => neg(self.value(*a, left, right)),
            Node::Not(a) => Val::Bool(!self.value(*a, left, right).truthy()),
            Node::And(a, b) => Val::Bool(self.value(*a, left, right).truthy() && self.value(*b, left, right).truthy()),
            Node::Or(a, b) => Val::Bool(self.value(*a, left, right).truthy() || self.value(*b, left, right).truthy()),
            Node::Arith(op, a, b) => arith(*op, self.value(*a, left, right), self.value(*b, left, right)),
            Node::Cmp(op, a, b) => compare(*op, self.value(*a, left, right), self.value(*b, left, right)),
        }
    }
}

// ---------------------------------------------------------------------------------- evaluation ---

/// A value in flight: strings borrow from a row or from a literal.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Val<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a str),
}

impl<'a> Val<'a> {
    fn of(v: &'a Value) -> Val<'a> {
        match v {
            Value::Null => Val::Null,
            Value::Bool(b) => Val::Bool(*b),
            Value::Int(i) => Val::Int(*i),
            Value::Float(f) => Val::Float(*f),
            Value::Str(s) => Val::Str(s),
            // Not a field a condition can name (refused at parse time).
            Value::IdList(_) => Val::Null,
        }
    }

    /// Python's `bool(x)`.
    fn truthy(self) -> bool {
        match self {
            Val::Null => false,
            Val::Bool(b) => b,
            Val::Int(i) => i != 0,
            // NaN != 0.0: true, as in Python.
            Val::Float(f) => f != 0.0,
            Val::Str(s) => !s.is_empty(),
        }
    }

    /// The value as a number, a bool as 0 or 1 (Python's `bool` is an `int`).
    fn number(self) -> Option<Num> {
        match self {
            Val::Bool(b) => Some(Num::Int(i64::from(b))),
            Val::Int(i) => Some(Num::Int(i)),
            Val::Float(f) => Some(Num::Float(f)),
            Val::Null | Val::Str(_) => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    fn to_f64(self) -> f64 {
        match self {
            // Rounds to nearest, ties to even: Python's float(int).
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

fn neg(v: Val<'_>) -> Val<'_> {
    match v.number() {
        Some(Num::Int(i)) => i.checked_neg().map_or(Val::Null, Val::Int),
        Some(Num::Float(f)) => Val::Float(-f),
        None => Val::Null,
    }
}

fn arith<'a>(op: Arith, a: Val<'a>, b: Val<'a>) -> Val<'a> {
    // Null, or a string (refused at parse time; Python would concatenate, repeat or format).
    let (Some(x), Some(y)) = (a.number(), b.number()) else { return Val::Null };
    match (x, y) {
        (Num::Int(x), Num::Int(y)) => int_arith(op, x, y),
        _ => float_arith(op, x.to_f64(), y.to_f64()),
    }
}

fn int_arith(op: Arith, x: i64, y: i64) -> Val<'static> {
    let checked = match op {
        Arith::Add => x.checked_add(y),
        Arith::Sub => x.checked_sub(y),
        Arith::Mul => x.checked_mul(y),
        Arith::Div => return if y == 0 { Val::Null } else { Val::Float(int_true_div(x, y)) },
        Arith::Rem => py_int_rem(x, y),
    };
    checked.map_or(Val::Null, Val::Int)
}

fn float_arith(op: Arith, x: f64, y: f64) -> Val<'static> {
    Val::Float(match op {
        Arith::Add => x + y,
        Arith::Sub => x - y,
        Arith::Mul => x * y,
        Arith::Div if y == 0.0 => return Val::Null,
        Arith::Div => x / y,
        Arith::Rem if y == 0.0 => return Val::Null,
        Arith::Rem => py_float_rem(x, y),
    })
}

/// Python's `x % y` on ints: the sign of the divisor. `None` for `y == 0`.
fn py_int_rem(x: i64, y: i64) -> Option<i64> {
    if y == 0 {
        return None;
    }
    // wrapping: i64::MIN % -1 is 0 (the only overflowing case of `%`).
    let r = x.wrapping_rem(y);
    // r and y have opposite signs here, so r + y cannot overflow.
    Some(if r != 0 && (r < 0) != (y < 0) { r + y } else { r })
}

/// CPython's `float_rem` (`y != 0`).
fn py_float_rem(x: f64, y: f64) -> f64 {
    let m = x % y; // C's fmod
    if m != 0.0 { if (y < 0.0) != (m < 0.0) { m + y } else { m } } else { 0.0f64.copysign(y) }
}

/// Python's `x / y` on ints (`y != 0`): the correctly rounded quotient, like `int.__truediv__`.
fn int_true_div(x: i64, y: i64) -> f64 {
    const EXACT: u64 = 1 << 53;
    let (n, d) = (x.unsigned_abs(), y.unsigned_abs());
    if n <= EXACT && d <= EXACT {
        // Both convert exactly; IEEE division then rounds once, correctly.
        return x as f64 / y as f64;
    }
    // Scale n so the integer quotient has at least 56 significant bits, fold the remainder into
    // a sticky low bit, and let the u128 → f64 conversion round (to nearest, ties to even).
    let (n, d) = (u128::from(n), u128::from(d));
    let bits = |v: u128| 128 - v.leading_zeros();
    // bits(n) + shift = 56 + bits(d) <= 120: no overflow; shift <= 119.
    let shift = (56 + bits(d)).saturating_sub(bits(n));
    let scaled = n << shift;
    let q = (scaled / d) | u128::from(scaled % d != 0);
    // 2^-shift, exact; the result (>= 2^-64 in magnitude) is a normal double, so the product is exact.
    let scale = f64::from_bits(u64::from(1023 - shift) << 52);
    let magnitude = q as f64 * scale;
    if (x < 0) != (y < 0) { -magnitude } else { magnitude }
}

fn compare<'a>(op: Cmp, a: Val<'a>, b: Val<'a>) -> Val<'a> {
    let ord = match (a, b) {
        (Val::Null, _) | (_, Val::Null) => return Val::Bool(false),
        (Val::Str(x), Val::Str(y)) => Some(x.cmp(y)),
        // Refused at parse time; Python: unequal, and ordering raises TypeError (the model: None).
        (Val::Str(_), _) | (_, Val::Str(_)) => {
            return match op {
                Cmp::Eq => Val::Bool(false),
                Cmp::Ne => Val::Bool(true),
                _ => Val::Null,
            };
        }
        _ => match (a.number(), b.number()) {
            (Some(x), Some(y)) => num_cmp(x, y),
            _ => return Val::Null,
        },
    };
    Val::Bool(match ord {
        // NaN: only `!=` holds.
        None => op == Cmp::Ne,
        Some(o) => match op {
            Cmp::Eq => o.is_eq(),
            Cmp::Ne => o.is_ne(),
            Cmp::Lt => o.is_lt(),
            Cmp::Le => o.is_le(),
            Cmp::Gt => o.is_gt(),
            Cmp::Ge => o.is_ge(),
        },
    })
}

fn num_cmp(x: Num, y: Num) -> Option<Ordering> {
    match (x, y) {
        (Num::Int(x), Num::Int(y)) => Some(x.cmp(&y)),
        (Num::Float(x), Num::Float(y)) => x.partial_cmp(&y),
        (Num::Int(x), Num::Float(y)) => int_float_cmp(x, y),
        (Num::Float(x), Num::Int(y)) => int_float_cmp(y, x).map(Ordering::reverse),
    }
}

/// Compares an int with a float exactly, as Python does (no rounding of the int). `None`: NaN.
fn int_float_cmp(i: i64, f: f64) -> Option<Ordering> {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f.is_nan() {
        return None;
    }
    if f >= TWO_63 {
        return Some(Ordering::Less);
    }
    if f < -TWO_63 {
        return Some(Ordering::Greater);
    }
    let whole = f.trunc();
    // In [-2^63, 2^63) and integral: the conversion is exact.
    let t = whole as i64;
    Some(match i.cmp(&t) {
        Ordering::Equal => 0.0.partial_cmp(&(f - whole)).unwrap_or(Ordering::Equal),
        o => o,
    })
}

// ------------------------------------------------------------------------------------ tokenizer ---

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Or,
    And,
    Not,
    Cmp(Cmp),
    Arith(Arith),
    Open,
    Close,
}

#[derive(Debug)]
enum TokKind {
    Lit(Value),
    Field(Side, usize, FieldType),
    Op(Op),
}

#[derive(Debug)]
struct Tok {
    kind: TokKind,
    /// Byte offsets of the token in the condition.
    start: usize,
    end: usize,
}

/// 1-based character column of byte offset `at`.
fn column(text: &str, at: usize) -> usize {
    text.get(..at).map_or(0, |s| s.chars().count()) + 1
}

/// `s` quoted like Python's `repr` of a string (the model's messages use `!r`).
fn quoted(s: &str) -> String {
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

fn tokenize(text: &str, schemas: [&Schema; 2]) -> Result<Vec<Tok>, String> {
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
            word(trimmed, schemas)?
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

/// A word at the start of `s`: a field (`left.x`), a keyword or a literal word.
fn word(s: &str, schemas: [&Schema; 2]) -> Result<(TokKind, usize), String> {
    let word_len = |s: &str| s.find(|c: char| !is_word(c)).unwrap_or(s.len());
    let len = word_len(s);
    let w = &s[..len];
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
    let kind = match w.to_ascii_lowercase().as_str() {
        "and" => TokKind::Op(Op::And),
        "or" => TokKind::Op(Op::Or),
        "not" => TokKind::Op(Op::Not),
        "true" => TokKind::Lit(Value::Bool(true)),
        "false" => TokKind::Lit(Value::Bool(false)),
        "null" => TokKind::Lit(Value::Null),
        _ => return Err(format!("unknown word {} (fields are left.x / right.x)", quoted(w))),
    };
    Ok((kind, len))
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
        _ => return None,
    };
    Some((op, 1))
}

// --------------------------------------------------------------------------------------- parser ---

/// The static type of a subexpression (its value may always be null as well).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    Null,
    Bool,
    Int,
    Float,
    Str,
}

impl Ty {
    /// `None`: a type a condition cannot use (an id list).
    fn of_field(ty: FieldType) -> Option<Ty> {
        match ty {
            FieldType::String | FieldType::Bytes => Some(Ty::Str),
            FieldType::Int => Some(Ty::Int),
            FieldType::Float => Some(Ty::Float),
            FieldType::Bool => Some(Ty::Bool),
            FieldType::IdList => None,
        }
    }

    fn of_value(v: &Value) -> Ty {
        match v {
            Value::Null => Ty::Null,
            Value::Bool(_) => Ty::Bool,
            Value::Int(_) => Ty::Int,
            Value::Float(_) => Ty::Float,
            // Literals are never id lists.
            Value::Str(_) | Value::IdList(_) => Ty::Str,
        }
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ty::Null => "null",
            Ty::Bool => "bool",
            Ty::Int => "int",
            Ty::Float => "float",
            Ty::Str => "string",
        })
    }
}

impl fmt::Display for Arith {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arith::Add => "+",
            Arith::Sub => "-",
            Arith::Mul => "*",
            Arith::Div => "/",
            Arith::Rem => "%",
        })
    }
}

/// A parsed subexpression: its node, static type and byte span in the condition.
#[derive(Clone, Copy, Debug)]
struct Sub {
    at: usize,
    ty: Ty,
    start: usize,
    end: usize,
}

struct Parser<'t> {
    text: &'t str,
    toks: Vec<Tok>,
    i: usize,
    nodes: Vec<Node>,
    /// Tree depth of each node.
    depths: Vec<usize>,
    /// Current nesting of parentheses, `not` and unary minus (the parser's recursion).
    nesting: usize,
    /// The first type error. Parsing goes on, so that a syntax error anywhere is reported first
    /// (as in the model, which finds only those).
    type_error: Option<String>,
}

impl Parser<'_> {
    fn peek_op(&self) -> Option<Op> {
        match self.toks.get(self.i) {
            Some(Tok { kind: TokKind::Op(op), .. }) => Some(*op),
            _ => None,
        }
    }

    /// Consumes the next token if it is `op`; returns its start.
    fn take(&mut self, op: Op) -> Option<usize> {
        if self.peek_op() != Some(op) {
            return None;
        }
        self.i += 1;
        self.toks.get(self.i - 1).map(|t| t.start)
    }

    fn fragment(&self, sub: Sub) -> &str {
        self.text.get(sub.start..sub.end).unwrap_or("")
    }

    fn quoted_tok(&self, tok: &Tok) -> String {
        quoted(self.text.get(tok.start..tok.end).unwrap_or(""))
    }

    fn type_error(&mut self, message: String) {
        self.type_error.get_or_insert(message);
    }

    fn enter(&mut self, start: usize) -> Result<(), String> {
        self.nesting += 1;
        if self.nesting > MAX_DEPTH {
            return Err(format!(
                "condition nested too deeply at column {} (limit {MAX_DEPTH})",
                column(self.text, start)
            ));
        }
        Ok(())
    }

    fn push(&mut self, node: Node, ty: Ty, start: usize, end: usize, operands: &[Sub]) -> Result<Sub, String> {
        let depth = 1 + operands.iter().map(|s| self.depths.get(s.at).copied().unwrap_or(0)).max().unwrap_or(0);
        if depth > MAX_DEPTH {
            return Err(format!(
                "condition too deep at column {} (limit {MAX_DEPTH} levels; a chain of n operators counts n)",
                column(self.text, start)
            ));
        }
        self.nodes.push(node);
        self.depths.push(depth);
        Ok(Sub { at: self.nodes.len() - 1, ty, start, end })
    }

    fn or(&mut self) -> Result<Sub, String> {
        let mut a = self.and()?;
        while self.take(Op::Or).is_some() {
            let b = self.and()?;
            a = self.push(Node::Or(a.at, b.at), Ty::Bool, a.start, b.end, &[a, b])?;
        }
        Ok(a)
    }

    fn and(&mut self) -> Result<Sub, String> {
        let mut a = self.not()?;
        while self.take(Op::And).is_some() {
            let b = self.not()?;
            a = self.push(Node::And(a.at, b.at), Ty::Bool, a.start, b.end, &[a, b])?;
        }
        Ok(a)
    }

    fn not(&mut self) -> Result<Sub, String> {
        let Some(start) = self.take(Op::Not) else { return self.comparison() };
        self.enter(start)?;
        let a = self.not()?;
        self.nesting -= 1;
        self.push(Node::Not(a.at), Ty::Bool, start, a.end, &[a])
    }

    fn comparison(&mut self) -> Result<Sub, String> {
        let a = self.sum()?;
        let Some(Op::Cmp(op)) = self.peek_op() else { return Ok(a) };
        self.i += 1;
        let b = self.sum()?;
        if let Some(tok @ Tok { kind: TokKind::Op(Op::Cmp(_)), .. }) = self.toks.get(self.i) {
            return Err(format!(
                "unexpected {} at column {}: comparisons do not chain (use and)",
                self.quoted_tok(tok),
                column(self.text, tok.start)
            ));
        }
        let mixed = |x: Ty, y: Ty| x == Ty::Str && !matches!(y, Ty::Str | Ty::Null);
        if mixed(a.ty, b.ty) || mixed(b.ty, a.ty) {
            self.type_error(format!(
                "cannot compare {} {} with {} {} at column {} (a string compares only with a string)",
                a.ty,
                self.fragment(a),
                b.ty,
                self.fragment(b),
                column(self.text, a.start)
            ));
        }
        self.push(Node::Cmp(op, a.at, b.at), Ty::Bool, a.start, b.end, &[a, b])
    }

    fn sum(&mut self) -> Result<Sub, String> {
        let mut a = self.product()?;
        while let Some(Op::Arith(op @ (Arith::Add | Arith::Sub))) = self.peek_op() {
            self.i += 1;
            let b = self.product()?;
            a = self.arith(op, a, b)?;
        }
        Ok(a)
    }

    fn product(&mut self) -> Result<Sub, String> {
        let mut a = self.unary()?;
        while let Some(Op::Arith(op @ (Arith::Mul | Arith::Div | Arith::Rem))) = self.peek_op() {
            self.i += 1;
            let b = self.unary()?;
            a = self.arith(op, a, b)?;
        }
        Ok(a)
    }

    fn arith(&mut self, op: Arith, a: Sub, b: Sub) -> Result<Sub, String> {
        if let Some(s) = [a, b].into_iter().find(|s| s.ty == Ty::Str) {
            self.type_error(format!(
                "cannot apply {op} to string {} at column {} (strings support only comparisons)",
                self.fragment(s),
                column(self.text, s.start)
            ));
        }
        let ty = match (a.ty, b.ty) {
            // (Str: already an error; Null keeps it from causing more.)
            (Ty::Null | Ty::Str, _) | (_, Ty::Null | Ty::Str) => Ty::Null,
            _ if op == Arith::Div => Ty::Float,
            (Ty::Float, _) | (_, Ty::Float) => Ty::Float,
            _ => Ty::Int,
        };
        self.push(Node::Arith(op, a.at, b.at), ty, a.start, b.end, &[a, b])
    }

    fn unary(&mut self) -> Result<Sub, String> {
        let Some(tok) = self.toks.get(self.i) else {
            let end = self.text.trim_end().len();
            return Err(format!("unexpected end of condition at column {}", column(self.text, end)));
        };
        let (start, end) = (tok.start, tok.end);
        match &tok.kind {
            TokKind::Lit(v) => {
                let (node, ty) = (Node::Lit(v.clone()), Ty::of_value(v));
                self.i += 1;
                self.push(node, ty, start, end, &[])
            }
            TokKind::Field(side, pos, field_ty) => {
                let (node, ty, field_ty) = (Node::Field(*side, *pos), Ty::of_field(*field_ty), *field_ty);
                self.i += 1;
                let ty = ty.unwrap_or_else(|| {
                    self.type_error(format!(
                        "{} at column {} is an {field_ty}, which a condition cannot use",
                        self.text.get(start..end).unwrap_or(""),
                        column(self.text, start)
                    ));
                    Ty::Null
                });
                self.push(node, ty, start, end, &[])
            }
            TokKind::Op(Op::Arith(Arith::Sub)) => {
                self.i += 1;
                self.enter(start)?;
                let a = self.unary()?;
                self.nesting -= 1;
                let ty = match a.ty {
                    Ty::Str => {
                        self.type_error(format!(
                            "cannot apply unary - to string {} at column {}",
                            self.fragment(a),
                            column(self.text, a.start)
                        ));
                        Ty::Null
                    }
                    Ty::Null => Ty::Null,
                    Ty::Float => Ty::Float,
                    Ty::Bool | Ty::Int => Ty::Int,
                };
                self.push(Node::Neg(a.at), ty, start, a.end, &[a])
            }
            TokKind::Op(Op::Open) => {
                self.i += 1;
                self.enter(start)?;
                let a = self.or()?;
                self.nesting -= 1;
                let Some(close) = self.take(Op::Close) else {
                    let found = match self.toks.get(self.i) {
                        Some(t) => format!("found {} at column {}", self.quoted_tok(t), column(self.text, t.start)),
                        None => "found the end".into(),
                    };
                    return Err(format!("missing ) for the ( at column {} ({found})", column(self.text, start)));
                };
                Ok(Sub { start, end: close + 1, ..a })
            }
            TokKind::Op(_) => {
                Err(format!("unexpected {} at column {}", self.quoted_tok(tok), column(self.text, start)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::schema::Field;
    use crate::record::{Key, TimeSpec};
    use proptest::prelude::*;

    fn schema(fields: &[(&str, FieldType)]) -> Schema {
        let fields = fields.iter().map(|(n, ty)| Field { name: (*n).into(), ty: *ty, nullable: true }).collect();
        Schema::new(fields, None, TimeSpec::Ingest)
    }

    /// left: name string, n int, x float, flag bool, b bytes; right: amount float, qty int, tag string, ok bool.
    fn schemas() -> (Schema, Schema) {
        use FieldType::*;
        (
            schema(&[("name", String), ("n", Int), ("x", Float), ("flag", Bool), ("b", Bytes)]),
            schema(&[("amount", Float), ("qty", Int), ("tag", String), ("ok", Bool)]),
        )
    }

    fn row(values: Vec<Value>) -> Row {
        Row { ts: 0, key: Key::Broadcast, key_hash: 0, id: 0, values: values.into() }
    }

    fn s(v: &str) -> Value {
        Value::Str(v.into())
    }

    /// A typical pair: name "ann", n 7, x 2.5, flag true, b "QQ=="; amount 150.0, qty -3, tag "a", ok false.
    fn pair() -> (Row, Row) {
        (
            row(vec![s("ann"), Value::Int(7), Value::Float(2.5), Value::Bool(true), s("QQ==")]),
            row(vec![Value::Float(150.0), Value::Int(-3), s("a"), Value::Bool(false)]),
        )
    }

    fn parse(text: &str) -> Result<Expr, String> {
        let (l, r) = schemas();
        Expr::parse(text, &l, &r)
    }

    fn eval_on(text: &str, l: &Row, r: &Row) -> bool {
        match parse(text) {
            Ok(e) => e.eval(l, r),
            Err(e) => panic!("{text}: {e}"),
        }
    }

    fn eval(text: &str) -> bool {
        let (l, r) = pair();
        eval_on(text, &l, &r)
    }

    /// The value of a whole expression (not only its truthiness), on `pair()`.
    fn value_of(text: &str) -> Value {
        let (l, r) = pair();
        let e = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        match e.value(e.root, &l, &r) {
            Val::Null => Value::Null,
            Val::Bool(b) => Value::Bool(b),
            Val::Int(i) => Value::Int(i),
            Val::Float(f) => Value::Float(f),
            Val::Str(s) => Value::Str(s.into()),
        }
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Ok(e) => panic!("{text}: parsed as {e:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn the_contract_example() {
        let (l, r) = schemas();
        let e = Expr::parse("right.amount > 100", &l, &r).unwrap();
        let (left, mut right) = pair();
        assert!(e.eval(&left, &right));
        right.values[0] = Value::Float(100.0);
        assert!(!e.eval(&left, &right));
        right.values[0] = Value::Null;
        assert!(!e.eval(&left, &right));
    }

    #[test]
    fn parse_errors_say_what_and_where() {
        let cases = [
            ("left.n > 1 ) ", "unexpected ')' at column 12"),
            ("(left.n > 1", "missing ) for the ( at column 1 (found the end)"),
            ("(left.n 1)", "missing ) for the ( at column 1 (found '1' at column 9)"),
            ("left.n > foo", "unknown word 'foo' (fields are left.x / right.x)"),
            ("left.nope > 1", "unknown field left.nope (left has: name, n, x, flag, b)"),
            ("right.name = 'x'", "unknown field right.name (right has: amount, qty, tag, ok)"),
            ("left.n # 2", "cannot parse '# 2' at column 8"),
            ("left.n & 2", "cannot parse '& 2' at column 8"),
            ("left.n > 'abc", "unterminated string \"'abc\" at column 10"),
            ("left.name = 'a\\qb'", "bad escape \\q in the string at column 13"),
            ("left.name = '\\ud800'", "lone surrogate \\uD800 in the string at column 13"),
            ("left.name = '\\u12'", "bad escape \\u12' in the string at column 13: want 4 hex digits"),
            ("", "empty condition"),
            ("   ", "empty condition"),
            ("left.n >", "unexpected end of condition at column 9"),
            ("left.n > 1 and", "unexpected end of condition at column 15"),
            ("1 < left.n < 3", "unexpected '<' at column 12: comparisons do not chain (use and)"),
            ("left.n 2", "unexpected '2' at column 8"),
            ("left.n > 1 left.x", "unexpected 'left.x' at column 12"),
            ("left.n && && 1", "unexpected '&&' at column 11"),
            ("1 + not true", "unexpected 'not' at column 5"),
            ("left.n > 99999999999999999999", "integer 99999999999999999999 at column 10 is out of range"),
            ("LEFT.n > 1", "unknown word 'LEFT'"),
            ("left. n > 1", "unknown word 'left'"),
            ("left.n.x > 1", "cannot parse '.x > 1' at column 7"),
            ("left.n <> 1", "unexpected '>' at column 9"),
            ("()", "unexpected ')' at column 2"),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(got.starts_with(want), "{text:?}: got {got:?}, want {want:?}");
        }
        // Tokens are all read first (as the model does): an unknown word beats a missing ).
        assert!(err("(left.n > foo").starts_with("unknown word 'foo'"));
        // Quoting follows Python's repr.
        assert_eq!(err("don't"), "unknown word 'don' (fields are left.x / right.x)");
        assert_eq!(err("1 = \"it's"), "unterminated string '\"it\\'s' at column 5");
    }

    #[test]
    fn type_errors_are_refused_at_parse_time() {
        let cases = [
            ("left.name * 2 > 1", "cannot apply * to string left.name at column 1"),
            ("left.name + right.tag == 'ab'", "cannot apply + to string left.name at column 1"),
            ("1 + 'a' == 2", "cannot apply + to string 'a' at column 5"),
            ("left.b % 2", "cannot apply % to string left.b"),
            ("-left.name < 1", "cannot apply unary - to string left.name at column 2"),
            ("left.name > 5", "cannot compare string left.name with int 5 at column 1"),
            ("(left.n + 1) = left.name", "cannot compare int (left.n + 1) with string left.name at column 1"),
            ("left.name == true", "cannot compare string left.name with bool true"),
            ("right.tag != right.amount", "cannot compare string right.tag with float right.amount"),
            ("'x' < (1 < 2)", "cannot compare string 'x' with bool (1 < 2)"),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(got.starts_with(want), "{text:?}: got {got:?}, want {want:?}");
        }
        // A syntax error anywhere is reported before a type error (the model finds only those).
        assert_eq!(err("left.name * 2 )"), "unexpected ')' at column 15");
        assert_eq!(err("left.name * 2 > (1"), "missing ) for the ( at column 17 (found the end)");
        // The first type error is reported, and a bad operand does not cause more.
        assert!(err("-left.name + 1 < 'a'").starts_with("cannot apply unary - to string left.name at column 2"));
        // Still fine: strings with strings and with null, bools and numbers together.
        for ok in ["left.name < right.tag", "left.name = null", "left.flag + 1 == 2", "-left.flag = -1", "left.b"] {
            assert!(parse(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn id_lists_are_refused() {
        let (l, r) = schemas();
        let mut fields = r.fields.clone();
        fields.push(Field { name: "_supersedes".into(), ty: FieldType::IdList, nullable: false });
        let r = Schema::new(fields, None, TimeSpec::Ingest);
        assert_eq!(
            Expr::parse("right._supersedes", &l, &r),
            Err("right._supersedes at column 1 is an id list, which a condition cannot use".into())
        );
    }

    #[test]
    fn precedence() {
        assert_eq!(value_of("1 + 2 * 3"), Value::Int(7));
        assert_eq!(value_of("(1 + 2) * 3"), Value::Int(9));
        assert_eq!(value_of("10 - 4 - 3"), Value::Int(3)); // left-associative
        assert_eq!(value_of("2 * 7 % 4"), Value::Int(2)); // (2*7)%4
        assert_eq!(value_of("2 * (7 % 4)"), Value::Int(6));
        assert_eq!(value_of("-2 * 3"), Value::Int(-6));
        assert_eq!(value_of("- -2"), Value::Int(2));
        assert_eq!(value_of("-(2 - 5)"), Value::Int(3));
        assert_eq!(value_of("100 / 10 / 5"), Value::Float(2.0));
        // or < and < not < comparison
        assert!(eval("true or true and false")); // true or (true and false)
        assert!(!eval("(true or true) and false"));
        assert!(eval("not false and true")); // (not false) and true
        assert!(!eval("not (false or true)"));
        assert!(eval("not 1 == 2")); // not (1 == 2)
        assert!(eval("! left.n == 8"));
        assert!(eval("left.n + 1 > 7 and right.amount / 2 >= 75"));
        assert!(eval("left.n > 100 or right.qty < 0"));
        assert!(eval("left.n > 100 || right.qty < 0 && !right.ok"));
        assert!(eval("not not true"));
        assert!(eval("1 + 2 == 3"));
        assert!(eval("3 == 1 + 2"));
        assert!(eval("left.n = 7 AND right.qty = -3"));
        assert!(eval("NOT left.n = 8 Or FALSE"));
    }

    #[test]
    fn literals() {
        assert_eq!(value_of("42"), Value::Int(42));
        assert_eq!(value_of("007"), Value::Int(7));
        assert_eq!(value_of("9223372036854775807"), Value::Int(i64::MAX));
        assert_eq!(value_of("2.5"), Value::Float(2.5));
        assert_eq!(value_of("2."), Value::Float(2.0));
        assert_eq!(value_of(".25"), Value::Float(0.25));
        assert_eq!(value_of("0.1"), Value::Float(0.1));
        assert_eq!(value_of("true"), Value::Bool(true));
        assert_eq!(value_of("FALSE"), Value::Bool(false));
        assert_eq!(value_of("Null"), Value::Null);
        assert_eq!(value_of("'it\\'s'"), s("it's"));
        assert_eq!(value_of("\"say \\\"hi\\\"\""), s("say \"hi\""));
        assert_eq!(value_of("'a\"b'"), s("a\"b"));
        assert_eq!(value_of("\"a'b\""), s("a'b"));
        assert_eq!(value_of(r"'\\ \/ \b \f \n \r \t'"), s("\\ / \u{8} \u{c} \n \r \t"));
        assert_eq!(value_of(r"'\u00e9\u00C9'"), s("éÉ"));
        assert_eq!(value_of(r"'\ud83d\ude00'"), s("😀"));
        assert_eq!(value_of("'héllo wörld'"), s("héllo wörld"));
        assert_eq!(value_of("''"), s(""));
        assert_eq!(value_of("  left.n  "), Value::Int(7));
        assert_eq!(value_of("left.name"), s("ann"));
        assert_eq!(value_of("left.flag"), Value::Bool(true));
        assert_eq!(value_of("right.amount"), Value::Float(150.0));
        assert!(eval("left.name == 'ann' and left.name == \"ann\""));
        assert!(eval("left.b = 'QQ=='"));
    }

    #[test]
    fn nulls() {
        let (l, _) = pair();
        let r = row(vec![Value::Null, Value::Null, Value::Null, Value::Null]);
        for cmp in ["==", "!=", "<", "<=", ">", ">="] {
            assert!(!eval_on(&format!("right.qty {cmp} 1"), &l, &r), "{cmp}");
            assert!(!eval_on(&format!("1 {cmp} right.qty"), &l, &r), "{cmp}");
            assert!(!eval_on(&format!("right.tag {cmp} 'a'"), &l, &r), "{cmp}");
            assert!(!eval_on(&format!("null {cmp} null"), &l, &r), "{cmp}");
            // and `not` of a null comparison is true
            assert!(eval_on(&format!("not right.qty {cmp} 1"), &l, &r), "{cmp}");
        }
        assert_eq!(value_of("null + 1"), Value::Null);
        assert_eq!(value_of("-null"), Value::Null);
        assert_eq!(value_of("left.n * null"), Value::Null);
        assert!(!eval_on("right.qty + 1 > 0 or right.qty + 1 <= 0", &l, &r));
        assert!(!eval_on("right.ok", &l, &r));
        assert!(eval_on("not right.ok", &l, &r));
        assert!(eval_on("right.ok or true", &l, &r));
        assert!(!eval("null"));
        // A comparison with the null literal is always false: `!= null` is no null test.
        assert!(!eval("left.n != null"));
    }

    #[test]
    fn truthiness() {
        assert!(!eval("0") && eval("1") && eval("-1"));
        assert!(!eval("0.0") && eval("0.5"));
        assert!(!eval("''") && eval("'x'"));
        assert!(!eval("false") && eval("true"));
        assert!(eval("left.n") && !eval("left.n - 7"));
        assert!(eval("left.n and right.amount and left.name"));
        assert!(!eval("left.n and right.ok"));
    }

    #[test]
    fn int_and_float_mix() {
        assert_eq!(value_of("left.n + 1"), Value::Int(8));
        assert_eq!(value_of("left.n + 0.5"), Value::Float(7.5));
        assert_eq!(value_of("left.n * left.x"), Value::Float(17.5));
        assert_eq!(value_of("right.amount - left.n"), Value::Float(143.0));
        assert!(eval("left.n == 7.0"));
        assert!(eval("7.0 == left.n"));
        assert!(eval("left.n < 7.5 and left.n > 6.9999"));
        assert!(eval("right.amount == 150"));
        // Bools are 0 and 1 (Python's bool is an int).
        assert_eq!(value_of("left.flag + left.flag"), Value::Int(2));
        assert_eq!(value_of("true * 2.5"), Value::Float(2.5));
        assert_eq!(value_of("-true"), Value::Int(-1));
        assert!(eval("left.flag == 1 and right.ok == 0 and true > false"));
        // Exact comparison of int and float, as Python: 2^53 + 1 is not 2^53 as a double.
        assert!(eval("9007199254740993 > 9007199254740992.0"));
        assert!(eval("9007199254740993 != 9007199254740992.0"));
        assert!(eval("9007199254740992 == 9007199254740992.0"));
        assert!(eval("9223372036854775807 < 9223372036854775808.0"));
        assert!(eval("-9223372036854775807 - 1 == -9223372036854775808.0"));
        assert!(eval("-3 < -2.5 and -2 > -2.5 and 2 > 1.5 and 1 < 1.5"));
        // Overflow of int arithmetic: null.
        assert_eq!(value_of("9223372036854775807 + 1"), Value::Null);
        assert_eq!(value_of("-9223372036854775807 - 2"), Value::Null);
        assert_eq!(value_of("4611686018427387904 * 2"), Value::Null);
        assert_eq!(value_of("-(-9223372036854775807 - 1)"), Value::Null);
        assert_eq!(value_of("9223372036854775807 + 1.0"), Value::Float(9223372036854775808.0));
        // Float overflow is inf, like Python.
        let big = format!("{}.0", "9".repeat(300));
        assert_eq!(value_of(&format!("{big} * {big}")), Value::Float(f64::INFINITY));
        assert!(eval(&format!("{big} * {big} > 9223372036854775807")));
        // NaN (inf - inf): every comparison false but !=; truthy.
        let nan = format!("({big} * {big} - {big} * {big})");
        assert!(!eval(&format!("{nan} == {nan}")) && eval(&format!("{nan} != {nan}")));
        assert!(!eval(&format!("{nan} < 1")) && !eval(&format!("1 >= {nan}")) && eval(&format!("1 != {nan}")));
        assert!(eval(&nan));
    }

    #[test]
    fn python_division_and_remainder() {
        // True division gives a float, correctly rounded.
        assert_eq!(value_of("7 / 2"), Value::Float(3.5));
        assert_eq!(value_of("-7 / 2"), Value::Float(-3.5));
        assert_eq!(value_of("6 / 3"), Value::Float(2.0));
        assert_eq!(value_of("1 / 3"), Value::Float(1.0 / 3.0));
        assert_eq!(value_of("7.0 / 2"), Value::Float(3.5));
        // Python: 9007199254740993 / 1 == 9007199254740992.0 (ties to even);
        // (2**63 - 1) / 3 == 3074457345618258602.3333… → 3.0744573456182584e18.
        assert_eq!(value_of("9007199254740993 / 1"), Value::Float(9007199254740992.0));
        assert_eq!(value_of("9007199254740995 / 1"), Value::Float(9007199254740996.0));
        assert_eq!(value_of("9223372036854775807 / 3"), Value::Float(3.0744573456182584e18));
        assert_eq!(value_of("9223372036854775807 / 9223372036854775806"), Value::Float(1.0));
        assert_eq!(value_of("1 / 9223372036854775807"), Value::Float(1.0842021724855044e-19));
        assert_eq!(value_of("-9007199254740997 / 2"), Value::Float(-4503599627370498.0));
        // Python: 18014398509481985 / 2 == 9007199254740992.0 (…992.5: the doubles there are 2 apart)
        assert_eq!(value_of("18014398509481985 / 2"), Value::Float(9007199254740992.0));
        // Python: 18014398509481987 / 2 == 9007199254740994.0 (…993.5 is nearer …994)
        assert_eq!(value_of("18014398509481987 / 2"), Value::Float(9007199254740994.0));
        // Remainder: the sign of the divisor.
        assert_eq!(value_of("7 % 3"), Value::Int(1));
        assert_eq!(value_of("-7 % 3"), Value::Int(2));
        assert_eq!(value_of("7 % -3"), Value::Int(-2));
        assert_eq!(value_of("-7 % -3"), Value::Int(-1));
        assert_eq!(value_of("6 % -3"), Value::Int(0));
        assert_eq!(value_of("(-9223372036854775807 - 1) % -1"), Value::Int(0));
        assert_eq!(value_of("7.5 % 2"), Value::Float(1.5));
        assert_eq!(value_of("7.5 % -2"), Value::Float(-0.5));
        assert_eq!(value_of("-7.5 % 2"), Value::Float(0.5));
    }

    #[test]
    fn division_by_zero_is_null() {
        for text in ["1 / 0", "1 % 0", "1.0 / 0", "1 / 0.0", "1.5 % 0.0", "0 / 0", "left.n / (left.n - 7)"] {
            assert_eq!(value_of(text), Value::Null, "{text}");
            assert!(!eval(&format!("{text} == {text}")), "{text}");
        }
    }

    #[test]
    fn strings_compare_by_code_point() {
        assert!(eval("left.name == 'ann'"));
        assert!(eval("left.name != 'Ann'"));
        assert!(eval("left.name > 'Ann'")); // 'a' > 'A'
        assert!(eval("left.name < 'anna' and left.name > 'an' and left.name >= 'ann' and left.name <= 'ann'"));
        assert!(eval("'' < left.name"));
        assert!(eval("'z' < 'é' and 'é' < '😀'"));
        assert!(eval("right.tag < left.name"));
        assert!(!eval("left.name = right.tag"));
    }

    #[test]
    fn runtime_type_mismatches_follow_python() {
        // Rows whose values disagree with the schema (the decoder never makes them): no panic,
        // Python's answers (the model's None for a TypeError).
        let l = row(vec![Value::Int(3), s("x"), s("y"), s("z"), Value::Float(1.0)]);
        let r = row(vec![]);
        assert!(!eval_on("left.name == 'x'", &l, &r));
        assert!(eval_on("left.name != 'x'", &l, &r));
        assert!(!eval_on("left.name < 'x'", &l, &r));
        assert!(eval_on("not left.name < 'x'", &l, &r));
        assert!(!eval_on("left.n + 1 == 2", &l, &r));
        assert!(!eval_on("-left.n", &l, &r));
        // A row shorter than its schema reads null.
        assert!(!eval_on("right.qty == 1 or right.qty != 1", &l, &r));
        assert!(eval_on("not right.ok", &l, &r));
    }

    #[test]
    fn depth_is_bounded() {
        let fine = format!("{}1{}", "(".repeat(100), ")".repeat(100));
        assert_eq!(value_of(&fine), Value::Int(1));
        let chain = vec!["left.n > 0"; 100].join(" or ");
        assert!(eval(&chain));
        for deep in [
            format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000)),
            format!("{}1", "(".repeat(10_000)),
            format!("{}true", "not ".repeat(10_000)),
            format!("{}1", "-".repeat(10_000)),
            format!("1{}", " + 1".repeat(10_000)),
            vec!["true"; 10_000].join(" and "),
        ] {
            let e = err(&deep);
            assert!(e.contains("too deep"), "{e}");
        }
    }

    #[test]
    fn the_deepest_condition_evaluates_on_a_small_stack() {
        // MAX_DEPTH levels of recursion must fit easily in a shard thread's stack (debug build).
        let text = vec!["left.n > 0"; MAX_DEPTH - 1].join(" and ");
        let e = parse(&text).unwrap();
        let handle = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || {
                let (l, r) = pair();
                e.eval(&l, &r)
            })
            .unwrap();
        assert!(handle.join().unwrap());
    }

    const EXPRESSIONS: &[&str] = &[
        "right.amount > 100",
        "left.n + right.qty * 2 - 1 >= left.x / 3",
        "left.n % right.qty == 0 or right.qty % 0 = 1",
        "left.x % right.amount < 0.5 and -left.x != right.amount",
        "left.n / right.qty < left.x",
        "left.name < right.tag or left.b = 'QQ=='",
        "not left.flag and right.ok or left.flag != right.ok",
        "left.flag + right.ok * left.n > right.qty",
        "left.n * right.qty * left.n * right.qty > 1000000000000",
        "-left.n - -right.qty",
        "left.name",
        "left.x",
        "(left.n - 9223372036854775807) * 2 < 0",
        "left.name = null or right.tag != null",
        "right.qty / 0 > 1 or 1.5 % right.amount < 1",
    ];

    fn arb_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Int),
            prop_oneof![-3i64..=3, Just(i64::MIN), Just(i64::MAX)].prop_map(Value::Int),
            any::<f64>().prop_map(Value::Float),
            prop_oneof![Just(0.0), Just(-0.0), Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY)]
                .prop_map(Value::Float),
            ".{0,6}".prop_map(|s| Value::Str(s.into())),
            prop::collection::vec(any::<u64>(), 0..3).prop_map(|ids| Value::IdList(ids.into())),
        ]
    }

    fn arb_row() -> impl Strategy<Value = Row> {
        prop::collection::vec(arb_value(), 0..7).prop_map(row)
    }

    /// Condition-like text: mostly valid tokens, glued at random.
    fn arb_text() -> impl Strategy<Value = String> {
        let token = prop_oneof![
            Just("left.n"),
            Just("left.x"),
            Just("left.name"),
            Just("left.flag"),
            Just("left.b"),
            Just("right.amount"),
            Just("right.qty"),
            Just("right.tag"),
            Just("right.ok"),
            Just("left.zz"),
            Just("1"),
            Just("0"),
            Just("2.5"),
            Just(".5"),
            Just("9223372036854775807"),
            Just("'s'"),
            Just("\"t\\u00e9\""),
            Just("'\\ud83d"),
            Just("'"),
            Just("\\"),
            Just("true"),
            Just("null"),
            Just("and"),
            Just("or"),
            Just("not"),
            Just("&&"),
            Just("||"),
            Just("!"),
            Just("=="),
            Just("="),
            Just("!="),
            Just("<"),
            Just("<="),
            Just(">"),
            Just(">="),
            Just("+"),
            Just("-"),
            Just("*"),
            Just("/"),
            Just("%"),
            Just("("),
            Just(")"),
            Just("foo"),
            Just("é"),
            Just("."),
        ];
        prop::collection::vec((token, prop_oneof![Just(""), Just(" ")]), 0..24)
            .prop_map(|ts| ts.into_iter().map(|(t, sp)| format!("{t}{sp}")).collect())
    }

    proptest! {
        #[test]
        fn eval_never_panics(l in arb_row(), r in arb_row()) {
            for text in EXPRESSIONS {
                let e = parse(text).unwrap();
                let _ = e.eval(&l, &r);
            }
        }

        #[test]
        fn parse_never_panics_on_any_string(text in any::<String>()) {
            let _ = parse(&text);
        }

        #[test]
        fn random_conditions_parse_or_fail_cleanly_and_evaluate(text in arb_text(), l in arb_row(), r in arb_row()) {
            if let Ok(e) = parse(&text) {
                let _ = e.eval(&l, &r);
                // Parsing is deterministic.
                prop_assert_eq!(parse(&text), Ok(e));
            }
        }

        #[test]
        fn int_true_division_is_correctly_rounded(x in any::<i64>(), y in any::<i64>()) {
            // |y| <= |x|, so |x / y| >= 1 and the exact check below fits an i128.
            let (x, y) = if y.unsigned_abs() <= x.unsigned_abs() { (x, y) } else { (y, x) };
            prop_assume!(y != 0);
            let q = int_true_div(x, y);
            let (below, above) = (q.next_down(), q.next_up());
            // |x - c*y| * 2^k for c = m * 2^e, with one k that makes every c * 2^k an integer.
            let k = [q, below, above].iter().map(|c| -decompose(*c).1).max().unwrap_or(0).max(0);
            let distance = |c: f64| {
                let (m, e) = decompose(c);
                (i128::from(x) * (1i128 << k) - m * i128::from(y) * (1i128 << (e + k))).abs()
            };
            let (d, d_below, d_above) = (distance(q), distance(below), distance(above));
            prop_assert!(d <= d_below && d <= d_above, "{x} / {y} = {q}");
            if d == d_below || d == d_above {
                prop_assert_eq!(decompose(q).0 % 2, 0, "{} / {} = {}: a tie goes to the even double", x, y, q);
            }
        }
    }

    /// `f` (finite, normal) = m * 2^e with m an integer of 53 bits.
    fn decompose(f: f64) -> (i128, i32) {
        let bits = f.to_bits();
        let exp = ((bits >> 52) & 0x7ff) as i32;
        let m = i128::from((bits & ((1 << 52) - 1)) | 1 << 52);
        (if f < 0.0 { -m } else { m }, exp - 1075)
    }
}
