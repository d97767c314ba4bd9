//! `[operators.NAME]`: every kind is parsed and checked, inputs resolved (upstream first, cycles
//! refused) and output schemas derived, so chains validate end to end. Kinds this build cannot
//! run are refused with "not available in this build" after all their other checks.

use std::collections::HashMap;
use std::ops::Range;

use toml::de::DeValue;

use super::streams::{Streams, bad_name};
use super::walk::{Errors, Table, type_name};
use super::{NodeRef, OperatorDef, RESERVED_FIELDS};
use crate::operator::interval_join::{JoinType, LEFT, RIGHT};
use crate::operator::projection::Column;
use crate::operator::{IntervalJoinSpec, OperatorSpec, Projection};
use crate::record::schema::Field;
use crate::record::{FieldType, Schema, TimeSpec};

/// The checked operators, upstream first.
pub struct Graph {
    pub operators: Vec<OperatorDef>,
    /// Every declared operator name with its output schema when it checked out.
    pub outputs: HashMap<String, Option<Schema>>,
}

const KINDS: [&str; 7] = ["union", "connect", "window_join", "cogroup", "interval_join", "temporal_join", "absence"];
const BUILT_KINDS: [&str; 1] = ["interval_join"];

fn allowed_keys(kind: &str) -> &'static [&'static str] {
    match kind {
        "union" => &["kind", "inputs", "key"],
        "interval_join" => {
            &["kind", "left", "right", "lower", "upper", "lower_exclusive", "upper_exclusive", "join", "select", "key"]
        }
        "window_join" => &["kind", "left", "right", "window", "allowed_lateness", "where", "select", "key"],
        "cogroup" => &["kind", "left", "right", "window", "allowed_lateness", "join", "aggregate", "key"],
        "temporal_join" => &["kind", "left", "right", "join", "select", "key"],
        "connect" => &["kind", "function", "left", "right", "value", "limit", "timeout", "select", "key"],
        _ => &["kind", "input", "timeout", "key"],
    }
}

/// An input as an operator sees it.
#[derive(Clone)]
struct Input {
    node: NodeRef,
    name: String,
    schema: Schema,
}

impl Input {
    fn key_field(&self) -> Option<&Field> {
        self.schema.key_field()
    }
}

enum Status {
    Building,
    Broken,
    Built(usize),
}

struct Checked {
    name: String,
    inputs: Vec<NodeRef>,
    output: Schema,
    spec: Option<OperatorSpec>,
}

struct Builder<'s, 'a, 'i> {
    section: Table<'a, 'i>,
    streams: &'s Streams,
    status: HashMap<String, Status>,
    checked: Vec<Checked>,
}

pub fn operators(section: Table<'_, '_>, streams: &Streams, errors: &mut Errors) -> Graph {
    let mut builder = Builder { section, streams, status: HashMap::new(), checked: Vec::new() };
    for (name, span, _) in section.entries() {
        if let Some(problem) = bad_name(name) {
            errors.at(&span, &section.child_path(name), problem);
        }
        if streams.defs.iter().any(|s| s.name == name) || streams.broken.iter().any(|s| s == name) {
            errors.at(&span, &section.child_path(name), format!("name {name:?} is already used by a stream"));
            builder.status.insert(name.to_owned(), Status::Broken);
        }
    }
    for (name, _, _) in section.entries() {
        builder.build(name, errors);
    }
    let outputs = section
        .entries()
        .map(|(name, _, _)| {
            let schema = match builder.status.get(name) {
                Some(Status::Built(i)) => Some(builder.checked[*i].output.clone()),
                _ => None,
            };
            (name.to_owned(), schema)
        })
        .collect();
    let operators = builder
        .checked
        .into_iter()
        .filter_map(|c| Some(OperatorDef { spec: c.spec?, name: c.name, inputs: c.inputs, output: c.output }))
        .collect();
    Graph { operators, outputs }
}

