//! The parser: tokens → the compiled arena, one method per rule of the grammar (module doc of
//! [`super`]), with the parse-time type checks and the depth limit.

use std::fmt;

use super::lexer::{Fields, Op, Tok, TokKind, column, quoted, tokenize};
use super::{Arith, Expr, MAX_DEPTH, Node};
use crate::record::{FieldType, Schema, Value};

/// Parses and type-checks `text`: [`Expr::parse`].
pub(super) fn parse(text: &str, fields: Fields<'_>) -> Result<Expr, String> {
    parse_typed(text, fields).map(|(expr, _)| expr)
}

/// [`Expr::parse_value`]: the expression and the type of its values.
pub(super) fn parse_value(text: &str, left: &Schema, right: &Schema) -> Result<(Expr, FieldType), String> {
    let (expr, ty) = parse_typed(text, Fields::Pair([left, right]))?;
    let ty = match ty {
        Ty::Bool => FieldType::Bool,
        Ty::Int => FieldType::Int,
        Ty::Float => FieldType::Float,
        Ty::Str => FieldType::String,
        Ty::Null => return Err("the expression is always null: it has no type a field could have".into()),
    };
    Ok((expr, ty))
}

fn parse_typed(text: &str, fields: Fields<'_>) -> Result<(Expr, Ty), String> {
    let toks = tokenize(text, fields)?;
    if toks.is_empty() {
        return Err("empty condition".into());
    }
    let mut parser = Parser { text, toks, i: 0, nodes: Vec::new(), depths: Vec::new(), nesting: 0, type_error: None };
    let root = parser.or()?;
    if let Some(tok) = parser.toks.get(parser.i) {
        return Err(format!("unexpected {} at column {}", parser.quoted_tok(tok), column(text, tok.start)));
    }
    if let Some(e) = parser.type_error {
        return Err(e);
    }
    Ok((Expr { nodes: parser.nodes, root: root.at }, root.ty))
}

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

    /// The next token's start, or the end of the text.
    fn here(&self) -> usize {
        self.toks.get(self.i).map_or(self.text.trim_end().len(), |t| t.start)
    }

    /// Consumes `op` or fails saying `what` was wanted.
    fn expect(&mut self, op: Op, what: &str) -> Result<usize, String> {
        self.take(op).ok_or_else(|| {
            let found = match self.toks.get(self.i) {
                Some(t) => format!("found {}", self.quoted_tok(t)),
                None => "found the end".into(),
            };
            format!("expected {what} at column {} ({found})", column(self.text, self.here()))
        })
    }

    /// The type of values that may come from any of `subs` (CASE branches, COALESCE operands):
    /// null goes with anything, int with float gives float; other mixes are a type error.
    fn unify(&mut self, what: &str, subs: &[Sub]) -> Ty {
        let mut ty = Ty::Null;
        for s in subs {
            ty = match (ty, s.ty) {
                (Ty::Null, t) | (t, Ty::Null) => t,
                (Ty::Int, Ty::Float) | (Ty::Float, Ty::Int) => Ty::Float,
                (a, b) if a == b => a,
                (a, b) => {
                    self.type_error(format!(
                        "{what} mixes {a} and {b} {} at column {} (one type, or int and float)",
                        self.fragment(*s),
                        column(self.text, s.start)
                    ));
                    return Ty::Null;
                }
            };
        }
        ty
    }

    /// `case when c then v … [else v] end` (after `case`, at `start`).
    fn case(&mut self, start: usize) -> Result<Sub, String> {
        self.enter(start)?;
        let (mut arms, mut operands, mut values) = (Vec::new(), Vec::new(), Vec::new());
        self.expect(Op::When, "when after case")?;
        loop {
            let when = self.or()?;
            self.expect(Op::Then, "then")?;
            let then = self.or()?;
            arms.push((when.at, then.at));
            operands.extend([when, then]);
            values.push(then);
            if self.take(Op::When).is_none() {
                break;
            }
        }
        let otherwise = match self.take(Op::Else) {
            Some(_) => {
                let e = self.or()?;
                operands.push(e);
                values.push(e);
                Some(e.at)
            }
            None => None,
        };
        let end = self.expect(Op::End, "when, else or end")?;
        self.nesting -= 1;
        let ty = self.unify("case", &values);
        self.push(Node::Case { arms: arms.into(), otherwise }, ty, start, end + 3, &operands)
    }

    /// `coalesce(a, b, …)` (after `coalesce`, at `start`).
    fn coalesce(&mut self, start: usize) -> Result<Sub, String> {
        self.enter(start)?;
        self.expect(Op::Open, "( after coalesce")?;
        let mut args = vec![self.or()?];
        while self.take(Op::Comma).is_some() {
            args.push(self.or()?);
        }
        let close = self.expect(Op::Close, ", or )")?;
        self.nesting -= 1;
        let ty = self.unify("coalesce", &args);
        let nodes: Vec<usize> = args.iter().map(|a| a.at).collect();
        self.push(Node::Coalesce(nodes.into()), ty, start, close + 1, &args)
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
            TokKind::Op(Op::Case) => {
                self.i += 1;
                self.case(start)
            }
            TokKind::Op(Op::Coalesce) => {
                self.i += 1;
                self.coalesce(start)
            }
            TokKind::Op(_) => {
                Err(format!("unexpected {} at column {}", self.quoted_tok(tok), column(self.text, start)))
            }
        }
    }
}
