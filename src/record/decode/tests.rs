//! Unit tests of the decoder, and a differential test against the obvious implementation: parse
//! the line into a `serde_json::Value`, then look the declared fields up (what braid did before
//! the single-pass scan). Both must agree on every line, valid or not.

use proptest::prelude::*;
use serde_json::Value as Json;

use super::*;
use crate::record::schema::Field;

/// The reference decoder: `serde_json::Value` first, then the checks in contract order.
mod oracle {
    use base64::Engine as _;
    use serde_json::{Map, Number, Value as Json};

    use super::super::{Decoded, FieldValue, Fields, Reason, seconds_to_ms};
    use crate::record::{FieldType, Schema, TimeSpec, TimeUnit, Value};

    /// Decodes one line (a trailing CR already removed) of a stream with `schema`.
    pub fn decode_line(schema: &Schema, line: &[u8], max_payload: u64) -> Decoded {
        let unusable = |reason| Decoded { arrival: None, outcome: Err(reason) };
        if line.len() as u64 > max_payload {
            return unusable(Reason::Oversized);
        }
        let Ok(text) = std::str::from_utf8(line) else {
            return unusable(Reason::InvalidUtf8);
        };
        // serde_json refuses lone surrogate escapes and numbers beyond a double: both invalid_json.
        let Ok(json) = serde_json::from_str::<Json>(text) else {
            return unusable(Reason::InvalidJson);
        };
        let Json::Object(object) = json else {
            return unusable(Reason::NotAnObject);
        };
        decode_object(schema, &object)
    }

    fn decode_object(schema: &Schema, object: &Map<String, Json>) -> Decoded {
        let time = event_time(schema, object);
        let readable_ts = time.ok().flatten();
        let arrival = match object.get("arrival") {
            None | Some(Json::Null) => None,
            Some(a) => match json_integer(a) {
                Some(a) => Some(a),
                None => return Decoded { arrival: readable_ts, outcome: Err(Reason::BadArrival) },
            },
        };
        let arrival = arrival.or(readable_ts);
        let outcome =
            decode_fields(schema, object).and_then(|values| Ok(Fields { values: detached(values), ts: time? }));
        Decoded { arrival, outcome }
    }

    /// Values as decoded values that need no line (strings owned).
    fn detached(values: Vec<Value>) -> Vec<FieldValue> {
        let detach = |value| match value {
            Value::Bool(b) => FieldValue::Bool(b),
            Value::Int(i) => FieldValue::Int(i),
            Value::Float(f) => FieldValue::Float(f),
            Value::Str(s) => FieldValue::Owned(s),
            Value::Null | Value::IdList(_) => unreachable!("no field is decoded as {value:?}"),
        };
        values.into_iter().map(detach).collect()
    }

    fn decode_fields(schema: &Schema, object: &Map<String, Json>) -> Result<Vec<Value>, Reason> {
        let mut values = Vec::with_capacity(schema.fields.len());
        for (pos, field) in schema.fields.iter().enumerate() {
            let json = match object.get(&field.name) {
                None | Some(Json::Null) => return Err(Reason::MissingField(pos)),
                Some(v) => v,
            };
            values.push(typed_value(field.ty, json).ok_or(Reason::WrongType(pos))?);
        }
        Ok(values)
    }

    /// The value of `json` as a field of type `ty`, or `None` when it is of another type.
    pub fn typed_value(ty: FieldType, json: &Json) -> Option<Value> {
        Some(match (ty, json) {
            (FieldType::String, Json::String(s)) => Value::Str(s.as_str().into()),
            (FieldType::Bytes, Json::String(s)) if is_canonical_base64(s) => Value::Str(s.as_str().into()),
            (FieldType::Int, Json::Number(n)) => Value::Int(json_int(n)?),
            (FieldType::Float, Json::Number(n)) => Value::Float(n.as_f64()?),
            (FieldType::Bool, Json::Bool(b)) => Value::Bool(*b),
            _ => return None,
        })
    }

    /// A JSON integer within int64. serde_json reads the integer `-0` as the double −0.0 (to keep its
    /// sign), so a zero double counts as 0; the cost is that `0.0` and `-0.0` are taken as ints too.
    fn json_int(n: &Number) -> Option<i64> {
        n.as_i64().or_else(|| (n.as_f64() == Some(0.0)).then_some(0))
    }

