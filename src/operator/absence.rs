//! absence: a key seen and then silent for `timeout` of event time emits `absent`, and
//! `present` when it returns.

use crate::config::operators::{Builder, Built, broadcast_refused, output_schema};
use crate::config::walk::{Errors, Table};
use crate::record::FieldType;
use crate::record::schema::Field;

use super::Output;
use crate::record::Row;
use crate::time::Time;

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, _name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let input = b.named_input(t, "input", errors);
    if t.get("timeout").is_none() {
        t.missing("timeout", errors, "a duration such as \"30s\"");
    } else if t.duration("timeout", errors).is_some_and(|ms| ms <= 0) {
        t.error("timeout", errors, "must be positive");
    }
    let input = input?;
    let Some(key) = input.key_field().cloned() else {
        t.error("input", errors, broadcast_refused(&input.name));
        return None;
    };
    let fields = vec![key, Field { name: "_kind".into(), ty: FieldType::String, nullable: false }];
    let (output, _) = output_schema(t, fields, errors)?;
    Some(Built { inputs: vec![input.node], output, spec: None })
}
/// Its runtime: not in this build yet (`check` returns no spec, so nothing builds one).
#[derive(Clone, Debug)]
pub struct AbsenceSpec;

pub struct Absence;

impl Absence {
    pub fn new(_spec: AbsenceSpec) -> Absence {
        Absence
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
