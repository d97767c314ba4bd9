//! Replay resume (CONTRACT.md "Replay"): a replay with a `state_dir`, killed with SIGKILL at
//! random points and started again with the same arguments each time, ends with exactly the
//! output lines of one uninterrupted run — none missing, none twice, none different.
//!
//! Every example of configs/ runs over its samples tiled in time (each copy shifted past the
//! last, so every operator kind holds state across many checkpoints), with a checkpoint every
//! 200 ms of arrival time. The harness times an uninterrupted run, then kills each replay at a
//! random point within that time, restarts it, four times (or until a run finishes first), and
//! lets the last run finish; a kill can land anywhere — while inputs are scanned, mid-checkpoint,
//! between a barrier and its commit, during the last drain.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::common;
use common::rng::Rng;
use common::run::{Files, replay_command, run_with_timeout};

/// Copies of the samples laid end to end in time.
const COPIES: i64 = 60;

/// The example's samples, tiled: copy `c` has every `ts` and `arrival` moved by `c × span`.
fn tiled_inputs(name: &str, dir: &Path) -> Files {
    let samples = Path::new("configs/samples").join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&samples).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let texts: Vec<(String, String)> = files
        .iter()
        .map(|p| (p.file_stem().unwrap().to_str().unwrap().to_owned(), std::fs::read_to_string(p).unwrap()))
        .collect();
    let times = |v: &Value| ["ts", "arrival"].into_iter().filter_map(|f| v.get(f)?.as_i64()).collect::<Vec<_>>();
    let all: Vec<i64> = texts
        .iter()
        .flat_map(|(_, t)| t.lines())
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|v| times(&v))
        .collect();
    let span = all.iter().max().unwrap() - all.iter().min().unwrap() + 60_000;
    texts
        .iter()
        .map(|(stream, text)| {
            let mut out = String::new();
            for copy in 0..COPIES {
                for line in text.lines() {
                    match serde_json::from_str::<Value>(line) {
                        Ok(Value::Object(mut row)) => {
                            for field in ["ts", "arrival"] {
                                if let Some(t) = row.get(field).and_then(Value::as_i64) {
                                    row.insert(field.into(), (t + copy * span).into());
                                }
                            }
                            out.push_str(&Value::Object(row).to_string());
                        }
                        // Lines that are no object stay as they are (dead letters).
                        _ => out.push_str(line),
                    }
                    out.push('\n');
                }
            }
            let path = dir.join(format!("{stream}.jsonl"));
            std::fs::write(&path, out).unwrap();
            (stream.clone(), path)
        })
        .collect()
}

/// The example's config with its state in `state` (none: a private temporary directory) and a
/// checkpoint every 200 ms.
fn config_with(example: &Path, state: Option<&Path>, dir: &Path, file: &str) -> PathBuf {
    let mut table: toml::Table = std::fs::read_to_string(example).unwrap().parse().unwrap();
    let runtime = table.entry("runtime").or_insert_with(|| toml::Table::new().into()).as_table_mut().unwrap();
    runtime.remove("state_dir");
    if let Some(state) = state {
        runtime.insert("state_dir".into(), state.display().to_string().into());
    }
    runtime.insert("checkpoint_interval".into(), "200ms".into());
    let path = dir.join(file);
    std::fs::write(&path, toml::to_string(&table).unwrap()).unwrap();
    path
}

/// Every output of the plan: each operator, its late rows, and the dead letters.
fn output_names(config: &Path) -> Vec<String> {
    let plan = braid::config::load(config).unwrap();
    let mut names: Vec<String> =
        plan.operators.iter().flat_map(|o| [o.name.clone(), format!("{}.late", o.name)]).collect();
    names.push("dead_letter".into());
    names
}

fn files(dir: &Path, prefix: &str, names: &[String]) -> Files {
    names.iter().map(|n| (n.clone(), dir.join(format!("{prefix}-{n}.jsonl")))).collect()
}

/// Each output file's lines, counted.
fn line_counts(outputs: &Files) -> BTreeMap<String, BTreeMap<String, usize>> {
    outputs
        .iter()
        .map(|(name, path)| {
            let text = std::fs::read_to_string(path).unwrap();
            let mut counts = BTreeMap::new();
            for line in text.lines() {
                *counts.entry(line.to_owned()).or_default() += 1;
            }
            (name.clone(), counts)
        })
        .collect()
}

