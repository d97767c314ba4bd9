//! Poison input (issue 12, item 3 and 4): no message can stop `braid run`. Through a real
//! mosquitto, one service takes, in this order,
//! - a 20 MiB publish (over every limit of the source: read through the trimming relay, a dead
//!   letter `oversized`),
//! - a command on `devices//command` (an empty `+device` level: `bad_topic_capture:device`),
//! - a status from a device whose clock is 9 minutes fast (beyond the default `max_skew` of
//!   30 s: `time_out_of_range`),
//! - a command and a status of ~300 KiB each that join into a result larger than a shard ring
//!   carries (`too_large`, with `_stream` the operator),
//! - then a command and a status of each of 40 ordinary devices, published right behind them.
//!
//! Every ordinary device's command must join its status (40 `match` results), every poison must
//! be one dead letter with its reason, counted in `braid_stream_dead_letter_total`, and the
//! service must still be up with its source connected.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::mqtt::{Mosquitto, free_port, publish_all};
use common::run::{replay, write_inputs};
use common::service::{
    Braid, gateway_pipeline, http_get, metric, now_ms, poll_until, read_complete_jsonl, with_sections,
};
use rumqttc::QoS;
use serde_json::{Value, json};

const DEVICES: usize = 40;
const START: Duration = Duration::from_secs(15);
const RESULTS: Duration = Duration::from_secs(20);

fn config(broker: &Mosquitto, state: &Path, archive: &Path, ops_port: u16) -> String {
    let mut pipeline = gateway_pipeline();
    for (_, stream) in pipeline["streams"].as_table_mut().unwrap().iter_mut() {
        let stream = stream.as_table_mut().unwrap();
        stream.insert("idle_timeout".into(), "1s".into());
        // Room for one ~300 KiB row; a pair of them is more than a ring carries.
        stream.insert("max_payload".into(), "400KiB".into());
    }
    let deployment = format!(
        "[runtime]\nshards = 2\nstate_dir = \"{state}\"\nidle_advance = true\ncheckpoint_interval = \"1h\"\n\n\
         [ops]\nlisten = \"127.0.0.1:{ops_port}\"\n\n\
         [sources.devices]\nkind = \"mqtt\"\nurl = \"{url}\"\nkeep_alive = \"5s\"\n\n\
         [sinks.archive]\nkind = \"file\"\ninputs = [\"effect\", \"effect.late\", \"dead_letter\"]\npath = \"{archive}\"\n",
        state = state.display(),
        url = broker.url(),
        archive = archive.display(),
    );
    with_sections(pipeline, &deployment)
}

fn command(device: &str, ts: i64, cmd: &str) -> (String, Vec<u8>) {
    let payload = json!({"ts": ts, "cmd": cmd, "arg": "x", "cmd_id": format!("{device}-c")});
    (format!("devices/{device}/command"), payload.to_string().into_bytes())
}

fn status(device: &str, ts: i64, state: &str) -> (String, Vec<u8>) {
    let payload = json!({"ts": ts, "temp": 20.5, "state": state, "seq": 1});
    (format!("devices/{device}/status"), payload.to_string().into_bytes())
}

/// Publishes `payload` with mosquitto's own client (QoS 1): a real 20 MiB PUBLISH.
fn publish_file(port: u16, topic: &str, payload: &[u8], dir: &Path) {
    let file = dir.join("big-payload");
    std::fs::write(&file, payload).unwrap();
    let out = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1", "-t", topic, "-f"])
        .arg(&file)
        .output()
        .expect("running mosquitto_pub (package mosquitto-clients)");
    assert!(out.status.success(), "mosquitto_pub: {}", String::from_utf8_lossy(&out.stderr));
}

fn archive_rows(path: &Path) -> (Vec<Value>, Vec<Value>) {
    read_complete_jsonl(path).into_iter().partition(|row| row.get("_reason").is_none())
}

