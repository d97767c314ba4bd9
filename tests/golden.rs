//! Golden cases for `braid replay`, discovered by globbing `tests/golden/*/`.
//!
//! A case is a folder:
//!
//! ```text
//! tests/golden/<case>/
//!   config.toml            the configuration
//!   in/<stream>.jsonl      one `--input <stream>=...` per file, in file-name order
//!   out/<name>.jsonl       one `--output <name>=...` per file (`effect.late` -> out/effect.late.jsonl)
//!   args                   optional: one `--input NAME=PATH` / `--output NAME=PATH` per line
//!                          (paths relative to the case folder); replaces the file-name order,
//!                          since the order of the --input flags breaks ties in the merge
//!   expect_exit            optional: the exit status to expect (e.g. 78); outputs are not compared
//!   recover_after          optional: a checkpoint epoch E — a recovery case (below)
//!   README.md              which edge the case pins and why the expected output is right
//! ```
//!
//! Each case runs with `--shards 1` and `--shards 3`. Every output is compared with its expected
//! file as a multiset of JSON objects: numbers compare as f64, `_supersedes` is ignored and the
//! value of `_id` is ignored (only its presence counts), because ids are braid's own hash.
//! Instead every `_id` must be 16 lowercase hex digits, and ids must have the expected
//! *structure*: two actual rows share an `_id` exactly when the corresponding expected rows do
//! (checked over all outputs of a case, on the rows whose counterpart is unambiguous).
//!
//! A recovery case runs twice per shard count, with `state_dir` set to a fresh folder: first with
//! `BRAID_FAULT_EXIT_AFTER_CHECKPOINT=E`, so replay ends abruptly (as `kill -9` would) right
//! after committing checkpoint `E`; then again with the same arguments, which must resume from
//! checkpoint `E` (its log says so) and end with exactly the expected outputs. Its config sets a
//! `checkpoint_interval` that puts checkpoint `E` where the case's README says (mid-window, with
//! timers pending, …).
//!
//! Each case folder is its own test, named after the folder (a libtest-mimic trial, so the usual
//! filters work: `cargo test --test golden bound_` runs the cases whose name contains `bound_`).
//! A case's failures over both shard counts are reported together.

/// The two helper files of `tests/it/common` the runner needs (the rest belongs to the `it` crate).
#[allow(dead_code, clippy::unwrap_used)]
#[path = "it/common"]
mod common {
    pub mod multiset;
    pub mod run;
}

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::Value;

use common::multiset::is_id_value;
use common::run::{replay_command, run_with_timeout};

/// Shard counts every case runs with: output must not depend on them.
const SHARDS: [u32; 2] = [1, 3];
/// A replay of a golden case takes milliseconds; this only stops a hung engine hanging the suite.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Rows printed per list in a failure report.
const MAX_ROWS_SHOWN: usize = 25;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden");
    let mut cases: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", root.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no golden cases under {}", root.display());
    let trials = cases.into_iter().map(|case| Trial::test(case_name(&case), move || golden_case(&case))).collect();
    libtest_mimic::run(&Arguments::from_args(), trials).exit();
}

/// One case folder, run with every shard count of [`SHARDS`].
fn golden_case(case: &Path) -> Result<(), Failed> {
    let spec = CaseSpec::load(case).map_err(|msg| format!("{}: bad case folder: {msg}", case_name(case)))?;
    let mut failures = Vec::new();
    for shards in SHARDS {
        if let Err(msg) = run_case(&spec, shards) {
            failures.push(format!("{} (--shards {shards}):\n{}", case_name(case), indent(&msg)));
        }
    }
    if !failures.is_empty() {
        return Err(format!("{} golden run(s) failed:\n\n{}", failures.len(), failures.join("\n\n")).into());
    }
    Ok(())
}