    fn is_canonical_base64(s: &str) -> bool {
        let engine = base64::engine::general_purpose::STANDARD;
        engine.decode(s).is_ok_and(|bytes| engine.encode(bytes) == s)
    }

    /// Doubles that convert to an i64 exactly: [−2^63, 2^63) (both ends are exact doubles).
    const I64_AS_F64_RANGE: std::ops::Range<f64> = -9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0;

    /// `arrival`: an integral number within int64 (`5.0` counts, `5.5` and `true` do not).
    fn json_integer(json: &Json) -> Option<i64> {
        let Json::Number(n) = json else { return None };
        number_as_integral_i64(n)
    }

    fn number_as_integral_i64(n: &Number) -> Option<i64> {
        if let Some(i) = n.as_i64() {
            return Some(i);
        }
        let f = n.as_f64()?;
        // 2^63 is exactly representable; every double below it and ≥ −2^63 fits an i64.
        (f.fract() == 0.0 && I64_AS_F64_RANGE.contains(&f)).then_some(f as i64)
    }

    /// The event time of the line: `Ok(None)` for ingest time, `Err` when the field is unusable.
    fn event_time(schema: &Schema, object: &Map<String, Json>) -> Result<Option<i64>, Reason> {
        let TimeSpec::Field { pos, unit } = schema.time else {
            return Ok(None);
        };
        let json = match object.get(&schema.fields[pos].name) {
            None | Some(Json::Null) => return Err(Reason::MissingField(pos)),
            Some(v) => v,
        };
        let value = typed_value(schema.fields[pos].ty, json).ok_or(Reason::WrongType(pos))?;
        match (unit, value) {
            (TimeUnit::Ms, Value::Int(ms)) => Ok(Some(ms)),
            (TimeUnit::S, Value::Int(s)) => s.checked_mul(1000).map(Some).ok_or(Reason::TimeOutOfRange),
            (TimeUnit::S, Value::Float(s)) => seconds_to_ms(s).map(Some).ok_or(Reason::TimeOutOfRange),
            (TimeUnit::Rfc3339, Value::Str(s)) => {
                crate::time::rfc3339::parse_ms(&s).map(Some).ok_or(Reason::BadTime(pos))
            }
            // Config validation ties each unit to its field types.
            _ => Err(Reason::WrongType(pos)),
        }
    }
}

fn schema(unit: TimeUnit, time_ty: FieldType) -> Schema {
    let field = |name: &str, ty| Field { name: name.into(), ty, nullable: false };
    Schema::new(
        vec![field("device", FieldType::String), field("ts", time_ty), field("n", FieldType::Int)],
        Some(0),
        TimeSpec::Field { pos: 1, unit },
    )
}

fn reason(line: &str) -> Option<String> {
    let s = schema(TimeUnit::Ms, FieldType::Int);
    decode_line(&s, line.as_bytes(), 1 << 20).outcome.err().map(|r| r.label(&s))
}