#[test]
fn poison_messages_are_dead_letters_and_every_other_device_keeps_joining() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Mosquitto::start();
    let (state, archive, ops_port) = (dir.path().join("state"), dir.path().join("archive.jsonl"), free_port());
    let config_path = dir.path().join("braid.toml");
    std::fs::write(&config_path, config(&broker, &state, &archive, ops_port)).unwrap();
    let mut braid = Braid::start(&config_path, &dir.path().join("braid.log"));
    braid.wait_log("ready: subscribed", 1, START);

    let now = now_ms();
    let big = vec![b'x'; 20 << 20];
    publish_file(broker.port(), "devices/dbig/status", &big, dir.path());
    let huge = "h".repeat(300 << 10);
    let mut poison = vec![
        command("", now, "on"),
        status("dfast9", now + 9 * 60_000, "on"),
        command("dhuge", now, &huge),
        status("dhuge", now + 1, &huge),
    ];
    poison[0].0 = "devices//command".into();
    publish_all(broker.port(), &poison, QoS::AtLeastOnce);
    let ordinary: Vec<(String, Vec<u8>)> = (0..DEVICES)
        .flat_map(|d| {
            let device = format!("d{d:02}");
            let ts = now + 10 + d as i64;
            [command(&device, ts, "on"), status(&device, ts + 100, "on")]
        })
        .collect();
    publish_all(broker.port(), &ordinary, QoS::AtLeastOnce);

    let matches = |rows: &[Value]| {
        rows.iter().filter(|r| r["_kind"] == "match" && r["device"].as_str().is_some_and(|d| d.len() == 3)).count()
    };
    let joined = poll_until(RESULTS, || matches(&archive_rows(&archive).0) >= DEVICES);
    let (results, dead) = archive_rows(&archive);
    assert!(joined, "{} of {DEVICES} ordinary devices joined; log:\n{}", matches(&results), braid.log());
    assert_eq!(matches(&results), DEVICES, "each ordinary device joins once");

    let reasons: Vec<(String, String)> = dead
        .iter()
        .map(|d| (d["_stream"].as_str().unwrap().to_owned(), d["_reason"].as_str().unwrap().to_owned()))
        .collect();
    for expected in [
        ("status", "oversized"),
        ("command", "bad_topic_capture:device"),
        ("status", "time_out_of_range"),
        ("effect", "too_large"),
    ] {
        let n = reasons.iter().filter(|(s, r)| (s.as_str(), r.as_str()) == expected).count();
        assert_eq!(n, 1, "dead letters {expected:?}: {n}; all: {reasons:?}");
    }
    let oversized = dead.iter().find(|d| d["_reason"] == "oversized").unwrap();
    assert_eq!(oversized["raw"].as_str().unwrap().len(), 1024, "its first KiB");
    let too_large = dead.iter().find(|d| d["_reason"] == "too_large").unwrap();
    assert!(too_large["raw"].as_str().unwrap().starts_with('{'), "the result's first KiB as JSON");

    let counted = [
        ("stream=\"status\",reason=\"oversized\"", 1.0),
        ("stream=\"command\",reason=\"bad_topic_capture:device\"", 1.0),
        ("stream=\"status\",reason=\"time_out_of_range\"", 1.0),
        ("stream=\"effect\",reason=\"too_large\"", 1.0),
    ];
    // The figures behind /metrics are copied about once a second.
    let metrics = || http_get(ops_port, "/metrics").expect("/metrics answers").1;
    poll_until(Duration::from_secs(3), || {
        let text = metrics();
        counted.iter().all(|(labels, n)| metric(&text, "braid_stream_dead_letter_total", labels) == Some(*n))
    });
    let metrics = metrics();
    for (labels, n) in counted {
        assert_eq!(metric(&metrics, "braid_stream_dead_letter_total", labels), Some(n), "{labels}");
    }
    assert_eq!(metric(&metrics, "braid_source_oversized_trimmed_total", "source=\"devices\""), Some(1.0));
    assert_eq!(metric(&metrics, "braid_source_connected", "source=\"devices\""), Some(1.0));

    // The poison is in the journal (taken before it was found unusable) and no checkpoint covers
    // it (`checkpoint_interval = "1h"`, then kill -9): the restart replays every entry through
    // the same path, must come up (a frame over a ring's size failed every start before) and
    // keeps joining; what the file sink already took is not written again.
    braid.kill9();
    let mut again = Braid::start(&config_path, &dir.path().join("braid-again.log"));
    again.wait_log("ready: subscribed", 1, START);
    let replayed = again.log();
    // 85 messages, and the start and connection events.
    let entries = replayed.split("journal replayed").nth(1).and_then(|rest| rest.split("entries=").nth(1));
    let entries: usize = entries.and_then(|e| e.split_whitespace().next()?.parse().ok()).unwrap_or(0);
    assert!(entries > 85, "{entries} journal entries replayed; log:\n{replayed}");
    publish_all(
        broker.port(),
        &[command("dnew", now_ms(), "on"), status("dnew", now_ms() + 100, "on")],
        QoS::AtLeastOnce,
    );
    let new_match = || archive_rows(&archive).0.iter().any(|r| r["device"] == "dnew" && r["_kind"] == "match");
    assert!(poll_until(RESULTS, new_match), "no join after the restart; log:\n{}", again.log());
    let too_large = archive_rows(&archive).1.iter().filter(|d| d["_reason"] == "too_large").count();
    assert_eq!(too_large, 1, "written once");
    assert!(again.terminate(Duration::from_secs(10)).success(), "log:\n{}", again.log());
}

