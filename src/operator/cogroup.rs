//! cogroup: both groups per key per window (either may be empty), aggregated per side.

use crate::config::RESERVED_FIELDS;
use crate::config::operators::{Builder, Built, Input, is_identifier, join_type, output_schema};
use crate::config::walk::{Errors, Table};
use crate::operator::interval_join::{LEFT, RIGHT};
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
    let join = join_type(t, &["inner", "left", "right", "full"], errors)?;
    let mut fields =
        aggregates(t, inputs.as_ref()?, [join.keeps_unmatched(RIGHT), join.keeps_unmatched(LEFT)], errors)?;
    let meta = [("_window_start", FieldType::Int), ("_window_end", FieldType::Int), ("_version", FieldType::Int)];
    fields.extend(meta.map(|(name, ty)| Field { name: name.into(), ty, nullable: false }));
    let (output, _) = output_schema(t, fields, errors)?;
    Some(Built { inputs: inputs?.map(|i| i.node).to_vec(), output, spec: None })
}

/// `aggregate`: `fn(left|right[.field]) [AS alias]` with fn in count, sum, min, max, first, last.
pub fn aggregates(
    t: Table<'_, '_>,
    inputs: &[Input; 2],
    can_be_empty: [bool; 2],
    errors: &mut Errors,
) -> Option<Vec<Field>> {
    let path = t.child_path("aggregate");
    let what = "a list like [\"count(left) AS n\", \"sum(right.x) AS total\"]";
    let items = t.required_list("aggregate", errors, what)?;
    let key = inputs[LEFT].key_field()?.clone();
    let mut fields = vec![Field { nullable: false, ..key }];
    let before = errors.count();
    for (item, span) in items {
        let Some((function, input, field, alias)) = parse_aggregate(item) else {
            errors.at(&span, &path, format!("bad aggregate {item:?} (want e.g. \"sum(right.amount) AS total\")"));
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
                Some(pos) => Some(&schema.fields[pos]),
                None => {
                    errors.at(&span, &path, format!("{item:?}: {} has no field {f:?}", inputs[input].name));
                    continue;
                }
            },
        };
        if function == "sum" && source.is_some_and(|f| !matches!(f.ty, FieldType::Int | FieldType::Float)) {
            errors.at(&span, &path, format!("{item:?}: sum() needs an int or float field"));
            continue;
        }
        let side = if input == LEFT { "left" } else { "right" };
        let alias = alias.map_or_else(
            || format!("{function}_{side}{}", field.map_or(String::new(), |f| format!("_{f}"))),
            str::to_owned,
        );
        if RESERVED_FIELDS.contains(&alias.as_str()) || fields.iter().any(|f| f.name == alias) {
            errors.at(&span, &path, format!("{item:?}: output name {alias:?} is taken"));
            continue;
        }
        let (ty, nullable) = match source {
            None => (FieldType::Int, false),
            Some(_) if function == "count" => (FieldType::Int, false),
            Some(f) => (f.ty, can_be_empty[input] || f.nullable),
        };
        fields.push(Field { name: alias, ty, nullable });
    }
    fields.push(Field { name: "_kind".into(), ty: FieldType::String, nullable: false });
    (errors.count() == before).then_some(fields)
}

fn parse_aggregate(item: &str) -> Option<(&str, usize, Option<&str>, Option<&str>)> {
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
    if !["count", "sum", "min", "max", "first", "last"].contains(&function) {
        return None;
    }
    let argument = argument.trim();
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

/// Its runtime: not in this build yet (`check` returns no spec, so nothing builds one).
#[derive(Clone, Debug)]
pub struct CoGroupSpec;

pub struct CoGroup;

impl CoGroup {
    pub fn new(_spec: CoGroupSpec) -> CoGroup {
        CoGroup
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregate_items() {
        assert_eq!(parse_aggregate("count(left) AS views"), Some(("count", LEFT, None, Some("views"))));
        assert_eq!(parse_aggregate("sum(right.amount)"), Some(("sum", RIGHT, Some("amount"), None)));
        assert_eq!(parse_aggregate("avg(right.amount)"), None);
        assert_eq!(parse_aggregate("count(up)"), None);
    }
}
