//! cogroup: both groups per key per window (either may be empty), aggregated per side
//! (DESIGN.md "Operators", CONTRACT.md rules 5, 7–11). Windows, lateness, firing and eviction
//! are [`super::window`]'s. The same machinery runs window_aggregate, the one-input form
//! ([`super::window_aggregate`]: one group per key per window, no `_kind`, an optional `where`).
//!
//! - `join` decides which key-windows produce a result: inner (both groups non-empty), left (the
//!   left one), right (the right one), full (either). `_kind` is `match`, `left_only` or
//!   `right_only` by which groups are non-empty.
//! - Aggregates per side: `count(side)` counts rows; `count(side.f)`, `sum`, `min`, `max`,
//!   `first`, `last`, `avg` skip null values (an upstream outer join's missing side) and are null
//!   over no values. `avg` is a float whatever the field's type: the exact sum of the values (ints
//!   as doubles, exact up to 2^53) divided by their count, rounded once. first/last order a group by (ts, arrival at this operator) (rule 11).
//! - Incremental: a window holds one accumulator per aggregate, never rows — count and sum are
//!   counters, min/max the best value, first/last the best (ts, arrival, value). An int sum is
//!   kept in i128 and saturates to int64 when written; a float sum is exact (Shewchuk's
//!   partials, as Python's `math.fsum`): the correctly rounded sum of the group whatever the
//!   order rows came in or sessions merged.
//! - Join quality ([`Quality`]): a row is **matched** when its group's window (a sliding row's
//!   last window) holds at least one row of the other input when it is freed — the other group is
//!   not empty — and unmatched otherwise, whatever `join` emits; counted once, then, inner
//!   cogroups too ([`super::window`] "Join quality").
//! - `_id` = H(operator, "group", key, start, end): a re-fire within allowed lateness repeats it
//!   with `_version` + 1. A merged session is a new result (`_version` 1) whose `_supersedes`
//!   lists, sorted, the `_id`s emitted for its parts and those they superseded.

use std::cmp::Ordering;

use crate::config::RESERVED_FIELDS;
use crate::config::operators::{Builder, Built, Input, is_identifier, join_type, output_schema};
use crate::config::walk::{Errors, Table};
use crate::operator::expr::Expr;
use crate::operator::interval_join::{JoinType, LEFT, RIGHT};
use crate::record::frame::{to_row, to_value};
use crate::record::id::IdHasher;
use crate::record::schema::Field;
use crate::record::view::{KeyRef, RowView};
use crate::record::{ArchivedRow, FieldType, Row, Value};
use crate::state::snapshot::{self, SnapshotError};
use crate::time::Time;

use super::projection::result_key;
use super::window::{Contents, Fire, OnMerge, RowRef, Window, WindowSpec, Windows, WindowsState, check_spec};
use super::{OperatorSpec, Output, Quality, ResultKind};

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let inputs = b.two_inputs(t, false, errors);
    let window = check_spec(t, errors);
    let join = join_type(t, &["inner", "left", "right", "full"], errors)?;
    let inputs = inputs?;
    let can_be_empty = [join.keeps_unmatched(RIGHT), join.keeps_unmatched(LEFT)];
    let (aggregates, fields) = aggregates(t, &inputs, can_be_empty, errors)?;
    let spec =
        CoGroupSpec { name: name.to_owned(), window: WindowSpec::UNUSED, join, aggregates, rekey: None, one: None };
    let key_fields = inputs[LEFT].key_fields().len();
    let (output, spec) = with_window(t, spec, window, fields, key_fields, errors)?;
    Some(Built { inputs: inputs.map(|i| i.node).to_vec(), output, spec: OperatorSpec::CoGroup(spec) })
}

