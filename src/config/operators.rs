//! `[operators.NAME]`: every kind is parsed and checked, inputs resolved (upstream first, cycles
//! refused) and output schemas derived, so chains validate end to end. Each kind's own checks
//! live beside its runtime, in `src/operator/<kind>.rs`.
//!
//! `kind` is parsed once into an [`OperatorKind`]; [`allowed_keys`] and the choice of check are
//! exhaustive matches on it (an unknown kind is an error at the `kind` value, listing every kind).
//! The plan's limits ([`crate::plan`]) are checked here: at most [`MAX_OPERATORS`] operators,
//! [`MAX_INPUTS`] inputs each, chains of at most [`MAX_CHAIN_DEPTH`] operators, counted with the
//! plan's own rule ([`chain_depth`]) as each operator is built.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use toml::de::DeValue;

use super::RESERVED_FIELDS;
use super::streams::{Streams, bad_name};
use super::walk::{Errors, Table, type_name};
use crate::operator::expr::Expr;
use crate::operator::interval_join::{JoinType, LEFT, RIGHT};
use crate::operator::projection::Column;
use crate::operator::{self, OperatorKind, OperatorSpec};
use crate::plan::{MAX_CHAIN_DEPTH, MAX_INPUTS, MAX_OPERATORS, NodeRef, OperatorDef, chain_depth};
use crate::record::schema::Field;
use crate::record::{FieldType, Schema, TimeSpec};

/// The checked operators, upstream first.
pub struct Graph {
    pub operators: Vec<OperatorDef>,
    /// Every declared operator name with its output schema when it checked out.
    pub outputs: HashMap<String, Option<Schema>>,
}

/// The keys every `[operators.NAME]` may have, whatever its kind: `ttl` (bounded state, the
/// operator host's; operator/host.rs).
const COMMON_KEYS: &[&str] = &["ttl"];

/// The keys `[operators.NAME]` of `kind` may have, besides [`COMMON_KEYS`].
fn allowed_keys(kind: OperatorKind) -> &'static [&'static str] {
    match kind {
        OperatorKind::Union => &["kind", "inputs", "key"],
        OperatorKind::IntervalJoin => &[
            "kind",
            "left",
            "right",
            "lower",
            "upper",
            "lower_exclusive",
            "upper_exclusive",
            "join",
            "where",
            "select",
            "key",
        ],
        OperatorKind::WindowJoin => {
            &["kind", "left", "right", "window", "allowed_lateness", "join", "where", "select", "key"]
        }
        OperatorKind::CoGroup => &["kind", "left", "right", "window", "allowed_lateness", "join", "aggregate", "key"],
        OperatorKind::TemporalJoin => &["kind", "left", "right", "join", "where", "select", "key"],
        OperatorKind::Connect => &["kind", "function", "left", "right", "value", "limit", "timeout", "select", "key"],
        OperatorKind::Absence => &["kind", "input", "timeout", "key"],
        OperatorKind::WindowAggregate => &["kind", "input", "window", "allowed_lateness", "where", "aggregate", "key"],
    }
}

/// `union, connect, …`: every kind's name, for error messages.
fn kind_names() -> String {
    OperatorKind::ALL.map(OperatorKind::name).join(", ")
}

/// An input as an operator sees it.
#[derive(Clone)]
pub struct Input {
    pub node: NodeRef,
    pub name: String,
    pub schema: Schema,
}

impl Input {
    /// The key fields in the key's order (none for a broadcast input).
    pub fn key_fields(&self) -> impl ExactSizeIterator<Item = &Field> + Clone {
        self.schema.key_fields()
    }

    pub fn is_broadcast(&self) -> bool {
        self.schema.is_broadcast()
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
    spec: OperatorSpec,
    /// [`chain_depth`]: operators on the longest chain ending here.
    depth: usize,
    ttl: Option<i64>,
}

/// Resolves operator inputs (checking upstream operators first) while each kind checks its table.
pub struct Builder<'s, 'a, 'i> {
    section: Table<'a, 'i>,
    streams: &'s Streams,
    status: HashMap<String, Status>,
    checked: Vec<Checked>,
}

