#![allow(clippy::unwrap_used)]
//! The SQL front end (README.md "SQL"): every `configs/NAME.sql` is the twin of `configs/NAME.toml`
//! — the same streams with the same fields, the same operators — and replaying both over
//! `configs/samples/NAME/` gives identical outputs, `_id`s included, for every operator and its
//! late side output; a `[pipeline] sql` TOML runs like its all-TOML twin; every
//! `configs/invalid/sql/*.sql` fails with exactly the error its first line announces
//! (`-- expect: LINE:COL: message`).

use crate::common;

use std::path::{Path, PathBuf};

use common::run::{RUN_TIMEOUT, braid, replay, write_file};

fn files_in(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    files
}

fn samples(name: &str) -> Vec<(String, PathBuf)> {
    files_in(&Path::new("configs/samples").join(name), "jsonl")
        .into_iter()
        .map(|p| (p.file_stem().unwrap().to_str().unwrap().to_owned(), p))
        .collect()
}

/// A copy of the TOML at `path` in `dir` without its `state_dir`, so that replays in parallel
/// tests do not share one (configs/gateway.toml keeps its state in /var/lib/braid).
fn private_state(dir: &Path, path: &Path) -> PathBuf {
    let text = std::fs::read_to_string(path).unwrap();
    let text: Vec<&str> = text.lines().filter(|l| !l.starts_with("state_dir")).collect();
    write_file(dir, path.file_name().unwrap().to_str().unwrap(), text.join("\n"))
}

/// Each output's rows as sorted JSON texts (serde_json sorts object keys): a multiset.
fn rows_of(dir: &Path, config: &Path, inputs: &[(String, PathBuf)], outputs: &[&str]) -> Vec<(String, Vec<String>)> {
    let out = replay(dir, config, None, inputs, outputs, RUN_TIMEOUT).unwrap();
    outputs
        .iter()
        .map(|name| {
            let mut rows: Vec<String> = out.get(name).iter().map(|v| v.to_string()).collect();
            rows.sort();
            (name.to_string(), rows)
        })
        .collect()
}

#[test]
fn every_sql_twin_replays_like_its_toml() {
    let twins = files_in(Path::new("configs"), "sql");
    assert!(twins.len() >= 5, "configs/ holds the SQL twins: {twins:?}");
    for sql in twins {
        let toml = sql.with_extension("toml");
        let name = sql.file_stem().unwrap().to_str().unwrap();
        let (from_sql, from_toml) = (braid::config::load(&sql).unwrap(), braid::config::load(&toml).unwrap());
        let fields = |plan: &braid::plan::Plan| -> Vec<(String, Vec<String>)> {
            let mut streams: Vec<_> = plan
                .streams
                .iter()
                .map(|s| {
                    let mut f: Vec<String> = s.schema.fields.iter().map(|f| format!("{}:{}", f.name, f.ty)).collect();
                    f.sort();
                    (s.name.clone(), f)
                })
                .collect();
            streams.sort();
            streams
        };
        assert_eq!(fields(&from_sql), fields(&from_toml), "{name}: the twins declare the same fields");
        let operators: Vec<String> = from_toml.operators.iter().map(|o| o.name.clone()).collect();
        let sql_operators: Vec<String> = from_sql.operators.iter().map(|o| o.name.clone()).collect();
        assert_eq!(sql_operators, operators, "{name}: the same operators");
        let mut outputs: Vec<String> = operators.clone();
        outputs.extend(operators.iter().map(|o| format!("{o}.late")));
        outputs.push("dead_letter".into());
        let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
        let inputs = samples(name);
        let dir = tempfile::tempdir().unwrap();
        let (sql_dir, toml_dir) = (dir.path().join("sql"), dir.path().join("toml"));
        std::fs::create_dir_all(&sql_dir).unwrap();
        std::fs::create_dir_all(&toml_dir).unwrap();
        let got = rows_of(&sql_dir, &sql, &inputs, &outputs);
        let want = rows_of(&toml_dir, &private_state(&toml_dir, &toml), &inputs, &outputs);
        assert!(!want[0].1.is_empty(), "{name}: the sample produces results");
        assert_eq!(got, want, "{name}: the SQL twin's outputs differ from the TOML's");
    }
}

