//! `select`: how a result's values are built from the rows it joins (CONTRACT.md rule 9).
//!
//! A result holds, by position: the key under the left input's key field name, the selected
//! fields in `select` order, then `_kind`. A selected key field of either side holds the key on
//! every result, outer rows included; any other field of a missing side is null, and so is
//! every field a computed item reads of it. With
//! `key = "FIELD"` the result is re-keyed by one of its own values.

use std::sync::Arc;

use crate::record::view::{KeyRef, RowView};
use crate::record::{FieldType, Key, Row, Value, id};

use super::ResultKind;
use super::expr::Expr;

/// Where one output value comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Column {
    Key,
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
            Column::Key => key.to_value(),
            Column::Field { input, pos } => rows[*input].map_or(Value::Null, |row| row.value(*pos)),
            Column::Computed { expr, ty } => expr.compute(*ty, rows[0], rows[1]),
            Column::Kind => Value::Str(kind.as_str().into()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Projection {
    pub columns: Vec<Column>,
    /// `key = "FIELD"`: the output position whose value keys the result; `None` keeps the input key.
    pub rekey: Option<usize>,
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
        match self.rekey.and_then(|pos| Key::from_value(&values[pos])) {
            Some(new_key) => {
                let hash = id::key_hash(&new_key);
                (new_key, hash, values)
            }
            None => (key.to_key(), key_hash, values),
        }
    }
}

#[cfg(test)]
impl Projection {
    /// What operator unit tests select: the key, the first value of each side, `_kind`.
    pub fn key_and_first_values() -> Projection {
        use crate::operator::interval_join::{LEFT, RIGHT};
        let columns = vec![
            Column::Key,
            Column::Field { input: LEFT, pos: 0 },
            Column::Field { input: RIGHT, pos: 0 },
            Column::Kind,
        ];
        Projection { columns, rekey: None }
    }
}