impl<'a, 'i> Builder<'_, 'a, 'i> {
    /// Checks operator `name` (and, first, the operators it reads); its index when it checked out.
    fn build(&mut self, name: &str, errors: &mut Errors) -> Option<usize> {
        match self.status.get(name) {
            Some(Status::Built(i)) => return Some(*i),
            Some(Status::Broken) => return None,
            Some(Status::Building) => return None,
            None => {}
        }
        let (_, name_span, value) = self.section.entries().find(|(n, _, _)| *n == name)?;
        let path = self.section.child_path(name);
        let DeValue::Table(table) = value.get_ref() else {
            errors.at(&name_span, &path, format!("expected a table, found {}", type_name(value.get_ref())));
            self.status.insert(name.to_owned(), Status::Broken);
            return None;
        };
        self.status.insert(name.to_owned(), Status::Building);
        let t = Table { path: &path, span: &name_span, table };
        // An operator whose output schema could be derived stays referable whatever else is
        // wrong with it, so the operators reading it are checked too.
        match self.check(name, t, errors) {
            Some(c) => {
                self.checked.push(c);
                let i = self.checked.len() - 1;
                self.status.insert(name.to_owned(), Status::Built(i));
                Some(i)
            }
            _ => {
                self.status.insert(name.to_owned(), Status::Broken);
                None
            }
        }
    }

    /// Resolves a stream or operator name; `None` when it is unknown (error) or broken (no error:
    /// it has its own).
    fn input(
        &mut self,
        t: Table<'_, '_>,
        key: &str,
        name: &str,
        span: &Range<usize>,
        errors: &mut Errors,
    ) -> Option<Input> {
        let path = t.child_path(key);
        if let Some(i) = self.streams.defs.iter().position(|s| s.name == name) {
            let schema = self.streams.defs[i].schema.clone();
            return Some(Input { node: NodeRef::Stream(i), name: name.to_owned(), schema });
        }
        if self.streams.broken.iter().any(|s| s == name) {
            return None;
        }
        if self.section.get(name).is_none() {
            errors.at(span, &path, format!("unknown stream or operator {name:?}"));
            return None;
        }
        if matches!(self.status.get(name), Some(Status::Building)) {
            errors.at(span, &path, format!("operators form a cycle through {name:?}"));
            return None;
        }
        let i = self.build(name, errors)?;
        let schema = self.checked[i].output.clone();
        Some(Input { node: NodeRef::Operator(i), name: name.to_owned(), schema })
    }

    fn named_input(&mut self, t: Table<'_, '_>, key: &str, errors: &mut Errors) -> Option<Input> {
        let (name, span) = t.required_str(key, errors, "the name of a stream or operator")?;
        self.input(t, key, name, &span, errors)
    }

    fn check(&mut self, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Checked> {
        let (kind, kind_span) = t.required_str("kind", errors, &format!("one of {}", KINDS.join(", ")))?;
        if !KINDS.contains(&kind) {
            errors.at(&kind_span, &t.child_path("kind"), format!("must be one of {}", KINDS.join(", ")));
            return None;
        }
        t.check_keys(allowed_keys(kind), errors);
        let checked = match kind {
            "interval_join" => self.interval_join(name, t, errors),
            "window_join" | "cogroup" => self.windowed(kind, t, errors),
            "temporal_join" => self.temporal_join(t, errors),
            "connect" => self.connect(t, errors),
            "union" => self.union(t, errors),
            _ => self.absence(t, errors),
        };
        if !BUILT_KINDS.contains(&kind) {
            errors.at(
                &kind_span,
                &t.child_path("kind"),
                format!("kind {kind:?} is not available in this build (it runs: {})", BUILT_KINDS.join(", ")),
            );
        }
        checked.map(|(inputs, output, spec)| Checked { name: name.to_owned(), inputs, output, spec })
    }

    /// `left` and `right`: keyed alike (string vs int keys never match), broadcast only where
    /// allowed.
    fn two_inputs(&mut self, t: Table<'_, '_>, broadcast_right: bool, errors: &mut Errors) -> Option<[Input; 2]> {
        let left = self.named_input(t, "left", errors);
        let right = self.named_input(t, "right", errors);
        let (left, right) = (left?, right?);
        if left.key_field().is_none() {
            t.error("left", errors, broadcast_refused(&left.name));
            return None;
        }
        if right.key_field().is_none() && !broadcast_right {
            t.error("right", errors, broadcast_refused(&right.name));
        }
        if let (Some(lk), Some(rk)) = (left.key_field(), right.key_field())
            && lk.ty != rk.ty
        {
            let message = format!(
                "key type mismatch: left {}.{} is {}, right {}.{} is {} (string and int keys never match)",
                left.name, lk.name, lk.ty, right.name, rk.name, rk.ty
            );
            t.error("right", errors, message);
        }
        // A key type mismatch or a refused broadcast on the right is reported; the rest of the
        // operator (select, output schema) is still checked against these inputs.
        Some([left, right])
    }

    fn interval_join(&mut self, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
        let inputs = self.two_inputs(t, false, errors);
        let required = |key: &str, errors: &mut Errors| {
            if t.get(key).is_none() {
                t.missing(key, errors, "a duration such as \"-3s\" or \"500ms\"");
            }
            t.duration(key, errors)
        };
        let lower = required("lower", errors);
        let upper = required("upper", errors);
        let lower_exclusive = t.bool("lower_exclusive", false, errors);
        let upper_exclusive = t.bool("upper_exclusive", false, errors);
        let join = join_type(t, &["inner", "left", "right", "full"], errors);
        let (lower, upper) = (lower? + i64::from(lower_exclusive), upper? - i64::from(upper_exclusive));
        if lower > upper {
            let message = format!(
                "the bounds leave no room: lower' = {lower} ms > upper' = {upper} ms (after the exclusive flags)"
            );
            t.error("lower", errors, message);
        }
        let inputs = inputs?;
        let join = join?;
        let missing = [join.keeps_unmatched(RIGHT), join.keeps_unmatched(LEFT)];
        let (columns, fields) = select(t, &inputs, missing, errors)?;
        let (output, rekey) = output_schema(t, fields, errors)?;
        let projection = Projection { columns, rekey };
        let spec = IntervalJoinSpec { name: name.to_owned(), lower, upper, join, projection };
        Some((inputs.map(|i| i.node).to_vec(), output, Some(OperatorSpec::IntervalJoin(spec))))
    }

    fn windowed(&mut self, kind: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
        let inputs = self.two_inputs(t, false, errors);
        window(t, errors);
        let _ = t.duration_or("allowed_lateness", 0, errors);
        let fields = if kind == "window_join" {
            if let Some(v) = t.get("where").filter(|v| !v.get_ref().is_str()) {
                t.error("where", errors, format!("expected a condition string, found {}", type_name(v.get_ref())));
            }
            select(t, inputs.as_ref()?, [false, false], errors)?.1
        } else {
            let join = join_type(t, &["inner", "left", "right", "full"], errors)?;
            aggregates(t, inputs.as_ref()?, [join.keeps_unmatched(RIGHT), join.keeps_unmatched(LEFT)], errors)?
        };
        let mut fields = fields;
        let meta = [("_window_start", FieldType::Int), ("_window_end", FieldType::Int), ("_version", FieldType::Int)];
        fields.extend(meta.map(|(name, ty)| Field { name: name.into(), ty, nullable: false }));
        let (output, _) = output_schema(t, fields, errors)?;
        Some((inputs?.map(|i| i.node).to_vec(), output, None))
    }

    fn temporal_join(&mut self, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
        let inputs = self.two_inputs(t, true, errors);
        let join = join_type(t, &["inner", "left"], errors)?;
        let (_, fields) = select(t, inputs.as_ref()?, [false, join == JoinType::Left], errors)?;
        let (output, _) = output_schema(t, fields, errors)?;
        Some((inputs?.map(|i| i.node).to_vec(), output, None))
    }

    fn connect(&mut self, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
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
        let inputs = self.two_inputs(t, threshold, errors);
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
        Some((inputs?.map(|i| i.node).to_vec(), output, None))
    }

    fn union(&mut self, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
        let names = t.required_list("inputs", errors, "a list of stream or operator names")?;
        let inputs: Vec<Option<Input>> =
            names.iter().map(|(n, span)| self.input(t, "inputs", n, span, errors)).collect();
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
                let detail =
                    if differs.is_empty() { "field count or key field".to_owned() } else { differs.join(", ") };
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
        Some((inputs.iter().map(|i| i.node).collect(), output, None))
    }

    fn absence(&mut self, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
        let input = self.named_input(t, "input", errors);
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
        Some((vec![input.node], output, None))
    }
}

