//! `braid run` end to end over MQTT: the braid binary as a child process, the gateway join fed by
//! a device broker (mosquitto, or braid's embedded one) and sending its results to an upstream
//! mosquitto and a file.
//!
//! The expectation is always `braid replay` of the same messages on the same configuration: the
//! workload is published in event-time order, so nothing is late and the join's result set does
//! not depend on when rows arrive. Results are compared as JSON objects deduplicated by `_id`
//! (redeliveries repeat `_id`s; CONTRACT.md rule 10). Outer (`left_only`) results come once the
//! streams are idle (`idle_timeout = "1s"`) and idle advance has moved the watermark past them,
//! about 7 s after the last message; every wait polls until a deadline.
//!
//! Outages longer than `idle_timeout` (braid itself, or the device broker) must not turn the
//! backlog late: a stream does not turn idle while braid cannot see its input
//! (`StreamClock::suspend`, journaled as source connection changes and starts).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::mqtt::{Mosquitto, Subscriber, free_port, publish_all};
use common::run::{replay, write_inputs};
use common::service::{
    Braid, DeviceMsg, Setup, Source, assert_same_rows, by_id, gateway_config, http_get, jsonl, metric, mqtt_messages,
    now_ms, poll_until, read_complete_jsonl, spawn_publisher, workload,
};
use rumqttc::QoS;
use serde_json::{Value, json};

/// How long braid may take to subscribe after its start.
const START: Duration = Duration::from_secs(15);
/// How long the results of a workload may take to arrive after its last message.
const RESULTS: Duration = Duration::from_secs(25);
const DEVICE_TOPIC: &str = "up/effect/{device}";

/// One test's world: the state folder, the device broker (None: braid's embedded broker), the
/// upstream broker and the configuration.
struct Rig {
    dir: tempfile::TempDir,
    devices: Option<Mosquitto>,
    device_port: u16,
    up: Mosquitto,
    ops: u16,
    config: PathBuf,
    replay_config: PathBuf,
    file: PathBuf,
}

impl Rig {
    fn new(embedded: bool, topic: &str, max_payload: Option<&str>) -> Rig {
        let dir = tempfile::Builder::new().prefix("braid-service-").tempdir().unwrap();
        let devices = (!embedded).then(Mosquitto::start);
        let device_port = devices.as_ref().map_or_else(free_port, Mosquitto::port);
        let up = Mosquitto::start();
        let ops = free_port();
        let file = dir.path().join("archive.jsonl");
        let write = |name: &str, state: &Path| {
            let source = match &devices {
                Some(m) => Source::Mqtt(m.url()),
                None => Source::Embedded(device_port),
            };
            let setup = Setup {
                source,
                upstream_url: &up.url(),
                topic,
                state_dir: state,
                file: &file,
                ops_port: ops,
                max_payload,
                idle_timeout: "1s",
            };
            let path = dir.path().join(name);
            std::fs::write(&path, gateway_config(&setup)).unwrap();
            path
        };
        let config = write("braid.toml", &dir.path().join("state"));
        // replay keeps its state in runtime.state_dir: its own, never the service's.
        let replay_config = write("replay.toml", &dir.path().join("replay-state"));
        Rig { dir, devices, device_port, up, ops, config, replay_config, file }
    }

    fn start(&self) -> Braid {
        Braid::start(&self.config, &self.dir.path().join("braid.log"))
    }

    /// Starts braid and waits until its source holds its subscriptions.
    fn start_subscribed(&self) -> Braid {
        let mut braid = self.start();
        braid.wait_log("ready: subscribed", 1, START);
        braid
    }

    /// `braid replay` of `msgs` (device carried in the lines): its `effect` and `dead_letter`.
    fn replay(&self, msgs: &[DeviceMsg]) -> (Vec<Value>, Vec<Value>) {
        let inputs =
            write_inputs(self.dir.path(), [("command", jsonl(msgs, "command")), ("status", jsonl(msgs, "status"))]);
        let mut out =
            replay(self.dir.path(), &self.replay_config, None, &inputs, &["effect", "dead_letter"], RESULTS).unwrap();
        (out.take("effect"), out.take("dead_letter"))
    }

