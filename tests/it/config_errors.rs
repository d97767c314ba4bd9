#![allow(clippy::unwrap_used)]
//! `braid validate` (and `braid replay`) on invalid configurations (CONTRACT.md "Configuration",
//! "Command line"): exit 78, one `FILE:LINE:COL: dotted.path: message` line per error, all of them
//! at once, then `FILE: N configuration error(s)`.
//!
//! Position convention (checked here, counted by hand from the texts below): an error points at
//! the key it is about — for a bad value the key holding it, for an item of a list (`select`,
//! `inputs`) the list's key, for a key inside an inline table (`time = { zone = .. }`) that inner
//! key — and an error about a whole table (a name already used, a reserved name, a missing
//! required key) at the `[` of its `[section.name]` header. Lines and columns count from 1.
//!
//! Besides the inline cases, every `configs/invalid/*.toml` must fail with the error its first
//! line announces (`# expect: LINE:COL PATH: substring`), and every `configs/*.toml` must validate.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::run::{braid, write_file};

/// EX_CONFIG.
const INVALID: i32 = 78;

/// One reported error.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reported {
    line: usize,
    col: usize,
    /// Empty for a TOML syntax error.
    path: String,
    message: String,
}

/// What `braid validate` said about one file.
#[derive(Debug)]
struct Verdict {
    code: i32,
    stderr: String,
    errors: Vec<Reported>,
    /// `PATH: message` of each `FILE:LINE:COL: warning: …` line.
    warnings: Vec<String>,
    /// N of the final `FILE: N configuration error(s)` line, when present.
    summary: Option<usize>,
}

fn run(cmd: &mut Command) -> Output {
    cmd.env("BRAID_LOG", "error").output().unwrap()
}

/// Parses braid's stderr for `file` (the path exactly as given on the command line).
fn verdict(file: &Path, out: &Output) -> Verdict {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let prefix = format!("{}:", file.display());
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut summary = None;
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else { continue };
        if let Some(n) = rest.strip_prefix(' ').and_then(|r| r.strip_suffix(" configuration error(s)")) {
            summary = Some(n.parse().unwrap());
            continue;
        }
        let mut parts = rest.splitn(3, ':');
        let (Some(l), Some(c), Some(tail)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let (Ok(l), Ok(c)) = (l.parse(), c.parse()) else { continue };
        let tail = tail.strip_prefix(' ').unwrap_or(tail);
        if let Some(warning) = tail.strip_prefix("warning: ") {
            warnings.push(warning.to_owned());
            continue;
        }
        // `dotted.path: message`, or only `message` for a syntax error. A path has no spaces.
        let (path, message) = match tail.split_once(": ") {
            Some((p, m)) if !p.is_empty() && !p.contains(char::is_whitespace) => (p.to_owned(), m.to_owned()),
            _ => (String::new(), tail.to_owned()),
        };
        errors.push(Reported { line: l, col: c, path, message });
    }
    Verdict { code: out.status.code().unwrap_or(-1), stderr, errors, warnings, summary }
}

fn validate_file(file: &Path) -> Verdict {
    let out = run(braid().arg("validate").arg("--config").arg(file));
    verdict(file, &out)
}

/// Writes `text` to a fresh temporary `name` and validates it.
fn validate(name: &str, text: &str) -> Verdict {
    let dir = tempfile::tempdir().unwrap();
    validate_file(&write_file(dir.path(), name, text))
}

impl Verdict {
    /// Invalid, with exactly `expected` errors (line, col, path, a phrase of the message), in
    /// file order, and a summary line that counts them.
    fn assert_errors(&self, expected: &[(usize, usize, &str, &str)]) {
        let shown = || format!("stderr:\n{}", self.stderr);
        assert_eq!(self.code, INVALID, "exit status; {}", shown());
        assert_eq!(self.errors.len(), expected.len(), "number of errors; {}", shown());
        assert_eq!(self.summary, Some(expected.len()), "summary line; {}", shown());
        let mut unmatched: Vec<&Reported> = self.errors.iter().collect();
        for &(line, col, path, phrase) in expected {
            let found = unmatched
                .iter()
                .position(|e| e.line == line && e.col == col && e.path == path && e.message.contains(phrase));
            match found {
                Some(i) => {
                    unmatched.remove(i);
                }
                None => panic!("expected {line}:{col}: {path}: ...{phrase}... ; {}", shown()),
            }
        }
        let mut positions: Vec<(usize, usize)> = self.errors.iter().map(|e| (e.line, e.col)).collect();
        let reported = positions.clone();
        positions.sort_unstable();
        assert_eq!(reported, positions, "errors are listed in file order; {}", shown());
    }

