#![allow(clippy::unwrap_used)]
//! Robustness: the parts of braid that read untrusted text never panic, whatever they are given.
//!
//! - `braid::config::parse` on arbitrary strings and on mutated valid configurations (byte and
//!   line deletions, inserted keys, duplicated and swapped lines); its error display too, since
//!   that maps byte offsets to lines and columns;
//! - `braid::record::decode::decode_line` on arbitrary bytes and on mutated valid JSON lines, for
//!   each event-time unit (ms, s, rfc3339);
//! - `braid::time::rfc3339::parse_ms` on arbitrary strings and on near-valid date-times (and, on
//!   valid ones, the epoch ms of an independent day count);
//! - `braid replay` on a file of random lines: exit 0, and every non-blank line lands either in
//!   the stream's output or in `dead_letter`.
//!
//! Cases per property are kept small (≤ 64; the replay property spawns a process per case);
//! `ROBUSTNESS_SCALE=N` runs N times as many.

use crate::common;

use base64::Engine as _;
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Value as Json, json};

use braid::record::decode::decode_line;
use braid::record::schema::Field;
use braid::record::{FieldType, Schema, TimeSpec, TimeUnit};
use common::BASE_TS;
use common::run::{RUN_TIMEOUT, read_jsonl, replay_command, run_with_timeout, write_file};

/// `cases` per property; `ROBUSTNESS_SCALE=N` multiplies them for a longer hunt by hand.
fn config(cases: u32) -> Config {
    let scale = std::env::var("ROBUSTNESS_SCALE").ok().and_then(|s| s.parse::<u32>().ok()).unwrap_or(1).max(1);
    // No regression files are written next to the tests; a failure prints its minimal input.
    Config { cases: cases.saturating_mul(scale), failure_persistence: None, ..Config::default() }
}

// ---------------------------------------------------------------------------------- config ---

const VALID_CONFIG: &str = r#"[runtime]
shards = "auto"
state_dir = "/var/lib/braid"
durability = "process"
checkpoint_interval = "1s"
idle_advance = true

[ops]
listen = "127.0.0.1:9464"

[sources.devices]
kind = "mqtt"
url = "mqtt://127.0.0.1:1883"

[streams.status]
source = "devices"
topic = "devices/+device/status"
key = "device"
time = { field = "ts", unit = "ms" }
max_out_of_orderness = "500ms"
idle_timeout = "5s"
fields = { device = "string", ts = "int", temp = "float", state = "string", seq = "int" }

[streams.command]
source = "devices"
topic = "devices/+device/command"
key = "device"
time = { field = "ts", unit = "ms" }
max_out_of_orderness = "500ms"
idle_timeout = "5s"
fields = { device = "string", ts = "int", cmd = "string", arg = "string", cmd_id = "string" }

[operators.effect]
kind = "interval_join"
left = "command"
right = "status"
lower = "-3s"
upper = "5s"
lower_exclusive = false
upper_exclusive = false
join = "inner"
select = ["left.cmd_id", "left.device", "right.seq", "right.ts AS status_ts"]

[operators.again]
kind = "interval_join"
left = "effect"
right = "status"
lower = "0s"
upper = "1s"
join = "left"
select = ["left.cmd_id", "right.temp"]
key = "cmd_id"

[sinks.cloud]
kind = "mqtt"
inputs = ["effect"]
url = "mqtts://cloud.example.com:8883"
topic = "gateways/gw1/effect/{device}"
qos = 1
buffer = "256MiB"

[sinks.archive]
kind = "file"
inputs = ["effect", "effect.late", "dead_letter"]
path = "/var/lib/braid/effect.jsonl"
"#;

/// Keys and values a mutation may insert: real ones in wrong places, and junk.
const KEYS: [&str; 14] = [
    "kind",
    "left",
    "right",
    "lower",
    "upper",
    "select",
    "key",
    "time",
    "fields",
    "inputs",
    "[streams.x]",
    "[operators.status]",
    "[[sinks.archive]]",
    "time.unit",
];
const VALUES: [&str; 14] = [
    "\"*\"",
    "\"-3s\"",
    "\"\"",
    "5",
    "-1",
    "1e400",
    "true",
    "[]",
    "[\"left.ts AS _id\"]",
    "{ field = \"ts\" }",
    "{}",
    "\"dead_letter\"",
    "\"status\"",
    "\"é\u{0}\"",
];

