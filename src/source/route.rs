//! Topic → streams: the `topic` filters of one source's streams, compiled once against each
//! stream's schema, and the fields their `+name` levels capture.
//!
//! Matching follows MQTT (3.1.1 and 5.0, section 4.7): a topic is split at every `/` into
//! levels, empty levels included (`a//b` has three, the middle one empty). A filter level is
//! - a literal, equal to the topic level byte for byte;
//! - `+`, any one level, an empty one included;
//! - `+name`, any one level, captured into the declared field `name` (string or int);
//! - a final `#`, zero or more levels: `a/#` matches `a`, `a/` and `a/b/c`.
//!
//! A topic starting with `$` (`$SYS/...`, broker-reserved) never matches a filter whose first
//! level is a wildcard; a filter spelling the `$` level out (`$SYS/+`) matches it.
//!
//! Decisions braid adds (CONTRACT.md should state them):
//! - **Int captures are canonical decimal**: an optional `-`, then `0` or digits without a
//!   leading zero, within i64. `+7`, `007`, `-0`, `7 ` or `1e3` are not ints. One device has one
//!   topic: `dev/007` and `dev/7` never merge into the key 7, and an int key written back into a
//!   sink topic (`{device}`) gives the level it came from.
//! - **A level that is not an int, or an empty level captured into any field, in a topic the
//!   filter otherwise matches, is a dead letter** `bad_topic_capture:FIELD`, not a non-match:
//!   the device published where the stream listens, so dropping the row silently would hide it
//!   (DESIGN.md "Delivery": never a silent drop). An empty capture (`devices//command` under
//!   `devices/+device/command`) would make `""` a key that every such publisher shares, and a
//!   sink topic `{device}` built from it would lose a level. A plain `+` still matches an empty
//!   level (MQTT does). A topic that differs in a literal level is a non-match and is never
//!   reported.
//! - **A topic may match several streams**: each of them gets the row (as MQTT subscriptions
//!   overlap), with its own captures or its own dead letter.
//! - **Captures and the payload**: a captured field is filled from the topic and may be left out
//!   of the JSON payload (it is then not `missing_field`). A payload that carries it too must
//!   hold the same value (after typing: `"device": 7` equals the level `7`); a different value
//!   is a dead letter `topic_payload_mismatch:FIELD`, a value of the wrong type `wrong_type:FIELD`
//!   as for any field. The topic is what the broker's ACL ties to the client (mosquitto
//!   `pattern write devices/%c/#`) and the key decides whose state a row joins, so neither side
//!   may quietly win: a payload naming another device is either spoofing or a firmware bug, and
//!   an operator wants to see it. [`decode_payload`](crate::record::decode::decode_payload)
//!   applies this rule.
//!
//! Cost: [`Router::route`] splits a topic at its `/`s once, then scans the filters of one source
//! (a handful of streams) over its levels, each match one pass with no allocation: levels and
//! captures borrow the topic and live in fixed arrays ([`MAX_CAPTURES`]). It used to split the
//! topic again for every filter, 4 % of the intake thread's time at saturation (BENCHMARKS.md).
//! A source with hundreds of filters would want a trie.

use crate::record::schema::Field;
use crate::record::view::ValueRef;
use crate::record::{FieldType, Schema, Value};

/// Captures one filter may hold; a filter with more is a configuration error.
pub const MAX_CAPTURES: usize = 8;

/// What the `+name` levels of one topic captured: (field position, value), in level order.
pub type Captures<'t> = heapless::Vec<(usize, Captured<'t>), MAX_CAPTURES>;

/// A captured level, typed as its field: a string borrows the topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Captured<'t> {
    Str(&'t str),
    Int(i64),
}

impl<'t> Captured<'t> {
    pub fn to_value(self) -> Value {
        self.as_value_ref().to_value()
    }

    /// The value, still borrowing the topic.
    pub fn as_value_ref(self) -> ValueRef<'t> {
        match self {
            Captured::Str(s) => ValueRef::Str(s),
            Captured::Int(i) => ValueRef::Int(i),
        }
    }
}

/// The topic matches, but the level captured into the field at `pos` is empty, or not a
/// canonical int for an int field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the topic level captured into field #{pos} is empty or not a canonical int")]
pub struct BadCapture {
    pub pos: usize,
}

