//! `braid explain` against the cases under tests/explain/ (its README lists them): the plain
//! words word for word, `--json` object by object at two shard counts.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::run::braid;

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("explain");
    let mut cases: Vec<PathBuf> =
        std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.join("key").is_file()).collect();
    cases.sort();
    cases
}

/// The pair cases under tests/explain/pairs/ (`rows`: the flags naming the two rows, one a line).
fn pair_cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("explain").join("pairs");
    let mut cases: Vec<PathBuf> =
        std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.join("rows").is_file()).collect();
    cases.sort();
    cases
}

/// `braid explain` of a pair case (its `rows` flags, then `extra`): exit success and stdout.
fn explain_pair(case: &Path, extra: &[&str]) -> (bool, String, String) {
    let config = case.parent().unwrap().parent().unwrap().join("config.toml");
    let mut cmd = braid();
    cmd.arg("explain").arg("--config").arg(config);
    for stream in ["command", "status"] {
        cmd.arg("--input").arg(format!("{stream}={}", case.join("in").join(format!("{stream}.jsonl")).display()));
    }
    cmd.args(std::fs::read_to_string(case.join("rows")).unwrap().lines());
    let out = cmd.args(extra).output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `braid explain` of a case; its stdout.
fn explain(case: &Path, extra: &[&str]) -> String {
    let config = case.parent().unwrap().join("config.toml");
    let key = std::fs::read_to_string(case.join("key")).unwrap();
    let mut cmd = braid();
    cmd.arg("explain").arg("--config").arg(config).arg("--key").arg(key.trim_end_matches('\n'));
    for stream in ["command", "status"] {
        cmd.arg("--input").arg(format!("{stream}={}", case.join("in").join(format!("{stream}.jsonl")).display()));
    }
    let out = cmd.args(extra).output().unwrap();
    assert!(out.status.success(), "{}: {}", case.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn name(case: &Path) -> String {
    case.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn every_reason_has_its_case() {
    let names: Vec<String> = cases().iter().map(|c| name(c)).collect();
    for reason in ["dead_letter", "evicted", "key_spelling", "key_type", "late", "matched", "outside_bound"] {
        assert!(names.iter().any(|n| n == reason), "no explain case {reason} in {names:?}");
    }
}

#[test]
fn plain_words_are_the_expected_ones_word_for_word() {
    let mut failures = Vec::new();
    for case in cases() {
        let want = std::fs::read_to_string(case.join("expected.txt")).unwrap();
        let got = explain(&case, &[]);
        if got != want {
            failures.push(format!("== {}\n-- expected\n{want}-- got\n{got}", name(&case)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn json_is_one_object_per_row_and_operator_whatever_the_shard_count() {
    for shards in [1, 3] {
        for case in cases() {
            let want: Vec<Value> = std::fs::read_to_string(case.join("expected.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let got: Vec<Value> = explain(&case, &["--json", "--shards", &shards.to_string()])
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let comparable = |objects: &[Value]| -> Vec<Value> {
                objects
                    .iter()
                    .map(|o| {
                        let mut o = o.clone();
                        let map = o.as_object_mut().unwrap();
                        if let Some(id) = map.remove("id").filter(|id| !id.is_null()) {
                            let id = id.as_str().unwrap().to_owned();
                            assert!(id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()), "id {id}");
                        }
                        if let Some(shard) = map.remove("shard").and_then(|s| s.as_u64()) {
                            assert!(shard < shards, "shard {shard} of {shards}");
                        }
                        for field in ["stream", "ts", "operator", "fate", "why"] {
                            assert!(map.contains_key(field), "{}: no {field} in {o}", name(&case));
                        }
                        o
                    })
                    .collect()
            };
            assert_eq!(comparable(&got), comparable(&want), "{} at {shards} shards", name(&case));
        }
    }
}

#[test]
fn late_rows_carry_late_by_ms_the_watermark_minus_their_ts() {
    let case = cases().into_iter().find(|c| name(c) == "late").unwrap();
    let late: Vec<Value> = explain(&case, &["--json"])
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|o| o["fate"] == "late")
        .collect();
    assert_eq!(late.len(), 1);
    let o = &late[0];
    assert_eq!(
        o["late_by_ms"].as_i64().unwrap(),
        o["operator_watermark"].as_i64().unwrap() - o["ts"].as_i64().unwrap()
    );
}

#[test]
fn every_pair_verdict_has_its_case() {
    let verdicts: Vec<String> = pair_cases()
        .iter()
        .map(|c| {
            let json: Value = serde_json::from_str(&std::fs::read_to_string(c.join("expected.json")).unwrap()).unwrap();
            json["verdict"].as_str().unwrap().to_owned()
        })
        .collect();
    for verdict in ["joined", "outside_bound", "different_keys", "late", "left_state", "dead_letter"] {
        assert!(verdicts.iter().any(|v| v == verdict), "no pair case with verdict {verdict} in {verdicts:?}");
    }
}

#[test]
fn pairs_in_plain_words_are_the_expected_ones_word_for_word() {
    let mut failures = Vec::new();
    for case in pair_cases() {
        let want = std::fs::read_to_string(case.join("expected.txt")).unwrap();
        let (ok, got, stderr) = explain_pair(&case, &[]);
        assert!(ok, "{}: {stderr}", name(&case));
        if got != want {
            failures.push(format!("== {}\n-- expected\n{want}-- got\n{got}", name(&case)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_pair_in_json_is_one_object_whatever_the_shard_count() {
    // The shard a row went to (and the head line naming it) depends on the count; nothing else.
    let comparable = |mut o: Value| {
        for row in o["rows"].as_array_mut().unwrap() {
            let row = row.as_object_mut().unwrap();
            assert!(row.remove("shard").is_some() && row.remove("head").is_some(), "{row:?}");
        }
        o
    };
    for shards in [1, 3] {
        for case in pair_cases() {
            let want: Value =
                serde_json::from_str(&std::fs::read_to_string(case.join("expected.json")).unwrap()).unwrap();
            let (ok, got, stderr) = explain_pair(&case, &["--json", "--shards", &shards.to_string()]);
            assert!(ok, "{}: {stderr}", name(&case));
            assert_eq!(got.lines().count(), 1, "{}: one object for the pair", name(&case));
            let got: Value = serde_json::from_str(&got).unwrap();
            assert_eq!(got["joined"], got["verdict"] == "joined");
            assert_eq!(comparable(got), comparable(want), "{} at {shards} shards", name(&case));
        }
    }
}

#[test]
fn a_pair_by_ids_is_the_pair_by_field_values() {
    let by = |case: &str| {
        let case = pair_cases().into_iter().find(|c| name(c) == case).unwrap();
        let (ok, got, stderr) = explain_pair(&case, &["--json"]);
        assert!(ok, "{stderr}");
        let mut got: Value = serde_json::from_str(&got).unwrap();
        got.as_object_mut().unwrap().remove("keys");
        got
    };
    assert_eq!(by("by_id")["result_id"], by("joined")["result_id"]);
    assert_eq!(by("by_id")["rows"], by("joined")["rows"]);
    // The joined pair's result _id alone names the same two rows.
    assert_eq!(by("by_result")["rows"], by("joined")["rows"]);
    assert_eq!(by("by_result")["result_id"], by("joined")["result_id"]);
}

#[test]
fn rows_that_cannot_be_told_apart_or_found_are_refused_clearly() {
    let case = pair_cases().into_iter().find(|c| name(c) == "late").unwrap();
    let config = case.parent().unwrap().parent().unwrap().join("config.toml");
    let dir = tempfile::tempdir().unwrap();
    let doubled = dir.path().join("status.jsonl");
    std::fs::write(&doubled, "{\"device\":\"dev-1\",\"ts\":1,\"seq\":1}\n{\"device\":\"dev-1\",\"ts\":2,\"seq\":1}\n")
        .unwrap();
    let twice = format!("status={}", doubled.display());
    let run = |rows: &[&str]| {
        let mut cmd = braid();
        cmd.arg("explain").arg("--config").arg(&config);
        for stream in ["command", "status"] {
            cmd.arg("--input").arg(format!("{stream}={}", case.join("in").join(format!("{stream}.jsonl")).display()));
        }
        let out = cmd.args(rows).output().unwrap();
        assert!(!out.status.success(), "{rows:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = run(&["--row", "command:cmd_id=c1", "--row", "status:seq=1,device=dev-1", "--input", &twice]);
    assert!(stderr.contains(" rows match status:seq=1,device=dev-1: name more fields"), "{stderr}");
    let stderr = run(&["--row", "command:cmd_id=c1", "--row", "status:seq=7"]);
    assert!(stderr.contains("no row matches status:seq=7"), "{stderr}");
    let stderr = run(&["--row", "command:cmd_id=c1", "--row", "status:colour=red"]);
    assert!(stderr.contains("stream status has no field colour"), "{stderr}");
    let stderr = run(&["--row", "command:cmd_id=c1"]);
    assert!(stderr.contains("command:cmd_id=c1 is one row: name a second row"), "{stderr}");
    let stderr = run(&["--id", "38eed7104cd8c28a", "--id", "38eed7104cd8c28a", "--id", "38eed7104cd8c28a"]);
    assert!(stderr.contains("name two rows (--row or --id, twice in all), or one result with --id; not 3"), "{stderr}");
    let stderr = run(&["--id", "38eed7104cd8c28a"]);
    assert!(stderr.contains("id 38eed7104cd8c28a is one row: name a second row, or one result's _id"), "{stderr}");
    let stderr = run(&["--id", "0000000000000001"]);
    assert!(stderr.contains("id 0000000000000001 matches no row or result"), "{stderr}");
    let stderr = run(&["--row", "command"]);
    assert!(stderr.contains("STREAM:FIELD=VALUE"), "{stderr}");
}

/// A window aggregate's rows: aggregated (`matched`, also a row re-firing its window within
/// allowed lateness), dropped by `where` (`unmatched`), or late.
#[test]
fn window_aggregate_rows_are_aggregated_filtered_or_late() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let sample = root.join("samples").join("window_aggregate").join("telemetry.jsonl");
    // `braid explain --json` of a key of configs/window_aggregate.toml over its sample.
    let explained = |key: &str, shards: &str| -> Vec<Value> {
        let out = braid()
            .arg("explain")
            .arg("--config")
            .arg(root.join("window_aggregate.toml"))
            .arg("--input")
            .arg(format!("telemetry={}", sample.display()))
            .args(["--key", key, "--json", "--shards", shards])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    const BASE: i64 = 1_767_225_600_000;
    for shards in ["1", "3"] {
        let rows = explained("pump-1", shards);
        let fate = |ts: i64| {
            let row = rows.iter().find(|r| r["ts"] == ts).unwrap_or_else(|| panic!("no row at {ts}"));
            (row["fate"].as_str().unwrap().to_owned(), row["why"].as_str().unwrap().to_owned())
        };
        assert_eq!(rows.len(), 8);
        let (f, why) = fate(BASE + 1000);
        assert_eq!(
            (f.as_str(), why.as_str()),
            ("matched", "aggregated into the result of window [1767225600000, 1767225610000)")
        );
        let (f, why) = fate(BASE + 6000);
        assert_eq!(
            (f.as_str(), why.as_str()),
            ("unmatched", "the `where` condition of per_device did not hold: it was not aggregated")
        );
        let (f, why) = fate(BASE + 8000);
        assert_eq!(f, "matched");
        assert!(why.ends_with("(behind the watermark by 3499 ms, within allowed lateness: re-fired)"), "{why}");
    }
    let late: Vec<Value> = explained("pump-2", "2").into_iter().filter(|r| r["fate"] == "late").collect();
    assert_eq!(late.len(), 1);
    assert_eq!((late[0]["ts"].as_i64(), late[0]["late_by_ms"].as_i64()), (Some(BASE + 3000), Some(18_499)));
}

/// A row `ttl` removed is `expired` at its operator (the golden case `ttl_interval_join`: d1's
/// two commands expired; its status row found no partner), whatever the shard count.
#[test]
fn a_row_removed_by_ttl_is_expired() {
    fates_of_d1(
        "ttl_interval_join",
        ["command", "status"],
        [(1_000, "expired"), (2_000, "expired"), (100, "unmatched")],
    );
}

/// A row that left with a window join's expired window is `expired` too (the golden case
/// `ttl_window_join`: d1's a and x were in the window that expired at 2400; z came after, alone).
#[test]
fn a_row_of_an_expired_window_is_expired() {
    fates_of_d1("ttl_window_join", ["l", "r"], [(100, "expired"), (150, "expired"), (600, "unmatched")]);
}

/// `braid explain --key d1 --json` on a golden case with 1 and 3 shards: (ts, fate) per row.
fn fates_of_d1<const N: usize>(case: &str, streams: [&str; 2], expected: [(i64, &str); N]) {
    let case = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(case);
    for shards in ["1", "3"] {
        let mut cmd = braid();
        cmd.arg("explain").arg("--config").arg(case.join("config.toml")).args(["--key", "d1", "--json"]);
        cmd.args(["--shards", shards]);
        for stream in streams {
            cmd.arg("--input").arg(format!("{stream}={}", case.join("in").join(format!("{stream}.jsonl")).display()));
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let fates: Vec<(i64, String)> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .map(|v| (v["ts"].as_i64().unwrap(), v["fate"].as_str().unwrap_or_default().to_owned()))
            .collect();
        assert_eq!(fates, expected.map(|(ts, f)| (ts, f.to_owned())), "{shards} shards");
    }
}