    /// The file sink's rows so far: (effect results, late rows, dead letters), in file order.
    fn archive(&self) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
        let (mut effect, mut late, mut dead) = (Vec::new(), Vec::new(), Vec::new());
        for row in read_complete_jsonl(&self.file) {
            if row.get("_reason").is_some() {
                dead.push(row);
            } else if row.get("_kind").is_some() {
                effect.push(row);
            } else {
                late.push(row);
            }
        }
        (effect, late, dead)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("braid.log")).unwrap_or_default()
    }
}

/// The workload of `devices` devices over 20 s of event time from now.
fn devices_workload(seed: u64, devices: usize) -> Vec<DeviceMsg> {
    workload(seed, devices, now_ms(), 20_000)
}

/// Waits until the upstream subscriber holds `want.len()` distinct `_id`s, then checks it holds
/// exactly `want` (JSON objects), each on `up/effect/<device>`.
fn expect_upstream(sub: &Subscriber, want: &BTreeMap<String, Value>, rig: &Rig) -> Vec<(String, Value)> {
    let arrived = poll_until(RESULTS, || by_id(sub.json_rows(), "upstream").len() >= want.len());
    let got = by_id(sub.json_rows(), "upstream");
    if !arrived {
        let (_, late, _) = rig.archive();
        eprintln!("{} late rows in the file sink; first: {:?}", late.len(), late.first());
        eprintln!("braid log:\n{}", rig.log());
    }
    assert_same_rows(&got, want, "upstream results");
    let messages: Vec<(String, Value)> =
        sub.messages().into_iter().map(|(t, p)| (t, serde_json::from_slice(&p).unwrap())).collect();
    for (topic, row) in &messages {
        assert_eq!(topic, &format!("up/effect/{}", row["device"].as_str().unwrap()), "topic of {row}");
    }
    messages
}

/// Waits until the file sink holds every expected result, then checks it holds exactly those,
/// and no late row and no dead letter.
fn expect_archive(rig: &Rig, want: &BTreeMap<String, Value>) {
    poll_until(RESULTS, || by_id(rig.archive().0, "archive").len() >= want.len());
    let (effect, late, dead) = rig.archive();
    assert_same_rows(&by_id(effect, "archive"), want, "file sink results");
    assert!(late.is_empty(), "late rows in the file sink (in-order input): {late:#?}");
    assert!(dead.is_empty(), "dead letters in the file sink (valid input): {dead:#?}");
}

fn kinds(rows: &BTreeMap<String, Value>) -> (usize, usize) {
    let left_only = rows.values().filter(|r| r["_kind"] == "left_only").count();
    (rows.len() - left_only, left_only)
}

/// The workload has both kinds of result, or the test proves less than it says.
fn assert_workload_has_outer_results(want: &BTreeMap<String, Value>) {
    let (matches, left_only) = kinds(want);
    assert!(matches > 50 && left_only > 0, "workload too thin: {matches} matches, {left_only} left_only");
}

#[test]
fn results_of_the_gateway_join_reach_the_upstream_broker_and_the_file_through_mosquitto() {
    end_to_end(false, 1, 20);
}

#[test]
fn results_of_the_gateway_join_reach_the_upstream_broker_through_the_embedded_broker() {
    end_to_end(true, 2, 12);
}

/// A seeded workload of `devices` published to the device broker (braid's embedded one or
/// mosquitto) reaches upstream and the file sink exactly as replay joins it; SIGTERM exits 0.
fn end_to_end(embedded: bool, seed: u64, devices: usize) {
    let rig = Rig::new(embedded, DEVICE_TOPIC, None);
    let msgs = devices_workload(seed, devices);
    let want = by_id(rig.replay(&msgs).0, "replay");
    assert_workload_has_outer_results(&want);
    let sub = Subscriber::connect(rig.up.port(), "up/#", QoS::AtLeastOnce);
    let mut braid = rig.start_subscribed();
    publish_all(rig.device_port, &mqtt_messages(&msgs), QoS::AtLeastOnce);
    expect_upstream(&sub, &want, &rig);
    expect_archive(&rig, &want);
    assert!(braid.terminate(Duration::from_secs(20)).success(), "braid run did not exit 0 after SIGTERM");
}

#[test]
fn a_device_broker_restart_mid_stream_loses_nothing_acknowledged() {
    device_broker_restart(3, Duration::ZERO);
}