    fn assert_valid(&self) {
        assert_eq!(self.code, 0, "exit status (warnings do not change it); stderr:\n{}", self.stderr);
        assert!(self.errors.is_empty(), "stderr:\n{}", self.stderr);
        assert!(self.stderr.contains(": valid"), "stderr:\n{}", self.stderr);
    }
}

// ------------------------------------------------------------------------------ valid config ---

const VALID: &str = r#"[runtime]
shards = 2
idle_advance = false

[ops]
listen = ""

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
fields = { device = "string", ts = "int", temp = "float", seq = "int" }

[streams.command]
key = "device"
time = { field = "ts", unit = "rfc3339" }
idle_timeout = "0ms"
fields = { device = "string", ts = "string", cmd = "string", cmd_id = "string" }

[operators.effect]
kind = "interval_join"
left = "command"
right = "status"
lower = "-3s"
upper = "5s"
lower_exclusive = true
join = "left"
select = ["left.cmd_id", "left.device", "right.seq", "right.ts AS status_ts"]
key = "cmd_id"

[operators.point]
kind = "interval_join"
left = "status"
right = "status"
lower = "1s"
upper = "1s"
select = ["left.temp", "right.temp AS later_temp", "right.device"]

[operators.chained]
kind = "interval_join"
left = "effect"
right = "command"
lower = "0ms"
upper = "2ms"
lower_exclusive = true
upper_exclusive = true
join = "full"
select = ["left.status_ts", "right.cmd AS cmd"]

[sinks.archive]
kind = "file"
inputs = ["effect", "effect.late", "effect.expired", "chained", "dead_letter", "status"]
path = "/tmp/braid-effect.jsonl"

[sinks.cloud]
kind = "mqtt"
inputs = ["point"]
url = "mqtts://cloud.example.com:8883"
topic = "gateways/gw1/point/{device}"
qos = 1
buffer = "256MiB"
"#;

#[test]
fn a_valid_config_exits_0() {
    let verdict = validate("valid.toml", VALID);
    verdict.assert_valid();
    // Its point join (span 0) over a stream out of order by 500 ms draws one warning.
    assert_eq!(verdict.warnings.len(), 1, "{}", verdict.stderr);
    assert!(
        verdict.warnings[0].starts_with("operators.point: status may be out of order by 500 ms"),
        "{}",
        verdict.stderr
    );
}

// ---------------------------------------------------------------------------------- syntax ---

#[test]
fn toml_syntax_error_has_the_parsers_position() {
    let text = r#"[streams.a]
key = "k"
fields = { k = "string" }
idle_timeout = = "5s"
"#;
    let v = validate("syntax.toml", text);
    // The second `=` (column 16) is where a value was expected. No dotted path for a syntax error.
    v.assert_errors(&[(4, 16, "", "")]);
}

#[test]
fn duplicate_table_is_a_syntax_error_at_the_second_header() {
    let text = r#"[streams.a]
key = "k"
fields = { k = "string" }

[streams.a]
key = "k"
"#;
    let v = validate("dup.toml", text);
    assert_eq!(v.code, INVALID, "{}", v.stderr);
    assert_eq!(v.errors.len(), 1, "{}", v.stderr);
    assert_eq!(v.errors[0].line, 5, "{}", v.stderr);
}

// ---------------------------------------------------------------------------- unknown keys ---

#[test]
fn unknown_keys_everywhere_are_all_reported() {
    let text = r#"colour = "blue"

[runtime]
shards = 1
threads = 4

[streams.a]
key = "k"
time = { field = "ts", unit = "ms", zone = "UTC" }
fields = { k = "string", ts = "int" }
spead = 3

[streams.b]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "int", v = "int" }

[operators.j]
kind = "interval_join"
left = "a"
right = "b"
lower = "0s"
upper = "1s"
select = ["right.v"]
flavour = "x"

