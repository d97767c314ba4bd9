//! Sink topic templates: `gateways/gw1/effect/{device}` + a result row → the publish topic.
//!
//! A template is compiled once against the schema of the rows a sink publishes: each `{field}`
//! becomes that field's position, so rendering is a walk over text and positions into a reused
//! `String` (no allocation per row once the buffer has grown).
//!
//! A placeholder is filled with the value's text as the JSON output writes it
//! ([`crate::record::json`]), without quotes: a string as is, an int in decimal, a float as
//! serde_json formats it (`20.0`, `0.5`, `-0.0`: the shortest text that reads back the same
//! double) except that a positive exponent loses its `+` (`1e+20` → `1e20`, the same JSON
//! number; a `+` is a wildcard in MQTT), a bool as `true`/`false`. A `bytes` field cannot be a placeholder (its standard
//! base64 holds `/` and `+`): that is a configuration error, as is a name that is no field.
//!
//! A value never changes the shape of the topic. The row goes to `dead_letter` with the reason
//! `bad_topic_value:FIELD` instead of being published when the value
//! - is null (the missing side of an outer join) or a non-finite float;
//! - holds `/` (it would add levels: a device id `a/b` must not publish into another device's
//!   topic), `+` or `#` (wildcards are illegal in a publish topic) or NUL (illegal in MQTT);
//! - starts the topic with `$` (topics starting with `$` are broker-reserved, `$SYS`); a
//!   template whose own text starts with `$` is the operator's choice (AWS IoT's `$aws/things/…`
//!   is published to) and is left alone;
//! - leaves the topic empty or longer than [`MAX_TOPIC_LEN`] bytes (MQTT's limits).
//!
//! An empty value is allowed: MQTT allows empty levels (`a//b`), and the template decides the
//! level count, never the value.

use crate::record::{FieldType, Schema, Value};
use std::fmt::Write as _;

/// The most bytes an MQTT topic may hold (its length is a u16 on the wire).
pub const MAX_TOPIC_LEN: usize = 65_535;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(Box<str>),
    Field(usize),
}

/// A sink's `topic`, compiled against the schema of the rows it publishes.
#[derive(Clone, Debug)]
pub struct TopicTemplate {
    parts: Box<[Part]>,
}

/// Why a row's values cannot fill the template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    Null,
    NotFinite,
    /// A list of ids, which has no topic text (compile refuses such fields; a row of another
    /// schema could still hold one).
    NotText,
    Forbidden(char),
    Dollar,
    Empty,
    TooLong,
}

/// A placeholder's value that cannot go into the topic; `pos` is the field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("topic placeholder for field #{pos}: {}", why.describe())]
pub struct TopicError {
    pub pos: usize,
    pub why: Why,
}

impl Why {
    fn describe(self) -> String {
        match self {
            Why::Null => "the value is null".into(),
            Why::NotFinite => "the value is not a finite number".into(),
            Why::NotText => "the value has no topic text".into(),
            Why::Forbidden(c) => format!("the value holds {c:?}"),
            Why::Dollar => "the topic would start with '$'".into(),
            Why::Empty => "the topic would be empty".into(),
            Why::TooLong => format!("the topic would be longer than {MAX_TOPIC_LEN} bytes"),
        }
    }
}

impl TopicError {
    /// The dead-letter `_reason`, e.g. `bad_topic_value:device`.
    pub fn label(&self, schema: &Schema) -> String {
        format!("bad_topic_value:{}", schema.fields[self.pos].name)
    }
}

impl TopicTemplate {
    /// Compiles `template`; an error message names the placeholder and the fields there are.
    pub fn compile(template: &str, schema: &Schema) -> Result<TopicTemplate, String> {
        if template.is_empty() || template.len() > MAX_TOPIC_LEN {
            return Err(format!("a publish topic holds 1 to {MAX_TOPIC_LEN} bytes"));
        }
        let mut parts = Vec::new();
        let mut rest = template;
        loop {
            let open = rest.find('{').unwrap_or(rest.len());
            let text = &rest[..open];
            if text.contains(['+', '#', '\0', '}']) {
                return Err(format!("{template:?}: '+', '#', NUL or an unbalanced '}}' in a publish topic"));
            }
            if !text.is_empty() {
                parts.push(Part::Text(text.into()));
            }
            if open == rest.len() {
                return Ok(TopicTemplate { parts: parts.into() });
            }
            let close = rest[open..].find('}').ok_or_else(|| format!("unclosed '{{' in {template:?}"))? + open;
            parts.push(Part::Field(placeholder(&rest[open + 1..close], schema)?));
            rest = &rest[close + 1..];
        }
    }