/// While the device broker is down nothing arrives; its streams must not turn idle meanwhile
/// (idle advance would move the watermark past what the devices publish after the outage).
#[test]
fn a_device_broker_down_longer_than_idle_timeout_loses_nothing_acknowledged() {
    device_broker_restart(8, Duration::from_secs(3));
}

/// Restarts the device broker (SIGTERM, `downtime`, start on the same port and persistence)
/// while a paced publisher (that republishes what was not acknowledged) is mid-stream.
fn device_broker_restart(seed: u64, downtime: Duration) {
    let mut rig = Rig::new(false, DEVICE_TOPIC, None);
    let msgs = devices_workload(seed, 20);
    let want = by_id(rig.replay(&msgs).0, "replay");
    let sub = Subscriber::connect(rig.up.port(), "up/#", QoS::AtLeastOnce);
    let _braid = rig.start_subscribed();
    let acked = Arc::new(AtomicUsize::new(0));
    let publisher =
        spawn_publisher(rig.device_port, mqtt_messages(&msgs), 10, Duration::from_millis(20), acked.clone());
    assert!(poll_until(Duration::from_secs(10), || acked.load(Ordering::Relaxed) >= msgs.len() / 3));
    let at_restart = acked.load(Ordering::Relaxed);
    let devices = rig.devices.as_mut().unwrap();
    devices.stop();
    // The outage is the scenario, not a wait for a condition.
    std::thread::sleep(downtime);
    devices.restart();
    publisher.join().unwrap();
    assert!(at_restart < msgs.len(), "the restart came after the last message ({at_restart} acked): nothing tested");
    expect_upstream(&sub, &want, &rig);
    expect_archive(&rig, &want);
}

#[test]
fn results_produced_while_the_upstream_broker_is_down_arrive_in_order_once_it_is_back() {
    let mut rig = Rig::new(false, DEVICE_TOPIC, None);
    let msgs = devices_workload(4, 20);
    let want = by_id(rig.replay(&msgs).0, "replay");
    // A kept session: what braid sends while this client is away is queued for it.
    let client_id = format!("braid-svc-up-{}", std::process::id());
    let sub = Subscriber::connect_with(rig.up.port(), "up/#", QoS::AtLeastOnce, &client_id, false);
    let _braid = rig.start_subscribed();
    rig.up.stop();
    publish_all(rig.device_port, &mqtt_messages(&msgs), QoS::AtLeastOnce);
    // Results pile up in the sink's buffer while the upstream broker is away, for a few seconds.
    let half = want.len() / 2;
    assert!(poll_until(RESULTS, || by_id(rig.archive().0, "archive").len() >= half), "no results produced");
    assert!(sub.messages().is_empty(), "received results while the upstream broker was down");
    std::thread::sleep(Duration::from_secs(2));
    rig.up.restart();
    let messages = expect_upstream(&sub, &want, &rig);
    expect_archive(&rig, &want);
    // Per device topic, results arrive (first arrival of each `_id`) in the order braid emitted
    // them, which is the file sink's order.
    let first_seen = |rows: Vec<(String, Value)>| {
        let mut seen = std::collections::HashSet::new();
        let mut per_topic: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (topic, row) in rows {
            let id = row["_id"].as_str().unwrap().to_owned();
            if seen.insert(id.clone()) {
                per_topic.entry(topic).or_default().push(id);
            }
        }
        per_topic
    };
    let emitted = rig.archive().0.into_iter().map(|r| (format!("up/effect/{}", r["device"].as_str().unwrap()), r));
    assert_eq!(first_seen(messages), first_seen(emitted.collect()), "upstream order per device topic");
}

#[test]
fn braid_killed_with_sigkill_while_ingesting_loses_nothing_acknowledged() {
    kill_9_and_restart(5, Duration::ZERO);
}

/// braid's own downtime is no idleness: after the journal replay, idleness counts from the
/// restart, so the messages the broker kept for braid meanwhile (acknowledged to their
/// publisher, never seen by braid) arrive in time and their results reach upstream.
#[test]
fn braid_down_longer_than_idle_timeout_loses_nothing_acknowledged() {
    kill_9_and_restart(7, Duration::from_secs(3));
}