[sinks.out]
kind = "stdout"
inputs = ["j"]
path = "/tmp/x"
"#;
    validate("unknown.toml", text).assert_errors(&[
        (1, 1, "colour", "unknown key"),
        (5, 1, "runtime.threads", "unknown key"),
        // t-i-m-e ␣ = ␣ { ␣ field ␣ = ␣ "ts" , ␣ unit ␣ = ␣ "ms" , ␣ zone: `zone` starts at column 37.
        (9, 37, "streams.a.time.zone", "unknown key"),
        (11, 1, "streams.a.spead", "unknown key"),
        (25, 1, "operators.j.flavour", "unknown key"),
        // `path` belongs to file sinks only.
        (30, 1, "sinks.out.path", "unknown key"),
    ]);
}

// ------------------------------------------------------------------- references and joins ---

#[test]
fn unknown_inputs_and_key_type_mismatch() {
    let text = r#"[streams.a]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "int", v = "int" }

[streams.n]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "int", ts = "int", w = "int" }

[operators.ghost]
kind = "interval_join"
left = "a"
right = "nowhere"
lower = "0s"
upper = "1s"
select = ["left.v"]

[operators.mixed]
kind = "interval_join"
left = "a"
right = "n"
lower = "0s"
upper = "1s"
select = ["left.v", "right.w"]

[sinks.out]
kind = "stdout"
inputs = ["mixed", "nothing", "ghost.late", "a.late", "mixed.expired", "a.expired"]
"#;
    validate("refs.toml", text).assert_errors(&[
        (14, 1, "operators.ghost.right", "unknown stream or operator"),
        (22, 1, "operators.mixed.right", "key type mismatch"),
        (29, 1, "sinks.out.inputs", "\"nothing\""),
        // `.late` and `.expired` exist for operators only.
        (29, 1, "sinks.out.inputs", "\"a.late\""),
        (29, 1, "sinks.out.inputs", "\"a.expired\""),
    ]);
}

#[test]
fn bounds_that_leave_no_room() {
    let text = r#"[streams.a]
key = "k"
fields = { k = "string", v = "int" }

[streams.b]
key = "k"
fields = { k = "string", v = "int" }

[operators.reversed]
kind = "interval_join"
left = "a"
right = "b"
lower = "2s"
upper = "1s"
select = ["left.v"]

[operators.upper_excl]
kind = "interval_join"
left = "a"
right = "b"
lower = "1s"
upper = "1s"
upper_exclusive = true
select = ["left.v"]

[operators.lower_excl]
kind = "interval_join"
left = "a"
right = "b"
lower = "1s"
upper = "1s"
lower_exclusive = true
select = ["left.v"]

[operators.both_excl]
kind = "interval_join"
left = "a"
right = "b"
lower = "0ms"
upper = "1ms"
lower_exclusive = true
upper_exclusive = true
select = ["left.v"]

[operators.point]
kind = "interval_join"
left = "a"
right = "b"
lower = "1s"
upper = "1s"
select = ["left.v"]

[operators.one_ms]
kind = "interval_join"
left = "a"
right = "b"
lower = "0ms"
upper = "2ms"
lower_exclusive = true
upper_exclusive = true
select = ["left.v"]
"#;
    validate("bounds.toml", text).assert_errors(&[
        (13, 1, "operators.reversed.lower", "leave no room"),
        (21, 1, "operators.upper_excl.lower", "leave no room"),
        (30, 1, "operators.lower_excl.lower", "leave no room"),
        (39, 1, "operators.both_excl.lower", "leave no room"),
    ]);
}

#[test]
fn select_errors_point_at_the_select_key() {
    let text = r#"[streams.a]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "int", v = "int", w = "int" }

[streams.b]
key = "id"
time = { field = "ts", unit = "ms" }
fields = { id = "string", ts = "int", x = "int" }

[operators.j]
kind = "interval_join"
left = "a"
right = "b"
lower = "0s"
upper = "1s"
select = [
  "left.v",
  "right.nope",
  "left.w AS _id",
  "right.x AS k",
  "right.ts AS v",
  "right.id AS k",
  "left.ts AS _ts",
  "middle.v",
]
"#;
    validate("select.toml", text).assert_errors(&[
        (17, 1, "operators.j.select", "has no field"),
        (17, 1, "operators.j.select", "\"_id\""),
        // `k` is the left key field: only a key field may take its name (`right.id AS k` may).
        (17, 1, "operators.j.select", "\"right.x AS k\""),
        (17, 1, "operators.j.select", "duplicate output name"),
        (17, 1, "operators.j.select", "\"_ts\""),
        (17, 1, "operators.j.select", "\"middle.v\""),
    ]);
}

