//! window_aggregate: one group per key per window over one input, aggregated (Flink SQL's window
//! aggregation, `GROUP BY window_start, window_end, key` over a TUMBLE/HOP/SESSION TVF).
//!
//! It is a cogroup of one input, run by [`super::cogroup`]'s machinery — windows, lateness,
//! firing, eviction, accumulators, `_id`s, `_version`s, session merges and `_supersedes`, its
//! snapshot — so the two cannot drift apart. What differs is in this check and in
//! [`OneInput`]:
//!
//! - `input = "STREAM"` instead of `left`/`right`, no `join` (a window with a row emits);
//! - `aggregate` items name plain fields: `count(*)`, `count(f)`, `sum(f)`, `min(f)`, `max(f)`,
//!   `first(f)`, `last(f)`, `avg(f)`; a missing alias is `count` or `fn_f`;
//! - results carry the key, the aggregates, `_window_start`, `_window_end`, `_version` (and for
//!   sessions `_supersedes`), `_id` = H(operator, "group", key, start, end), `_ts` = end − 1; no
//!   `_kind` (the `kind` label of `braid_operator_results_total` is `row`), no join quality;
//! - `where = "temp > 20"`: a condition on the row ([`crate::operator::expr`], fields by plain
//!   name) picks the rows aggregated, before the windows, as SQL's WHERE: a row it drops is
//!   neither aggregated nor late.

use crate::config::operators::{Builder, Built, broadcast_refused};
use crate::config::walk::{Errors, Table, type_name};
use crate::operator::cogroup::{self, CoGroupSpec, OneInput};
use crate::operator::expr::Expr;
use crate::operator::interval_join::JoinType;
use crate::operator::window::{WindowSpec, check_spec};

use super::OperatorSpec;

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let input = b.named_input(t, "input", errors);
    let window = check_spec(t, errors);
    let input = input?;
    let key_fields = input.key_fields().len();
    if key_fields == 0 {
        t.error("input", errors, broadcast_refused(&input.name));
        return None;
    }
    let filter = row_condition(t, &input.schema, errors);
    let inputs = [input];
    let (aggregates, fields) = cogroup::aggregates(t, &inputs, [false; 2], errors)?;
    let spec = CoGroupSpec {
        name: name.to_owned(),
        window: WindowSpec::UNUSED,
        join: JoinType::Left,
        aggregates,
        rekey: None,
        one: Some(OneInput { filter }),
    };
    let (output, spec) = cogroup::with_window(t, spec, window, fields, key_fields, errors)?;
    Some(Built { inputs: vec![inputs[0].node], output, spec: OperatorSpec::WindowAggregate(spec) })
}

/// `where`: an optional condition on the input's row; `None` when absent or in error (reported).
fn row_condition(t: Table<'_, '_>, schema: &crate::record::Schema, errors: &mut Errors) -> Option<Expr> {
    let value = t.get("where")?;
    let Some(text) = value.get_ref().as_str() else {
        t.error("where", errors, format!("expected a condition string, found {}", type_name(value.get_ref())));
        return None;
    };
    Expr::parse_row(text, schema).map_err(|e| t.error("where", errors, format!("bad condition {text:?}: {e}"))).ok()
}

#[cfg(test)]
mod tests;