/// The end of a cogroup's or window aggregate's check: the window fields after the aggregates
/// (`_window_start`, `_window_end`, `_version`, a session's `_supersedes`), `key`, the window.
pub(crate) fn with_window(
    t: Table<'_, '_>,
    mut spec: CoGroupSpec,
    window: Option<WindowSpec>,
    mut fields: Vec<Field>,
    key_fields: usize,
    errors: &mut Errors,
) -> Option<(crate::record::Schema, CoGroupSpec)> {
    let meta = [("_window_start", FieldType::Int), ("_window_end", FieldType::Int), ("_version", FieldType::Int)];
    fields.extend(meta.map(|(name, ty)| Field { name: name.into(), ty, nullable: false }));
    // A bad window is reported already (the plan will not run); the output stays referable.
    spec.window = window.unwrap_or(WindowSpec::UNUSED);
    if spec.window.is_session() {
        fields.push(Field { name: "_supersedes".into(), ty: FieldType::IdList, nullable: false });
    }
    let (output, rekey) = output_schema(t, fields, key_fields, errors)?;
    spec.rekey = rekey;
    Some((output, spec))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Function {
    Count,
    Sum,
    Min,
    Max,
    First,
    Last,
    /// The mean of a group's int or float values, a float (null for an empty group).
    Avg,
}

impl Function {
    fn parse(name: &str) -> Option<Function> {
        Some(match name {
            "count" => Function::Count,
            "sum" => Function::Sum,
            "min" => Function::Min,
            "max" => Function::Max,
            "first" => Function::First,
            "last" => Function::Last,
            "avg" => Function::Avg,
            _ => return None,
        })
    }
}

/// One item of `aggregate`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aggregate {
    pub function: Function,
    pub input: usize,
    /// The field's position in its input; `None` for `count(side)` (`count(*)` over one input).
    pub pos: Option<usize>,
    /// The field's type (the type of sum, min, max, first and last).
    pub ty: FieldType,
}

/// `aggregate`: `fn(left|right[.field]) [AS alias]` with fn in count, sum, min, max, first, last,
/// avg; over one input (window_aggregate) `fn(field)` and `count(*)`. Returns the aggregates and
/// the output fields: the left key, one per aggregate, `_kind` (two inputs only).
pub fn aggregates(
    t: Table<'_, '_>,
    inputs: &[Input],
    can_be_empty: [bool; 2],
    errors: &mut Errors,
) -> Option<(Vec<Aggregate>, Vec<Field>)> {
    let one = inputs.len() == 1;
    let path = t.child_path("aggregate");
    let (what, example) = if one {
        ("a list like [\"count(*) AS n\", \"avg(temp) AS mean\"]", "\"avg(temp) AS mean\"")
    } else {
        ("a list like [\"count(left) AS n\", \"sum(right.x) AS total\"]", "\"sum(right.amount) AS total\"")
    };
    let items = t.required_list("aggregate", errors, what)?;
    let mut fields: Vec<Field> = inputs.first()?.key_fields().map(|k| Field { nullable: false, ..k.clone() }).collect();
    if fields.is_empty() {
        return None;
    }
    let mut aggregates = Vec::new();
    let before = errors.count();
    for (item, span) in items {
        let Some((function, input, field, alias)) = parse_aggregate(item, one) else {
            errors.at(&span, &path, format!("bad aggregate {item:?} (want e.g. {example})"));
            continue;
        };
        let schema = &inputs[input].schema;
        let source = match field {
            None if function == "count" => None,
            None => {
                errors.at(&span, &path, format!("{function}() needs a field: {item:?}"));
                continue;
            }
            Some(f) => match schema.position(f) {
                Some(pos) => Some((pos, &schema.fields[pos])),
                None => {
                    errors.at(&span, &path, format!("{item:?}: {} has no field {f:?}", inputs[input].name));
                    continue;
                }
            },
        };
        if (function == "sum" || function == "avg")
            && source.is_some_and(|(_, f)| !matches!(f.ty, FieldType::Int | FieldType::Float))
        {
            errors.at(&span, &path, format!("{item:?}: {function}() needs an int or float field"));
            continue;
        }
        let side = match input {
            _ if one => "",
            LEFT => "_left",
            _ => "_right",
        };
        let alias = alias.map_or_else(
            || format!("{function}{side}{}", field.map_or(String::new(), |f| format!("_{f}"))),
            str::to_owned,
        );
        if RESERVED_FIELDS.contains(&alias.as_str()) || fields.iter().any(|f| f.name == alias) {
            errors.at(&span, &path, format!("{item:?}: output name {alias:?} is taken"));
            continue;
        }
        let (ty, nullable) = match source {
            None => (FieldType::Int, false),
            Some(_) if function == "count" => (FieldType::Int, false),
            Some((_, f)) if function == "avg" => (FieldType::Float, can_be_empty[input] || f.nullable),
            Some((_, f)) => (f.ty, can_be_empty[input] || f.nullable),
        };
        let Some(function) = Function::parse(function) else { continue };
        aggregates.push(Aggregate { function, input, pos: source.map(|(pos, _)| pos), ty });
        fields.push(Field { name: alias, ty, nullable });
    }
    if !one {
        fields.push(Field { name: "_kind".into(), ty: FieldType::String, nullable: false });
    }
    (errors.count() == before).then_some((aggregates, fields))
}