// ------------------------------------------------------------------------------------ names ---

#[test]
fn names_taken_or_reserved() {
    let text = r#"[streams.a]
key = "k"
fields = { k = "string", v = "int" }

[streams."b.c"]
key = "k"
fields = { k = "string", v = "int" }

[operators.a]
kind = "interval_join"
left = "a"
right = "a"
lower = "0s"
upper = "1s"
select = ["left.v"]

[operators.dead_letter]
kind = "interval_join"
left = "a"
right = "a"
lower = "0s"
upper = "1s"
select = ["left.v"]

[operators."x.y"]
kind = "interval_join"
left = "a"
right = "a"
lower = "0s"
upper = "1s"
select = ["left.v"]
"#;
    validate("names.toml", text).assert_errors(&[
        (5, 1, "streams.b.c", "'.'"),
        (9, 1, "operators.a", "already used"),
        (17, 1, "operators.dead_letter", "reserved"),
        (25, 1, "operators.x.y", "'.'"),
    ]);
}

#[test]
fn reserved_field_name_in_a_stream() {
    let text = r#"[streams.a]
key = "k"
fields = { k = "string", _ts = "int" }
"#;
    // f-i-e-l-d-s ␣ = ␣ { ␣ k ␣ = ␣ "string" , ␣ _ts: column 26.
    validate("reserved_field.toml", text).assert_errors(&[(3, 26, "streams.a.fields._ts", "braid writes itself")]);
}

// -------------------------------------------------------------------------------- broadcast ---

#[test]
fn broadcast_on_an_interval_join_input() {
    let text = r#"[streams.a]
key = "k"
fields = { k = "string", v = "int" }

[streams.everyone]
key = "*"
fields = { k = "string", limit = "int" }

[operators.j]
kind = "interval_join"
left = "a"
right = "everyone"
lower = "0s"
upper = "1s"
select = ["left.v", "right.limit"]

[operators.j2]
kind = "interval_join"
left = "everyone"
right = "a"
lower = "0s"
upper = "1s"
select = ["left.limit"]
"#;
    validate("broadcast.toml", text)
        .assert_errors(&[(12, 1, "operators.j.right", "broadcast"), (19, 1, "operators.j2.left", "broadcast")]);
}

// ---------------------------------------------------------------------------------- streams ---

#[test]
fn stream_errors() {
    let text = r#"[streams.a]
key = "k"
time = { field = "ts", unit = "ms" }
max_out_of_orderness = "5 parsecs"
idle_timeout = "-5s"
fields = { k = "string", ts = "int", v = "decimal" }

[streams.b]
key = "device"
time = { field = "ts", unit = "rfc3339" }
fields = { k = "string", ts = "int" }

[streams.c]
key = "k"
time = { field = "when", unit = "s" }
fields = { k = "string", ts = "int" }

[streams.d]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "float" }

[streams.e]
key = "k"
time = { field = "ts", unit = "ns" }
fields = { k = "string", ts = "int" }

[streams.f]
key = "v"
fields = { k = "string", v = "float" }
max_payload = "1 parsec"
"#;
    validate("streams.toml", text).assert_errors(&[
        (4, 1, "streams.a.max_out_of_orderness", "bad duration"),
        (5, 1, "streams.a.idle_timeout", "negative"),
        // f-i-e-l-d-s ␣ = ␣ { ␣ k ␣ = ␣ "string" , ␣ ts ␣ = ␣ "int" , ␣ v: column 38.
        (6, 38, "streams.a.fields.v", "unknown type"),
        (9, 1, "streams.b.key", "not in `fields`"),
        // t-i-m-e ␣ = ␣ { ␣ field: column 10.
        (10, 10, "streams.b.time.field", "rfc3339"),
        (15, 10, "streams.c.time.field", "not declared"),
        (20, 10, "streams.d.time.field", "float"),
        // ... field ␣ = ␣ "ts" , ␣ unit: column 24.
        (25, 24, "streams.e.time.unit", "ms, s or rfc3339"),
        (29, 1, "streams.f.key", "string or int"),
        (31, 1, "streams.f.max_payload", "size"),
    ]);
}

