//! `select`: how a result's values are built from the rows it joins (CONTRACT.md rule 9).
//!
//! A result holds, by position: the key under the left input's key field name (a composite key:
//! each of its fields under its name), the selected fields in `select` order, then `_kind`. A selected key field of either side holds the key on
//! every result, outer rows included; any other field of a missing side is null, and so is
//! every field a computed item reads of it. With
//! `key = "FIELD"` (or a list of fields) the result is re-keyed by its own values.

use std::sync::Arc;

use crate::record::archiver::RowArchives;
use crate::record::view::{KeyRef, RowView, ValueRef};
use crate::record::{FieldType, Key, Row, Value, id};

use super::expr::Expr;
use super::{ArchivedResults, ResultKind};

/// Where one output value comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Column {
    /// The key's field number `n` (0 for a one-field key).
    Key(usize),
    Field {
        input: usize,
        pos: usize,
    },
    /// A computed `select` item (`"left.amount * right.rate AS value"`), of type `ty`.
    Computed {
        expr: Arc<Expr>,
        ty: FieldType,
    },
    Kind,
}

impl Column {
    /// The value of this column for a result of `rows` (a missing side reads null).
    pub fn value(&self, key: KeyRef<'_>, rows: [Option<RowView<'_>>; 2], kind: ResultKind) -> Value {
        match self {
            Column::Key(part) => key.part(*part),
            Column::Field { input, pos } => rows[*input].map_or(Value::Null, |row| row.value(*pos)),
            Column::Computed { expr, ty } => expr.compute(*ty, rows[0], rows[1]),
            Column::Kind => Value::Str(kind.as_str().into()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Projection {
    pub columns: Vec<Column>,
    /// `key = "FIELD"` or `key = ["F", "G"]`: the output positions whose values key the result;
    /// `None` keeps the input key.
    pub rekey: Option<Vec<usize>>,
}

impl Projection {
    /// The result's key, its key hash and its values.
    pub fn project(
        &self,
        key: &Key,
        key_hash: u64,
        rows: [Option<&Row>; 2],
        kind: ResultKind,
    ) -> (Key, u64, Box<[Value]>) {
        self.project_views(key.key_ref(), key_hash, rows.map(|r| r.map(RowView::Heap)), kind)
    }

    /// [`project`](Self::project) from rows read in place (a ring frame's, an arena's).
    pub fn project_views(
        &self,
        key: KeyRef<'_>,
        key_hash: u64,
        rows: [Option<RowView<'_>>; 2],
        kind: ResultKind,
    ) -> (Key, u64, Box<[Value]>) {
        let values: Box<[Value]> = self.columns.iter().map(|column| column.value(key, rows, kind)).collect();
        let (key, key_hash) = result_key(key, key_hash, &values, self.rekey.as_deref());
        (key, key_hash, values)
    }

    /// [`project_views`](Self::project_views) written straight into a result's archive, with
    /// its event time and id: selected values are copied from the rows as they lie (a frame's,
    /// an arena's), no heap row is built. The bytes are those of the projected row encoded.
    #[allow(clippy::too_many_arguments)]
    pub fn archive(
        &self,
        out: &mut ArchivedResults,
        ts: i64,
        id: u64,
        key: KeyRef<'_>,
        key_hash: u64,
        rows: [Option<RowView<'_>>; 2],
        kind: ResultKind,
    ) {
        if self.rekey.is_some() {
            return self.archive_rekeyed(out, ts, id, key, key_hash, rows, kind);
        }
        out.rows.begin(key);
        for column in &self.columns {
            // One call writes whatever the column holds (`value` is inlined here once). A computed
            // item is evaluated and written out of line: its value, and dropping it, then hold
            // none of this loop's registers.
            let value = match column {
                Column::Key(part) => key_part(key, *part),
                Column::Field { input, pos } => rows[*input].map_or(ValueRef::Null, |row| row.value_ref(*pos)),
                Column::Computed { expr, ty } => {
                    write_computed(&mut out.rows, expr, *ty, rows);
                    continue;
                }
                Column::Kind => ValueRef::Str(kind.as_str()),
            };
            out.rows.value(value);
        }
        out.rows.end(ts, key_hash, id);
        out.ended(kind);
    }

    /// [`archive`](Self::archive) of a result re-keyed by its own values: they are built first.
    /// Not the hot path, so kept out of `archive`'s frame.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn archive_rekeyed(
        &self,
        out: &mut ArchivedResults,
        ts: i64,
        id: u64,
        key: KeyRef<'_>,
        key_hash: u64,
        rows: [Option<RowView<'_>>; 2],
        kind: ResultKind,
    ) {
        let (key, key_hash, values) = self.project_views(key, key_hash, rows, kind);
        out.rows.begin(key.key_ref());
        values.iter().for_each(|v| out.rows.value(ValueRef::of(v)));
        out.rows.end(ts, key_hash, id);
        out.ended(kind);
    }
}

/// A computed item's value for `rows`, written as the next value of the row `out` is writing.
#[inline(never)]
fn write_computed(out: &mut RowArchives, expr: &Expr, ty: FieldType, rows: [Option<RowView<'_>>; 2]) {
    let value = expr.compute(ty, rows[0], rows[1]);
    out.value(ValueRef::of(&value));
}

/// The value of the key's field number `part`, borrowed ([`KeyRef::part`]).
fn key_part(key: KeyRef<'_>, part: usize) -> ValueRef<'_> {
    match key {
        KeyRef::Composite(_) => key.parts().nth(part).map_or(ValueRef::Null, ValueRef::of_key),
        one if part == 0 => ValueRef::of_key(one),
        _ => ValueRef::Null,
    }
}

/// The key of a result with `values`: the key it came with, or with `key = …` the values at the
/// re-key positions `rekey` (CONTRACT.md "Configuration": an operator's output is keyed by its
/// input's key). Every operator keys its results here.
pub fn result_key(key: KeyRef<'_>, key_hash: u64, values: &[Value], rekey: Option<&[usize]>) -> (Key, u64) {
    match rekey.and_then(|positions| Key::from_values(values, positions)) {
        Some(new_key) => {
            let hash = id::key_hash(&new_key);
            (new_key, hash)
        }
        None => (key.to_key(), key_hash),
    }
}

#[cfg(test)]
impl Projection {
    /// What operator unit tests select: the key, the first value of each side, `_kind`.
    pub fn key_and_first_values() -> Projection {
        use crate::operator::interval_join::{LEFT, RIGHT};
        let columns = vec![
            Column::Key(0),
            Column::Field { input: LEFT, pos: 0 },
            Column::Field { input: RIGHT, pos: 0 },
            Column::Kind,
        ];
        Projection { columns, rekey: None }
    }
}