/// Runs `cmd` to its end; how long it took, counted in polls of [`POLL`] (tests do not read the
/// clock).
fn timed_run(cmd: &mut std::process::Command) -> Duration {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut took = Duration::ZERO;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "reference replay failed: {status}");
            return took;
        }
        std::thread::sleep(POLL);
        took += POLL;
        assert!(took < Duration::from_secs(120), "reference replay hung");
    }
}

const POLL: Duration = Duration::from_millis(5);
/// Kills per example: each run is killed at a random point of about one whole run's length.
const KILLS: usize = 4;

/// Runs the replay, killing it after a random delay within `whole` (an uninterrupted run's
/// length) and starting it again, [`KILLS`] times (fewer when a run ends first), then lets it
/// finish; the number of kills, and of the runs that resumed from a checkpoint.
fn replay_with_kills(rng: &mut Rng, config: &Path, inputs: &Files, outputs: &Files, whole: Duration) -> (usize, usize) {
    let mut kills = 0;
    let whole_ms = whole.as_millis().max(20) as i64;
    let log = config.with_extension("log");
    let resumes = || std::fs::read_to_string(&log).unwrap_or_default().matches("resumes from its checkpoint").count();
    while kills < KILLS {
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut child = replay_command(config, Some(2), inputs, outputs)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.range(whole_ms / 10, whole_ms) as u64));
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{}: replay failed: {status}", config.display());
            return (kills, resumes());
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
    }
    let (status, stderr) =
        run_with_timeout(&mut replay_command(config, Some(2), inputs, outputs), Duration::from_secs(120)).unwrap();
    assert!(status.success(), "{}: {stderr}", config.display());
    (kills, resumes() + stderr.matches("resumes from its checkpoint").count())
}

#[test]
fn a_replay_killed_at_random_points_ends_as_one_uninterrupted_run() {
    let mut examples: Vec<PathBuf> = std::fs::read_dir("configs")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    examples.sort();
    let (mut total_kills, mut total_resumes) = (0, 0);
    for (seed, example) in examples.iter().enumerate() {
        let name = example.file_stem().unwrap().to_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let inputs = tiled_inputs(name, dir.path());
        let reference_config = config_with(example, None, dir.path(), "reference.toml");
        let names = output_names(&reference_config);
        let reference = files(dir.path(), "reference", &names);
        let whole = timed_run(&mut replay_command(&reference_config, Some(2), &inputs, &reference));

        let state = dir.path().join("state");
        let config = config_with(example, Some(&state), dir.path(), "resumed.toml");
        let resumed = files(dir.path(), "resumed", &names);
        let mut rng = Rng::new(seed as u64 + 1);
        let (kills, resumed_runs) = replay_with_kills(&mut rng, &config, &inputs, &resumed, whole);
        total_kills += kills;
        total_resumes += resumed_runs;
        eprintln!("{name}: {kills} kills, {resumed_runs} runs resumed from a checkpoint");
        let (want, got) = (line_counts(&reference), line_counts(&resumed));
        for (output, lines) in &want {
            let got = &got[output];
            let missing: Vec<_> = lines.iter().filter(|(l, n)| got.get(*l) < Some(n)).take(3).collect();
            let extra: Vec<_> = got.iter().filter(|(l, n)| lines.get(*l) < Some(n)).take(3).collect();
            assert!(
                missing.is_empty() && extra.is_empty(),
                "{name}: output {output} after {kills} kills: missing {missing:?}, extra {extra:?}"
            );
        }
        let replay_checkpoints = state.join("replay-checkpoints");
        let left = std::fs::read_dir(&replay_checkpoints).map_or(0, |d| d.count());
        assert_eq!(left, 0, "{name}: a finished replay leaves no checkpoint to resume");
    }
    assert!(total_kills >= 20, "only {total_kills} kills landed: the runs are too short to test resume");
    assert!(total_resumes >= 10, "only {total_resumes} runs resumed from a checkpoint: the kills came too early");
}