/// `fn(argument) [AS alias]` → (fn, input, field, alias); `one`: over one input, where the
/// argument is a field or `*` (count only) instead of `left|right[.field]`.
fn parse_aggregate(item: &str, one: bool) -> Option<(&str, usize, Option<&str>, Option<&str>)> {
    let (call, alias) = match item.trim().rsplit_once(')') {
        Some((call, rest)) => {
            let words: Vec<&str> = rest.split_whitespace().collect();
            match words.as_slice() {
                [] => (call, None),
                [as_, alias] if (*as_ == "AS" || *as_ == "as") && is_identifier(alias) => (call, Some(*alias)),
                _ => return None,
            }
        }
        None => return None,
    };
    let (function, argument) = call.split_once('(')?;
    let function = function.trim();
    Function::parse(function)?;
    let argument = argument.trim();
    if one {
        return match argument {
            "*" if function == "count" => Some((function, LEFT, None, alias)),
            field if is_identifier(field) => Some((function, LEFT, Some(field), alias)),
            _ => None,
        };
    }
    let (side, field) = match argument.split_once('.') {
        Some((side, field)) if is_identifier(field) => (side, Some(field)),
        Some(_) => return None,
        None => (argument, None),
    };
    let input = match side {
        "left" => LEFT,
        "right" => RIGHT,
        _ => return None,
    };
    Some((function, input, field, alias))
}

#[derive(Clone, Debug)]
pub struct CoGroupSpec {
    pub name: String,
    pub window: WindowSpec,
    pub join: JoinType,
    pub aggregates: Vec<Aggregate>,
    /// `key = "FIELD"`: the output position whose value keys the result.
    pub rekey: Option<Vec<usize>>,
    /// A window_aggregate: one input, `join` left.
    pub one: Option<OneInput>,
}

/// What makes a window_aggregate of a cogroup: its results carry no `_kind` (they count as
/// `row`), and its `where` picks the rows it aggregates.
#[derive(Clone, Debug)]
pub struct OneInput {
    pub filter: Option<Expr>,
}

impl CoGroupSpec {
    /// Whether a key-window with these group sizes produces a result.
    fn emits(&self, counts: [u64; 2]) -> bool {
        let [left, right] = counts.map(|n| n > 0);
        match self.join {
            JoinType::Inner => left && right,
            JoinType::Left => left,
            JoinType::Right => right,
            JoinType::Full => left || right,
        }
    }
}

/// The exact sum of floats: non-overlapping partials whose sum is the exact sum of what was
/// added (Shewchuk; Python's `math.fsum`), so the result does not depend on the order of the
/// additions. A sum that overflows, or takes an infinity, is the plain running sum instead.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct ExactSum {
    partials: Vec<f64>,
    plain: f64,
}

