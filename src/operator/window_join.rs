//! window_join: every pair per key per window, inner; an optional `where` condition.

use crate::config::operators::{Builder, Built, output_schema, select};
use crate::config::walk::{Errors, Table, type_name};
use crate::record::FieldType;
use crate::record::schema::Field;

use super::Output;
use crate::record::Row;
use crate::time::Time;

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, _name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let inputs = b.two_inputs(t, false, errors);
    super::window::check_spec(t, errors);
    let _ = t.duration_or("allowed_lateness", 0, errors);
    if let Some(v) = t.get("where").filter(|v| !v.get_ref().is_str()) {
        t.error("where", errors, format!("expected a condition string, found {}", type_name(v.get_ref())));
    }
    let mut fields = select(t, inputs.as_ref()?, [false, false], errors)?.1;
    let meta = [("_window_start", FieldType::Int), ("_window_end", FieldType::Int), ("_version", FieldType::Int)];
    fields.extend(meta.map(|(name, ty)| Field { name: name.into(), ty, nullable: false }));
    let (output, _) = output_schema(t, fields, errors)?;
    Some(Built { inputs: inputs?.map(|i| i.node).to_vec(), output, spec: None })
}

/// Its runtime: not in this build yet (`check` returns no spec, so nothing builds one).
#[derive(Clone, Debug)]
pub struct WindowJoinSpec;

pub struct WindowJoin;

impl WindowJoin {
    pub fn new(_spec: WindowJoinSpec) -> WindowJoin {
        WindowJoin
    }

    pub fn on_row(&mut self, _input: usize, _row: Row, _out: &mut Output) {}

    pub fn on_watermark(&mut self, _watermark: Time, _out: &mut Output) {}

    pub fn output_watermark(&self) -> Time {
        Time::NEG_INF
    }

    pub fn is_quiescent(&self) -> bool {
        true
    }

    pub fn state_rows(&self) -> usize {
        0
    }

    pub fn state_bytes(&self) -> usize {
        0
    }
}
