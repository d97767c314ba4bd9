//! Composite keys (`key = ["site", "device"]`): joins by several fields against brute force,
//! every operator kind on them independent of the shard count, dead letters per key field.
//!
//! The workloads keep every row on time, so the brute-force references need no time rules: each
//! stream's rows arrive in event-time order and never turn idle (`idle_timeout = "0ms"`), so an
//! operator's watermark (the minimum of its inputs') stays behind every row still to come, and
//! the end of input flushes the rest. What is left to check is exactly what the key decides —
//! which rows meet — and that results carry every key field (rule 9). Sites and devices are
//! drawn so that the same device number appears at several sites (`("n", 1)` never meets
//! `("s", 1)`), and site names prefix each other (`"n"`, `"n1"`).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::common::rng::Rng;
use crate::common::run::{output_files, replay_in_process, write_inputs};

const BASE: i64 = 1_767_225_600_000;
const SITES: [&str; 3] = ["n", "s", "n1"];
const WINDOW: i64 = 5_000;

const STREAMS: &str = r#"
[streams.reading]
key = ["site", "device"]
time = { field = "ts", unit = "ms" }
idle_timeout = "0ms"
fields = { site = "string", device = "int", ts = "int", seq = "int" }

[streams.limit]
key = ["site", "device"]
time = { field = "ts", unit = "ms" }
idle_timeout = "0ms"
fields = { site = "string", device = "int", ts = "int", seq = "int" }
"#;

#[derive(Clone, Debug)]
struct Row {
    site: &'static str,
    device: i64,
    ts: i64,
    seq: i64,
}

impl Row {
    fn key(&self) -> (&'static str, i64) {
        (self.site, self.device)
    }
}

/// Two streams of rows in event-time order, `seq` numbering each stream's rows.
fn workload(seed: u64, rows: usize) -> [Vec<Row>; 2] {
    let mut rng = Rng::new(seed);
    [0, 1].map(|_| {
        let mut ts = BASE;
        (0..rows)
            .map(|seq| {
                ts += rng.range(0, 900);
                let site = SITES[rng.below(SITES.len() as u64) as usize];
                Row { site, device: rng.range(0, 2), ts, seq: seq as i64 }
            })
            .collect()
    })
}

fn lines(rows: &[Row]) -> String {
    rows.iter()
        .map(|r| format!("{}\n", json!({"site": r.site, "device": r.device, "ts": r.ts, "seq": r.seq})))
        .collect()
}