impl ExactSum {
    fn add(&mut self, mut x: f64) {
        self.plain += x;
        let mut kept = 0;
        for j in 0..self.partials.len() {
            let mut y = self.partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                self.partials[kept] = lo;
                kept += 1;
            }
            x = hi;
        }
        self.partials.truncate(kept);
        self.partials.push(x);
    }

    fn absorb(&mut self, other: ExactSum) {
        let plain = self.plain + other.plain;
        for x in other.partials {
            self.add(x);
        }
        self.plain = plain;
    }

    /// The correctly rounded sum (round half to even), as `math.fsum` computes it.
    fn value(&self) -> f64 {
        if !self.plain.is_finite() || self.partials.iter().any(|p| !p.is_finite()) {
            return self.plain;
        }
        let p = &self.partials;
        let Some(&last) = p.last() else { return 0.0 };
        let (mut hi, mut lo, mut n) = (last, 0.0, p.len() - 1);
        while n > 0 {
            let x = hi;
            n -= 1;
            let y = p[n];
            hi = x + y;
            lo = y - (hi - x);
            if lo != 0.0 {
                break;
            }
        }
        if n > 0 && ((lo < 0.0 && p[n - 1] < 0.0) || (lo > 0.0 && p[n - 1] > 0.0)) {
            let y = lo * 2.0;
            let x = hi + y;
            if y == x - hi {
                hi = x;
            }
        }
        hi
    }
}

/// Values of one field compared as min/max do: numbers by value, strings by code point, false
/// before true. Values of different types (never in one field) are equal.
fn compare(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Int(a), Value::Int(b)) => a.cmp(b),
        (Value::Float(a), Value::Float(b)) => a.partial_cmp(b).unwrap_or(Ordering::Equal),
        (Value::Str(a), Value::Str(b)) => a.cmp(b),
        (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
        _ => Ordering::Equal,
    }
}

/// The running state of one aggregate over one group.
#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
enum Acc {
    Count(i64),
    SumInt(Option<i128>),
    SumFloat(Option<ExactSum>),
    Min(Option<Value>),
    Max(Option<Value>),
    /// (ts, arrival, value) of the best row so far.
    First(Option<(i64, u64, Value)>),
    Last(Option<(i64, u64, Value)>),
    /// The exact sum of the values (ints as doubles) and their count.
    Avg(ExactSum, i64),
}

impl Acc {
    fn new(a: &Aggregate) -> Acc {
        match a.function {
            Function::Count => Acc::Count(0),
            Function::Sum if a.ty == FieldType::Float => Acc::SumFloat(None),
            Function::Sum => Acc::SumInt(None),
            Function::Min => Acc::Min(None),
            Function::Max => Acc::Max(None),
            Function::First => Acc::First(None),
            Function::Last => Acc::Last(None),
            Function::Avg => Acc::Avg(ExactSum::default(), 0),
        }
    }

    /// Adds one non-null value (`count(side)`: any value) of a row at `ts` that arrived `seq`th.
    fn add(&mut self, value: &Value, ts: i64, seq: u64) {
        let better = |best: &Option<(i64, u64, Value)>, first: bool| {
            best.as_ref().is_none_or(|(t, s, _)| if first { (ts, seq) < (*t, *s) } else { (ts, seq) > (*t, *s) })
        };
        match self {
            Acc::Count(n) => *n += 1,
            Acc::SumInt(sum) => *sum = Some(sum.unwrap_or(0) + i128::from(int(value))),
            Acc::SumFloat(sum) => sum.get_or_insert_default().add(float(value)),
            Acc::Avg(sum, n) => {
                sum.add(float(value));
                *n += 1;
            }
            Acc::Min(best) if best.as_ref().is_none_or(|b| compare(value, b) == Ordering::Less) => {
                *best = Some(value.clone())
            }
            Acc::Max(best) if best.as_ref().is_none_or(|b| compare(value, b) == Ordering::Greater) => {
                *best = Some(value.clone())
            }
            Acc::First(best) if better(best, true) => *best = Some((ts, seq, value.clone())),
            Acc::Last(best) if better(best, false) => *best = Some((ts, seq, value.clone())),
            _ => {}
        }
    }