#[test]
fn reasons_in_contract_order() {
    assert_eq!(reason("{"), Some("invalid_json".into()));
    assert_eq!(reason("[1]"), Some("not_an_object".into()));
    assert_eq!(reason(r#"{"arrival":1.5,"device":"a","ts":1,"n":1}"#), Some("bad_arrival".into()));
    assert_eq!(reason(r#"{"arrival":true}"#), Some("bad_arrival".into()));
    assert_eq!(reason(r#"{"ts":1,"n":1}"#), Some("missing_field:device".into()));
    assert_eq!(reason(r#"{"device":null,"ts":1,"n":1}"#), Some("missing_field:device".into()));
    assert_eq!(reason(r#"{"device":"a","ts":1,"n":1.0}"#), Some("wrong_type:n".into()));
    assert_eq!(reason(r#"{"device":"a","ts":1,"n":1e3}"#), Some("wrong_type:n".into()));
    assert_eq!(reason(r#"{"device":"a","ts":1,"n":9223372036854775808}"#), Some("wrong_type:n".into()));
    assert_eq!(reason(r#"{"device":"a","ts":1,"n":1e999}"#), Some("invalid_json".into()));
    assert_eq!(reason(r#"{"device":"\ud800","ts":1,"n":1}"#), Some("invalid_json".into()));
    assert_eq!(reason(r#"{"device":"a","ts":1,"n":-9223372036854775808,"x":[]}"#), None);
    assert_eq!(reason(r#"{"device":"a","ts":-0,"n":-0}"#), None);
}

#[test]
fn arrival_falls_back_to_event_time_even_on_a_dead_letter() {
    let s = schema(TimeUnit::Ms, FieldType::Int);
    let d = decode_line(&s, br#"{"device":1,"ts":500}"#, 1 << 20);
    assert_eq!((d.arrival, d.outcome.is_err()), (Some(500), true));
    let d = decode_line(&s, br#"{"device":"a","ts":500,"n":1,"arrival":7.0}"#, 1 << 20);
    assert_eq!(d.arrival, Some(7));
    let d = decode_line(&s, br#"{"arrival":"x","ts":9}"#, 1 << 20);
    assert_eq!((d.arrival, d.outcome.unwrap_err()), (Some(9), Reason::BadArrival));
}

#[test]
fn seconds_round_half_away_from_zero() {
    let s = schema(TimeUnit::S, FieldType::Float);
    let ts = |line: &str| decode_line(&s, line.as_bytes(), 1 << 20).outcome.unwrap().ts;
    assert_eq!(ts(r#"{"device":"a","ts":1.0005,"n":1}"#), Some((1.0005f64 * 1000.0).round() as i64));
    assert_eq!(ts(r#"{"device":"a","ts":0.0025,"n":1}"#), Some(3));
    assert_eq!(ts(r#"{"device":"a","ts":-0.0025,"n":1}"#), Some(-3));
    assert_eq!(ts(r#"{"device":"a","ts":2,"n":1}"#), Some(2000));
    let big = decode_line(&s, br#"{"device":"a","ts":1e300,"n":1}"#, 1 << 20);
    assert_eq!(big.outcome.unwrap_err(), Reason::TimeOutOfRange);
}

#[test]
fn bytes_must_be_canonical_base64() {
    assert_eq!(oracle::typed_value(FieldType::Bytes, &Json::from("aGk=")), Some(Value::Str("aGk=".into())));
    assert_eq!(oracle::typed_value(FieldType::Bytes, &Json::from("aGk")), None);
    assert_eq!(oracle::typed_value(FieldType::Bytes, &Json::from("aGl=")), None);
    assert_eq!(oracle::typed_value(FieldType::Bytes, &Json::from("")), Some(Value::Str("".into())));
}

#[test]
fn topic_captures_fill_absent_fields_and_must_agree_with_present_ones() {
    let s = schema(TimeUnit::Ms, FieldType::Int);
    let dev7 = [(0, Value::Str("dev-7".into()))];
    let decode = |line: &str, captures: &[(usize, Value)]| {
        let captures: Vec<(usize, ValueRef)> = captures.iter().map(|(pos, v)| (*pos, ValueRef::of(v))).collect();
        decode_payload(&s, line.as_bytes(), 1 << 20, &captures)
    };
    let filled = decode("{\"ts\":5,\"n\":1}", &dev7).outcome.unwrap();
    assert_eq!(filled.to_values(""), [Value::Str("dev-7".into()), Value::Int(5), Value::Int(1)]);
    // A payload that carries the captured value keeps its own, read in place.
    let line = "{\"device\":\"dev-7\",\"ts\":5,\"n\":1}";
    let carried = decode(line, &dev7).outcome.unwrap();
    assert!(matches!(carried.values[0], FieldValue::InLine(_)), "{:?}", carried.values[0]);
    assert_eq!(carried.to_values(line), [Value::Str("dev-7".into()), Value::Int(5), Value::Int(1)]);
    assert!(decode("{\"device\":null,\"ts\":5,\"n\":1}", &dev7).outcome.is_ok());
    let label = |d: Decoded| d.outcome.unwrap_err().label(&s);
    assert_eq!(label(decode("{\"device\":\"dev-8\",\"ts\":5,\"n\":1}", &dev7)), "topic_payload_mismatch:device");
    assert_eq!(label(decode("{\"device\":7,\"ts\":5,\"n\":1}", &dev7)), "wrong_type:device");
    // An int capture compares as an int: 7 and 7.0-as-int agree, "7" is a string.
    let n7 = [(2, Value::Int(7))];
    assert!(decode("{\"device\":\"d\",\"ts\":5,\"n\":7}", &n7).outcome.is_ok());
    assert_eq!(label(decode("{\"device\":\"d\",\"ts\":5,\"n\":8}", &n7)), "topic_payload_mismatch:n");
    assert_eq!(label(decode("{\"device\":\"d\",\"ts\":5,\"n\":\"7\"}", &n7)), "wrong_type:n");
    // Without captures, a payload decodes as a replay line does.
    assert_eq!(decode("{\"ts\":5,\"n\":1}", &[]).outcome.unwrap_err(), Reason::MissingField(0));
}

#[test]
fn oversized_and_invalid_utf8() {
    let s = schema(TimeUnit::Ms, FieldType::Int);
    assert_eq!(decode_line(&s, b"{}", 1).outcome.unwrap_err(), Reason::Oversized);
    assert_eq!(decode_line(&s, b"{\"a\":\"\xff\"}", 100).outcome.unwrap_err(), Reason::InvalidUtf8);
}

fn schemas() -> Vec<Schema> {
    let field = |name: &str, ty| Field { name: name.into(), ty, nullable: false };
    let mut out = Vec::new();
    for (unit, ty) in [
        (TimeUnit::Ms, FieldType::Int),
        (TimeUnit::S, FieldType::Float),
        (TimeUnit::S, FieldType::Int),
        (TimeUnit::Rfc3339, FieldType::String),
    ] {
        out.push(Schema::new(
            vec![
                field("device", FieldType::String),
                field("ts", ty),
                field("n", FieldType::Int),
                field("x", FieldType::Float),
                field("ok", FieldType::Bool),
                field("b", FieldType::Bytes),
            ],
            Some(0),
            TimeSpec::Field { pos: 1, unit },
        ));
    }
    out.push(Schema::new(
        vec![field("arrival", FieldType::Int), field("k", FieldType::String)],
        Some(1),
        TimeSpec::Ingest,
    ));
    out
}

fn json_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        any::<i64>().prop_map(|i| i.to_string()),
        any::<u64>().prop_map(|u| u.to_string()),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| format!("{f:?}")),
        prop::sample::select(vec![
            "-0",
            "0.0",
            "-0.0",
            "1e3",
            "1.5",
            "1e400",
            "-1e400",
            "9223372036854775808",
            "18446744073709551616",
            "\"aGk=\"",
            "\"aGk\"",
            "\"\"",
            "\"\\ud800\"",
            "\"\\u00e9\"",
            "\"1970-01-01T00:00:01.5Z\"",
            "\"2026-02-30T00:00:00Z\"",
            "1700000000000",
            "1700000000.25",
            "[]",
            "[1,{\"a\":1e400}]",
            "{}",
            "{\"y\":[null]}",
        ])
        .prop_map(str::to_owned),
        "[a-z0-9 ]{0,6}".prop_map(|s| format!("{s:?}")),
    ];
    leaf
}

fn json_line() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec!["device", "ts", "n", "x", "ok", "b", "arrival", "k", "other", "de\\u0076ice"]);
    let members = prop::collection::vec((key, json_value()), 0..9);
    (members, prop::sample::select(vec!["", " ", "x", ",", "}", "\n"])).prop_map(|(members, tail)| {
        let body: Vec<String> = members.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}{tail}", body.join(","))
    })
}

fn same(a: &Decoded, b: &Decoded, line: &str) -> bool {
    let outcome = match (&a.outcome, &b.outcome) {
        (Ok(x), Ok(y)) => x.ts == y.ts && x.to_values(line) == y.to_values(line),
        (Err(x), Err(y)) => x == y,
        _ => false,
    };
    outcome && a.arrival == b.arrival
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_single_pass_scan_decodes_like_the_value_tree(line in json_line()) {
        for schema in schemas() {
            let fast = decode_line(&schema, line.as_bytes(), 1 << 20);
            let slow = oracle::decode_line(&schema, line.as_bytes(), 1 << 20);
            prop_assert!(same(&fast, &slow, &line), "line {line}\nscan:   {fast:?}\nvalues: {slow:?}");
            prop_assert_eq!(super::arrival_of_line(&schema.time_only(), line.as_bytes(), 1 << 20), fast.arrival);
            ordering_arrival_agrees(&schema, &line, fast.arrival)?;
        }
    }

    #[test]
    fn and_on_arbitrary_text(line in "\\PC{0,40}") {
        for schema in schemas() {
            let fast = decode_line(&schema, line.as_bytes(), 1 << 20);
            let slow = oracle::decode_line(&schema, line.as_bytes(), 1 << 20);
            prop_assert!(same(&fast, &slow, &line), "line {line:?}\nscan:   {fast:?}\nvalues: {slow:?}");
            prop_assert_eq!(super::arrival_of_line(&schema.time_only(), line.as_bytes(), 1 << 20), fast.arrival);
            ordering_arrival_agrees(&schema, &line, fast.arrival)?;
        }
    }
}

/// Where the decoder reads an arrival, replay's first pass reads the same one.
fn ordering_arrival_agrees(schema: &Schema, line: &str, decoded: Option<i64>) -> Result<(), TestCaseError> {
    let ordering = super::ordering_arrival(&schema.time_only(), line.as_bytes(), 1 << 20);
    if decoded.is_some() {
        prop_assert_eq!(ordering, decoded, "line {:?}", line);
    }
    Ok(())
}

/// The first pass reads the arrival of the common lines without the decoder, and of lines the
/// decoder refuses for what the arrival does not depend on; lines it cannot read (escapes, nested
/// values) go to the decoder.
#[test]
fn ordering_arrival_reads_only_what_the_arrival_depends_on() {
    let schema = &schemas()[0];
    let timing = schema.time_only();
    let quick = |line: &[u8]| {
        super::scan::declared_only(&timing, line).map(|_| super::ordering_arrival(&timing, line, 1 << 20))
    };
    assert_eq!(
        quick(br#"{"device":"dev-00813","ts":1700000000002,"n":4,"x":-1.5e3,"ok":true}"#),
        Some(Some(1700000000002))
    );
    assert_eq!(quick(br#"{"ts":5,"arrival":9}"#), Some(Some(9)));
    assert_eq!(quick(br#"{"ts":5,"ts":7}"#), Some(Some(7)));
    // Refused by the decoder (invalid UTF-8, a leading zero, trailing text), read here all the same.
    let refused: [&[u8]; 3] = [&b"{\"device\":\"\xff\",\"ts\":5}"[..], br#"{"n":01,"ts":5}"#, br#"{"ts":5} x"#];
    for refused in refused {
        assert_eq!(decode_line(schema, refused, 1 << 20).arrival, None);
        assert_eq!(quick(refused), Some(Some(5)));
    }
    let unread: [&[u8]; 3] = [br#"{"de\u0076ice":"a","ts":5}"#, br#"{"y":[1],"ts":5}"#, br#"{"ts":1e3}"#];
    for unread in unread {
        assert_eq!(quick(unread), None, "{}", String::from_utf8_lossy(unread));
        assert_eq!(super::ordering_arrival(&timing, unread, 1 << 20), decode_line(schema, unread, 1 << 20).arrival);
    }
}

#[test]
fn a_payload_decoded_in_the_room_of_the_last_one_decodes_the_same_in_its_allocation() {
    let s = schema(TimeUnit::Ms, FieldType::Int);
    let flat = "{\"device\":\"a\",\"ts\":5,\"n\":1}";
    let lines = [
        flat,
        "{\"n\":2,\"ts\":6,\"device\":\"b\\u0041\"}",
        "{\"ts\":7}",
        "[1]",
        "{\"n\":3,\"ts\":8,\"device\":\"c\"}",
    ];
    let mut room = FieldRoom::default();
    for line in lines.iter().chain(&lines) {
        let in_room = decode_payload_in(&s, line.as_bytes(), 1 << 20, &[], &mut room);
        let alone = decode_line(&s, line.as_bytes(), 1 << 20);
        assert_eq!(in_room.arrival, alone.arrival, "{line}");
        match (in_room.outcome, alone.outcome) {
            (Ok(fields), Ok(expected)) => {
                assert_eq!((fields.to_values(line), fields.ts), (expected.to_values(line), expected.ts), "{line}");
                room.keep(fields);
            }
            (got, expected) => assert_eq!(got.err(), expected.err(), "{line}"),
        }
    }
    // A flat payload (the scanner's own path, not serde_json's) is decoded in the room's allocation:
    // one larger than any line needs shows it.
    room.keep(Fields { values: Vec::with_capacity(64), ts: None });
    let fields = decode_payload_in(&s, flat.as_bytes(), 1 << 20, &[], &mut room).outcome.unwrap();
    assert_eq!(fields.values.capacity(), 64, "decoded in the room it was given");
}