/// SIGKILL braid while it ingests a paced workload, keep it down for `downtime` (the publisher
/// goes on; the broker queues for braid's session), start it again on the same state: the
/// upstream results equal the replay's.
fn kill_9_and_restart(seed: u64, downtime: Duration) {
    let rig = Rig::new(false, DEVICE_TOPIC, None);
    let msgs = devices_workload(seed, 20);
    let want = by_id(rig.replay(&msgs).0, "replay");
    let sub = Subscriber::connect(rig.up.port(), "up/#", QoS::AtLeastOnce);
    let mut braid = rig.start_subscribed();
    // Slow enough (about 2.5 s) that braid is killed with messages still to come.
    let acked = Arc::new(AtomicUsize::new(0));
    let publisher = spawn_publisher(rig.device_port, mqtt_messages(&msgs), 5, Duration::from_millis(50), acked.clone());
    let ingested = || {
        let text = http_get(rig.ops, "/metrics").map(|(_, body)| body).unwrap_or_default();
        let rows = |s: &str| metric(&text, "braid_stream_rows_total", &format!("stream=\"{s}\"")).unwrap_or(0.0);
        (rows("command") + rows("status")) as usize
    };
    assert!(poll_until(Duration::from_secs(10), || ingested() >= msgs.len() / 4), "braid ingests nothing");
    braid.kill9();
    let at_kill = acked.load(Ordering::Relaxed);
    assert!(at_kill < msgs.len(), "braid was killed after the last message ({at_kill} acked): nothing tested");
    // Messages published meanwhile wait at the broker in braid's session.
    assert!(poll_until(Duration::from_secs(10), || acked.load(Ordering::Relaxed) > at_kill + 20));
    // The downtime is the scenario, not a wait for a condition.
    std::thread::sleep(downtime);
    let mut braid = rig.start();
    publisher.join().unwrap();
    braid.wait_log("journal replayed", 1, START);
    expect_upstream(&sub, &want, &rig);
    expect_archive(&rig, &want);
}