impl BadCapture {
    /// The dead-letter `_reason`, e.g. `bad_topic_capture:device`.
    pub fn label(self, schema: &Schema) -> String {
        format!("bad_topic_capture:{}", schema.fields[self.pos].name)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Level {
    Literal(Box<str>),
    Any,
    Capture { pos: usize, int: bool },
    Rest,
}

/// One stream's `topic` filter, compiled against its schema.
#[derive(Clone, Debug)]
pub struct TopicFilter {
    levels: Box<[Level]>,
    /// The first level is a wildcard, so a `$` topic never matches.
    wild_first: bool,
}

impl TopicFilter {
    /// Compiles `filter`; the message of an error names the offending level.
    pub fn compile(filter: &str, schema: &Schema) -> Result<TopicFilter, String> {
        let levels = parse_levels(filter, Some(&schema.fields))?;
        let wild_first = matches!(levels[0], Level::Any | Level::Capture { .. } | Level::Rest);
        Ok(TopicFilter { levels: levels.into(), wild_first })
    }

    /// Checks `filter` as [`compile`](Self::compile) does (config validation: `validate` accepts
    /// exactly the filters a source can use); with `fields` unknown (a stream whose schema has
    /// errors of its own), captures are not checked against them.
    pub fn check(filter: &str, fields: Option<&[Field]>) -> Result<(), String> {
        parse_levels(filter, fields).map(drop)
    }

    /// `None` when `topic` is not this filter's; else its captures, or why one level is unusable.
    pub fn matches<'t>(&self, topic: &'t str) -> Option<Result<Captures<'t>, BadCapture>> {
        self.matches_levels(topic.split('/'))
    }

    /// [`matches`](Self::matches) for a topic already split at every `/` (all of its levels, in
    /// order; there is always at least one).
    fn matches_levels<'t>(&self, topic: impl Iterator<Item = &'t str>) -> Option<Result<Captures<'t>, BadCapture>> {
        let mut topic = topic.peekable();
        if self.wild_first && topic.peek().is_some_and(|first| first.starts_with('$')) {
            return None;
        }
        let mut captures = Captures::new();
        let mut bad = None;
        for level in &self.levels {
            if matches!(level, Level::Rest) {
                return Some(bad.map_or(Ok(captures), Err));
            }
            let text = topic.next()?;
            let value = match level {
                Level::Literal(literal) if **literal != *text => return None,
                Level::Capture { pos, int: false } if !text.is_empty() => (*pos, Captured::Str(text)),
                Level::Capture { pos, int } => match parse_int(text).filter(|_| *int) {
                    Some(i) => (*pos, Captured::Int(i)),
                    None => {
                        // Reported only if the rest of the topic matches too.
                        bad = bad.or(Some(BadCapture { pos: *pos }));
                        continue;
                    }
                },
                _ => continue,
            };
            let pushed = captures.push(value);
            debug_assert!(pushed.is_ok(), "compile caps the captures at MAX_CAPTURES");
        }
        if topic.next().is_some() {
            return None;
        }
        Some(bad.map_or(Ok(captures), Err))
    }
}

/// The levels of `filter`: the one reading of the filter grammar (module doc), for compiling and
/// for config validation. With `fields` unknown, a capture is taken as a string field.
fn parse_levels(filter: &str, fields: Option<&[Field]>) -> Result<Vec<Level>, String> {
    if filter.is_empty() || filter.contains('\0') {
        return Err("a topic filter may not be empty or contain NUL".into());
    }
    let count = filter.split('/').count();
    let mut levels = Vec::with_capacity(count);
    for (i, text) in filter.split('/').enumerate() {
        let level = match text {
            "#" if i + 1 == count => Level::Rest,
            "#" => return Err("'#' must be the last level (and fill a whole level)".into()),
            "+" => Level::Any,
            _ if text.starts_with('+') && !text[1..].contains(['+', '#']) => capture(&text[1..], fields)?,
            _ if text.contains(['+', '#']) => {
                return Err(format!("level {text:?}: '+' and '#' must fill a whole level"));
            }
            _ => Level::Literal(text.into()),
        };
        levels.push(level);
    }
    let captured: Vec<usize> =
        levels.iter().filter_map(|l| if let Level::Capture { pos, .. } = l { Some(*pos) } else { None }).collect();
    if captured.len() > MAX_CAPTURES {
        return Err(format!("at most {MAX_CAPTURES} captures in one filter"));
    }
    if let Some(fields) = fields {
        for (i, &pos) in captured.iter().enumerate() {
            if captured[..i].contains(&pos) {
                return Err(format!("field {} is captured twice", fields[pos].name));
            }
        }
    }
    Ok(levels)
}

