//! union: N inputs with the same schema, interleaved; `_stream` names the input of each row
//! (DESIGN.md "Operators", CONTRACT.md rules 5, 7, 9, 10).
//!
//! - A row is late when `ts < watermark` (the operator's: the minimum over its non-idle inputs,
//!   rule 5); late rows go to the late side output and nowhere else.
//! - An on-time row is passed through at once: every field of the schema (an upstream `_stream`
//!   is replaced), then `_stream` = the name of the input it came on; `_ts` = its ts;
//!   `_id` = H(operator, input name, row id), so the same row reaching the union through two
//!   inputs gives two results with two ids.
//! - No state, nothing waits: the output watermark is the watermark (a result's `_ts` is an
//!   on-time row's ts, ≥ the watermark).

use crate::config::operators::Input;
use crate::config::operators::{Builder, Built, broadcast_refused, output_schema};
use crate::config::walk::{Errors, Table};
use crate::record::frame::to_row;
use crate::record::id::IdHasher;
use crate::record::schema::Field;
use crate::record::view::RowView;
use crate::record::{ArchivedRow, FieldType, Row, Schema, TimeSpec, Value};
use crate::state::snapshot::{self, SnapshotError};
use crate::time::Time;

use super::projection::result_key;
use super::{OperatorSpec, Output, ResultKind};

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let names = t.required_list("inputs", errors, "a list of stream or operator names")?;
    let inputs: Vec<Option<Input>> = names.iter().map(|(n, span)| b.input(t, "inputs", n, span, errors)).collect();
    let inputs: Vec<Input> = inputs.into_iter().collect::<Option<_>>()?;
    let first = &inputs[0];
    for (input, (_, span)) in inputs.iter().zip(&names) {
        if input.is_broadcast() {
            errors.at(span, &t.child_path("inputs"), broadcast_refused(&input.name));
            return None;
        }
        if let Some(detail) = schema_difference(first, input) {
            errors.at(span, &t.child_path("inputs"), format!("{} and {} differ: {detail}", first.name, input.name));
            return None;
        }
    }
    // The fields of a result: the first input's (but an upstream `_stream`), then `_stream`; a
    // field is nullable when it is on any input (operator outputs of outer joins). Inputs may
    // declare the same fields in another order: each has its own positions.
    let names_kept: Vec<&Field> = first.schema.fields.iter().filter(|f| f.name != "_stream").collect();
    let keep: Vec<Vec<usize>> =
        inputs.iter().map(|input| names_kept.iter().filter_map(|f| input.schema.position(&f.name)).collect()).collect();
    let mut fields: Vec<Field> = names_kept
        .iter()
        .enumerate()
        .map(|(i, f)| Field {
            nullable: inputs.iter().zip(&keep).any(|(input, k)| input.schema.fields[k[i]].nullable),
            ..(*f).clone()
        })
        .collect();
    fields.push(Field { name: "_stream".into(), ty: FieldType::String, nullable: false });
    let key: Vec<usize> = first.key_fields().filter_map(|k| fields.iter().position(|f| f.name == k.name)).collect();
    let (output, rekey) = match t.get("key") {
        Some(_) => output_schema(t, fields, 0, errors)?,
        None => (Schema::new(fields, key, TimeSpec::Ingest), None),
    };
    let spec =
        UnionSpec { name: name.to_owned(), inputs: inputs.iter().map(|i| i.name.clone()).collect(), keep, rekey };
    Some(Built { inputs: inputs.iter().map(|i| i.node).collect(), output, spec: OperatorSpec::Union(spec) })
}

/// How `input`'s schema differs from `first`'s (fields by name and type, the key field by name);
/// `None` when they are the same schema, whatever the order of their fields.
fn schema_difference(first: &Input, input: &Input) -> Option<String> {
    let mut differs: Vec<String> = vec![];
    for f in &first.schema.fields {
        match input.schema.position(&f.name) {
            None => differs.push(format!("{} has no field {}", input.name, f.name)),
            Some(p) if input.schema.fields[p].ty != f.ty => {
                differs.push(format!("{} is {} vs {}", f.name, f.ty, input.schema.fields[p].ty))
            }
            Some(_) => {}
        }
    }
    for f in input.schema.fields.iter().filter(|f| first.schema.position(&f.name).is_none()) {
        differs.push(format!("{} has no field {}", first.name, f.name));
    }
    let key = |i: &Input| i.key_fields().map(|f| f.name.clone()).collect::<Vec<_>>();
    if differs.is_empty() && key(first) != key(input) {
        differs.push(format!("key field {:?} vs {:?}", key(first), key(input)));
    }
    (!differs.is_empty()).then(|| differs.join(", "))
}

#[derive(Clone, Debug)]
pub struct UnionSpec {
    pub name: String,
    /// The names of the inputs, by input index: each result's `_stream`.
    pub inputs: Vec<String>,
    /// Per input, the positions a result copies, in output order (every field but an upstream
    /// `_stream`).
    pub keep: Vec<Vec<usize>>,
    /// `key = "FIELD"` or a list: the output positions whose values key the result.
    pub rekey: Option<Vec<usize>>,
}

pub struct Union {
    spec: UnionSpec,
    watermark: Time,
    ids: IdHasher,
}