#[test]
fn bad_input_goes_to_dead_letter_and_the_run_goes_on() {
    let rig = Rig::new(false, "up/effect/{cmd_id}", Some("1KiB"));
    let mut msgs = devices_workload(6, 8);
    // Two valid commands whose cmd_id cannot go into the sink topic: their results go to
    // dead_letter as bad_topic_value:cmd_id, never upstream.
    let middle = msgs.len() / 2;
    let ts = msgs[middle].ts;
    for (device, cmd_id) in [("d05", "d05/evil"), ("d06", "d06#x")] {
        let payload = json!({"ts": ts, "cmd": "on", "arg": "x", "cmd_id": cmd_id});
        msgs.insert(middle, DeviceMsg { stream: "command", device: device.into(), ts, payload });
    }
    let (replayed, _) = rig.replay(&msgs);
    let all = by_id(replayed, "replay");
    let bad_topic = |r: &Value| r["cmd_id"].as_str().unwrap().contains(['/', '#']);
    let want: BTreeMap<String, Value> =
        all.iter().filter(|(_, r)| !bad_topic(r)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let refused: Vec<&Value> = all.values().filter(|r| bad_topic(r)).collect();
    assert!(refused.len() >= 2, "the bad cmd_ids produced no results");
    // Unusable payloads in the middle of the stream: (topic, payload, dead_letter stream, reason).
    let big = format!("{{\"ts\":{ts},\"cmd\":\"on\",\"arg\":\"{}\",\"cmd_id\":\"big\"}}", "x".repeat(2000));
    let bad: Vec<(&str, String, &str, &str)> = vec![
        ("devices/d01/command", format!("{{\"ts\":{ts},\"cmd\":"), "command", "invalid_json"),
        ("devices/d02/command", big, "command", "oversized"),
        ("devices/d03/status", r#"{"ts":"x","temp":20.5,"state":"on","seq":1}"#.into(), "status", "wrong_type:ts"),
        (
            "devices/d04/command",
            format!("{{\"ts\":{ts},\"cmd\":\"on\",\"arg\":\"x\"}}"),
            "command",
            "missing_field:cmd_id",
        ),
    ];
    let mut mqtt = mqtt_messages(&msgs);
    for (topic, payload, _, _) in bad.iter().rev() {
        mqtt.insert(middle, (topic.to_string(), payload.clone().into_bytes()));
    }
    let sub = Subscriber::connect(rig.up.port(), "up/#", QoS::AtLeastOnce);
    let _braid = rig.start_subscribed();
    publish_all(rig.device_port, &mqtt, QoS::AtLeastOnce);

    // Good messages published after the bad ones still produce their results.
    assert!(poll_until(RESULTS, || by_id(sub.json_rows(), "upstream").len() >= want.len()));
    let got = by_id(sub.json_rows(), "upstream");
    assert_same_rows(&got, &want, "upstream results");
    for (topic, payload) in sub.messages() {
        let row: Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(topic, format!("up/effect/{}", row["cmd_id"].as_str().unwrap()));
    }
    let dead_count = bad.len() + refused.len();
    assert!(poll_until(RESULTS, || rig.archive().2.len() >= dead_count
        && by_id(rig.archive().0, "archive").len() >= all.len()));
    let (effect, late, dead) = rig.archive();
    assert_same_rows(&by_id(effect, "archive"), &all, "file sink results");
    assert!(late.is_empty(), "late rows: {late:#?}");
    assert_eq!(dead.len(), dead_count, "dead letters: {dead:#?}");
    for (_, payload, stream, reason) in &bad {
        let raw: String = payload.chars().take(1024).collect();
        let row = json!({"_stream": stream, "raw": raw, "_reason": reason});
        assert!(dead.contains(&row), "no dead letter {row}; dead letters: {dead:#?}");
    }
    for result in refused {
        let found = dead.iter().any(|d| {
            d["_stream"] == "effect"
                && d["_reason"] == "bad_topic_value:cmd_id"
                && serde_json::from_str::<Value>(d["raw"].as_str().unwrap()).ok().as_ref() == Some(result)
        });
        assert!(found, "result {result} not dead-lettered as bad_topic_value:cmd_id; dead letters: {dead:#?}");
    }

    // /metrics and /healthz while connected. The sink reads the broker's PUBACKs together (up to
    // 20 ms after they came, README "Store and forward upstream"): its count of results sent
    // catches up with what the subscriber has.
    let sent_all = || {
        let text = http_get(rig.ops, "/metrics").map(|(_, text)| text).unwrap_or_default();
        metric(&text, "braid_sink_sent_total", "sink=\"up\"").is_some_and(|sent| sent >= want.len() as f64)
    };
    poll_until(Duration::from_secs(5), sent_all);
    let (status, health) = http_get(rig.ops, "/healthz").unwrap();
    assert_eq!((status, health.trim()), (200, "ok"));
    let (status, text) = http_get(rig.ops, "/metrics").unwrap();
    assert_eq!(status, 200);
    let get = |name: &str, labels: &str| {
        metric(&text, name, labels).unwrap_or_else(|| panic!("no {name}{{{labels}}} in /metrics:\n{text}"))
    };
    let commands = mqtt.iter().filter(|(t, _)| t.ends_with("/command")).count() as f64;
    let statuses = mqtt.iter().filter(|(t, _)| t.ends_with("/status")).count() as f64;
    assert_eq!(get("braid_stream_rows_total", "stream=\"command\""), commands);
    assert_eq!(get("braid_stream_rows_total", "stream=\"status\""), statuses);
    // Join quality, live: rows still waiting in state are in neither count yet.
    for input in ["command", "status"] {
        let labels = format!("operator=\"effect\",input=\"{input}\"");
        let (matched, unmatched) =
            (get("braid_operator_matched_total", &labels), get("braid_operator_unmatched_total", &labels));
        let (rows, late) = (get("braid_operator_rows_total", &labels), get("braid_operator_late_total", &labels));
        assert!(matched + unmatched + late <= rows, "{input}: {matched} + {unmatched} + {late} > {rows} rows");
    }
    for (_, _, stream, reason) in &bad {
        assert_eq!(get("braid_stream_dead_letter_total", &format!("stream=\"{stream}\",reason=\"{reason}\"")), 1.0);
    }
    let sent = get("braid_sink_sent_total", "sink=\"up\"");
    assert!(sent >= want.len() as f64 && sent <= sub.messages().len() as f64, "braid_sink_sent_total {sent}");
    assert_eq!(get("braid_sink_connected", "sink=\"up\""), 1.0);
    assert_eq!(get("braid_sink_bad_topic_total", ""), (dead_count - bad.len()) as f64);
}
