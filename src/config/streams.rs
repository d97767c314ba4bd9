//! `[streams.NAME]`: schemas, keys, event time and the stream's time settings.

use toml::de::DeValue;

use super::walk::{Errors, Table, type_name};
use super::{DEAD_LETTER, RESERVED_FIELDS, SourceDef};
use crate::record::schema::Field;
use crate::record::{FieldType, Schema, TimeSpec, TimeUnit};

/// A declared input stream.
#[derive(Clone, Debug)]
pub struct StreamDef {
    pub name: String,
    pub schema: Schema,
    pub max_out_of_orderness: i64,
    /// 0: never idle.
    pub idle_timeout: i64,
    pub max_age: i64,
    pub max_skew: i64,
    pub max_payload: u64,
    pub source: Option<String>,
    pub topic: Option<String>,
}

/// The streams that passed their checks, and the names of those that did not (operators that
/// read a broken stream report nothing more about it).
#[derive(Default)]
pub struct Streams {
    pub defs: Vec<StreamDef>,
    pub broken: Vec<String>,
}

const STREAM_KEYS: [&str; 10] = [
    "source",
    "topic",
    "key",
    "time",
    "max_out_of_orderness",
    "idle_timeout",
    "max_age",
    "max_skew",
    "max_payload",
    "fields",
];

pub fn streams(section: Table<'_, '_>, sources: &[SourceDef], errors: &mut Errors) -> Streams {
    let mut out = Streams::default();
    for (name, name_span, value) in section.entries() {
        let path = section.child_path(name);
        if let Some(problem) = bad_name(name) {
            errors.at(&name_span, &path, problem);
        }
        let DeValue::Table(table) = value.get_ref() else {
            errors.at(&name_span, &path, format!("expected a table, found {}", type_name(value.get_ref())));
            out.broken.push(name.to_owned());
            continue;
        };
        // A stream with a usable schema stays referable whatever else is wrong with it, so the
        // operators reading it are checked too.
        match stream(name, Table { path: &path, span: &name_span, table }, sources, errors) {
            Some(def) => out.defs.push(def),
            None => out.broken.push(name.to_owned()),
        }
    }
    out
}

/// Why `name` cannot name a stream or operator, if it cannot.
pub fn bad_name(name: &str) -> Option<String> {
    if name.contains('.') {
        Some(format!(
            "{name:?}: a stream or operator name may not contain '.' (outputs are named NAME.late, NAME.expired)"
        ))
    } else if name == DEAD_LETTER {
        Some(format!("{DEAD_LETTER:?} is reserved for rows that could not be used"))
    } else if name.is_empty() {
        Some("a name may not be empty".into())
    } else {
        None
    }
}

fn stream(name: &str, t: Table<'_, '_>, sources: &[SourceDef], errors: &mut Errors) -> Option<StreamDef> {
    t.check_keys(&STREAM_KEYS, errors);
    let fields = fields(t, errors);
    let key = key(t, fields.as_deref(), errors);
    let time = time(t, fields.as_deref(), errors);
    let source = t.str("source", errors).map(|(s, span)| {
        if !sources.iter().any(|src| src.name == s) {
            errors.at(&span, &t.child_path("source"), format!("unknown source {s:?} (not in [sources])"));
        }
        s.to_owned()
    });
    let topic = t.str("topic", errors).map(|(topic, span)| {
        if let Err(e) = check_topic_filter(topic, fields.as_deref()) {
            errors.at(&span, &t.child_path("topic"), e);
        }
        topic.to_owned()
    });
    let max_out_of_orderness = t.duration_or("max_out_of_orderness", 0, errors);
    let idle_timeout = t.duration_or("idle_timeout", 30_000, errors);
    let max_age = t.duration_or("max_age", 7 * 86_400_000, errors);
    let max_skew = t.duration_or("max_skew", 30_000, errors);
    let max_payload = t.size_or("max_payload", 256 * 1024, errors);
    if max_payload > crate::shard::MAX_ROW_BYTES as u64 {
        // Such a payload could pass the size check and still never fit a shard ring.
        let most = crate::shard::MAX_ROW_BYTES;
        t.error("max_payload", errors, format!("{max_payload} bytes is more than a shard ring carries ({most} bytes)"));
    }
    let schema = Schema::new(fields?, key?, time?);
    Some(StreamDef {
        name: name.to_owned(),
        schema,
        max_out_of_orderness,
        idle_timeout,
        max_age,
        max_skew,
        max_payload,
        source,
        topic,
    })
}