#[derive(Clone, Debug)]
enum Mutation {
    DeleteByte(usize),
    InsertByte(usize, u8),
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    InsertKey(usize, usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::DeleteByte),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::InsertByte(i, b)),
        any::<usize>().prop_map(Mutation::DeleteLine),
        any::<usize>().prop_map(Mutation::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        (any::<usize>(), 0..KEYS.len(), 0..VALUES.len()).prop_map(|(l, k, v)| Mutation::InsertKey(l, k, v)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

/// Applies `mutations` to the bytes of `text`, line- or byte-wise.
fn mutate(text: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = text.to_vec();
    for m in mutations {
        let mut lines: Vec<Vec<u8>> = bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
        let n = lines.len();
        match *m {
            Mutation::DeleteByte(i) if !bytes.is_empty() => {
                bytes.remove(i % bytes.len());
                continue;
            }
            Mutation::InsertByte(i, b) => {
                bytes.insert(i % (bytes.len() + 1), b);
                continue;
            }
            Mutation::Truncate(i) => {
                bytes.truncate(i % (bytes.len() + 1));
                continue;
            }
            Mutation::DeleteByte(_) => continue,
            Mutation::DeleteLine(i) => {
                lines.remove(i % n);
            }
            Mutation::DuplicateLine(i) => {
                let line = lines[i % n].clone();
                lines.insert(i % n, line);
            }
            Mutation::SwapLines(a, b) => lines.swap(a % n, b % n),
            Mutation::InsertKey(l, k, v) => {
                let key = KEYS[k];
                let line = if key.starts_with('[') { key.to_owned() } else { format!("{key} = {}", VALUES[v]) };
                lines.insert(l % (n + 1), line.into_bytes());
            }
        }
        bytes = lines.join(&b'\n');
    }
    bytes
}

/// Parses `text`; on errors also renders them (offset → line:column) and checks their shape.
fn parse_and_render(text: &str) {
    match braid::config::parse("f.toml", text) {
        Ok(plan) => {
            // What validated is usable: names resolve.
            for op in &plan.operators {
                assert_eq!(plan.operator(&op.name).map(|i| &plan.operators[i].name), Some(&op.name));
            }
        }
        Err(errors) => {
            assert!(!errors.errors.is_empty(), "an invalid config has at least one error");
            let shown = errors.to_string();
            assert_eq!(shown.lines().count(), errors.errors.len(), "one line per error:\n{shown}");
            for line in shown.lines() {
                let mut parts = line.splitn(4, ':');
                assert_eq!(parts.next(), Some("f.toml"), "{line}");
                let l: usize = parts.next().unwrap().parse().unwrap();
                let c: usize = parts.next().unwrap().parse().unwrap();
                assert!(l >= 1 && c >= 1, "{line}");
                assert!(l <= text.split('\n').count(), "line beyond the end of the text: {line}");
            }
        }
    }
}

#[test]
fn the_base_config_is_valid() {
    // Otherwise the mutation property below would only ever mutate an invalid config.
    assert!(braid::config::parse("f.toml", VALID_CONFIG).is_ok());
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn config_parse_never_panics_on_arbitrary_text(text in any::<String>()) {
        parse_and_render(&text);
    }

    #[test]
    fn config_parse_never_panics_on_toml_like_text(text in "([a-z_.\"\\[\\]={}, 0-9-]{0,30}\n){0,12}") {
        parse_and_render(&text);
    }

    #[test]
    fn config_parse_never_panics_on_mutated_configs(mutations in prop::collection::vec(mutation(), 1..8)) {
        let bytes = mutate(VALID_CONFIG.as_bytes(), &mutations);
        parse_and_render(&String::from_utf8_lossy(&bytes));
    }
}

// ---------------------------------------------------------------------------------- decode ---

fn field(name: &str, ty: FieldType) -> Field {
    Field { name: name.to_owned(), ty, nullable: false }
}

/// `k` (key), `ts` (the event time, typed for `unit`), and one field of every other type.
fn schema(unit: TimeUnit) -> Schema {
    let ts_type = match unit {
        TimeUnit::Ms => FieldType::Int,
        TimeUnit::S => FieldType::Float,
        TimeUnit::Rfc3339 => FieldType::String,
    };
    let fields = vec![
        field("k", FieldType::String),
        field("ts", ts_type),
        field("n", FieldType::Int),
        field("x", FieldType::Float),
        field("b", FieldType::Bool),
        field("raw", FieldType::Bytes),
    ];
    Schema::new(fields, Some(0), TimeSpec::Field { pos: 1, unit })
}

const UNITS: [TimeUnit; 3] = [TimeUnit::Ms, TimeUnit::S, TimeUnit::Rfc3339];

/// Numbers at the edges of what JSON, doubles and i64 hold.
fn edge_number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| format!("{f:e}")),
        Just("9223372036854775807".to_owned()),
        Just("9223372036854775808".to_owned()),
        Just("-9223372036854775809".to_owned()),
        Just("9.223372036854775807e18".to_owned()),
        Just("-9.223372036854775808e18".to_owned()),
        Just("1e308".to_owned()),
        Just("1e309".to_owned()),
        Just("-0".to_owned()),
        Just("-0.0".to_owned()),
        Just("0.0005".to_owned()),
        Just("123456789012345678901234567890".to_owned()),
    ]
}