    fn absorb(&mut self, other: Acc) {
        match (self, other) {
            (Acc::Count(a), Acc::Count(b)) => *a += b,
            (Acc::SumInt(a), Acc::SumInt(Some(b))) => *a = Some(a.unwrap_or(0) + b),
            (Acc::SumFloat(a), Acc::SumFloat(Some(b))) => a.get_or_insert_default().absorb(b),
            (Acc::Avg(a, n), Acc::Avg(b, m)) => {
                a.absorb(b);
                *n += m;
            }
            (me @ (Acc::Min(_) | Acc::Max(_)), Acc::Min(Some(v)) | Acc::Max(Some(v))) => me.add(&v, 0, 0),
            (me @ (Acc::First(_) | Acc::Last(_)), Acc::First(Some((ts, seq, v))) | Acc::Last(Some((ts, seq, v)))) => {
                me.add(&v, ts, seq)
            }
            _ => {}
        }
    }

    fn value(&self) -> Value {
        match self {
            Acc::Count(n) => Value::Int(*n),
            Acc::SumInt(sum) => {
                sum.map_or(Value::Null, |s| Value::Int(s.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64))
            }
            Acc::SumFloat(sum) => sum.as_ref().map_or(Value::Null, |s| Value::Float(s.value())),
            Acc::Avg(_, 0) => Value::Null,
            Acc::Avg(sum, n) => Value::Float(sum.value() / *n as f64),
            Acc::Min(v) | Acc::Max(v) => v.clone().unwrap_or(Value::Null),
            Acc::First(v) | Acc::Last(v) => v.as_ref().map_or(Value::Null, |(_, _, v)| v.clone()),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Acc::SumFloat(Some(sum)) | Acc::Avg(sum, _) => sum.partials.len() * std::mem::size_of::<f64>(),
            Acc::Min(Some(v)) | Acc::Max(Some(v)) | Acc::First(Some((_, _, v))) | Acc::Last(Some((_, _, v))) => {
                v.heap_bytes()
            }
            _ => 0,
        }
    }
}

fn int(value: &Value) -> i64 {
    match value {
        Value::Int(i) => *i,
        _ => 0,
    }
}

fn float(value: &Value) -> f64 {
    match value {
        Value::Float(f) => *f,
        Value::Int(i) => *i as f64,
        _ => 0.0,
    }
}

/// The groups of one key-window: how many rows each side has, and the aggregates.
#[derive(Clone, Debug)]
pub struct Groups {
    counts: [u64; 2],
    /// (input, field position or None for `count(side)`, state), one per aggregate.
    accs: Vec<(usize, Option<usize>, Acc)>,
}

impl Groups {
    fn new(aggregates: &[Aggregate]) -> Groups {
        Groups { counts: [0; 2], accs: aggregates.iter().map(|a| (a.input, a.pos, Acc::new(a))).collect() }
    }
}

impl Contents for Groups {
    type Item = Row;

    fn add(&mut self, input: usize, row: &Row, seq: u64) {
        self.counts[input] += 1;
        for (acc_input, pos, acc) in &mut self.accs {
            if *acc_input != input {
                continue;
            }
            match pos.map(|p| &row.values[p]) {
                None => acc.add(&Value::Null, row.ts, seq),
                Some(Value::Null) => {}
                Some(value) => acc.add(value, row.ts, seq),
            }
        }
    }

    fn absorb(&mut self, other: Groups) {
        self.counts[LEFT] += other.counts[LEFT];
        self.counts[RIGHT] += other.counts[RIGHT];
        for ((_, _, mine), (_, _, theirs)) in self.accs.iter_mut().zip(other.accs) {
            mine.absorb(theirs);
        }
    }

