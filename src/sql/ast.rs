//! The syntax tree the parser builds: a little more than the subset, so that what lies outside it
//! is refused by the compiler with a reason rather than by the parser with "unexpected".
//! Every node keeps the byte offset where it starts.

/// A name as written (`` `quoted` `` or not) and where.
#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub at: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Statement {
    CreateTable(CreateTable),
    CreateView {
        name: Ident,
        query: Query,
    },
    /// `INSERT INTO target SELECT …`.
    Insert {
        target: Ident,
        query: Query,
    },
    /// `SET 'key' = 'value'`.
    Set {
        key: String,
        value: String,
        at: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct CreateTable {
    pub name: Ident,
    pub columns: Vec<ColumnDef>,
    /// `rt AS expr`: computed columns (the time attribute).
    pub computed: Vec<(Ident, Expr)>,
    /// `WATERMARK FOR column AS expr`.
    pub watermark: Option<(Ident, Expr)>,
    /// `PRIMARY KEY (…)`, refused by the compiler.
    pub primary_key: Option<usize>,
    /// `WITH ('k' = 'v', …)`: key, value, where the key is written.
    pub options: Vec<(String, String, usize)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ColumnDef {
    pub name: Ident,
    /// The type as written, upper-cased (`STRING`, `VARCHAR`, `DECIMAL`), with where it is.
    pub ty: Ident,
    /// `NOT NULL` or a length/precision was written after the type.
    pub decorated: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Query {
    Select(Box<Select>),
    /// `q UNION ALL q …`; `at` is the first `UNION`.
    UnionAll {
        parts: Vec<Select>,
        at: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Select {
    pub at: usize,
    pub distinct: bool,
    pub items: Vec<SelectItem>,
    pub from: TableRef,
    pub joins: Vec<Join>,
    pub where_: Option<Expr>,
    pub group_by: Vec<Expr>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum SelectItem {
    /// `*` or `alias.*`.
    Star {
        qualifier: Option<Ident>,
        at: usize,
    },
    Expr {
        expr: Expr,
        alias: Option<Ident>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct TableRef {
    pub source: Source,
    pub alias: Option<Ident>,
    /// `FOR SYSTEM_TIME AS OF expr`.
    pub as_of: Option<Expr>,
    pub at: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Named(Ident),
    /// `TABLE(TUMBLE(…))`.
    Window(Tvf),
    Subquery(Box<Query>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TvfKind {
    Tumble,
    Hop,
    Session,
    Cumulate,
}

/// A window table-valued function: `TUMBLE(TABLE t, DESCRIPTOR(rt), size [, offset])`,
/// `HOP(TABLE t, DESCRIPTOR(rt), slide, size [, offset])`,
/// `SESSION(TABLE t [PARTITION BY k], DESCRIPTOR(rt), gap)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Tvf {
    pub kind: TvfKind,
    pub table: Ident,
    pub partition_by: Vec<Ident>,
    pub descriptor: Ident,
    pub args: Vec<Expr>,
    pub at: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinKind {
    Inner,
    Left,
    Right,
    Full,
    Cross,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Join {
    pub kind: JoinKind,
    pub right: TableRef,
    pub on: Option<Expr>,
    pub at: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    And,
    Or,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Concat,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Column {
        qualifier: Option<Ident>,
        name: Ident,
    },
    Number {
        text: String,
        at: usize,
    },
    Str {
        value: String,
        at: usize,
    },
    /// TRUE, FALSE, NULL.
    Keyword {
        word: String,
        at: usize,
    },
    /// `INTERVAL '3' SECOND`: the quoted value and the unit word, upper-cased.
    Interval {
        value: String,
        unit: String,
        at: usize,
    },
    Binary {
        op: BinOp,
        left: Box<Expr>,
        right: Box<Expr>,
        at: usize,
    },
    Not {
        operand: Box<Expr>,
        at: usize,
    },
    Neg {
        operand: Box<Expr>,
        at: usize,
    },
    Between {
        operand: Box<Expr>,
        low: Box<Expr>,
        high: Box<Expr>,
        negated: bool,
        at: usize,
    },
    /// `f(args)`, `COUNT(*)` (star), `f(DISTINCT x)`.
    Call {
        name: Ident,
        args: Vec<Expr>,
        star: bool,
        distinct: bool,
    },
    /// `CASE WHEN c THEN v … [ELSE v] END` (the searched form).
    Case {
        arms: Vec<(Expr, Expr)>,
        otherwise: Option<Box<Expr>>,
        at: usize,
    },
    /// CAST, IS NULL, IN, LIKE, subqueries, CASE x WHEN…: parsed far enough to be refused by name.
    Other {
        what: String,
        at: usize,
    },
}

impl Expr {
    pub fn at(&self) -> usize {
        match self {
            Expr::Column { qualifier, name } => qualifier.as_ref().map_or(name.at, |q| q.at),
            Expr::Call { name, .. } => name.at,
            Expr::Number { at, .. }
            | Expr::Str { at, .. }
            | Expr::Keyword { at, .. }
            | Expr::Interval { at, .. }
            | Expr::Binary { at, .. }
            | Expr::Not { at, .. }
            | Expr::Neg { at, .. }
            | Expr::Between { at, .. }
            | Expr::Case { at, .. }
            | Expr::Other { at, .. } => *at,
        }
    }
}