    /// Fills `buf` (cleared first) with the topic of the row holding `values`, laid out by the
    /// compile schema.
    pub fn render(&self, values: &[Value], buf: &mut String) -> Result<(), TopicError> {
        buf.clear();
        let mut last = 0;
        for part in &self.parts {
            match part {
                Part::Text(text) => buf.push_str(text),
                Part::Field(pos) => {
                    last = *pos;
                    push_value(*pos, &values[*pos], buf)?;
                }
            }
        }
        // Only a template with placeholders can fail these: `compile` checked its text (and
        // there is a first part). A '$' from the text behind empty values counts as theirs.
        let (pos, why) = match (buf.len(), &self.parts[0]) {
            (0, _) => (last, Why::Empty),
            (len, _) if len > MAX_TOPIC_LEN => (last, Why::TooLong),
            (_, &Part::Field(first)) if buf.starts_with('$') => (first, Why::Dollar),
            _ => return Ok(()),
        };
        Err(TopicError { pos, why })
    }
}

fn placeholder(name: &str, schema: &Schema) -> Result<usize, String> {
    let Some(pos) = schema.position(name) else {
        let names: Vec<&str> = schema.fields.iter().map(|f| f.name.as_str()).collect();
        return Err(format!("placeholder {{{name}}} names no field of the rows published ({})", names.join(", ")));
    };
    match schema.fields[pos].ty {
        FieldType::String | FieldType::Int | FieldType::Float | FieldType::Bool => Ok(pos),
        FieldType::Bytes => Err(format!("placeholder {{{name}}} is a bytes field: its base64 text holds '/' and '+'")),
        FieldType::IdList => Err(format!("placeholder {{{name}}} is a list of ids, which has no topic text")),
    }
}

/// Appends the text of one value, then checks what it appended.
fn push_value(pos: usize, value: &Value, buf: &mut String) -> Result<(), TopicError> {
    let start = buf.len();
    let error = |why| Err(TopicError { pos, why });
    match value {
        Value::Str(s) => buf.push_str(s),
        // Writing into a String cannot fail; `{}` of an i64 is the JSON output's text.
        Value::Int(i) => {
            let _ = write!(buf, "{i}");
        }
        Value::Float(f) if f.is_finite() => {
            // serde_json writes finite doubles as UTF-8, so neither step can fail.
            let _ = serde_json::to_writer(Utf8Sink(&mut *buf), f);
            // The only '+' a number can hold is its exponent's sign, which JSON may leave out.
            if let Some(plus) = buf[start..].find('+') {
                buf.remove(start + plus);
            }
        }
        Value::Float(_) => return error(Why::NotFinite),
        Value::Bool(b) => buf.push_str(if *b { "true" } else { "false" }),
        Value::Null => return error(Why::Null),
        Value::IdList(_) => return error(Why::NotText),
    }
    if let Some(c) = buf[start..].chars().find(|c| matches!(c, '/' | '+' | '#' | '\0')) {
        return error(Why::Forbidden(c));
    }
    if start == 0 && buf.starts_with('$') {
        return error(Why::Dollar);
    }
    Ok(())
}

/// Lets serde_json's number formatter write into a `String`.
struct Utf8Sink<'a>(&'a mut String);