    fn has(&self, input: usize) -> bool {
        self.counts[input] > 0
    }

    /// A window holds no rows, only its accumulators.
    fn rows(&self) -> usize {
        0
    }

    fn bytes(&self) -> usize {
        self.accs.len() * std::mem::size_of::<(usize, Option<usize>, Acc)>()
            + self.accs.iter().map(|(_, _, acc)| acc.bytes()).sum::<usize>()
    }
}

/// Emits the result of a firing key-window.
struct Results {
    spec: CoGroupSpec,
    ids: IdHasher,
}

impl Fire<Groups> for Results {
    fn fire(&mut self, w: &Window<Groups>, out: &mut Output) -> Option<u64> {
        let Results { spec, ids } = self;
        let counts = w.contents.counts;
        if !spec.emits(counts) {
            return None;
        }
        let kind = match counts.map(|n| n > 0) {
            _ if spec.one.is_some() => ResultKind::Row,
            [true, true] => ResultKind::Match,
            [true, false] => ResultKind::LeftOnly,
            _ => ResultKind::RightOnly,
        };
        let id = ids.begin().str(&spec.name).str("group").key(w.key.key_ref());
        let id = id.u64(w.start as u64).u64(w.end as u64).finish();
        let mut values = Vec::with_capacity(w.contents.accs.len() + 6);
        values.extend(w.key.key_ref().parts().map(KeyRef::to_value));
        values.extend(w.contents.accs.iter().map(|(_, _, acc)| acc.value()));
        if spec.one.is_none() {
            values.push(Value::Str(kind.as_str().into()));
        }
        values.extend(w.meta());
        if spec.window.is_session() {
            values.push(Value::IdList(w.supersedes.as_slice().into()));
        }
        let (key, key_hash) = result_key(w.key.key_ref(), w.key_hash, &values, spec.rekey.as_deref());
        out.results.push((kind, Row { ts: w.end - 1, key, key_hash, id, values: values.into() }));
        Some(id)
    }
}

pub struct CoGroup {
    windows: Windows<Groups>,
    results: Results,
}