#[test]
fn a_pipeline_sql_toml_runs_like_the_toml() {
    let dir = tempfile::tempdir().unwrap();
    let gateway_toml = private_state(dir.path(), Path::new("configs/gateway.toml"));
    let gateway = std::fs::read_to_string(&gateway_toml).unwrap();
    // [runtime], [ops], [sources] and [sinks] stay; the streams (with their source and topics,
    // as `braid run` needs) and the operator come from SQL.
    let sql = "
CREATE TABLE status (device STRING, ts BIGINT, temp DOUBLE, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND)
  WITH ('source' = 'devices', 'topic' = 'devices/+device/status', 'key' = 'device', 'idle_timeout' = '5s');
CREATE TABLE command (device STRING, ts BIGINT, cmd STRING, arg STRING, cmd_id STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.501' SECOND)
  WITH ('source' = 'devices', 'topic' = 'devices/+device/command', 'key' = 'device', 'idle_timeout' = '5s');
INSERT INTO cloud
  SELECT c.cmd_id, c.cmd, s.state, s.seq, s.ts AS status_ts
  FROM command c LEFT JOIN status s
    ON c.device = s.device AND s.rt BETWEEN c.rt - INTERVAL '3' SECOND AND c.rt + INTERVAL '5' SECOND;
";
    let start = gateway.find("[streams.status]").unwrap();
    let end = gateway.find("[sinks.cloud]").unwrap();
    // INSERT INTO cloud feeds [sinks.cloud], which lists no inputs of its own here.
    let sinks = gateway[end..].replace("inputs = [\"effect\"]\n", "").replace("\"effect.late\"", "\"cloud.late\"");
    let text = format!("{}[pipeline]\nsql = \"\"\"{sql}\"\"\"\n\n{sinks}", &gateway[..start]);
    let config = write_file(dir.path(), "gateway_sql.toml", &text);
    let plan = braid::config::load(&config).unwrap();
    assert_eq!(
        plan.streams.iter().map(|s| s.topic.clone().unwrap()).collect::<Vec<_>>(),
        ["devices/+device/status", "devices/+device/command"]
    );
    assert_eq!(plan.sinks[0].inputs, ["cloud"], "INSERT INTO cloud feeds the sink");
    let out = braid().args(["validate", "--config", config.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let inputs = samples("gateway");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    // The operator is named after the sink, so its `_id`s differ from `effect`'s: compare the rows
    // without them.
    let strip = |rows: Vec<(String, Vec<String>)>| -> Vec<Vec<String>> {
        rows.into_iter()
            .map(|(_, rows)| {
                let mut rows: Vec<String> = rows
                    .iter()
                    .map(|r| {
                        let mut v: serde_json::Value = serde_json::from_str(r).unwrap();
                        v.as_object_mut().unwrap().remove("_id");
                        v.to_string()
                    })
                    .collect();
                rows.sort();
                rows
            })
            .collect()
    };
    let got = strip(rows_of(&a, &config, &inputs, &["cloud", "cloud.late"]));
    let want = strip(rows_of(&b, &gateway_toml, &inputs, &["effect", "effect.late"]));
    assert!(!want[0].is_empty());
    assert_eq!(got, want);
}

#[test]
fn every_invalid_sql_fails_as_announced() {
    let files = files_in(Path::new("configs/invalid/sql"), "sql");
    assert!(files.len() >= 10, "configs/invalid/sql holds the golden errors");
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let expected = text.lines().next().and_then(|l| l.strip_prefix("-- expect: ")).unwrap_or("");
        let out = braid().args(["validate", "--config", file.to_str().unwrap()]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want = format!("{}:{expected}\n{}: 1 configuration error(s)\n", file.display(), file.display());
        if out.status.code() != Some(78) || stderr != want {
            failures.push(format!(
                "{}: want exit 78 and\n{want}got {:?}:\n{stderr}",
                file.display(),
                out.status.code()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_twin_exports_the_same_flink_script_and_bad_names_exit_1() {
    let export = |config: &str, extra: &[&str]| {
        let mut cmd = braid();
        cmd.args(["export", "flink-sql", "--config", config]);
        for (stream, path) in samples("gateway") {
            cmd.arg("--input").arg(format!("{stream}={}", path.display()));
        }
        cmd.args(extra).output().unwrap()
    };
    let (from_sql, from_toml) = (export("configs/gateway.sql", &[]), export("configs/gateway.toml", &[]));
    assert!(from_sql.status.success(), "{}", String::from_utf8_lossy(&from_sql.stderr));
    assert_eq!(String::from_utf8_lossy(&from_sql.stdout), String::from_utf8_lossy(&from_toml.stdout));
    assert!(String::from_utf8_lossy(&from_sql.stdout).contains("CREATE TEMPORARY VIEW `effect` AS"));
    let late = export("configs/gateway.sql", &["--output", "effect.late=/tmp/x"]);
    assert_eq!(late.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&late.stderr).contains("late rows and dead letters stay in braid"));
}

#[test]
fn a_composite_key_is_exported_as_one_equality_per_field() {
    let export = |config: &str| braid().args(["export", "flink-sql", "--config", config]).output().unwrap();
    let (from_sql, from_toml) = (export("configs/site_limits.sql"), export("configs/site_limits.toml"));
    assert!(from_toml.status.success(), "{}", String::from_utf8_lossy(&from_toml.stderr));
    let script = String::from_utf8_lossy(&from_toml.stdout);
    assert_eq!(String::from_utf8_lossy(&from_sql.stdout), script);
    assert!(script.contains("PRIMARY KEY (`site`, `device`) NOT ENFORCED"), "{script}");
    assert!(
        script.contains("FOR SYSTEM_TIME AS OF l.rt AS r\n  ON l.`site` = r.`site` AND l.`device` = r.`device`;"),
        "{script}"
    );
    assert!(script.contains("GROUP BY `site`, `device`, window_start, window_end"), "{script}");
    assert!(
        script.contains(
            "ON l.`site` = r.`site` AND l.`device` = r.`device` AND l.window_start = r.window_start AND l.window_end = r.window_end;"
        ),
        "{script}"
    );
}