/// A date-time string, mostly valid RFC 3339.
fn date_time_text() -> impl Strategy<Value = String> {
    (
        1u32..=9999,
        1u32..=12,
        1u32..=31,
        0u32..=23,
        0u32..=59,
        0u32..=59,
        "(\\.[0-9]{1,9})?",
        "(Z|z|[+-][0-2][0-9]:[0-5][0-9])",
    )
        .prop_map(|(y, mo, d, h, mi, s, frac, zone)| format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{frac}{zone}"))
}

/// A JSON line of `schema(unit)`, valid except where the generated values are not.
fn json_line(unit: TimeUnit) -> impl Strategy<Value = String> {
    let ts = match unit {
        TimeUnit::Ms => edge_number().boxed(),
        TimeUnit::S => prop_oneof![edge_number(), (-1e12f64..1e12).prop_map(|f| f.to_string())].boxed(),
        TimeUnit::Rfc3339 => date_time_text().prop_map(|s| json!(s).to_string()).boxed(),
    };
    (
        any::<String>(),
        ts,
        edge_number(),
        edge_number(),
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 0..12),
        prop::option::of(edge_number()),
        any::<bool>(),
    )
        .prop_map(|(k, ts, n, x, b, raw, arrival, extra)| {
            let raw = base64::engine::general_purpose::STANDARD.encode(raw);
            let mut line =
                format!("{{\"k\":{},\"ts\":{ts},\"n\":{n},\"x\":{x},\"b\":{b},\"raw\":{}", json!(k), json!(raw));
            if let Some(arrival) = arrival {
                line.push_str(&format!(",\"arrival\":{arrival}"));
            }
            if extra {
                line.push_str(",\"extra\":[1,{\"deep\":[null,\"\\ud800\"]}]");
            }
            line.push('}');
            line
        })
}

fn mutate_bytes(line: &str, edits: &[(usize, Option<u8>)]) -> Vec<u8> {
    let mut bytes = line.as_bytes().to_vec();
    for &(i, b) in edits {
        match b {
            Some(b) => bytes.insert(i % (bytes.len() + 1), b),
            None if !bytes.is_empty() => {
                bytes.remove(i % bytes.len());
            }
            None => {}
        }
    }
    bytes
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn time_window_check_never_overflows(ts in any::<i64>(), arrival in any::<i64>(), age in any::<i64>(), skew in any::<i64>()) {
        let inside = braid::record::decode::check_time_window(ts, arrival, age, skew).is_ok();
        let (ts, arrival) = (i128::from(ts), i128::from(arrival));
        prop_assert_eq!(inside, arrival - i128::from(age) <= ts && ts <= arrival + i128::from(skew));
    }
}