fn case_name(case: &Path) -> String {
    case.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// What a case folder asks for.
struct CaseSpec {
    dir: PathBuf,
    /// (stream, input file), in --input flag order.
    inputs: Vec<(String, PathBuf)>,
    /// (output name, expected file), in --output flag order.
    outputs: Vec<(String, PathBuf)>,
    expect_exit: i32,
    /// A recovery case: the checkpoint epoch to crash after.
    recover_after: Option<u64>,
}

impl CaseSpec {
    fn load(dir: &Path) -> Result<CaseSpec, String> {
        if !dir.join("config.toml").is_file() {
            return Err("no config.toml".into());
        }
        let expect_exit = match fs::read_to_string(dir.join("expect_exit")) {
            Ok(s) => s.trim().parse().map_err(|e| format!("expect_exit {s:?}: {e}"))?,
            Err(_) => 0,
        };
        let in_files = jsonl_files(&dir.join("in"))?;
        let out_files = jsonl_files(&dir.join("out"))?;
        let (inputs, outputs) = if dir.join("args").is_file() {
            let (inputs, outputs) = parse_args_file(dir)?;
            // Every file of in/ and out/ must be named in `args`: an expected file that is
            // silently not compared would pin nothing.
            for (what, files, listed) in [("in", &in_files, &inputs), ("out", &out_files, &outputs)] {
                for (_, file) in files {
                    if !listed.iter().any(|(_, p)| same_file(p, file)) {
                        return Err(format!("{what}/{} is not named in `args`", file_name(file)));
                    }
                }
            }
            (inputs, outputs)
        } else {
            (in_files, out_files)
        };
        if expect_exit == 0 && outputs.is_empty() {
            return Err("no out/*.jsonl: nothing to compare".into());
        }
        let recover_after = match fs::read_to_string(dir.join("recover_after")) {
            Ok(s) => Some(s.trim().parse().map_err(|e| format!("recover_after {s:?}: {e}"))?),
            Err(_) => None,
        };
        Ok(CaseSpec { dir: dir.to_path_buf(), inputs, outputs, expect_exit, recover_after })
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// `dir/*.jsonl` as (name, path) in file-name order; name = file name without `.jsonl`.
/// A missing folder is an empty list.
fn jsonl_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(_) => return Ok(Vec::new()),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        let name = file_name(&path);
        match name.strip_suffix(".jsonl") {
            Some(stem) if path.is_file() => files.push((stem.to_string(), path)),
            _ => return Err(format!("{}: unexpected entry {name:?}", dir.display())),
        }
    }
    files.sort_by_key(|(_, path)| file_name(path));
    Ok(files)
}

/// (name, file) pairs of `--input` or `--output` flags, in flag order.
type Flags = Vec<(String, PathBuf)>;

fn parse_args_file(dir: &Path) -> Result<(Flags, Flags), String> {
    let text = fs::read_to_string(dir.join("args")).map_err(|e| format!("args: {e}"))?;
    let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || format!("args line {}: want `--input NAME=PATH` or `--output NAME=PATH`, got {line:?}", n + 1);
        let mut words = line.split_whitespace();
        let (flag, value) = (words.next().ok_or_else(bad)?, words.next().ok_or_else(bad)?);
        let value = value.strip_prefix('=').unwrap_or(value);
        if words.next().is_some() {
            return Err(bad());
        }
        let (name, path) = value.split_once('=').ok_or_else(bad)?;
        let entry = (name.to_string(), dir.join(path));
        match flag {
            "--input" => inputs.push(entry),
            "--output" => outputs.push(entry),
            _ => return Err(bad()),
        }
    }
    Ok((inputs, outputs))
}