fn fields(t: Table<'_, '_>, errors: &mut Errors) -> Option<Vec<Field>> {
    const REQUIRED: &str = "a table of name = type (string, int, float, bool, bytes)";
    let Some((_, table)) = t.table("fields", errors) else {
        if t.get("fields").is_none() {
            t.missing("fields", errors, REQUIRED);
        }
        return None;
    };
    if table.is_empty() {
        t.error("fields", errors, format!("required: {REQUIRED}"));
        return None;
    }
    let path = t.child_path("fields");
    let mut out = Vec::new();
    for (name, value) in table.iter() {
        let field_path = format!("{path}.{}", name.get_ref());
        if RESERVED_FIELDS.contains(&name.get_ref().as_ref()) {
            errors.at(&name.span(), &field_path, format!("{:?} is a name braid writes itself", name.get_ref()));
        }
        match value.get_ref() {
            DeValue::String(ty) => match FieldType::parse(ty) {
                Some(ty) => out.push(Field { name: name.get_ref().to_string(), ty, nullable: false }),
                None => errors.at(
                    &name.span(),
                    &field_path,
                    format!("unknown type {ty:?} (string, int, float, bool, bytes)"),
                ),
            },
            other => errors.at(&name.span(), &field_path, format!("expected a type name, found {}", type_name(other))),
        }
    }
    (out.len() == table.len()).then_some(out)
}

/// The key field positions: one, several for a composite key (`key = ["site", "device"]`), none
/// for a broadcast stream (`key = "*"`).
fn key(t: Table<'_, '_>, fields: Option<&[Field]>, errors: &mut Errors) -> Option<Vec<usize>> {
    const WHAT: &str = "the key field, a list of them for a composite key, or \"*\" for broadcast";
    if t.get("key").is_none() {
        t.missing("key", errors, WHAT);
        return None;
    }
    let names = t.key_names("key", errors)?;
    let path = t.child_path("key");
    if let [("*", _)] = names.as_slice() {
        return Some(Vec::new());
    }
    if let Some((_, span)) = names.iter().find(|(name, _)| *name == "*") {
        errors.at(span, &path, "\"*\" (broadcast) stands alone: key = \"*\"");
        return None;
    }
    let fields = fields?;
    let mut positions = Vec::with_capacity(names.len());
    for (key, span) in names {
        let Some(pos) = fields.iter().position(|f| f.name == key) else {
            errors.at(&span, &path, format!("key field {key:?} is not in `fields`"));
            return None;
        };
        if !fields[pos].ty.can_be_key() {
            errors.at(&span, &path, format!("key field {key:?} must be string or int, not {}", fields[pos].ty));
            return None;
        }
        positions.push(pos);
    }
    Some(positions)
}

fn time(t: Table<'_, '_>, fields: Option<&[Field]>, errors: &mut Errors) -> Option<TimeSpec> {
    let Some((span, table)) = t.table("time", errors) else {
        return t.get("time").is_none().then_some(TimeSpec::Ingest);
    };
    let path = t.child_path("time");
    let time = Table { path: &path, span: &span, table };
    time.check_keys(&["field", "unit"], errors);
    let unit = match time.str("unit", errors) {
        None => (time.get("unit").is_none()).then_some(TimeUnit::Ms),
        Some(("ms", _)) => Some(TimeUnit::Ms),
        Some(("s", _)) => Some(TimeUnit::S),
        Some(("rfc3339", _)) => Some(TimeUnit::Rfc3339),
        Some((_, span)) => {
            errors.at(&span, &time.child_path("unit"), "must be ms, s or rfc3339");
            None
        }
    };
    let (field, field_span) = time.required_str("field", errors, "the event-time field")?;
    let (unit, fields) = (unit?, fields?);
    let field_path = time.child_path("field");
    let Some(pos) = fields.iter().position(|f| f.name == field) else {
        errors.at(&field_span, &field_path, format!("{field:?} is not declared in `fields`"));
        return None;
    };
    let allowed: &[FieldType] = match unit {
        TimeUnit::Ms => &[FieldType::Int],
        TimeUnit::S => &[FieldType::Int, FieldType::Float],
        TimeUnit::Rfc3339 => &[FieldType::String],
    };
    if !allowed.contains(&fields[pos].ty) {
        let names: Vec<String> = allowed.iter().map(ToString::to_string).collect();
        let unit_name = ["ms", "s", "rfc3339"][unit as usize];
        errors.at(
            &field_span,
            &field_path,
            format!("unit {unit_name:?} needs {field:?} declared as {}, not {}", names.join(" or "), fields[pos].ty),
        );
        return None;
    }
    Some(TimeSpec::Field { pos, unit })
}

/// An MQTT topic filter, read as the MQTT source reads it
/// ([`TopicFilter::check`](crate::source::route::TopicFilter::check)).
fn check_topic_filter(topic: &str, fields: Option<&[Field]>) -> Result<(), String> {
    crate::source::route::TopicFilter::check(topic, fields)
}