pub fn operators(section: Table<'_, '_>, streams: &Streams, errors: &mut Errors) -> Graph {
    let declared = section.entries().count();
    if declared > MAX_OPERATORS {
        errors.at(section.span, section.path, format!("{declared} operators: a plan holds at most {MAX_OPERATORS}"));
    }
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
        .map(|c| OperatorDef { spec: c.spec, name: c.name, inputs: c.inputs, output: c.output, ttl: c.ttl })
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
    pub fn input(
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
        if self.checked[i].depth >= MAX_CHAIN_DEPTH {
            errors.at(span, &path, format!("reading {name:?} makes a chain of more than {MAX_CHAIN_DEPTH} operators"));
            return None;
        }
        let schema = self.checked[i].output.clone();
        Some(Input { node: NodeRef::Operator(i), name: name.to_owned(), schema })
    }

    /// The `max_out_of_orderness` of an input stream (`None` for an operator's output).
    pub fn out_of_orderness(&self, node: NodeRef) -> Option<i64> {
        match node {
            NodeRef::Stream(i) => self.streams.defs.get(i).map(|s| s.max_out_of_orderness),
            NodeRef::Operator(_) => None,
        }
    }

    pub fn named_input(&mut self, t: Table<'_, '_>, key: &str, errors: &mut Errors) -> Option<Input> {
        let (name, span) = t.required_str(key, errors, "the name of a stream or operator")?;
        self.input(t, key, name, &span, errors)
    }

    fn check(&mut self, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Checked> {
        let (kind, kind_span) = t.required_str("kind", errors, &format!("one of {}", kind_names()))?;
        let Some(kind) = OperatorKind::parse(kind) else {
            errors.at(&kind_span, &t.child_path("kind"), format!("must be one of {}", kind_names()));
            return None;
        };
        let mut keys = allowed_keys(kind).to_vec();
        keys.extend_from_slice(COMMON_KEYS);
        t.check_keys(&keys, errors);
        // Every kind takes a ttl (a union, which keeps no state, ignores it).
        let ttl = t.duration("ttl", errors).filter(|&ms| {
            if ms <= 0 {
                t.error("ttl", errors, "must be positive (leave it out for no ttl)");
            }
            ms > 0
        });
        let built = match kind {
            OperatorKind::IntervalJoin => operator::interval_join::check(self, name, t, errors),
            OperatorKind::WindowJoin => operator::window_join::check(self, name, t, errors),
            OperatorKind::CoGroup => operator::cogroup::check(self, name, t, errors),
            OperatorKind::TemporalJoin => operator::temporal_join::check(self, name, t, errors),
            OperatorKind::Connect => operator::connect::check(self, name, t, errors),
            OperatorKind::Union => operator::union::check(self, name, t, errors),
            OperatorKind::Absence => operator::absence::check(self, name, t, errors),
            OperatorKind::WindowAggregate => operator::window_aggregate::check(self, name, t, errors),
        }?;
        debug_assert_eq!(built.spec.kind(), kind, "operator {name}: a kind's check builds its own spec");
        if let Some(ttl) = ttl
            && let Some((needed, what)) = built.spec.ttl_floor()
            && ttl < needed
        {
            let message = format!(
                "ttl of {ttl} ms is shorter than {what} ({needed} ms): state may expire (to {name}.expired) \
                 before the rows it waits for can arrive"
            );
            errors.warn(&t.key_span("ttl"), &t.child_path("ttl"), message);
        }
        if built.inputs.len() > MAX_INPUTS {
            t.error("inputs", errors, format!("{} inputs: an operator reads at most {MAX_INPUTS}", built.inputs.len()));
            return None;
        }
        let depth = chain_depth(&built.inputs, |u| self.checked[u].depth);
        Some(Checked {
            name: name.to_owned(),
            inputs: built.inputs,
            output: built.output,
            spec: built.spec,
            depth,
            ttl,
        })
    }

    /// `left` and `right`: keyed alike (string vs int keys never match), broadcast only where
    /// allowed.
    pub fn two_inputs(&mut self, t: Table<'_, '_>, broadcast_right: bool, errors: &mut Errors) -> Option<[Input; 2]> {
        let left = self.named_input(t, "left", errors);
        let right = self.named_input(t, "right", errors);
        let (left, right) = (left?, right?);
        if left.is_broadcast() {
            t.error("left", errors, broadcast_refused(&left.name));
            return None;
        }
        if right.is_broadcast() && !broadcast_right {
            t.error("right", errors, broadcast_refused(&right.name));
        }
        if let Some(message) = key_mismatch(&left, &right) {
            t.error("right", errors, message);
        }
        // A key type mismatch or a refused broadcast on the right is reported; the rest of the
        // operator (select, output schema) is still checked against these inputs.
        Some([left, right])
    }
}

/// Why the keys of `left` and `right` can never be equal, if they cannot: a different number of
/// key fields, or a string field where the other has an int, position by position (string and
/// int keys never match). A broadcast side matches any key.
pub fn key_mismatch(left: &Input, right: &Input) -> Option<String> {
    if left.is_broadcast() || right.is_broadcast() {
        return None;
    }
    if left.key_fields().len() != right.key_fields().len() {
        return Some(format!(
            "key mismatch: left {} is keyed by ({}), right {} by ({}): a composite key matches one of as many fields",
            left.name,
            left.schema.key_names(),
            right.name,
            right.schema.key_names()
        ));
    }
    let (lk, rk) = left.key_fields().zip(right.key_fields()).find(|(lk, rk)| lk.ty != rk.ty)?;
    Some(format!(
        "key type mismatch: left {}.{} is {}, right {}.{} is {} (string and int keys never match)",
        left.name, lk.name, lk.ty, right.name, rk.name, rk.ty
    ))
}

/// What checking an operator's table yields.
pub struct Built {
    pub inputs: Vec<NodeRef>,
    /// The schema of its results.
    pub output: Schema,
    /// What the runtime runs.
    pub spec: OperatorSpec,
}

pub fn broadcast_refused(name: &str) -> String {
    format!(
        "{name} is a broadcast stream (key \"*\"): allowed only as the right input of connect threshold and temporal_join"
    )
}

pub fn join_type(t: Table<'_, '_>, allowed: &[&str], errors: &mut Errors) -> Option<JoinType> {
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

/// `where`: an optional condition on a pair of the two inputs; `None` when absent or in error
/// (reported).
pub fn pair_condition(t: Table<'_, '_>, inputs: &[Input; 2], errors: &mut Errors) -> Option<Expr> {
    let value = t.get("where")?;
    let Some(text) = value.get_ref().as_str() else {
        t.error("where", errors, format!("expected a condition string, found {}", type_name(value.get_ref())));
        return None;
    };
    match Expr::parse(text, &inputs[LEFT].schema, &inputs[RIGHT].schema) {
        Ok(expr) => Some(expr),
        Err(e) => {
            t.error("where", errors, format!("bad condition {text:?}: {e}"));
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

/// A computed item, `"EXPRESSION AS name"` (the `where` language: fields, literals, arithmetic,
/// comparisons, and/or/not, case when … then … else … end, coalesce(…)) → the expression, its
/// type and the name.
fn computed_item<'t>(item: &'t str, inputs: &[Input; 2]) -> Result<(Expr, FieldType, &'t str), String> {
    let trimmed = item.trim_end();
    let alias_start = trimmed.rfind(char::is_whitespace).map_or(0, |i| i + 1);
    let (before, alias) = trimmed.split_at(alias_start);
    let before = before.trim_end();
    let expr_text = before
        .strip_suffix(" AS")
        .or_else(|| before.strip_suffix(" as"))
        .filter(|_| is_identifier(alias))
        .ok_or("want \"left.f\", \"right.f AS g\" or \"EXPRESSION AS name\" (a computed item needs its name)")?;
    let (expr, ty) = Expr::parse_value(expr_text, &inputs[LEFT].schema, &inputs[RIGHT].schema)?;
    Ok((expr, ty, alias))
}

pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_') && chars.all(|c| c.is_alphanumeric() || c == '_')
}

/// `select` → the columns of a result and its fields: the left key first (rule 9), then the
/// selected fields, then `_kind`. `missing[i]`: results can lack input i (outer rows).
pub fn select(
    t: Table<'_, '_>,
    inputs: &[Input; 2],
    missing: [bool; 2],
    errors: &mut Errors,
) -> Option<(Vec<Column>, Vec<Field>)> {
    let path = t.child_path("select");
    let items = t.required_list("select", errors, "a list like [\"left.f\", \"right.g AS h\"]")?;
    let left_key: Vec<&Field> = inputs[LEFT].key_fields().collect();
    if left_key.is_empty() {
        return None;
    }
    let is_left_key = |name: &str| left_key.iter().any(|k| k.name == name);
    let mut columns: Vec<Column> = (0..left_key.len()).map(Column::Key).collect();
    let mut fields: Vec<Field> = left_key.iter().map(|&k| Field { nullable: false, ..k.clone() }).collect();
    let before = errors.count();
    for (item, span) in items {
        let Some((input, field, alias)) = parse_select_item(item) else {
            match computed_item(item, inputs) {
                Err(problem) => errors.at(&span, &path, format!("bad item {item:?}: {problem}")),
                Ok((expr, ty, alias)) => {
                    if RESERVED_FIELDS.contains(&alias) || is_left_key(alias) {
                        errors.at(&span, &path, format!("{item:?}: {alias:?} is a name braid writes itself"));
                    } else if fields.iter().any(|f| f.name == alias) {
                        errors.at(&span, &path, format!("{item:?}: duplicate output name {alias:?}"));
                    } else {
                        columns.push(Column::Computed { expr: Arc::new(expr), ty });
                        // Nullable: any operand may be null, a side may be missing.
                        fields.push(Field { name: alias.to_owned(), ty, nullable: true });
                    }
                }
            }
            continue;
        };
        let schema = &inputs[input].schema;
        let Some(pos) = schema.position(field) else {
            errors.at(&span, &path, format!("{item:?}: {} has no field {field:?}", inputs[input].name));
            continue;
        };
        let alias = alias.unwrap_or(field);
        // The key field number this field is in its input's key, if it is a key field.
        let key_part = schema.key.iter().position(|&k| k == pos);
        // Where a key field goes: under its own name when that names a key field of the left
        // input (the result carries it already), else as a column of its own holding the key's part.
        let carried = key_part.is_some_and(|part| left_key.get(part).is_some_and(|k| k.name == alias));
        if RESERVED_FIELDS.contains(&alias) {
            errors.at(&span, &path, format!("{item:?}: {alias:?} is a name braid writes itself; use AS"));
        } else if is_left_key(alias) && !carried {
            errors.at(
                &span,
                &path,
                format!(
                    "{item:?}: {alias:?} is {} key field of {}, which every result carries (rule 9); use AS",
                    if left_key.len() == 1 { "the" } else { "a" },
                    inputs[LEFT].name
                ),
            );
        } else if carried {
            // The key column is already there and holds the key.
        } else if fields.iter().any(|f| f.name == alias) {
            errors.at(&span, &path, format!("{item:?}: duplicate output name {alias:?}"));
        } else {
            let nullable = key_part.is_none() && (missing[input] || schema.fields[pos].nullable);
            columns.push(match key_part {
                Some(part) => Column::Key(part),
                None => Column::Field { input, pos },
            });
            fields.push(Field { name: alias.to_owned(), ty: schema.fields[pos].ty, nullable });
        }
    }
    columns.push(Column::Kind);
    fields.push(Field { name: "_kind".into(), ty: FieldType::String, nullable: false });
    (errors.count() == before).then_some((columns, fields))
}

/// The output schema: keyed by the input's key (its `key_fields` output positions), or by `key =
/// "FIELD"` / `key = ["F", "G"]`, output fields of type string or int that are never null.
/// Returns the re-key positions too.
pub fn output_schema(
    t: Table<'_, '_>,
    fields: Vec<Field>,
    key_fields: usize,
    errors: &mut Errors,
) -> Option<(Schema, Option<Vec<usize>>)> {
    if t.get("key").is_none() {
        return Some((Schema::new(fields, 0..key_fields, TimeSpec::Ingest), None));
    }
    let names = t.key_names("key", errors)?;
    let path = t.child_path("key");
    let mut positions = Vec::with_capacity(names.len());
    for (rekey, span) in names {
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
        positions.push(pos);
    }
    Some((Schema::new(fields, positions.iter().copied(), TimeSpec::Ingest), Some(positions)))
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
}