#[test]
fn missing_required_keys_point_at_the_header() {
    let text = r#"[streams.a]
fields = { k = "string", v = "int" }

[streams.b]
key = "k"

[operators.j]
kind = "interval_join"
left = "a"
lower = "0s"
select = ["left.v"]

  [operators.nokind]
  left = "a"
"#;
    validate("missing.toml", text).assert_errors(&[
        (1, 1, "streams.a.key", "required"),
        (4, 1, "streams.b.fields", "required"),
        (7, 1, "operators.j.right", "required"),
        (7, 1, "operators.j.upper", "required"),
        // An indented header: its `[` is in column 3.
        (13, 3, "operators.nokind.kind", "required"),
    ]);
}

// -------------------------------------------------------------------- every kind is checked ---

#[test]
fn every_kind_is_checked_alongside_the_others() {
    let text = r#"[streams.a]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "int", v = "int" }

[streams.b]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "int", v = "int" }

[operators.w]
kind = "window_join"
left = "a"
right = "b"
window = { kind = "tumbling", size = "5m" }
allowed_lateness = "soon"
select = ["left.v", "right.v AS rv"]

[operators.g]
kind = "cogroup"
left = "a"
right = "b"
window = { kind = "tumbling", size = "5m" }
aggregate = ["count(left) AS n"]

[operators.u]
kind = "union"
inputs = ["a", "b"]

[operators.t]
kind = "temporal_join"
left = "a"
right = "b"
select = ["left.v"]

[operators.c]
kind = "connect"
function = "threshold"
left = "a"
right = "b"
value = "v"
limit = "v"
select = ["left.v"]

[operators.ab]
kind = "absence"
input = "a"
timeout = "30s"

[operators.j]
kind = "interval_join"
left = "a"
right = "b"
lower = "0s"
upper = "1s"
select = ["left.v", "right.nope"]
"#;
    validate("kinds.toml", text).assert_errors(&[
        (16, 1, "operators.w.allowed_lateness", "bad duration"),
        (56, 1, "operators.j.select", "has no field"),
    ]);
}

// ------------------------------------------------------------------------- window_aggregate ---

#[test]
fn window_aggregate_errors() {
    let text = r#"[streams.a]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "int", v = "int", s = "string" }

[streams.rules]
key = "*"
fields = { k = "string", v = "int" }

[operators.w]
kind = "window_aggregate"
input = "a"
window = { kind = "tumbling", size = "5m" }
where = "v > 'x'"
aggregate = ["count(*) AS n", "sum(s)", "avg(nope) AS m", "count(left)", "min(*)", "max(v) AS n"]
join = "left"

[operators.b]
kind = "window_aggregate"
input = "rules"
window = { kind = "session", gap = "1s" }
aggregate = ["count(*)"]

[operators.c]
kind = "window_aggregate"
input = "a"
aggregate = ["count(*)"]
key = "count"
"#;
    validate("wa.toml", text).assert_errors(&[
        (14, 1, "operators.w.where", "cannot compare int v with string 'x'"),
        (15, 1, "operators.w.aggregate", "\"sum(s)\": sum() needs an int or float field"),
        (15, 1, "operators.w.aggregate", "\"avg(nope) AS m\": a has no field \"nope\""),
        (15, 1, "operators.w.aggregate", "\"count(left)\": a has no field \"left\""),
        (15, 1, "operators.w.aggregate", "bad aggregate \"min(*)\""),
        (15, 1, "operators.w.aggregate", "output name \"n\" is taken"),
        (16, 1, "operators.w.join", "unknown key"),
        (20, 1, "operators.b.input", "rules is a broadcast stream"),
        (24, 1, "operators.c.window", "required"),
    ]);
}

// ---------------------------------------------------------------------------------- re-keying ---

#[test]
fn re_keying_errors() {
    let text = r#"[streams.a]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "int", v = "int", name = "string" }

[streams.b]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "int", x = "string", f = "float" }

[operators.outer]
kind = "interval_join"
left = "a"
right = "b"
lower = "0s"
upper = "1s"
join = "left"
select = ["left.name", "right.x"]
key = "x"

[operators.floaty]
kind = "interval_join"
left = "a"
right = "b"
lower = "0s"
upper = "1s"
select = ["left.v", "right.f"]
key = "f"

