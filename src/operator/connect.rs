//! connect: two inputs with shared keyed state and timers; built-ins `threshold` and
//! `reconcile`, and the `CoProcess` trait for custom logic.

use crate::config::operators::{Builder, Built, output_schema, select};
use crate::config::walk::{Errors, Table};

use super::Output;
use crate::record::Row;
use crate::time::Time;

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, _name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let function = t.required_str("function", errors, "threshold or reconcile");
    let threshold = match function {
        Some(("threshold", _)) => true,
        Some(("reconcile", _)) => false,
        Some((_, span)) => {
            errors.at(&span, &t.child_path("function"), "must be threshold or reconcile");
            return None;
        }
        None => return None,
    };
    let inputs = b.two_inputs(t, threshold, errors);
    let misplaced = |key: &str, owner: &str, errors: &mut Errors| {
        if t.get(key).is_some() {
            t.error(key, errors, format!("belongs to function = {owner:?}"));
        }
    };
    if threshold {
        misplaced("timeout", "reconcile", errors);
        if let Some(inputs) = &inputs {
            for (key, input) in [("value", &inputs[0]), ("limit", &inputs[1])] {
                match t.required_str(key, errors, &format!("a field of {}", input.name)) {
                    Some((f, span)) if input.schema.position(f).is_none() => {
                        errors.at(&span, &t.child_path(key), format!("{f:?} is not a field of {}", input.name));
                    }
                    _ => {}
                }
            }
        }
    } else {
        misplaced("value", "threshold", errors);
        misplaced("limit", "threshold", errors);
        if t.get("timeout").is_none() {
            t.missing("timeout", errors, "a duration such as \"5s\"");
        }
        let _ = t.duration_or("timeout", 0, errors);
    }
    let missing = if threshold { [false, false] } else { [true, true] };
    let (_, fields) = select(t, inputs.as_ref()?, missing, errors)?;
    let (output, _) = output_schema(t, fields, errors)?;
    Some(Built { inputs: inputs?.map(|i| i.node).to_vec(), output, spec: None })
}

/// Its runtime: not in this build yet (`check` returns no spec, so nothing builds one).
#[derive(Clone, Debug)]
pub struct ConnectSpec;

pub struct Connect;

impl Connect {
    pub fn new(_spec: ConnectSpec) -> Connect {
        Connect
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