fn run_case(spec: &CaseSpec, shards: u32) -> Result<(), String> {
    let tmp = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let actual_files: Vec<(String, PathBuf)> = spec
        .outputs
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.clone(), tmp.path().join(format!("out{i}.jsonl"))))
        .collect();
    let config = match spec.recover_after {
        Some(epoch) => crash_after_checkpoint(spec, shards, tmp.path(), &actual_files, epoch)?,
        None => spec.dir.join("config.toml"),
    };
    let mut cmd = replay_command(&config, Some(shards), &spec.inputs, &actual_files);
    let (status, stderr) = run_with_timeout(&mut cmd, TIMEOUT)?;
    if let Some(epoch) = spec.recover_after
        && !stderr.contains(&format!("resumes from its checkpoint epoch={epoch}"))
    {
        return Err(format!("the second run did not resume from checkpoint {epoch}; stderr:\n{}", indent(&stderr)));
    }
    let code = status.code();
    if code != Some(spec.expect_exit) {
        return Err(format!(
            "exit status {} (want {})\nstderr:\n{}",
            code.map_or_else(|| format!("{status}"), |c| c.to_string()),
            spec.expect_exit,
            indent(tail(&stderr, 40).as_str())
        ));
    }
    if spec.expect_exit != 0 {
        return Ok(());
    }

    let mut problems = Vec::new();
    let mut compared = Vec::new();
    for ((name, expected_path), (_, actual_path)) in spec.outputs.iter().zip(&actual_files) {
        let expected = match read_rows(expected_path) {
            Ok(rows) => rows,
            Err(e) => return Err(format!("expected output {name}: {e}")),
        };
        let actual = match read_rows(actual_path) {
            Ok(rows) => rows,
            Err(e) => {
                problems.push(format!("output {name}: {e}"));
                continue;
            }
        };
        for row in &actual {
            if let Some(id) = row.get("_id")
                && !is_id_value(id)
            {
                problems.push(format!("output {name}: `_id` is not 16 lowercase hex digits: {row}"));
            }
        }
        match diff(&expected, &actual) {
            Some(report) => problems.push(format!("output {name} differs:\n{}", indent(&report))),
            None => compared.push((name.as_str(), expected, actual)),
        }
    }
    if problems.is_empty()
        && let Err(e) = check_id_structure(&compared)
    {
        problems.push(e);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        if !stderr.trim().is_empty() {
            problems.push(format!("stderr:\n{}", indent(&tail(&stderr, 20))));
        }
        Err(problems.join("\n"))
    }
}

/// The first run of a recovery case: the case's config with `state_dir` in `tmp`, run until
/// it ends abruptly after committing checkpoint `epoch`. The config for the second run.
fn crash_after_checkpoint(
    spec: &CaseSpec,
    shards: u32,
    tmp: &Path,
    outputs: &[(String, PathBuf)],
    epoch: u64,
) -> Result<PathBuf, String> {
    let text = fs::read_to_string(spec.dir.join("config.toml")).map_err(|e| format!("config.toml: {e}"))?;
    let state = format!("state_dir = {:?}\n", tmp.join("state").display().to_string());
    let Some(at) = text.find("[runtime]\n") else {
        return Err("a recovery case's config.toml needs a [runtime] section (with checkpoint_interval)".into());
    };
    let text = format!("{}{state}{}", &text[..at + "[runtime]\n".len()], &text[at + "[runtime]\n".len()..]);
    let config = tmp.join("config.toml");
    fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    let mut cmd = replay_command(&config, Some(shards), &spec.inputs, outputs);
    cmd.env("BRAID_FAULT_EXIT_AFTER_CHECKPOINT", epoch.to_string()).env("BRAID_LOG", "info");
    let (status, stderr) = run_with_timeout(&mut cmd, TIMEOUT)?;
    if status.code() != Some(113) {
        return Err(format!(
            "the first run should end after checkpoint {epoch}, ended {status}; stderr:\n{}",
            indent(&stderr)
        ));
    }
    Ok(config)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The JSON objects of a JSON-lines file (blank lines skipped).
fn read_rows(path: &Path) -> Result<Vec<Value>, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line)
            .map_err(|e| format!("{} line {}: not JSON ({e}): {line}", path.display(), n + 1))?;
        if !value.is_object() {
            return Err(format!("{} line {}: not a JSON object: {line}", path.display(), n + 1));
        }
        rows.push(value);
    }
    Ok(rows)
}

/// The comparison form of a row: keys sorted, numbers as f64, `_supersedes` dropped and the
/// value of `_id` replaced by a marker (its presence still counts).
fn canonical(row: &Value) -> String {
    let mut out = String::new();
    write_canonical(row, true, &mut out);
    out
}

fn write_canonical(v: &Value, top: bool, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            let f = if f == 0.0 { 0.0 } else { f }; // -0.0 == 0.0
            out.push_str(&format!("{f:?}"));
        }
        Value::String(s) => out.push_str(&Value::String(s.clone()).to_string()),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, false, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let sorted: BTreeMap<&String, &Value> = map.iter().collect();
            out.push('{');
            let mut first = true;
            for (k, v) in sorted {
                if top && k == "_supersedes" {
                    continue;
                }
                if !first {
                    out.push(',');
                }
                first = false;
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if top && k == "_id" {
                    out.push_str("\"<id>\"");
                } else {
                    write_canonical(v, false, out);
                }
            }
            out.push('}');
        }
    }
}