/// (inputs, output schema, runnable spec — `None` for kinds this build does not run).
type Built = (Vec<NodeRef>, Schema, Option<OperatorSpec>);

fn broadcast_refused(name: &str) -> String {
    format!(
        "{name} is a broadcast stream (key \"*\"): allowed only as the right input of connect threshold and temporal_join"
    )
}

fn join_type(t: Table<'_, '_>, allowed: &[&str], errors: &mut Errors) -> Option<JoinType> {
    match t.str("join", errors) {
        None if t.get("join").is_some() => None,
        None => Some(JoinType::Inner),
        Some((j, _)) if allowed.contains(&j) => JoinType::parse(j),
        Some((_, span)) => {
            errors.at(&span, &t.child_path("join"), format!("must be one of {}", allowed.join(", ")));
            None
        }
    }
}

/// Parses `left.f`, `right.f AS g` → (input, field, alias).
fn parse_select_item(item: &str) -> Option<(usize, &str, Option<&str>)> {
    let words: Vec<&str> = item.split_whitespace().collect();
    let (reference, alias) = match words.as_slice() {
        [r] => (*r, None),
        [r, as_, alias] if *as_ == "AS" || *as_ == "as" => (*r, Some(*alias)),
        _ => return None,
    };
    let (side, field) = reference.split_once('.')?;
    let input = match side {
        "left" => LEFT,
        "right" => RIGHT,
        _ => return None,
    };
    (is_identifier(field) && alias.is_none_or(is_identifier)).then_some((input, field, alias))
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_') && chars.all(|c| c.is_alphanumeric() || c == '_')
}