impl Union {
    pub fn new(spec: UnionSpec) -> Union {
        Union { spec, watermark: Time::NEG_INF, ids: IdHasher::default() }
    }

    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        if self.watermark.is_past(row.ts) {
            out.late.push((input, row));
            return;
        }
        self.pass(input, RowView::Heap(&row), out);
    }

    /// [`on_row`](Self::on_row) for a row read in place from a ring frame: only the kept values
    /// are copied out.
    pub fn on_frame(&mut self, input: usize, row: &ArchivedRow, out: &mut Output) {
        if self.watermark.is_past(row.ts.to_native()) {
            out.late.push((input, to_row(row)));
            return;
        }
        self.pass(input, RowView::Archived(row), out);
    }

    fn pass(&mut self, input: usize, row: RowView<'_>, out: &mut Output) {
        let stream = &self.spec.inputs[input];
        let id = self.ids.begin().str(&self.spec.name).str(stream).u64(row.id()).finish();
        let values: Box<[Value]> = self.spec.keep[input]
            .iter()
            .map(|&pos| row.value(pos))
            .chain(std::iter::once(Value::Str(stream.as_str().into())))
            .collect();
        let (key, key_hash) = result_key(row.key(), row.key_hash(), &values, self.spec.rekey.as_deref());
        out.results.push((ResultKind::Row, Row { ts: row.ts(), key, key_hash, id, values }));
    }

    pub fn on_watermark(&mut self, watermark: Time, _out: &mut Output) {
        self.watermark = watermark;
    }

    pub fn output_watermark(&self) -> Time {
        self.watermark
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

/// What a checkpoint keeps of a union: its watermark (nothing waits in it).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct UnionState {
    watermark: Time,
}

impl Union {
    /// Everything this instance's output depends on (state/snapshot.rs).
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        snapshot::encode(&UnionState { watermark: self.watermark })
    }

    /// Takes up a [`snapshot`](Self::snapshot); `self` is freshly built from the same spec.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let saved: UnionState = snapshot::decode(bytes)?;
        self.watermark = saved.watermark;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Key, id};

    fn union() -> Union {
        let spec = UnionSpec {
            name: "u".into(),
            inputs: vec!["a".into(), "b".into()],
            keep: vec![vec![0, 2]; 2],
            rekey: None,
        };
        Union::new(spec)
    }

    fn row(ts: i64, id: u64) -> Row {
        let values = Box::new([Value::Str("d".into()), Value::Str("upstream".into()), Value::Int(ts)]);
        Row { ts, key: Key::Str("d".into()), key_hash: 9, id, values }
    }

    #[test]
    fn rows_pass_through_with_their_input_name() {
        let mut u = union();
        let mut out = Output::default();
        u.on_row(1, row(1000, 7), &mut out);
        let (kind, r) = &out.results[0];
        assert_eq!(*kind, ResultKind::Row);
        assert_eq!((r.ts, &r.key, r.key_hash), (1000, &Key::Str("d".into()), 9));
        assert_eq!(*r.values, [Value::Str("d".into()), Value::Int(1000), Value::Str("b".into())]);
    }

    #[test]
    fn ids_depend_on_the_input_and_the_row() {
        let mut u = union();
        let mut out = Output::default();
        u.on_row(0, row(1000, 7), &mut out);
        u.on_row(1, row(1000, 7), &mut out);
        u.on_row(0, row(1000, 8), &mut out);
        u.on_row(0, row(1000, 7), &mut out);
        let ids: Vec<u64> = out.results.iter().map(|(_, r)| r.id).collect();
        assert_ne!(ids[0], ids[1]);
        assert_ne!(ids[0], ids[2]);
        assert_eq!(ids[0], ids[3], "a redelivered row repeats its id");
    }

    #[test]
    fn late_is_strictly_below_the_watermark() {
        let mut u = union();
        let mut out = Output::default();
        u.on_watermark(Time::ms(1000), &mut out);
        u.on_row(0, row(1000, 1), &mut out);
        u.on_row(1, row(999, 2), &mut out);
        assert_eq!(out.results.len(), 1);
        assert_eq!(out.late.len(), 1);
        assert_eq!(out.late[0].0, 1);
        assert_eq!(u.output_watermark(), Time::ms(1000));
        assert!(u.is_quiescent());
    }

    #[test]
    fn each_input_has_its_own_field_positions() {
        let keep = vec![vec![0, 2], vec![2, 0]];
        let mut u = Union::new(UnionSpec { name: "u".into(), inputs: vec!["a".into(), "b".into()], keep, rekey: None });
        let mut out = Output::default();
        u.on_row(1, row(1000, 7), &mut out);
        assert_eq!(*out.results[0].1.values, [Value::Int(1000), Value::Str("d".into()), Value::Str("b".into())]);
    }

    #[test]
    fn rekeying_takes_the_output_value() {
        let spec =
            UnionSpec { name: "u".into(), inputs: vec!["a".into()], keep: vec![vec![0, 2]], rekey: Some(vec![1]) };
        let mut u = Union::new(spec);
        let mut out = Output::default();
        u.on_row(0, row(5, 1), &mut out);
        let r = &out.results[0].1;
        assert_eq!(r.key, Key::Int(5));
        assert_eq!(r.key_hash, id::key_hash(&Key::Int(5)));
    }
}