#[test]
fn a_plain_valid_line_decodes() {
    let line = br#"{"k":"dev","ts":1767225600000,"n":1,"x":2.5,"b":true,"raw":"AAE="}"#;
    let decoded = decode_line(&schema(TimeUnit::Ms), line, 1024);
    assert_eq!(decoded.outcome.map(|f| f.ts).unwrap(), Some(1_767_225_600_000));
    assert_eq!(decoded.arrival, Some(1_767_225_600_000));
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn decode_never_panics_on_arbitrary_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        max_payload in prop_oneof![Just(u64::MAX), 0u64..300],
    ) {
        for unit in UNITS {
            let _ = decode_line(&schema(unit), &bytes, max_payload);
        }
    }

    #[test]
    fn decode_never_panics_on_json_lines(
        unit in prop::sample::select(UNITS.to_vec()),
        line in prop::sample::select(UNITS.to_vec()).prop_flat_map(json_line),
        edits in prop::collection::vec((any::<usize>(), prop::option::of(any::<u8>())), 0..6),
        max_payload in prop_oneof![Just(256 * 1024u64), 0u64..400],
    ) {
        // The line is generated for some unit and decoded with every schema (a type mismatch is
        // as untrusted as a mutation).
        let schema = schema(unit);
        let _ = decode_line(&schema, line.as_bytes(), max_payload);
        let bytes = mutate_bytes(&line, &edits);
        let _ = decode_line(&schema, &bytes, max_payload);
    }

    #[test]
    fn decode_never_panics_on_generated_lines_of_its_own_unit(
        (unit, line) in prop::sample::select(UNITS.to_vec()).prop_flat_map(|u| (Just(u), json_line(u))),
        edits in prop::collection::vec((any::<usize>(), prop::option::of(any::<u8>())), 0..4),
    ) {
        let schema = schema(unit);
        let _ = decode_line(&schema, line.as_bytes(), u64::MAX);
        let _ = decode_line(&schema, &mutate_bytes(&line, &edits), u64::MAX);
    }
}

