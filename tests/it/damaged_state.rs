//! Damaged state files (issue 12, item 6): braid is SIGKILLed mid-stream, random bytes are
//! flipped in every file of its state directory (journal segments and head, the MQTT sink's
//! buffer and head, checkpoint manifests and shard files, the log of rows taken), and `braid run`
//! starts again with a real mosquitto. It must run (no exit at every start), hold the damaged
//! files in `STATE_DIR/quarantine/`, say in its log what was lost, count it in `/metrics`, and
//! emit nothing wrong: with an inner join, losing input can only take results away, so every
//! result in the file sink must be one a replay of all the messages gives, with the same content.
//! `FLIP_SEED=N` picks other flips (default 31).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::mqtt::Mosquitto;
use common::rng::Rng;
use common::run::{replay, write_inputs};
use common::service::{
    Braid, Setup, Source, by_id, gateway_config, http_get, jsonl, metric, mqtt_messages, now_ms, poll_until,
    read_complete_jsonl, workload,
};
use rumqttc::QoS;

const START: Duration = Duration::from_secs(15);

/// Every file of the state directory but the lock and the quarantine, recursively.
fn state_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "quarantine" {
                state_files(&path, out);
            }
        } else if name != "braid.lock" {
            out.push(path);
        }
    }
}

/// Flips `n` random bytes of `path`, within its written part (up to the last non-zero byte).
fn flip(path: &Path, n: usize, rng: &mut Rng) {
    let mut bytes = std::fs::read(path).unwrap();
    let used = bytes.iter().rposition(|&b| b != 0).map_or(0, |last| last + 32).min(bytes.len());
    if used == 0 {
        return;
    }
    for _ in 0..n {
        let at = rng.range(0, used as i64 - 1) as usize;
        bytes[at] ^= rng.range(1, 255) as u8;
    }
    std::fs::write(path, &bytes).unwrap();
}

#[test]
fn random_flips_in_every_state_file_then_start_quarantines_reports_and_emits_nothing_wrong() {
    let dir = tempfile::Builder::new().prefix("braid-damaged-").tempdir().unwrap();
    let (devices, up) = (Mosquitto::start(), Mosquitto::start());
    let (state, file) = (dir.path().join("state"), dir.path().join("archive.jsonl"));
    let ops_port = common::mqtt::free_port();
    let write = |name: &str, state: &Path| {
        let setup = Setup {
            source: Source::Mqtt(devices.url()),
            upstream_url: &up.url(),
            topic: "up/effect/{device}",
            state_dir: state,
            file: &file,
            ops_port,
            max_payload: None,
            idle_timeout: "1s",
        };
        let text = gateway_config(&setup)
            .replacen("[runtime]\n", "[runtime]\ncheckpoint_interval = \"300ms\"\n", 1)
            .replace("join = \"left\"", "join = \"inner\"");
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let config = write("braid.toml", &state);
    let replay_config = write("replay.toml", &dir.path().join("replay-state"));
    let msgs = workload(31, 16, now_ms(), 12_000);
    let (first, second) = msgs.split_at(msgs.len() * 2 / 3);
    let log = dir.path().join("braid.log");

    let mut braid = Braid::start(&config, &log);
    braid.wait_log("ready: subscribed", 1, START);
    common::mqtt::publish_all(devices.port(), &mqtt_messages(first), QoS::AtLeastOnce);
    poll_until(Duration::from_secs(10), || read_complete_jsonl(&file).len() > 10);
    std::thread::sleep(Duration::from_millis(900)); // a few checkpoints, and a journal after them
    braid.kill9();

    let mut files = Vec::new();
    state_files(&state, &mut files);
    let names: Vec<String> = files.iter().map(|p| p.strip_prefix(&state).unwrap().display().to_string()).collect();
    for kind in ["journal/head", ".spool", "sinks/up/head", "manifest", ".snap", "taken.log", "client-id"] {
        assert!(names.iter().any(|n| n.contains(kind)), "no {kind} among the state files {names:?}");
    }
    let mut rng = Rng::new(std::env::var("FLIP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(31));
    for path in &files {
        flip(path, 5, &mut rng);
    }

    // Before: exit 1 at every start (the damaged head), or records after a bad crc lost silently.
    let mut braid = Braid::start(&config, &log);
    braid.wait_log("ready: subscribed", 2, START);
    common::mqtt::publish_all(devices.port(), &mqtt_messages(second), QoS::AtLeastOnce);

    let inputs = write_inputs(dir.path(), [("command", jsonl(&msgs, "command")), ("status", jsonl(&msgs, "status"))]);
    let want =
        by_id(replay(dir.path(), &replay_config, None, &inputs, &["effect"], START).unwrap().take("effect"), "replay");
    let results = || read_complete_jsonl(&file).into_iter().filter(|r| r.get("_id").is_some()).count();
    let mut last = 0;
    poll_until(Duration::from_secs(20), || {
        let now = results();
        let settled = now == last && now > 0;
        last = now;
        std::thread::sleep(Duration::from_millis(700));
        settled
    });
    assert!(braid.running(), "braid runs after the damage; log:\n{}", braid.log());

    let quarantine: Vec<String> = std::fs::read_dir(state.join("quarantine"))
        .map(|e| e.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(!quarantine.is_empty(), "nothing quarantined after flips in {} files; log:\n{}", files.len(), braid.log());
    let text = braid.log();
    let reports = text.matches("Damaged state file").count();
    assert!(reports >= quarantine.len(), "{reports} reports for {} quarantined files:\n{text}", quarantine.len());
    let (_, metrics) = http_get(ops_port, "/metrics").unwrap();
    let counted = metric(&metrics, "braid_state_quarantined_files_total", "").unwrap();
    assert_eq!(counted as usize, quarantine.len(), "quarantined files counted");
    let (_, health) = http_get(ops_port, "/healthz").unwrap();
    assert!(health.contains("state_quarantined"), "/healthz: {health}");

    // Nothing wrong: every result is one the whole input gives, with the same content.
    let (rows, others): (Vec<_>, Vec<_>) = read_complete_jsonl(&file).into_iter().partition(|r| r.get("_id").is_some());
    let got = by_id(rows, "archive");
    for (id, row) in &got {
        assert_eq!(Some(row), want.get(id), "result {id} is not one the input gives");
    }
    assert!(others.iter().all(|r| r.get("_stream").is_none_or(|s| s != "dead_letter")), "dead letters: {others:?}");
    // And the service went on: most results are there (only those of lost input may miss).
    assert!(got.len() * 10 >= want.len() * 6, "{} of {} results", got.len(), want.len());
    eprintln!(
        "{} files flipped, {} quarantined ({reports} reports), {} of {} results",
        files.len(),
        quarantine.len(),
        got.len(),
        want.len()
    );
    braid.terminate(Duration::from_secs(30));
}