[operators.absent]
kind = "interval_join"
left = "a"
right = "b"
lower = "0s"
upper = "1s"
select = ["left.v"]
key = "zzz"

[operators.fine]
kind = "interval_join"
left = "a"
right = "b"
lower = "0s"
upper = "1s"
join = "left"
select = ["left.name", "right.x"]
key = "name"

[operators.full]
kind = "interval_join"
left = "a"
right = "b"
lower = "0s"
upper = "1s"
join = "full"
select = ["left.name"]
key = "name"

[operators.downstream]
kind = "interval_join"
left = "fine"
right = "n"
lower = "0s"
upper = "1s"
select = ["left.x"]

[streams.n]
key = "id"
fields = { id = "int" }
"#;
    validate("rekey.toml", text).assert_errors(&[
        (19, 1, "operators.outer.key", "null"),
        (28, 1, "operators.floaty.key", "string or int"),
        (37, 1, "operators.absent.key", "not an output field"),
        (57, 1, "operators.full.key", "null"),
        // `fine` is keyed by its string field `name` now; `n` has an int key.
        (62, 1, "operators.downstream.right", "key type mismatch"),
    ]);
}

// ------------------------------------------------------------------------ cycles and sinks ---

#[test]
fn cycles_and_sink_inputs() {
    let text = r#"[streams.a]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "int", v = "int" }

[operators.x]
kind = "interval_join"
left = "a"
right = "y"
lower = "0s"
upper = "1s"
select = ["left.v"]

[operators.y]
kind = "interval_join"
left = "x"
right = "a"
lower = "0s"
upper = "1s"
select = ["left.v"]

[operators.z]
kind = "interval_join"
left = "z"
right = "a"
lower = "0s"
upper = "1s"
select = ["left.v"]

[sinks.out]
kind = "file"
path = "/tmp/out.jsonl"
inputs = ["x", "z.late", "missing_op", "dead_letter"]
"#;
    validate("cycle.toml", text).assert_errors(&[
        (16, 1, "operators.y.left", "cycle"),
        (24, 1, "operators.z.left", "cycle"),
        (33, 1, "sinks.out.inputs", "\"missing_op\""),
    ]);
}

// ------------------------------------------------------------------------ sources and sinks ---

#[test]
fn sources_and_sinks_are_validated_too() {
    let text = r#"[sources.broker]
kind = "mqtt"

[sources.other]
kind = "kafka"
url = "mqtt://x:1883"

[sources.web]
kind = "mqtt"
url = "http://example.com"
max_inflight = 0

[streams.a]
source = "nope"
topic = "devices/+device/#/x"
key = "k"
fields = { k = "string", device = "string" }

[streams.b]
source = "broker"
topic = "devices/+dev/status"
key = "k"
fields = { k = "string", v = "int" }

[sinks.up]
kind = "mqtt"
inputs = ["a"]
url = "mqtts://cloud:8883"
topic = "x/{device"
qos = 2
buffer = "lots"
overflow = "drop"

[sinks.f]
kind = "file"
inputs = ["b"]

[sinks.z]
kind = "carrier-pigeon"
inputs = ["b"]
"#;
    validate("io.toml", text).assert_errors(&[
        (1, 1, "sources.broker.url", "required"),
        (5, 1, "sources.other.kind", "\"mqtt\" or \"embedded\""),
        (10, 1, "sources.web.url", "mqtt://HOST:PORT"),
        (11, 1, "sources.web.max_inflight", "between 1 and 65535"),
        (14, 1, "streams.a.source", "unknown source"),
        (15, 1, "streams.a.topic", "'#' must be the last level"),
        (21, 1, "streams.b.topic", "+dev"),
        (29, 1, "sinks.up.topic", "unclosed"),
        (30, 1, "sinks.up.qos", "0 or 1"),
        (31, 1, "sinks.up.buffer", "size"),
        (32, 1, "sinks.up.overflow", "drop_oldest"),
        (34, 1, "sinks.f.path", "required"),
        (39, 1, "sinks.z.kind", "\"stdout\""),
    ]);
}

// -------------------------------------------------------------------------------- positions ---