/// Replays `operators` over the two streams with `shards` shards: each output's rows.
fn replay(operators: &str, w: &[Vec<Row>; 2], shards: usize, outputs: &[&str]) -> Vec<Vec<Value>> {
    let plan = braid::config::parse("composite.toml", &format!("{STREAMS}{operators}")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let inputs = write_inputs(dir.path(), [("reading", lines(&w[0])), ("limit", lines(&w[1]))]);
    let files = output_files(dir.path(), "out", outputs);
    let texts = replay_in_process(&plan, shards, false, &inputs, &files);
    texts.into_iter().map(|lines| lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect()).collect()
}

/// A result as (kind, left seq, right seq), after checking it carries the key of its rows.
fn pair_of(result: &Value, w: &[Vec<Row>; 2]) -> (String, Option<i64>, Option<i64>) {
    let seqs = [result["lseq"].as_i64(), result["rseq"].as_i64()];
    let row = seqs[0].map(|s| &w[0][s as usize]).or_else(|| seqs[1].map(|s| &w[1][s as usize])).unwrap();
    assert_eq!((result["site"].as_str(), result["device"].as_i64()), (Some(row.site), Some(row.device)), "{result}");
    (result["_kind"].as_str().unwrap().to_owned(), seqs[0], seqs[1])
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

#[test]
fn interval_join_by_a_composite_key_equals_brute_force() {
    for seed in 0..24 {
        let w = workload(seed, 40);
        let mut rng = Rng::new(seed ^ 0xC0);
        let (lower, upper) = (-rng.range(0, 3_000), rng.range(0, 3_000));
        let join = ["inner", "left", "right", "full"][(seed % 4) as usize];
        let operators = format!(
            r#"
[operators.effect]
kind = "interval_join"
left = "reading"
right = "limit"
lower = "{lower}ms"
upper = "{upper}ms"
join = "{join}"
select = ["left.seq AS lseq", "right.seq AS rseq", "right.site", "right.device"]
"#
        );
        let out = replay(&operators, &w, 1 + (seed % 3) as usize, &["effect", "effect.late"]);
        assert!(out[1].is_empty(), "seed {seed}: nothing is late: {:?}", out[1]);
        let got = sorted(out[0].iter().map(|r| pair_of(r, &w)).collect());

        let mut want = Vec::new();
        let mut matched = [vec![false; w[0].len()], vec![false; w[1].len()]];
        for l in &w[0] {
            for r in &w[1] {
                if l.key() == r.key() && l.ts + lower <= r.ts && r.ts <= l.ts + upper {
                    want.push(("match".to_owned(), Some(l.seq), Some(r.seq)));
                    matched[0][l.seq as usize] = true;
                    matched[1][r.seq as usize] = true;
                }
            }
        }
        if join == "left" || join == "full" {
            want.extend(
                w[0].iter().filter(|l| !matched[0][l.seq as usize]).map(|l| ("left_only".into(), Some(l.seq), None)),
            );
        }
        if join == "right" || join == "full" {
            want.extend(
                w[1].iter().filter(|r| !matched[1][r.seq as usize]).map(|r| ("right_only".into(), None, Some(r.seq))),
            );
        }
        let want = sorted(want);
        assert!(want.iter().any(|(kind, ..)| kind == "match"), "seed {seed}: the workload joins something");
        assert_eq!(got, want, "seed {seed} ({join}, [{lower}, {upper}])");
    }
}

#[test]
fn window_join_and_cogroup_by_a_composite_key_equal_brute_force() {
    let operators = format!(
        r#"
[operators.pairs]
kind = "window_join"
left = "reading"
right = "limit"
window = {{ kind = "tumbling", size = "{WINDOW}ms" }}
select = ["left.seq AS lseq", "right.seq AS rseq"]

[operators.groups]
kind = "cogroup"
left = "reading"
right = "limit"
window = {{ kind = "tumbling", size = "{WINDOW}ms" }}
join = "full"
aggregate = ["count(left) AS readings", "count(right) AS limits"]
"#
    );
    for seed in 100..112 {
        let w = workload(seed, 50);
        let out = replay(&operators, &w, 1 + (seed % 3) as usize, &["pairs", "groups"]);
        let window = |ts: i64| ts - ts.rem_euclid(WINDOW);

        let got = sorted(out[0].iter().map(|r| pair_of(r, &w)).collect());
        let mut want = Vec::new();
        for l in &w[0] {
            for r in &w[1] {
                if l.key() == r.key() && window(l.ts) == window(r.ts) {
                    want.push(("match".to_owned(), Some(l.seq), Some(r.seq)));
                }
            }
        }
        assert!(!want.is_empty(), "seed {seed}: the workload pairs something");
        assert_eq!(got, sorted(want), "seed {seed}: window join");

        let got: Vec<(String, i64, i64, i64, i64)> = sorted(
            out[1]
                .iter()
                .map(|g| {
                    let key = (g["site"].as_str().unwrap().to_owned(), g["device"].as_i64().unwrap());
                    (
                        key.0,
                        key.1,
                        g["_window_start"].as_i64().unwrap(),
                        g["readings"].as_i64().unwrap(),
                        g["limits"].as_i64().unwrap(),
                    )
                })
                .collect(),
        );
        let mut groups: BTreeMap<(&str, i64, i64), [i64; 2]> = BTreeMap::new();
        for (side, rows) in w.iter().enumerate() {
            for r in rows {
                groups.entry((r.site, r.device, window(r.ts))).or_default()[side] += 1;
            }
        }
        let want: Vec<_> =
            groups.into_iter().map(|((site, device, start), [l, r])| (site.to_owned(), device, start, l, r)).collect();
        assert_eq!(got, want, "seed {seed}: cogroup");
    }
}

/// Every operator kind over composite keys, chained through a re-key by a list of fields: the
/// outputs are the same for 1, 2 and 3 shards, `_id`s included.
#[test]
fn every_operator_by_a_composite_key_is_independent_of_the_shard_count() {
    let operators = r#"
[operators.both]
kind = "union"
inputs = ["reading", "limit"]
key = ["device", "site"]

[operators.quiet]
kind = "absence"
input = "both"
timeout = "4s"

[operators.effect]
kind = "interval_join"
left = "reading"
right = "limit"
lower = "-1s"
upper = "1s"
join = "full"
select = ["left.seq AS lseq", "right.seq AS rseq"]

[operators.versions]
kind = "temporal_join"
left = "reading"
right = "limit"
join = "left"
select = ["left.seq AS lseq", "right.seq AS rseq"]

[operators.paired]
kind = "connect"
function = "reconcile"
left = "reading"
right = "limit"
timeout = "2s"
select = ["left.seq AS lseq", "right.seq AS rseq"]

[operators.sessions]
kind = "cogroup"
left = "reading"
right = "limit"
window = { kind = "session", gap = "2s" }
join = "full"
aggregate = ["count(left) AS readings", "max(right.seq) AS last_limit"]
key = ["site", "device"]

[operators.after]
kind = "interval_join"
left = "sessions"
right = "limit"
lower = "-10s"
upper = "10s"
select = ["left.readings", "right.seq AS rseq"]
"#;
    let outputs = ["both", "quiet", "effect", "versions", "paired", "sessions", "after", "dead_letter"];
    for seed in 200..204 {
        let w = workload(seed, 60);
        let runs: Vec<Vec<Vec<String>>> = (1..=3)
            .map(|shards| {
                replay(operators, &w, shards, &outputs)
                    .into_iter()
                    .map(|rows| sorted(rows.iter().map(Value::to_string).collect()))
                    .collect()
            })
            .collect();
        for (name, rows) in outputs.iter().zip(&runs[0]) {
            if *name != "dead_letter" {
                assert!(!rows.is_empty(), "seed {seed}: {name} has results");
            }
        }
        // The absence rows and the union's carry every key field; the union is keyed by
        // (device, site) and still holds both under their names.
        let quiet: Vec<Value> = runs[0][1].iter().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(quiet.iter().all(|q| q["site"].is_string() && q["device"].is_i64()), "{quiet:?}");
        assert_eq!(runs[1], runs[0], "seed {seed}: 2 shards differ from 1");
        assert_eq!(runs[2], runs[0], "seed {seed}: 3 shards differ from 1");
    }
}

#[test]
fn a_missing_null_or_mistyped_key_field_is_a_dead_letter_naming_it() {
    let plan = braid::config::parse("composite.toml", STREAMS).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let reading = [
        r#"{"site": "n", "device": 1, "ts": 1767225600000, "seq": 0}"#,
        r#"{"device": 1, "ts": 1767225600001, "seq": 1}"#,
        r#"{"site": "n", "device": null, "ts": 1767225600002, "seq": 2}"#,
        r#"{"site": "n", "device": "1", "ts": 1767225600003, "seq": 3}"#,
        r#"{"site": 7, "device": 1, "ts": 1767225600004, "seq": 4}"#,
    ];
    let inputs = write_inputs(dir.path(), [("reading", reading.join("\n")), ("limit", String::new())]);
    let files: Vec<(String, PathBuf)> = output_files(dir.path(), "out", &["reading", "dead_letter"]);
    let out = replay_in_process(&plan, 2, false, &inputs, &files);
    assert_eq!(out[0].len(), 1, "{out:?}");
    let reasons: Vec<String> = out[1]
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["_reason"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(reasons, ["missing_field:site", "missing_field:device", "wrong_type:device", "wrong_type:site"]);
}

#[test]
fn explain_takes_a_composite_key_as_its_values_joined_by_commas() {
    let samples = "configs/samples/site_limits";
    let out = crate::common::run::braid()
        .args(["explain", "--config", "configs/site_limits.toml", "--key", "north,1"])
        .args(["--input", &format!("telemetry={samples}/telemetry.jsonl")])
        .args(["--input", &format!("limits={samples}/limits.jsonl")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Device 1 of site north: two readings and two limits; device 1 of site south is another key.
    assert!(stdout.starts_with("key 'north,1': 4 rows\n"), "{stdout}");
    assert_eq!(stdout.matches("with_limits: matched").count(), 4, "{stdout}");
    assert!(!stdout.contains("ts 1767225600600"), "south's device 1 is not north's: {stdout}");
}
