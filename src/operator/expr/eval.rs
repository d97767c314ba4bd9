//! Evaluation of the compiled form: allocation-free, with Python's rules for numbers, strings,
//! nulls and truthiness (listed in the module doc of [`super`]).

use std::cmp::Ordering;

use super::{Arith, Cmp, Expr, Node, Side};
use crate::record::view::{RowView, ValueRef};
use crate::record::{FieldType, Value, cmp_int_float};

impl Expr {
    /// The value of node `at` on the pair; its strings borrow from the rows or the arena.
    pub(super) fn value<'a>(&'a self, at: usize, left: Option<RowView<'a>>, right: Option<RowView<'a>>) -> Val<'a> {
        let Some(node) = self.nodes.get(at) else { return Val::Null };
        match node {
            Node::Lit(v) => Val::of(v),
            Node::Field(Side::Left, pos) => field(left, *pos),
            Node::Field(Side::Right, pos) => field(right, *pos),
            Node::Neg(a) => neg(self.value(*a, left, right)),
            Node::Not(a) => Val::Bool(!self.value(*a, left, right).truthy()),
            Node::And(a, b) => Val::Bool(self.value(*a, left, right).truthy() && self.value(*b, left, right).truthy()),
            Node::Or(a, b) => Val::Bool(self.value(*a, left, right).truthy() || self.value(*b, left, right).truthy()),
            Node::Arith(op, a, b) => arith(*op, self.value(*a, left, right), self.value(*b, left, right)),
            Node::Cmp(op, a, b) => compare(*op, self.value(*a, left, right), self.value(*b, left, right)),
            Node::Case { arms, otherwise } => {
                match arms.iter().find(|(when, _)| self.value(*when, left, right).truthy()) {
                    Some((_, then)) => self.value(*then, left, right),
                    None => otherwise.map_or(Val::Null, |e| self.value(e, left, right)),
                }
            }
            Node::Coalesce(args) => {
                args.iter().map(|a| self.value(*a, left, right)).find(|v| *v != Val::Null).unwrap_or(Val::Null)
            }
        }
    }
}

/// Field `pos` of a row, borrowed; null past the end of the row.
fn field(row: Option<RowView<'_>>, pos: usize) -> Val<'_> {
    row.filter(|row| pos < row.len()).map_or(Val::Null, |row| Val::from(row.value_ref(pos)))
}

/// A value in flight: strings borrow from a row or from a literal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Val<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a str),
}

impl<'a> From<ValueRef<'a>> for Val<'a> {
    fn from(v: ValueRef<'a>) -> Val<'a> {
        match v {
            ValueRef::Null => Val::Null,
            ValueRef::Bool(b) => Val::Bool(b),
            ValueRef::Int(i) => Val::Int(i),
            ValueRef::Float(f) => Val::Float(f),
            ValueRef::Str(s) => Val::Str(s),
            // Not a field a condition can name (refused at parse time).
            ValueRef::IdList(_) => Val::Null,
        }
    }
}

impl<'a> Val<'a> {
    fn of(v: &'a Value) -> Val<'a> {
        Val::from(ValueRef::of(v))
    }

    /// The value as a result holds it, in a column of type `ty` (an int in a float column is
    /// converted, as Python's `float(int)`).
    pub(super) fn to_value(self, ty: FieldType) -> Value {
        match self {
            Val::Null => Value::Null,
            Val::Bool(b) => Value::Bool(b),
            Val::Int(i) if ty == FieldType::Float => Value::Float(i as f64),
            Val::Int(i) => Value::Int(i),
            Val::Float(f) => Value::Float(f),
            Val::Str(s) => Value::Str(s.into()),
        }
    }

    /// Python's `bool(x)`.
    pub(super) fn truthy(self) -> bool {
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
pub(super) fn int_true_div(x: i64, y: i64) -> f64 {
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
        (Num::Int(x), Num::Float(y)) => cmp_int_float(x, y),
        (Num::Float(x), Num::Int(y)) => cmp_int_float(y, x).map(Ordering::reverse),
    }
}