#[test]
fn columns_count_characters_not_bytes() {
    let text = r#"[streams.a]
key = "k"
time = { field = "tempé", unit = "ms", zone = "x" }
fields = { k = "string", "tempé" = "int" }
"#;
    // t-i-m-e ␣ = ␣ { ␣ field ␣ = ␣ "tempé" , ␣ unit ␣ = ␣ "ms" , ␣ zone: `zone` is the 40th
    // character (the 41st byte).
    validate("unicode.toml", text).assert_errors(&[(3, 40, "streams.a.time.zone", "unknown key")]);
}

#[test]
fn dotted_keys_point_at_the_key_itself() {
    let text = r#"[streams]
a.key = "k"
a.fields = { k = "string" }
a.bogus = 1
"#;
    validate("dotted.toml", text).assert_errors(&[(4, 3, "streams.a.bogus", "unknown key")]);
}

/// A syntax error is reported where the parser found it, also on a line that starts with `[`.
/// braid moves every position on such a line to the `[` (`ConfigErrors::line_col`, meant for keys
/// of `[table]` headers), so `[streams.a] key = "k"` is reported at 1:1 instead of 1:13.
#[test]

fn syntax_error_after_a_header_keeps_the_parsers_column() {
    let text = "[streams.a] key = \"k\"\nfields = { k = \"string\" }\n";
    validate("header_junk.toml", text).assert_errors(&[(1, 13, "", "")]);
}

// -------------------------------------------------------------------------- other commands ---

const INVALID_SMALL: &str = r#"[streams.a]
key = "k"
fields = { k = "string", v = "int" }
nonsense = true
"#;

#[test]
fn replay_with_an_invalid_config_exits_78() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(dir.path(), "bad.toml", INVALID_SMALL);
    let out_file = dir.path().join("a.jsonl");
    let out =
        run(braid().arg("replay").arg("--config").arg(&file).arg("--output").arg(format!("a={}", out_file.display())));
    let v = verdict(&file, &out);
    v.assert_errors(&[(4, 1, "streams.a.nonsense", "unknown key")]);
}

#[test]
fn a_missing_config_file_exits_78() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("does-not-exist.toml");
    let v = validate_file(&file);
    assert_eq!(v.code, INVALID, "{}", v.stderr);
    assert!(v.stderr.contains("cannot read"), "{}", v.stderr);
    assert_eq!(v.summary, Some(1), "{}", v.stderr);
}

// --------------------------------------------------------------------- the example configs ---

/// `# expect: LINE:COL PATH: substring` → (line, col, path, substring).
fn expectation(text: &str) -> Option<(usize, usize, String, String)> {
    let rest = text.lines().next()?.strip_prefix("# expect:")?.trim();
    let (position, rest) = rest.split_once(' ')?;
    let (line, col) = position.split_once(':')?;
    let (path, phrase) = match rest.split_once(": ") {
        Some((p, m)) => (p.trim().to_owned(), m.trim().to_owned()),
        // A syntax error has no path: `# expect: 3:7 : phrase` or `# expect: 3:7 phrase`.
        None => (String::new(), rest.trim_start_matches(':').trim().to_owned()),
    };
    let path = if path == ":" || path.is_empty() { String::new() } else { path };
    Some((line.parse().ok()?, col.parse().ok()?, path, phrase))
}

fn tomls_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_invalid_example_fails_as_announced() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs").join("invalid");
    let files = tomls_in(&dir);
    assert!(!files.is_empty(), "no configs in {}", dir.display());
    let mut failures = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        let Some((line, col, path, phrase)) = expectation(&text) else {
            failures.push(format!("{}: first line is no `# expect: LINE:COL PATH: substring`", file.display()));
            continue;
        };
        let v = validate_file(file);
        let found =
            v.errors.iter().any(|e| e.line == line && e.col == col && e.path == path && e.message.contains(&phrase));
        if v.code != INVALID || !found || v.summary != Some(v.errors.len()) {
            failures.push(format!(
                "{}: expected exit 78 and {line}:{col}: {path}: ...{phrase}...; got exit {}:\n{}",
                file.display(),
                v.code,
                v.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{} of {} invalid examples:\n{}", failures.len(), files.len(), failures.join("\n"));
}

#[test]
fn every_top_level_example_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let files = tomls_in(&dir);
    if files.is_empty() {
        eprintln!("no configs/*.toml: nothing to check");
        return;
    }
    let failures: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let v = validate_file(file);
            (v.code != 0).then(|| format!("{}: exit {}:\n{}", file.display(), v.code, v.stderr))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