// --------------------------------------------------------------------------------- rfc3339 ---

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn month_days(y: i64, m: i64) -> i64 {
    [31, if is_leap(y) { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][(m - 1) as usize]
}

/// Days from 1970-01-01 by counting whole years and months (independent of braid's formula).
fn days_since_epoch(y: i64, m: i64, d: i64) -> i64 {
    let mut days = 0;
    if y >= 1970 {
        for year in 1970..y {
            days += if is_leap(year) { 366 } else { 365 };
        }
    } else {
        for year in y..1970 {
            days -= if is_leap(year) { 366 } else { 365 };
        }
    }
    for month in 1..m {
        days += month_days(y, month);
    }
    days + d - 1
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn rfc3339_never_panics_on_arbitrary_text(s in any::<String>()) {
        let _ = braid::time::rfc3339::parse_ms(&s);
    }

    #[test]
    fn rfc3339_never_panics_on_near_date_times(
        s in date_time_text(),
        edits in prop::collection::vec((any::<usize>(), prop::option::of(prop_oneof![
            Just('0'), Just('9'), Just('-'), Just(':'), Just('.'), Just('Z'), Just('+'), Just('é'), Just('٣'),
        ])), 0..4),
    ) {
        let _ = braid::time::rfc3339::parse_ms(&s);
        let mut chars: Vec<char> = s.chars().collect();
        for (i, c) in edits {
            match c {
                Some(c) => chars.insert(i % (chars.len() + 1), c),
                None if !chars.is_empty() => {
                    chars.remove(i % chars.len());
                }
                None => {}
            }
        }
        let mutated: String = chars.into_iter().collect();
        let _ = braid::time::rfc3339::parse_ms(&mutated);
    }

    #[test]
    fn rfc3339_valid_date_times_give_their_epoch_ms(
        y in 1i64..=9999, mo in 1i64..=12, d in 1i64..=31, h in 0i64..=23, mi in 0i64..=59, s in 0i64..=59,
        frac in "[0-9]{0,7}",
        zone in prop::option::of((any::<bool>(), 0i64..=23, 0i64..=59)),
    ) {
        let text = format!(
            "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{}{}",
            if frac.is_empty() { String::new() } else { format!(".{frac}") },
            zone.map_or("Z".to_owned(), |(plus, oh, om)| format!("{}{oh:02}:{om:02}", if plus { '+' } else { '-' })),
        );
        let parsed = braid::time::rfc3339::parse_ms(&text);
        if d > month_days(y, mo) {
            prop_assert_eq!(parsed, None, "{}", text);
        } else {
            let millis: i64 = format!("{frac:0<3}")[..3].parse().unwrap();
            let offset = zone.map_or(0, |(plus, oh, om)| (oh * 3600 + om * 60) * if plus { 1 } else { -1 });
            let seconds = days_since_epoch(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset;
            prop_assert_eq!(parsed, Some(seconds * 1000 + millis), "{}", text);
        }
    }
}

// ---------------------------------------------------------------------------------- replay ---

const REPLAY_CONFIG: &str = r#"[streams.a]
key = "k"
time = { field = "ts", unit = "ms" }
max_payload = "200B"
fields = { k = "string", ts = "int", v = "float" }
"#;

#[derive(Clone, Debug)]
enum InputLine {
    /// Random bytes (no newline).
    Random(Vec<u8>),
    /// A valid row of stream `a`, without `arrival`: it must reach the stream output.
    Valid {
        k: String,
        ts: i64,
        v: f64,
    },
    /// A valid row with a few random byte edits.
    Mutated(Vec<u8>),
    Blank(String),
}

fn valid_row(k: &str, ts: i64, v: f64) -> String {
    json!({ "k": k, "ts": ts, "v": v }).to_string()
}

fn input_line() -> impl Strategy<Value = InputLine> {
    let row = ("[a-z]{0,3}", 0i64..50_000, -1e6f64..1e6);
    prop_oneof![
        3 => prop::collection::vec(any::<u8>().prop_filter("no newline", |&b| b != b'\n'), 0..300).prop_map(InputLine::Random),
        2 => row.clone().prop_map(|(k, ts, v)| InputLine::Valid { k, ts: BASE_TS + ts, v }),
        2 => (row, prop::collection::vec((any::<usize>(), prop::option::of(any::<u8>())), 1..4)).prop_map(
            |((k, ts, v), edits)| {
                let mut bytes = mutate_bytes(&valid_row(&k, BASE_TS + ts, v), &edits);
                bytes.retain(|&b| b != b'\n');
                InputLine::Mutated(bytes)
            }
        ),
        1 => "[ \t\r]{0,3}".prop_map(InputLine::Blank),
    ]
}

impl InputLine {
    fn bytes(&self) -> Vec<u8> {
        match self {
            InputLine::Random(b) | InputLine::Mutated(b) => b.clone(),
            InputLine::Valid { k, ts, v } => valid_row(k, *ts, *v).into_bytes(),
            InputLine::Blank(s) => s.clone().into_bytes(),
        }
    }
}

/// braid's blank line: nothing but ASCII whitespace once a trailing CR is cut.
fn is_blank(line: &[u8]) -> bool {
    line.strip_suffix(b"\r").unwrap_or(line).iter().all(u8::is_ascii_whitespace)
}

proptest! {
    #![proptest_config(config(8))]

    #[test]
    fn replay_of_random_lines_loses_nothing(lines in prop::collection::vec(input_line(), 0..40), crlf in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let config = write_file(dir.path(), "config.toml", REPLAY_CONFIG);
        let separator: &[u8] = if crlf { b"\r\n" } else { b"\n" };
        let bytes = lines.iter().map(InputLine::bytes).collect::<Vec<_>>().join(separator);
        let input = write_file(dir.path(), "a.in", &bytes);
        let (out, dead) = (dir.path().join("a.jsonl"), dir.path().join("dead.jsonl"));
        let outputs = [("a".to_owned(), out.clone()), ("dead_letter".to_owned(), dead.clone())];
        let mut cmd = replay_command(&config, Some(2), &[("a".to_owned(), input)], &outputs);
        let (status, stderr) = run_with_timeout(cmd.env("BRAID_LOG", "error"), RUN_TIMEOUT).unwrap();
        prop_assert_eq!(status.code(), Some(0), "stderr: {}", stderr);

        let file_lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
        let non_blank: Vec<&[u8]> = file_lines.into_iter().filter(|l| !is_blank(l)).collect();
        let (rows, dead_rows) = (read_jsonl(&out).unwrap(), read_jsonl(&dead).unwrap());
        prop_assert_eq!(rows.len() + dead_rows.len(), non_blank.len(), "rows {:?}\ndead {:?}", rows, dead_rows);

        let valid = lines.iter().filter(|l| matches!(l, InputLine::Valid { .. })).count();
        prop_assert!(rows.len() >= valid, "{} valid lines, {} rows", valid, rows.len());
        for row in &rows {
            prop_assert_eq!(row.get("_stream"), Some(&json!("a")), "{}", row);
        }
        let texts: Vec<String> = non_blank
            .iter()
            .map(|l| String::from_utf8_lossy(l.strip_suffix(b"\r").unwrap_or(l)).into_owned())
            .collect();
        for row in &dead_rows {
            prop_assert_eq!(row.get("_stream"), Some(&json!("a")), "{}", row);
            prop_assert!(row.get("_reason").is_some_and(Json::is_string), "{}", row);
            let raw = row.get("raw").and_then(Json::as_str).unwrap_or_default();
            prop_assert!(texts.iter().any(|t| t == raw), "raw {:?} is no input line", raw);
        }
    }
}