impl CoGroup {
    pub fn new(spec: CoGroupSpec) -> CoGroup {
        let windows = Windows::new(spec.window, OnMerge::Supersede, Groups::new(&spec.aggregates));
        CoGroup { windows, results: Results { spec, ids: IdHasher::default() } }
    }

    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        if !self.passes(RowView::Heap(&row), out) {
            return;
        }
        let at = RowRef { input, ts: row.ts, key: &row.key, key_hash: row.key_hash };
        if !self.windows.on_row(at, &row, &mut self.results, out) {
            out.late.push((input, row));
        }
    }

    /// [`on_row`](Self::on_row) for a row read in place from a ring frame: only the values its
    /// aggregates read (and the key) are copied out; a late row is copied whole.
    pub fn on_frame(&mut self, input: usize, row: &ArchivedRow, out: &mut Output) {
        if !self.passes(RowView::Archived(row), out) {
            return;
        }
        let aggregates = &self.results.spec.aggregates;
        let read = |pos: usize| aggregates.iter().any(|a| a.input == input && a.pos == Some(pos));
        let values =
            (0..row.values.len()).map(|pos| if read(pos) { to_value(&row.values[pos]) } else { Value::Null }).collect();
        let key = KeyRef::archived(&row.key).to_key();
        let reduced =
            Row { ts: row.ts.to_native(), key, key_hash: row.key_hash.to_native(), id: row.id.to_native(), values };
        let at = RowRef { input, ts: reduced.ts, key: &reduced.key, key_hash: reduced.key_hash };
        if !self.windows.on_row(at, &reduced, &mut self.results, out) {
            out.late.push((input, to_row(row)));
        }
    }

    /// A window aggregate's `where` holds for the row (counted in `out.filtered` when not): it
    /// filters before the windows, so a row it drops is not late either (as SQL's WHERE).
    fn passes(&self, row: RowView<'_>, out: &mut Output) -> bool {
        let Some(OneInput { filter: Some(filter) }) = &self.results.spec.one else { return true };
        let passes = filter.eval_row(row);
        out.filtered += usize::from(!passes);
        passes
    }

    pub fn on_watermark(&mut self, watermark: Time, out: &mut Output) {
        self.windows.on_watermark(watermark, &mut self.results, out);
    }

    /// Every open window, for `evict_oldest` (state/budget.rs), by its `_ts` (end − 1).
    pub fn visit_evictable(&self, visit: &mut dyn FnMut(usize, i64, u64, u64, u64)) {
        self.windows.visit_evictable(visit);
    }

    /// `evict_oldest` takes window `handle`: its would-be result, if not out yet, to
    /// `out.expired` (reason budget). False when it is gone already.
    pub fn evict(&mut self, handle: u64, out: &mut Output) -> bool {
        self.windows.evict(handle, &mut self.results, out)
    }

    /// `ttl` passed since a row last went into a window of the key: its open windows go
    /// ([`Windows::expire_key`]).
    pub fn expire(&mut self, due: crate::state::ttl::Due, out: &mut Output) {
        if let crate::state::ttl::Due::Key { key_hash, .. } = due {
            self.windows.expire_key(key_hash, super::ExpiryReason::Ttl, &mut self.results, out);
        }
    }

    pub fn output_watermark(&self) -> Time {
        self.windows.output_watermark()
    }

    pub fn is_quiescent(&self) -> bool {
        self.windows.is_quiescent()
    }

    /// Rows that left with their last window, matched or not (module doc).
    pub fn quality(&self) -> Quality {
        self.windows.quality()
    }

    /// Key-windows held (each one set of accumulators; no rows are kept).
    pub fn state_rows(&self) -> usize {
        self.windows.windows()
    }

    pub fn state_bytes(&self) -> usize {
        self.windows.state_bytes()
    }
}

/// A window's groups as a snapshot keeps them: the aggregates' states, in `aggregate` order.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct GroupsState {
    counts: [u64; 2],
    accs: Vec<Acc>,
}

/// What a checkpoint keeps of a cogroup (state/snapshot.rs): the windows and their groups.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct CoGroupState {
    windows: WindowsState,
    groups: Vec<GroupsState>,
}

impl CoGroup {
    /// Everything this instance's output depends on: the open windows with their aggregates,
    /// versions, `_supersedes` and firing state, the watermark, the arrival counter (first and
    /// last break ties by it), the join quality so far.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        let (windows, contents) = self.windows.snapshot();
        let groups = contents
            .into_iter()
            .map(|g| GroupsState { counts: g.counts, accs: g.accs.iter().map(|(_, _, acc)| acc.clone()).collect() })
            .collect();
        snapshot::encode(&CoGroupState { windows, groups })
    }

    /// Takes up a [`snapshot`](Self::snapshot); `self` is freshly built from the same spec.
    /// Each window's aggregates must be this spec's, function by function.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let saved: CoGroupState = snapshot::decode(bytes)?;
        let empty = Groups::new(&self.results.spec.aggregates);
        let mut contents = Vec::with_capacity(saved.groups.len());
        for GroupsState { counts, accs } in saved.groups {
            snapshot::expect_len("aggregates", empty.accs.len(), accs.len())?;
            let mut groups = Groups { counts, accs: Vec::with_capacity(accs.len()) };
            for (&(input, pos, ref fresh), acc) in empty.accs.iter().zip(accs) {
                if std::mem::discriminant(fresh) != std::mem::discriminant(&acc) {
                    let found = format!("{acc:?}");
                    return Err(SnapshotError::Mismatch { expected: format!("aggregate {fresh:?}"), found });
                }
                groups.accs.push((input, pos, acc));
            }
            contents.push(groups);
        }
        self.windows.restore(saved.windows, contents)
    }
}

#[cfg(test)]
mod tests;