/// None when `expected` and `actual` are equal as multisets of canonical rows, else a report.
fn diff(expected: &[Value], actual: &[Value]) -> Option<String> {
    let mut count: BTreeMap<String, (i64, Vec<&Value>, Vec<&Value>)> = BTreeMap::new();
    for row in expected {
        let e = count.entry(canonical(row)).or_default();
        e.0 += 1;
        e.1.push(row);
    }
    for row in actual {
        let e = count.entry(canonical(row)).or_default();
        e.0 -= 1;
        e.2.push(row);
    }
    let mut missing = Vec::new();
    let mut unexpected = Vec::new();
    for (n, exp, act) in count.values() {
        if *n > 0 {
            missing.extend(exp.iter().take(*n as usize).map(|r| show(r)));
        } else if *n < 0 {
            unexpected.extend(act.iter().take((-*n) as usize).map(|r| show(r)));
        }
    }
    if missing.is_empty() && unexpected.is_empty() {
        return None;
    }
    let mut report = format!(
        "{} expected row(s), {} actual; {} missing, {} unexpected (`_id` values are not compared)\n",
        expected.len(),
        actual.len(),
        missing.len(),
        unexpected.len()
    );
    for (label, rows) in
        [("missing (expected, not produced)", &missing), ("unexpected (produced, not expected)", &unexpected)]
    {
        if rows.is_empty() {
            continue;
        }
        report.push_str(&format!("{label}:\n"));
        for r in rows.iter().take(MAX_ROWS_SHOWN) {
            report.push_str(&format!("  - {r}\n"));
        }
        if rows.len() > MAX_ROWS_SHOWN {
            report.push_str(&format!("  ... and {} more\n", rows.len() - MAX_ROWS_SHOWN));
        }
    }
    Some(report)
}

/// A row as one line of JSON with its keys in sorted order, for reports.
fn show(row: &Value) -> String {
    let sorted: BTreeMap<&String, &Value> = row.as_object().map(|m| m.iter().collect()).unwrap_or_default();
    serde_json::to_string(&sorted).unwrap_or_else(|_| row.to_string())
}

/// Ids have the expected structure: pairing each expected row with the actual row of the same
/// canonical form (only where that form occurs once on each side, so the pairing is
/// unambiguous), expected `_id` -> actual `_id` must be a one-to-one mapping across all outputs
/// of the case (an upstream result seen again in a downstream `.late` output keeps its id).
fn check_id_structure(outputs: &[(&str, Vec<Value>, Vec<Value>)]) -> Result<(), String> {
    let mut e2a: HashMap<String, (String, String)> = HashMap::new(); // expected id -> (actual id, where)
    let mut a2e: HashMap<String, (String, String)> = HashMap::new();
    let mut errors = Vec::new();
    for (name, expected, actual) in outputs {
        let mut groups: HashMap<String, (Vec<&Value>, Vec<&Value>)> = HashMap::new();
        for row in expected {
            groups.entry(canonical(row)).or_default().0.push(row);
        }
        for row in actual {
            groups.entry(canonical(row)).or_default().1.push(row);
        }
        for (exp, act) in groups.values() {
            let ([e], [a]) = (exp.as_slice(), act.as_slice()) else { continue };
            let (Some(eid), Some(aid)) = (e.get("_id").and_then(Value::as_str), a.get("_id").and_then(Value::as_str))
            else {
                continue;
            };
            let here = format!("{name}: {}", show(a));
            if let Some((prev_a, prev_where)) = e2a.get(eid) {
                if prev_a != aid {
                    errors
                        .push(format!("expected rows share an _id but actual ones do not:\n  {prev_where}\n  {here}"));
                }
            } else {
                e2a.insert(eid.to_string(), (aid.to_string(), here.clone()));
            }
            if let Some((prev_e, prev_where)) = a2e.get(aid) {
                if prev_e != eid {
                    errors.push(format!(
                        "actual rows share an _id but the expected ones do not:\n  {prev_where}\n  {here}"
                    ));
                }
            } else {
                a2e.insert(aid.to_string(), (eid.to_string(), here));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        errors.sort();
        Err(format!("id structure differs:\n{}", indent(&errors.join("\n"))))
    }
}