/// `select` → the columns of a result and its fields: the left key first (rule 9), then the
/// selected fields, then `_kind`. `missing[i]`: results can lack input i (outer rows).
fn select(
    t: Table<'_, '_>,
    inputs: &[Input; 2],
    missing: [bool; 2],
    errors: &mut Errors,
) -> Option<(Vec<Column>, Vec<Field>)> {
    let path = t.child_path("select");
    let items = t.required_list("select", errors, "a list like [\"left.f\", \"right.g AS h\"]")?;
    let left_key = inputs[LEFT].key_field()?.clone();
    let mut columns = vec![Column::Key];
    let mut fields = vec![Field { nullable: false, ..left_key.clone() }];
    let before = errors.count();
    for (item, span) in items {
        let Some((input, field, alias)) = parse_select_item(item) else {
            errors.at(&span, &path, format!("bad item {item:?} (want \"left.f\" or \"right.f AS g\")"));
            continue;
        };
        let schema = &inputs[input].schema;
        let Some(pos) = schema.position(field) else {
            errors.at(&span, &path, format!("{item:?}: {} has no field {field:?}", inputs[input].name));
            continue;
        };
        let alias = alias.unwrap_or(field);
        let is_key = schema.key == Some(pos);
        if RESERVED_FIELDS.contains(&alias) {
            errors.at(&span, &path, format!("{item:?}: {alias:?} is a name braid writes itself; use AS"));
        } else if alias == left_key.name && !is_key {
            errors.at(
                &span,
                &path,
                format!(
                    "{item:?}: {alias:?} is the key field of {}, which every result carries (rule 9); use AS",
                    inputs[LEFT].name
                ),
            );
        } else if alias == left_key.name {
            // The key column is already there and holds the key.
        } else if fields.iter().any(|f| f.name == alias) {
            errors.at(&span, &path, format!("{item:?}: duplicate output name {alias:?}"));
        } else {
            let nullable = !is_key && (missing[input] || schema.fields[pos].nullable);
            columns.push(if is_key { Column::Key } else { Column::Field { input, pos } });
            fields.push(Field { name: alias.to_owned(), ty: schema.fields[pos].ty, nullable });
        }
    }
    columns.push(Column::Kind);
    fields.push(Field { name: "_kind".into(), ty: FieldType::String, nullable: false });
    (errors.count() == before).then_some((columns, fields))
}

