//! Temporal join: for each left row, the right row with the same key and the greatest ts ≤
//! left.ts (Flink SQL `FOR SYSTEM_TIME AS OF`); emitted once the watermark passes left.ts.

use crate::config::operators::{Builder, Built, join_type, output_schema, select};
use crate::config::walk::{Errors, Table};
use crate::operator::interval_join::JoinType;

use super::Output;
use crate::record::Row;
use crate::time::Time;

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, _name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let inputs = b.two_inputs(t, true, errors);
    let join = join_type(t, &["inner", "left"], errors)?;
    let (_, fields) = select(t, inputs.as_ref()?, [false, join == JoinType::Left], errors)?;
    let (output, _) = output_schema(t, fields, errors)?;
    Some(Built { inputs: inputs?.map(|i| i.node).to_vec(), output, spec: None })
}

/// Its runtime: not in this build yet (`check` returns no spec, so nothing builds one).
#[derive(Clone, Debug)]
pub struct TemporalJoinSpec;

pub struct TemporalJoin;

impl TemporalJoin {
    pub fn new(_spec: TemporalJoinSpec) -> TemporalJoin {
        TemporalJoin
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