impl std::io::Write for Utf8Sink<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.push_str(std::str::from_utf8(bytes).map_err(std::io::Error::other)?);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::TimeSpec;
    use crate::record::schema::Field;
    use proptest::prelude::*;

    fn schema() -> Schema {
        let fields = [
            ("device", FieldType::String),
            ("seq", FieldType::Int),
            ("temp", FieldType::Float),
            ("ok", FieldType::Bool),
            ("blob", FieldType::Bytes),
        ];
        let fields = fields.iter().map(|(n, ty)| Field { name: n.to_string(), ty: *ty, nullable: true }).collect();
        Schema::new(fields, Some(0), TimeSpec::Ingest)
    }

    fn row(device: &str) -> Vec<Value> {
        vec![Value::Str(device.into()), Value::Int(-42), Value::Float(20.0), Value::Bool(true), Value::Null]
    }

    fn render(template: &str, values: &[Value]) -> Result<String, TopicError> {
        let t = TopicTemplate::compile(template, &schema()).expect("valid template");
        let mut buf = String::from("stale");
        t.render(values, &mut buf).map(|()| buf)
    }

    #[test]
    fn placeholders_at_start_middle_and_end() {
        let r = row("d1");
        assert_eq!(render("gateways/gw1/effect/{device}", &r), Ok("gateways/gw1/effect/d1".into()));
        assert_eq!(render("{device}/effect", &r), Ok("d1/effect".into()));
        assert_eq!(render("a/{device}/b", &r), Ok("a/d1/b".into()));
        assert_eq!(render("a/x{device}y{seq}/b", &r), Ok("a/xd1y-42/b".into()));
        assert_eq!(render("{device}", &r), Ok("d1".into()));
        assert_eq!(render("{device}{seq}", &r), Ok("d1-42".into()));
        assert_eq!(render("no/placeholder", &r), Ok("no/placeholder".into()));
    }

    #[test]
    fn numbers_and_bools_read_as_in_the_json_output() {
        let mut r = row("d");
        for (f, text) in [(20.0, "20.0"), (0.5, "0.5"), (1e20, "1e20"), (-0.0, "-0.0"), (1.5e-7, "1.5e-7")] {
            r[2] = Value::Float(f);
            assert_eq!(render("t/{temp}", &r), Ok(format!("t/{text}")), "{f}");
            let json = serde_json::to_string(&f).expect("finite").replace("e+", "e");
            assert_eq!(json, text);
        }
        r[1] = Value::Int(i64::MIN);
        assert_eq!(render("{seq}/{ok}", &r), Ok(format!("{}/true", i64::MIN)));
        r[3] = Value::Bool(false);
        assert_eq!(render("{ok}", &r), Ok("false".into()));
    }

    #[test]
    fn forbidden_characters_are_dead_letters() {
        for (value, c) in [("a/b", '/'), ("a+", '+'), ("#", '#'), ("x\0", '\0'), ("/", '/')] {
            let got = render("devices/{device}/effect", &row(value));
            assert_eq!(got, Err(TopicError { pos: 0, why: Why::Forbidden(c) }), "{value:?}");
            assert_eq!(got.expect_err("rejected").label(&schema()), "bad_topic_value:device");
        }
    }

    #[test]
    fn null_and_non_finite_values_are_dead_letters() {
        let mut r = row("d");
        r[0] = Value::Null;
        assert_eq!(render("a/{device}", &r), Err(TopicError { pos: 0, why: Why::Null }));
        for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            r[2] = Value::Float(f);
            assert_eq!(render("a/{temp}", &r), Err(TopicError { pos: 2, why: Why::NotFinite }));
        }
        r[0] = Value::IdList(vec![1].into());
        assert_eq!(render("a/{device}", &r), Err(TopicError { pos: 0, why: Why::NotText }));
    }

    #[test]
    fn dollar_only_from_the_template() {
        assert_eq!(render("{device}/x", &row("$SYS")), Err(TopicError { pos: 0, why: Why::Dollar }));
        let two = TopicTemplate::compile("{device}{seq}", &schema()).expect("valid");
        let mut r = row("");
        r[1] = Value::Str("$x".into());
        assert_eq!(two.render(&r, &mut String::new()), Err(TopicError { pos: 1, why: Why::Dollar }));
        let dollar = TopicTemplate::compile("{device}$", &schema()).expect("valid");
        assert_eq!(dollar.render(&row(""), &mut String::new()), Err(TopicError { pos: 0, why: Why::Dollar }));
        assert_eq!(render("a/{device}", &row("$SYS")), Ok("a/$SYS".into()));
        assert_eq!(render("$aws/things/{device}/shadow/update", &row("d1")), Ok("$aws/things/d1/shadow/update".into()));
    }

    #[test]
    fn empty_levels_are_kept_but_not_an_empty_topic() {
        assert_eq!(render("a/{device}/b", &row("")), Ok("a//b".into()));
        assert_eq!(render("{device}", &row("")), Err(TopicError { pos: 0, why: Why::Empty }));
        let long = "x".repeat(MAX_TOPIC_LEN);
        assert_eq!(render("a{device}", &row(&long)), Err(TopicError { pos: 0, why: Why::TooLong }));
        assert_eq!(render("{device}", &row(&long)).map(|t| t.len()), Ok(MAX_TOPIC_LEN));
    }

    #[test]
    fn compile_errors_name_the_placeholder() {
        let s = schema();
        for (t, why) in [
            ("a/{devce}", "{devce} names no field of the rows published (device, seq, temp, ok, blob)"),
            ("a/{blob}", "bytes field"),
            ("a/{device", "unclosed"),
            ("a/}", "unbalanced"),
            ("a/+", "'+'"),
            ("a/#", "'#'"),
            ("", "1 to"),
        ] {
            let err = TopicTemplate::compile(t, &s).expect_err(t);
            assert!(err.contains(why), "{t}: {err}");
        }
    }

    #[test]
    fn a_warm_buffer_does_not_grow() {
        let t = TopicTemplate::compile("gateways/gw1/effect/{device}", &schema()).expect("valid");
        let mut buf = String::new();
        t.render(&row("device-0001"), &mut buf).expect("renders");
        let (ptr, cap) = (buf.as_ptr(), buf.capacity());
        for d in ["d1", "device-0002", "x"] {
            t.render(&row(d), &mut buf).expect("renders");
            assert_eq!((buf.as_ptr(), buf.capacity()), (ptr, cap));
        }
    }

    /// A template piece: literal text or a placeholder of field `f0`..`f3` (string, int, float,
    /// bool).
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z/$]{0,4}", (0..4usize).prop_map(|i| format!("{{f{i}}}"))]
    }

    fn value(ty: usize) -> BoxedStrategy<Value> {
        let v = match ty {
            0 => prop_oneof![any::<String>(), "[a-z/+#$\0]{0,4}"].prop_map(|s| Value::Str(s.into())).boxed(),
            1 => any::<i64>().prop_map(Value::Int).boxed(),
            2 => any::<f64>().prop_map(Value::Float).boxed(),
            _ => any::<bool>().prop_map(Value::Bool).boxed(),
        };
        prop_oneof![1 => Just(Value::Null), 8 => v].boxed()
    }

    proptest! {
        #[test]
        fn render_never_adds_levels_or_wildcards(
            pieces in prop::collection::vec(piece(), 1..6),
            values in (value(0), value(1), value(2), value(3)),
        ) {
            let template = pieces.concat();
            prop_assume!(!template.is_empty());
            let types = [FieldType::String, FieldType::Int, FieldType::Float, FieldType::Bool];
            let fields = (0..4).map(|i| Field { name: format!("f{i}"), ty: types[i], nullable: true }).collect();
            let schema = Schema::new(fields, None, TimeSpec::Ingest);
            let t = TopicTemplate::compile(&template, &schema).expect("valid template");
            let values = [values.0, values.1, values.2, values.3];
            let mut buf = String::new();
            let literal_slashes = template.matches('/').count();
            if t.render(&values, &mut buf).is_ok() {
                prop_assert!(!buf.contains(['+', '#', '\0']), "{buf:?}");
                prop_assert_eq!(buf.matches('/').count(), literal_slashes);
                prop_assert!(!buf.starts_with('$') || template.starts_with('$'));
                prop_assert!(!buf.is_empty() && buf.len() <= MAX_TOPIC_LEN);
            }
            // Model: strings are substituted verbatim, refused exactly when they would hurt.
            if let Value::Str(s) = &values[0] {
                let only = TopicTemplate::compile("x/{f0}/y", &schema).expect("valid");
                let got = only.render(&values, &mut buf);
                prop_assert_eq!(got.is_ok(), !s.contains(['/', '+', '#', '\0']));
                if got.is_ok() {
                    prop_assert_eq!(&buf, &format!("x/{s}/y"));
                }
            }
        }
    }
}
