#![allow(clippy::unwrap_used)]
//! Log formats of the real binary (README.md "Logs", `src/ops/logs.rs`): `BRAID_LOG_FORMAT=json`
//! writes one JSON object per event; `JOURNAL_STREAM` not naming stderr keeps plain text; naming
//! it goes to the journal, or without a journal socket falls back to text with a warning; an unknown format exits 78.
//!
//! No journald runs in CI: the journald output itself is not exercised here (the choice of
//! output is unit-tested in `src/ops/logs.rs`).

use crate::common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// EX_CONFIG.
const INVALID: i32 = 78;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// configs/gateway.toml with its state in `dir` (replays running at once must not share one).
pub(crate) fn gateway_config(dir: &Path) -> PathBuf {
    let text = fs::read_to_string(root().join("configs/gateway.toml")).unwrap();
    let state = format!("state_dir = {:?}", dir.join("state").display().to_string());
    assert!(text.contains("state_dir = \"/var/lib/braid\""));
    common::run::write_file(dir, "gateway.toml", text.replacen("state_dir = \"/var/lib/braid\"", &state, 1))
}

/// `braid replay` of the bundled gateway sample in `dir`, with a clean logging environment.
pub(crate) fn gateway_replay(dir: &Path) -> Command {
    let samples = root().join("configs/samples/gateway");
    let mut cmd = common::run::braid();
    cmd.env_remove("BRAID_LOG_FORMAT").env_remove("JOURNAL_STREAM").env_remove("BRAID_LOG");
    cmd.arg("replay").arg("--config").arg(gateway_config(dir));
    cmd.arg("--input").arg(format!("command={}", samples.join("command.jsonl").display()));
    cmd.arg("--input").arg(format!("status={}", samples.join("status.jsonl").display()));
    cmd.arg("--output").arg(format!("effect={}", dir.join("effect.jsonl").display()));
    cmd
}

fn stderr_of(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "braid failed: {:?}\n{stderr}", out.status);
    stderr
}

#[test]
fn json_format_writes_one_json_object_per_event() {
    let dir = tempfile::tempdir().unwrap();
    // debug: more events, with more kinds of fields, than the one at info.
    let stderr = stderr_of(gateway_replay(dir.path()).env("BRAID_LOG_FORMAT", "json").env("BRAID_LOG", "braid=debug"));
    let mut events = Vec::new();
    for line in stderr.lines().filter(|l| !l.is_empty()) {
        let event: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(event["timestamp"].as_str().is_some_and(|t| t.contains('T')), "timestamp: {line}");
        assert!(["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&event["level"].as_str().unwrap()), "{line}");
        assert!(event["target"].as_str().is_some_and(|t| t.starts_with("braid")), "target: {line}");
        assert!(event["fields"]["message"].as_str().is_some_and(|m| !m.is_empty()), "message: {line}");
        events.push(event);
    }
    let finished = events
        .iter()
        .find(|e| e["fields"]["message"] == "Replay finished")
        .unwrap_or_else(|| panic!("no `Replay finished` event in:\n{stderr}"));
    assert_eq!(finished["level"], "INFO");
    assert_eq!(finished["target"], "braid");
    // Structured fields stay typed: numbers, not text.
    let lines = fs::read_to_string(root().join("configs/samples/gateway/command.jsonl")).unwrap().lines().count()
        + fs::read_to_string(root().join("configs/samples/gateway/status.jsonl")).unwrap().lines().count();
    assert_eq!(finished["fields"]["lines"].as_u64(), Some(lines as u64), "{finished}");
    assert!(finished["fields"]["shards"].as_u64().is_some_and(|n| n >= 1), "{finished}");
}

#[test]
fn journal_stream_not_naming_stderr_keeps_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    // Set by systemd for the parent, inherited with stderr pointing elsewhere (here: a pipe).
    let stderr = stderr_of(gateway_replay(dir.path()).env("JOURNAL_STREAM", "8:12345"));
    let finished = stderr.lines().find(|l| l.contains("Replay finished")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(finished.contains(" INFO braid: Replay finished lines="), "{finished}");
    assert!(!stderr.lines().any(|l| l.starts_with('{')), "JSON in text mode:\n{stderr}");
    assert!(!stderr.contains("Journald"), "{stderr}");
}

#[test]
fn journal_stream_naming_stderr_goes_to_the_journal_or_falls_back_to_text() {
    let journal = Path::new("/run/systemd/journal/socket").exists();
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr.txt");
    let err_file = fs::File::create(&err_path).unwrap();
    let meta = err_file.metadata().unwrap();
    let status = gateway_replay(dir.path())
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(Stdio::from(err_file))
        .status()
        .unwrap();
    let stderr = fs::read_to_string(&err_path).unwrap();
    assert!(status.success(), "{status:?}\n{stderr}");
    if journal {
        // A journal to write to: events go there, none to stderr.
        assert!(!stderr.contains("Replay finished"), "events on stderr beside a journal:\n{stderr}");
        return;
    }
    let warning = stderr.lines().next().unwrap_or_default();
    assert!(
        warning.contains(" WARN braid::ops::logs: Journald socket unavailable, logging text to stderr"),
        "{stderr}"
    );
    assert!(stderr.contains(" INFO braid: Replay finished lines="), "{stderr}");
}

#[test]
fn an_unknown_format_exits_78_naming_the_accepted_values() {
    let dir = tempfile::tempdir().unwrap();
    let out = gateway_replay(dir.path()).env("BRAID_LOG_FORMAT", "logfmt").output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(INVALID), "{stderr}");
    assert_eq!(
        stderr,
        "error: BRAID_LOG_FORMAT=\"logfmt\" is not a log format; accepted: text, json (unset: journald under systemd, else text)\n"
    );
    assert!(!dir.path().join("effect.jsonl").exists(), "ran despite the error");
}