fn capture(name: &str, fields: Option<&[Field]>) -> Result<Level, String> {
    let Some(fields) = fields else { return Ok(Level::Capture { pos: usize::MAX, int: false }) };
    let pos =
        fields.iter().position(|f| f.name == name).ok_or_else(|| format!("capture +{name} names no declared field"))?;
    match fields[pos].ty {
        FieldType::String => Ok(Level::Capture { pos, int: false }),
        FieldType::Int => Ok(Level::Capture { pos, int: true }),
        other => Err(format!("capture +{name} names a {other} field; a topic level is a string or int")),
    }
}

/// Canonical decimal i64: `-`?, then `0` or a non-zero digit and digits; no `-0`.
fn parse_int(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let canonical = match digits.as_bytes() {
        [b'0'] => digits.len() == text.len(),
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if canonical { text.parse().ok() } else { None }
}

/// The filters of all streams of one source.
#[derive(Clone, Debug, Default)]
pub struct Router {
    filters: Vec<(usize, TopicFilter)>,
}

impl Router {
    /// Adds the filter of the stream with index `stream`.
    pub fn add(&mut self, stream: usize, filter: TopicFilter) {
        self.filters.push((stream, filter));
    }

    /// Every stream whose filter `topic` matches, in the order they were added. The topic is
    /// split once for all filters (a topic of more than [`SPLIT_ONCE`] levels, by each).
    pub fn route<'t>(&self, topic: &'t str) -> impl Iterator<Item = (usize, Result<Captures<'t>, BadCapture>)> {
        let mut levels = TopicLevels::new();
        let split_once = topic.split('/').all(|level| levels.push(level).is_ok());
        self.filters.iter().filter_map(move |(stream, filter)| {
            let found = if split_once { filter.matches_levels(levels.iter().copied()) } else { filter.matches(topic) };
            found.map(|m| (*stream, m))
        })
    }
}

/// Levels of a topic that [`Router::route`] splits once for all filters: device topics have a
/// handful; a longer one is split by each filter instead.
const SPLIT_ONCE: usize = 16;