/// Replay: a row whose frame is larger than a shard ring carries although its payload is within
/// `max_payload` (a 300 KiB key is archived twice: as the key and as its field), and a result of
/// two 300 KiB rows, are dead letters `too_large`; the run goes on, with 1 shard and with 3. A
/// config asking for a `max_payload` no ring carries is
/// refused with its position.
#[test]
fn rows_and_results_too_large_for_the_rings_are_dead_letters_in_replay() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("braid.toml");
    let mut pipeline = gateway_pipeline();
    for (_, stream) in pipeline["streams"].as_table_mut().unwrap().iter_mut() {
        stream.as_table_mut().unwrap().insert("max_payload".into(), "400KiB".into());
    }
    // Replay ignores sources, but the config must name the one its streams refer to.
    let source = "[sources.devices]\nkind = \"mqtt\"\nurl = \"mqtt://127.0.0.1:1883\"\n";
    std::fs::write(&config, with_sections(pipeline, source)).unwrap();
    let big = "b".repeat(300 << 10);
    let line = |v: Value| v.to_string() + "\n";
    let commands = [
        line(json!({"device": "d1", "ts": 1000, "cmd": "on", "arg": "x", "cmd_id": "d1-c"})),
        line(json!({"device": big, "ts": 1100, "cmd": "on", "arg": "x", "cmd_id": "big-key"})),
        line(json!({"device": "d2", "ts": 1200, "cmd": big, "arg": "x", "cmd_id": "d2-c"})),
    ]
    .concat();
    let statuses = [
        line(json!({"device": "d1", "ts": 1500, "temp": 1.0, "state": "on", "seq": 1})),
        line(json!({"device": "d2", "ts": 1600, "temp": 1.0, "state": big, "seq": 2})),
    ]
    .concat();
    let inputs = write_inputs(dir.path(), [("command", commands), ("status", statuses)]);
    for shards in [1, 3] {
        let mut out = replay(dir.path(), &config, Some(shards), &inputs, &["effect", "dead_letter"], RESULTS)
            .unwrap_or_else(|e| panic!("{e}"));
        let effect = out.take("effect");
        let ids: Vec<&str> = effect.iter().map(|r| r["cmd_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["d1-c"], "shards {shards}: {effect:?}");
        let dead: Vec<(String, String, usize)> = out
            .take("dead_letter")
            .iter()
            .map(|d| {
                let text = |f: &str| d[f].as_str().unwrap().to_owned();
                (text("_stream"), text("_reason"), d["raw"].as_str().unwrap().len())
            })
            .collect();
        let want = [("command".to_owned(), "too_large".to_owned(), 1024), ("effect".into(), "too_large".into(), 1024)];
        assert_eq!(dead, want, "shards {shards}");
    }

    let mut pipeline = gateway_pipeline();
    pipeline["streams"]["status"].as_table_mut().unwrap().insert("max_payload".into(), "1MiB".into());
    std::fs::write(&config, with_sections(pipeline, source)).unwrap();
    let validate = crate::common::run::braid().arg("validate").arg("--config").arg(&config).output().unwrap();
    let stderr = String::from_utf8_lossy(&validate.stderr);
    assert_eq!(validate.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("max_payload") && stderr.contains("more than a shard ring carries"), "{stderr}");
}
