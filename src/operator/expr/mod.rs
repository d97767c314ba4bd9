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
//!            | NAME                                   over one row (window_aggregate's `where`)
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
//!
//! The code follows the steps: `lexer` (text → tokens, fields resolved to positions), `parser`
//! (tokens → arena, with the parse-time checks), `eval` (arena and a pair of rows → value); this
//! file holds the public API and the arena's node types, which the parser writes and `eval` reads.

mod eval;
mod lexer;
mod parser;
#[cfg(test)]
mod tests;

use crate::record::view::RowView;
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

/// A node of the compiled form; operands are indices into [`Expr::nodes`].
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
    /// `case when c then v … [else v] end`: the first arm whose condition holds, else `otherwise`
    /// (null without one).
    Case {
        arms: Box<[(usize, usize)]>,
        otherwise: Option<usize>,
    },
    /// `coalesce(a, b, …)`: the first operand that is not null.
    Coalesce(Box<[usize]>),
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
        parser::parse(text, lexer::Fields::Pair([left, right]))
    }

    /// Parses a condition on one row (window_aggregate's `where`): a plain name is a field of
    /// `schema` (a keyword such as `end` wins over a field of that name).
    pub fn parse_row(text: &str, schema: &Schema) -> Result<Expr, String> {
        parser::parse(text, lexer::Fields::One(schema))
    }

    /// Whether one row satisfies a condition from [`parse_row`](Self::parse_row).
    pub fn eval_row(&self, row: RowView<'_>) -> bool {
        self.eval_views(row, row)
    }

    /// Whether the pair satisfies the condition. Never allocates, never panics.
    pub fn eval(&self, left: &Row, right: &Row) -> bool {
        self.eval_views(RowView::Heap(left), RowView::Heap(right))
    }

    /// [`eval`](Self::eval) on rows read in place (a ring frame's, an arena's).
    pub fn eval_views(&self, left: RowView<'_>, right: RowView<'_>) -> bool {
        self.value(self.root, Some(left), Some(right)).truthy()
    }

    /// Parses a computed `select` expression (same language, any type but null) and its output
    /// type: an int or float expression, a string (also from a `bytes` field), or a bool.
    pub fn parse_value(text: &str, left: &Schema, right: &Schema) -> Result<(Expr, FieldType), String> {
        parser::parse_value(text, left, right)
    }

    /// The value of a computed expression of type `ty` ([`parse_value`](Self::parse_value)); a
    /// side that is missing (an outer row) reads null. An int where `ty` is float (a CASE or
    /// COALESCE mixing them) becomes a float.
    pub fn compute(&self, ty: FieldType, left: Option<RowView<'_>>, right: Option<RowView<'_>>) -> Value {
        self.value(self.root, left, right).to_value(ty)
    }
}

impl Expr {
    /// The condition as SQL (`braid export flink-sql`), `field` naming a side's field. SQL's `/`
    /// of two integers truncates and its `%` takes the dividend's sign, where this language's
    /// `/` is a true division and `%` Python's: the export says so beside the condition.
    pub fn to_sql(&self, field: &dyn Fn(bool, usize) -> String) -> String {
        self.node_sql(self.root, field)
    }

    fn node_sql(&self, at: usize, field: &dyn Fn(bool, usize) -> String) -> String {
        let Some(node) = self.nodes.get(at) else { return "NULL".into() };
        let two =
            |op: &str, a: usize, b: usize| format!("({} {op} {})", self.node_sql(a, field), self.node_sql(b, field));
        match node {
            Node::Lit(Value::Null) => "NULL".into(),
            Node::Lit(Value::Bool(b)) => if *b { "TRUE" } else { "FALSE" }.into(),
            Node::Lit(Value::Int(i)) => i.to_string(),
            Node::Lit(Value::Float(f)) => format!("{f:?}"),
            Node::Lit(Value::Str(s)) => format!("'{}'", s.replace('\'', "''")),
            Node::Lit(Value::IdList(_)) => "NULL".into(),
            Node::Field(side, pos) => field(*side == Side::Left, *pos),
            Node::Neg(a) => format!("(-{})", self.node_sql(*a, field)),
            Node::Not(a) => format!("(NOT {})", self.node_sql(*a, field)),
            Node::And(a, b) => two("AND", *a, *b),
            Node::Or(a, b) => two("OR", *a, *b),
            Node::Arith(op, a, b) => {
                let op = match op {
                    Arith::Add => "+",
                    Arith::Sub => "-",
                    Arith::Mul => "*",
                    Arith::Div => "/",
                    Arith::Rem => "%",
                };
                two(op, *a, *b)
            }
            Node::Case { arms, otherwise } => {
                let mut sql = String::from("(CASE");
                for (when, then) in arms.iter() {
                    sql += &format!(" WHEN {} THEN {}", self.node_sql(*when, field), self.node_sql(*then, field));
                }
                if let Some(e) = otherwise {
                    sql += &format!(" ELSE {}", self.node_sql(*e, field));
                }
                sql + " END)"
            }
            Node::Coalesce(args) => {
                let args: Vec<String> = args.iter().map(|a| self.node_sql(*a, field)).collect();
                format!("COALESCE({})", args.join(", "))
            }
            Node::Cmp(op, a, b) => {
                let op = match op {
                    Cmp::Eq => "=",
                    Cmp::Ne => "<>",
                    Cmp::Lt => "<",
                    Cmp::Le => "<=",
                    Cmp::Gt => ">",
                    Cmp::Ge => ">=",
                };
                two(op, *a, *b)
            }
        }
    }
}