type TopicLevels<'t> = heapless::Vec<&'t str, SPLIT_ONCE>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::TimeSpec;
    use crate::record::schema::Field;
    use proptest::prelude::*;

    fn schema(fields: &[(&str, FieldType)]) -> Schema {
        let fields = fields.iter().map(|(n, ty)| Field { name: n.to_string(), ty: *ty, nullable: false }).collect();
        Schema::new(fields, Some(0), TimeSpec::Ingest)
    }

    fn status() -> Schema {
        schema(&[("device", FieldType::String), ("n", FieldType::Int), ("temp", FieldType::Float)])
    }

    fn filter(f: &str) -> TopicFilter {
        TopicFilter::compile(f, &status()).expect("valid filter")
    }

    /// The captures of a match, `None` for no match; panics on a bad capture.
    fn caps(f: &str, topic: &str) -> Option<Vec<(usize, Captured<'static>)>> {
        let topic: &'static str = Box::leak(topic.into());
        filter(f).matches(topic).map(|m| m.expect("good captures").to_vec())
    }

    #[test]
    fn literals_and_plus() {
        assert_eq!(caps("devices/+device/status", "devices/d1/status"), Some(vec![(0, Captured::Str("d1"))]));
        assert_eq!(caps("devices/+device/status", "devices/d1/command"), None);
        assert_eq!(caps("devices/+device/status", "devices/d1/status/x"), None);
        assert_eq!(caps("devices/+device/status", "devices/d1"), None);
        assert_eq!(caps("devices/+/status", "devices/d1/status"), Some(vec![]));
        assert_eq!(caps("Devices/+", "devices/d1"), None, "literals are case-sensitive");
    }

    #[test]
    fn plus_matches_an_empty_level() {
        assert_eq!(caps("a/+", "a/"), Some(vec![]));
        assert_eq!(caps("+/a", "/a"), Some(vec![]));
        assert_eq!(caps("a/+", "a"), None);
        assert_eq!(caps("a//b", "a//b"), Some(vec![]));
        assert_eq!(caps("a//b", "a/b"), None);
    }

    #[test]
    fn hash_matches_zero_or_more_levels() {
        for topic in ["a", "a/", "a/b", "a/b/c", "a//"] {
            assert_eq!(caps("a/#", topic), Some(vec![]), "{topic}");
        }
        assert_eq!(caps("a/#", "ab"), None);
        assert_eq!(caps("a/#", "b/a"), None);
        assert_eq!(caps("#", "x/y"), Some(vec![]));
        assert_eq!(caps("+device/#", "d1"), Some(vec![(0, Captured::Str("d1"))]));
    }

    #[test]
    fn dollar_topics_need_a_literal_first_level() {
        for f in ["#", "+/info", "+device/info", "+/#"] {
            assert_eq!(caps(f, "$SYS/info"), None, "{f}");
        }
        assert_eq!(caps("$SYS/#", "$SYS/info"), Some(vec![]));
        assert_eq!(caps("$SYS/+device", "$SYS/info"), Some(vec![(0, Captured::Str("info"))]));
        assert_eq!(caps("a/+device", "a/$x"), Some(vec![(0, Captured::Str("$x"))]), "only the first level");
    }

    #[test]
    fn int_captures_are_canonical() {
        for (level, n) in [("0", 0), ("7", 7), ("-12", -12), ("9223372036854775807", i64::MAX)] {
            assert_eq!(caps("d/+n", &format!("d/{level}")), Some(vec![(1, Captured::Int(n))]), "{level}");
        }
        assert_eq!(caps("d/+n", "d/-9223372036854775808"), Some(vec![(1, Captured::Int(i64::MIN))]));
        for level in ["", "+7", "007", "00", "-0", "-", "1e3", "7 ", " 7", "0x1", "9223372036854775808", "1.0"] {
            let f = filter("d/+n");
            assert_eq!(f.matches(&format!("d/{level}")), Some(Err(BadCapture { pos: 1 })), "{level:?}");
        }
    }

    #[test]
    fn an_empty_capture_is_a_bad_capture() {
        let f = filter("devices/+device/status");
        let err = f.matches("devices//status").expect("matches").expect_err("empty capture");
        assert_eq!(err.label(&status()), "bad_topic_capture:device");
        assert_eq!(f.matches("devices//command"), None, "a literal level differs: no match, no report");
        assert_eq!(filter("+device/#").matches("/x"), Some(Err(BadCapture { pos: 0 })));
    }

    #[test]
    fn a_bad_int_counts_only_when_the_rest_matches() {
        let f = filter("d/+n/status");
        assert_eq!(f.matches("d/x/command"), None);
        assert_eq!(f.matches("d/x/status/more"), None);
        let err = f.matches("d/x/status").expect("matches").expect_err("bad int");
        assert_eq!(err.label(&status()), "bad_topic_capture:n");
    }

    #[test]
    fn several_captures_in_level_order() {
        let got = caps("site/+n/+device/#", "site/3/d1/x/y");
        assert_eq!(got, Some(vec![(1, Captured::Int(3)), (0, Captured::Str("d1"))]));
        assert_eq!(Captured::Str("d1").to_value(), Value::Str("d1".into()));
        assert_eq!(Captured::Int(3).to_value(), Value::Int(3));
    }

    #[test]
    fn compile_errors() {
        let s = status();
        for (f, why) in [
            ("", "empty"),
            ("a/#/b", "whole level"),
            ("a/b#", "whole level"),
            ("a/+x+", "whole level"),
            ("a/+temp", "float field"),
            ("a/+nope", "no declared field"),
            ("+device/+device", "captured twice"),
            ("a\0", "NUL"),
        ] {
            let err = TopicFilter::compile(f, &s).expect_err(f);
            assert!(err.contains(why), "{f}: {err}");
        }
        let many: Vec<(String, FieldType)> = (0..=MAX_CAPTURES).map(|i| (format!("f{i}"), FieldType::String)).collect();
        let many_schema = schema(&many.iter().map(|(n, t)| (n.as_str(), *t)).collect::<Vec<_>>());
        let f: Vec<String> = many.iter().map(|(n, _)| format!("+{n}")).collect();
        assert!(TopicFilter::compile(&f.join("/"), &many_schema).expect_err("too many").contains("at most"));
        assert!(TopicFilter::compile(&f[1..].join("/"), &many_schema).is_ok());
    }

    #[test]
    fn router_gives_every_matching_stream() {
        let s = status();
        let mut router = Router::default();
        for (stream, f) in
            [(0, "devices/+device/status"), (1, "devices/#"), (2, "devices/+/command"), (3, "+n/x/status")]
        {
            router.add(stream, TopicFilter::compile(f, &s).expect("valid"));
        }
        let got: Vec<_> = router.route("devices/d1/status").collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], (0, Ok(Captures::from_slice(&[(0, Captured::Str("d1"))]).expect("fits"))));
        assert_eq!(got[1], (1, Ok(Captures::new())));
        let got: Vec<_> = router.route("7/x/status").map(|(i, m)| (i, m.is_ok())).collect();
        assert_eq!(got, vec![(3, true)]);
        let got: Vec<_> = router.route("q/x/status").collect();
        assert_eq!(got, vec![(3, Err(BadCapture { pos: 1 }))]);
        assert_eq!(router.route("other").count(), 0);
    }

    /// A filter level: a literal, `+` or a `+fN` capture.
    #[derive(Clone, Debug)]
    enum Gen {
        Literal(String),
        Any,
        Capture,
    }

    const LEVEL: &str = "[a-z0-9$ ._-]{0,5}";
    /// A level a capture takes (an empty one is a bad capture).
    const FILLED_LEVEL: &str = "[a-z0-9$ ._-]{1,5}";

    proptest! {
        #[test]
        fn filled_filters_match_and_give_back_their_levels(
            shape in prop::collection::vec(
                prop_oneof![LEVEL.prop_map(Gen::Literal), Just(Gen::Any), Just(Gen::Capture)], 1..7),
            fills in prop::collection::vec(FILLED_LEVEL, 7),
            hash in any::<bool>(),
            tail in prop::collection::vec(LEVEL, 0..3),
        ) {
            let names: Vec<String> = (0..7).map(|i| format!("f{i}")).collect();
            let s = schema(&names.iter().map(|n| (n.as_str(), FieldType::String)).collect::<Vec<_>>());
            let (mut f, mut topic, mut expected) = (Vec::new(), Vec::new(), Vec::new());
            for (i, level) in shape.iter().enumerate() {
                match level {
                    Gen::Literal(l) => { f.push(l.clone()); topic.push(l.clone()); }
                    Gen::Any => { f.push("+".into()); topic.push(fills[i].clone()); }
                    Gen::Capture => {
                        f.push(format!("+f{i}"));
                        topic.push(fills[i].clone());
                        expected.push((i, fills[i].clone()));
                    }
                }
            }
            if hash {
                f.push("#".into());
                topic.extend(tail);
            }
            let (f, topic) = (f.join("/"), topic.join("/"));
            prop_assume!(!f.is_empty());
            let compiled = TopicFilter::compile(&f, &s).expect("valid filter");
            let reserved = topic.starts_with('$') && !matches!(shape[0], Gen::Literal(_));
            match compiled.matches(&topic) {
                None => prop_assert!(reserved, "{f} must match {topic}"),
                Some(m) => {
                    prop_assert!(!reserved);
                    let got: Vec<(usize, String)> = m.expect("string captures").iter()
                        .map(|(pos, c)| match c { Captured::Str(s) => (*pos, s.to_string()), Captured::Int(_) => unreachable!() })
                        .collect();
                    prop_assert_eq!(got, expected);
                }
            }
        }

        /// The router splits a topic once for all filters (up to `SPLIT_ONCE` levels) and finds
        /// what each filter finds on its own, in filter order, over topics of 1 to 20 levels.
        /// Filters are made from the topic (its levels, `+`, captures; one level fewer or more;
        /// `#`), so that most match it.
        #[test]
        fn routing_finds_what_each_filter_finds(
            topic in prop::collection::vec("[ab$]{0,1}|7", 1..21),
            filters in prop::collection::vec(
                (-1i32..=1, prop::collection::vec(0u8..3, 21), any::<bool>()), 1..5),
        ) {
            let s = status();
            let mut router = Router::default();
            let mut compiled = Vec::new();
            for (i, (more, kinds, hash)) in filters.iter().enumerate() {
                let len = usize::try_from(topic.len() as i32 + more).unwrap_or(0);
                // The first capture goes to the int field, the second to the string one.
                let mut fields = ["+n", "+device"].into_iter();
                let mut levels: Vec<String> = (0..len)
                    .map(|l| match kinds[l] {
                        0 => topic.get(l).cloned().unwrap_or_else(|| "a".into()),
                        1 => "+".into(),
                        _ => fields.next().unwrap_or("+").into(),
                    })
                    .collect();
                if *hash {
                    levels.push("#".into());
                }
                // An empty filter (no level, or one empty level) is refused; the rest are valid.
                let Ok(filter) = TopicFilter::compile(&levels.join("/"), &s) else { continue };
                router.add(i, filter.clone());
                compiled.push((i, filter));
            }
            let topic = topic.join("/");
            let expected: Vec<_> =
                compiled.iter().filter_map(|(i, f)| f.matches(&topic).map(|m| (*i, m))).collect();
            prop_assert_eq!(router.route(&topic).collect::<Vec<_>>(), expected);
        }
    }
}