/// The output schema: keyed by the left input's key (position 0), or by `key = "FIELD"`, an
/// output field of type string or int that is never null. Returns the re-key position too.
fn output_schema(t: Table<'_, '_>, fields: Vec<Field>, errors: &mut Errors) -> Option<(Schema, Option<usize>)> {
    let Some((rekey, span)) = t.str("key", errors) else {
        return t.get("key").is_none().then(|| (Schema::new(fields, Some(0), TimeSpec::Ingest), None));
    };
    let path = t.child_path("key");
    let Some(pos) = fields.iter().position(|f| f.name == rekey) else {
        let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
        errors.at(&span, &path, format!("{rekey:?} is not an output field ({})", names.join(", ")));
        return None;
    };
    if !fields[pos].ty.can_be_key() {
        errors.at(&span, &path, format!("a key must be string or int; {rekey:?} is {}", fields[pos].ty));
        return None;
    }
    if fields[pos].nullable {
        errors.at(&span, &path, format!("{rekey:?} may be null (a field of a side an outer join can miss, or an aggregate of a group that can be empty): it cannot be the key"));
        return None;
    }
    Some((Schema::new(fields, Some(pos), TimeSpec::Ingest), Some(pos)))
}

fn window(t: Table<'_, '_>, errors: &mut Errors) {
    let Some((span, table)) = t.table("window", errors) else {
        if t.get("window").is_none() {
            t.missing("window", errors, "e.g. { kind = \"tumbling\", size = \"5m\" }");
        }
        return;
    };
    let path = t.child_path("window");
    let w = Table { path: &path, span: &span, table };
    w.check_keys(&["kind", "size", "slide", "gap", "offset"], errors);
    let needs: &[&str] = match w.required_str("kind", errors, "tumbling, sliding or session") {
        Some(("tumbling", _)) => &["size"],
        Some(("sliding", _)) => &["size", "slide"],
        Some(("session", _)) => &["gap"],
        Some((_, span)) => {
            errors.at(&span, &w.child_path("kind"), "must be tumbling, sliding or session");
            return;
        }
        None => return,
    };
    for key in ["size", "slide", "gap", "offset"] {
        let wanted = needs.contains(&key) || (key == "offset" && !needs.contains(&"gap"));
        match (wanted, w.get(key).is_some()) {
            (true, false) if key != "offset" => w.missing(key, errors, "a positive duration"),
            (false, true) => w.error(key, errors, format!("this window kind takes {}", needs.join(", "))),
            (true, true) => match w.duration(key, errors) {
                Some(ms) if ms <= 0 && key != "offset" => w.error(key, errors, "must be positive"),
                _ => {}
            },
            _ => {}
        }
    }
}

/// `aggregate`: `fn(left|right[.field]) [AS alias]` with fn in count, sum, min, max, first, last.
fn aggregates(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_items() {
        assert_eq!(parse_select_item("left.cmd_id"), Some((LEFT, "cmd_id", None)));
        assert_eq!(parse_select_item(" right.ts AS status_ts "), Some((RIGHT, "ts", Some("status_ts"))));
        assert_eq!(parse_select_item("right.ts as t"), Some((RIGHT, "ts", Some("t"))));
        assert_eq!(parse_select_item("middle.ts"), None);
        assert_eq!(parse_select_item("left.ts AS"), None);
        assert_eq!(parse_select_item("left.t-s"), None);
    }

    #[test]
    fn aggregate_items() {
        assert_eq!(parse_aggregate("count(left) AS views"), Some(("count", LEFT, None, Some("views"))));
        assert_eq!(parse_aggregate("sum(right.amount)"), Some(("sum", RIGHT, Some("amount"), None)));
        assert_eq!(parse_aggregate("avg(right.amount)"), None);
        assert_eq!(parse_aggregate("count(up)"), None);
    }
}
