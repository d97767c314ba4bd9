//! union: N inputs with the same schema, interleaved; `_stream` names the input of each row.

use crate::config::operators::Input;
use crate::config::operators::{Builder, Built, broadcast_refused, output_schema};
use crate::config::walk::{Errors, Table};
use crate::record::schema::Field;
use crate::record::{FieldType, Schema, TimeSpec};

use super::Output;
use crate::record::Row;
use crate::time::Time;

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, _name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let names = t.required_list("inputs", errors, "a list of stream or operator names")?;
    let inputs: Vec<Option<Input>> = names.iter().map(|(n, span)| b.input(t, "inputs", n, span, errors)).collect();
    let inputs: Vec<Input> = inputs.into_iter().collect::<Option<_>>()?;
    let first = &inputs[0];
    for (input, (_, span)) in inputs.iter().zip(&names) {
        if input.key_field().is_none() {
            errors.at(span, &t.child_path("inputs"), broadcast_refused(&input.name));
            return None;
        }
        let differs: Vec<String> = first
            .schema
            .fields
            .iter()
            .zip(&input.schema.fields)
            .filter(|(a, b)| a.name != b.name || a.ty != b.ty)
            .map(|(a, b)| format!("{} {} vs {} {}", a.name, a.ty, b.name, b.ty))
            .collect();
        if !differs.is_empty()
            || first.schema.fields.len() != input.schema.fields.len()
            || first.schema.key != input.schema.key
        {
            let detail = if differs.is_empty() { "field count or key field".to_owned() } else { differs.join(", ") };
            errors.at(span, &t.child_path("inputs"), format!("{} and {} differ: {detail}", first.name, input.name));
            return None;
        }
    }
    let mut fields: Vec<Field> = first.schema.fields.iter().filter(|f| f.name != "_stream").cloned().collect();
    fields.push(Field { name: "_stream".into(), ty: FieldType::String, nullable: false });
    let key = first.key_field().and_then(|k| fields.iter().position(|f| f.name == k.name));
    let output = match t.get("key") {
        Some(_) => output_schema(t, fields, errors)?.0,
        None => Schema::new(fields, key, TimeSpec::Ingest),
    };
    Some(Built { inputs: inputs.iter().map(|i| i.node).collect(), output, spec: None })
}

/// Its runtime: not in this build yet (`check` returns no spec, so nothing builds one).
#[derive(Clone, Debug)]
pub struct UnionSpec;

pub struct Union;

impl Union {
    pub fn new(_spec: UnionSpec) -> Union {
        Union
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
