//! `braid run` restarts exactly (issue "Checkpoints"): devices publish QoS 1 in real time through
//! mosquitto while braid is killed with SIGKILL at random points and stopped with SIGTERM; the
//! file sink must end with every result of a replay of the same messages — the gateway join, a
//! 10 s tumbling and a session cogroup and a temporal join whose state is far older than
//! `journal_retention` (2 s) — none missing, none different, the counts counting each message
//! once, no late row; repeats at most a checkpoint interval's worth per kill, and none after a
//! SIGTERM.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use common::mqtt::{Mosquitto, Subscriber};
use common::rng::Rng;
use common::run::{replay, write_inputs};
use common::service::{
    Braid, DeviceMsg, Setup, Source, assert_same_rows, by_id, gateway_config, jsonl, mqtt_messages, now_ms, poll_until,
    read_complete_jsonl, spawn_publisher, workload,
};
use rumqttc::QoS;
use serde_json::Value;

const START: Duration = Duration::from_secs(15);
const RESULTS: Duration = Duration::from_secs(30);
/// Checkpoint every half second; the journal keeps 2 s (what a long window meets).
const RUNTIME: &str = "checkpoint_interval = \"500ms\"\njournal_retention = \"2s\"\n";
/// Besides the gateway join: state far older than the journal keeps — 10 s tumbling windows,
/// sessions (3 s gap), and the latest command of each device as a temporal version.
const MORE: &str = "\n[operators.counts]\nkind = \"cogroup\"\nleft = \"status\"\nright = \"command\"\n\
    window = { kind = \"tumbling\", size = \"10s\" }\njoin = \"full\"\n\
    aggregate = [\"count(left) AS statuses\", \"count(right) AS commands\"]\n\
    \n[operators.sessions]\nkind = \"cogroup\"\nleft = \"status\"\nright = \"command\"\n\
    window = { kind = \"session\", gap = \"3s\" }\njoin = \"full\"\n\
    aggregate = [\"count(left) AS statuses\", \"last(right.cmd) AS last_cmd\"]\n\
    \n[operators.last_command]\nkind = \"temporal_join\"\nleft = \"status\"\nright = \"command\"\njoin = \"left\"\n\
    select = [\"left.device\", \"left.seq\", \"right.cmd\", \"right.ts AS cmd_ts\"]\n";
/// The operators whose results are compared.
const OPERATORS: [&str; 4] = ["effect", "counts", "sessions", "last_command"];

struct Rig {
    dir: tempfile::TempDir,
    devices: Mosquitto,
    up: Mosquitto,
    config: PathBuf,
    replay_config: PathBuf,
    file: PathBuf,
    /// braid's `[ops] listen` port.
    ops: u16,
}

impl Rig {
    fn new() -> Rig {
        Rig::with_runtime("")
    }

    /// A rig whose braid's `[runtime]` also has `runtime` (lines).
    fn with_runtime(runtime: &str) -> Rig {
        let dir = tempfile::Builder::new().prefix("braid-restart-").tempdir().unwrap();
        let devices = Mosquitto::start();
        let up = Mosquitto::start();
        let file = dir.path().join("archive.jsonl");
        let write = |name: &str, state: &Path, ops_port: u16| {
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
            let text = gateway_config(&setup).replacen("[runtime]\n", &format!("[runtime]\n{RUNTIME}{runtime}"), 1);
            let all = "inputs = [\"effect\", \"counts\", \"sessions\", \"last_command\", \"effect.late\"";
            let text = text.replace("inputs = [\"effect\", \"effect.late\"", all);
            let path = dir.path().join(name);
            std::fs::write(&path, text + MORE).unwrap();
            path
        };
        let ops = common::mqtt::free_port();
        let config = write("braid.toml", &dir.path().join("state"), ops);
        let replay_config = write("replay.toml", &dir.path().join("replay-state"), common::mqtt::free_port());
        Rig { dir, devices, up, config, replay_config, file, ops }
    }

    /// Starts braid (again) and waits until this run holds its subscriptions.
    fn start(&self) -> Braid {
        let log = self.dir.path().join("braid.log");
        let before = std::fs::read_to_string(&log).unwrap_or_default().matches("ready: subscribed").count();
        let mut braid = Braid::start(&self.config, &log);
        braid.wait_log("ready: subscribed", before + 1, START);
        braid
    }

    /// What a replay of `msgs` gives: the results of [`OPERATORS`] by `_id`.
    fn expected(&self, msgs: &[DeviceMsg]) -> BTreeMap<String, Value> {
        self.expected_of(msgs, &OPERATORS)
    }

    /// What a replay of `msgs` gives: the results of `operators` by `_id`.
    fn expected_of(&self, msgs: &[DeviceMsg], operators: &[&str]) -> BTreeMap<String, Value> {
        let inputs =
            write_inputs(self.dir.path(), [("command", jsonl(msgs, "command")), ("status", jsonl(msgs, "status"))]);
        let mut out = replay(self.dir.path(), &self.replay_config, None, &inputs, operators, RESULTS).unwrap();
        by_id(operators.iter().flat_map(|op| out.take(op)), "replay")
    }

    /// The file sink's results (every line but late rows and dead letters), and the lines that
    /// are not results.
    fn archive(&self) -> (Vec<Value>, Vec<Value>) {
        read_complete_jsonl(&self.file).into_iter().partition(|row| row.get("_id").is_some())
    }

    /// Waits until the file sink holds every expected `_id`; checks it holds exactly those (no
    /// `_id` with two contents) and nothing else; the number of repeated lines.
    fn expect_archive(&self, want: &BTreeMap<String, Value>) -> usize {
        poll_until(RESULTS, || {
            let got = by_id(self.archive().0, "archive");
            want.keys().all(|id| got.contains_key(id))
        });
        let (results, others) = self.archive();
        let lines = results.len();
        let got = by_id(results, "archive");
        if got.len() < want.len() {
            eprintln!("braid log:\n{}", std::fs::read_to_string(self.dir.path().join("braid.log")).unwrap_or_default());
        }
        assert_same_rows(&got, want, "file sink results");
        assert!(others.is_empty(), "late rows or dead letters (in-order input): {:#?}", &others[..others.len().min(5)]);
        lines - got.len()
    }
}

fn messages(seed: u64) -> Vec<DeviceMsg> {
    workload(seed, 20, now_ms(), 20_000)
}

#[test]
fn killed_and_stopped_at_random_points_braid_emits_every_result_once_within_an_interval() {
    killed_and_stopped_at_random_points(Rig::new(), 21);
}

/// The same with the journal synced before every acknowledgement.
#[test]
fn killed_and_stopped_at_random_points_with_durability_power_every_result_comes_once_within_an_interval() {
    killed_and_stopped_at_random_points(Rig::with_runtime("durability = \"power\"\n"), 23);
}

fn killed_and_stopped_at_random_points(rig: Rig, seed: u64) {
    let msgs = messages(seed);
    let want = rig.expected(&msgs);
    let windows = want.values().filter(|r| r.get("_window_start").is_some()).count();
    assert!(windows > 20 && want.len() > windows + 50, "workload too thin: {} results, {windows} windows", want.len());
    let mut braid = rig.start();
    let acked = Arc::new(AtomicUsize::new(0));
    // About 10 s of publishing: 2 messages every 60 ms.
    let publisher = spawn_publisher(rig.devices.port(), mqtt_messages(&msgs), 2, Duration::from_millis(60), acked);
    let mut rng = Rng::new(seed);
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(rng.range(1_200, 2_500) as u64));
        if round == 1 {
            assert!(braid.terminate(Duration::from_secs(30)).success(), "SIGTERM: a clean exit");
        } else {
            braid.kill9();
        }
        braid = rig.start();
    }
    publisher.join().unwrap();
    let repeated = rig.expect_archive(&want);
    // The sinks' log of rows taken (service/taken.rs) leaves a kill only the rows of the batch it
    // interrupts between the sinks' flush and the log's; without it each kill would repeat what
    // came after the last checkpoint (up to 500 ms: tens of results).
    assert!(repeated <= 10, "{repeated} results repeated after two kills");
    eprintln!("{} results, {repeated} repeated after two kills and a SIGTERM", want.len());
}

/// Under `durability = "power"` a journal sync that fails is tried again every second, input or
/// not: the broker sends nothing more while its messages wait for acknowledgement. The one message
/// whose sync fails (`BRAID_FAULT_JOURNAL_SYNC_FAILS=1`) is acknowledged once a retry syncs it,
/// so a restart does not get it again.
#[test]
fn a_journal_sync_that_failed_under_power_is_tried_again_without_new_input() {
    let rig = Rig::with_runtime("durability = \"power\"\n");
    let log = rig.dir.path().join("braid.log");
    let fault = [("BRAID_FAULT_JOURNAL_SYNC_FAILS", std::ffi::OsStr::new("1"))];
    let mut braid = Braid::start_with_env(&rig.config, &log, &fault);
    braid.wait_log("ready: subscribed", 1, START);
    let msgs = messages(24);
    common::mqtt::publish_all(rig.devices.port(), &mqtt_messages(&msgs[..1]), QoS::AtLeastOnce);
    braid.wait_log("Write error", 1, Duration::from_secs(10));
    braid.wait_log("Writes again; resumed", 1, Duration::from_secs(10));
    // The acknowledgement goes out with the source's next round (within milliseconds).
    std::thread::sleep(Duration::from_millis(500));
    assert!(braid.terminate(Duration::from_secs(30)).success(), "SIGTERM: a clean exit");
    let mut braid = rig.start();
    // A redelivery would come first, right after the subscription.
    std::thread::sleep(Duration::from_secs(2));
    let metrics = common::service::http_get(rig.ops, "/metrics").unwrap().1;
    let redelivered = common::service::metric(&metrics, "braid_source_redelivered_total", "");
    assert_eq!(redelivered, Some(0.0), "the message whose sync failed was never acknowledged");
    braid.terminate(Duration::from_secs(30));
}

#[test]
fn after_a_sigterm_nothing_is_emitted_again() {
    let rig = Rig::new();
    let msgs = messages(22);
    let want = rig.expected(&msgs);
    let sub = Subscriber::connect(rig.up.port(), "up/#", QoS::AtLeastOnce);
    let (first, second) = msgs.split_at(msgs.len() / 2);
    let mut braid = rig.start();
    common::mqtt::publish_all(rig.devices.port(), &mqtt_messages(first), QoS::AtLeastOnce);
    // Let the first half's results out, then stop cleanly mid-stream (windows open, joins waiting).
    poll_until(Duration::from_secs(10), || !rig.archive().0.is_empty());
    std::thread::sleep(Duration::from_millis(700));
    assert!(braid.terminate(Duration::from_secs(30)).success());
    let mut braid = rig.start();
    common::mqtt::publish_all(rig.devices.port(), &mqtt_messages(second), QoS::AtLeastOnce);
    let repeated = rig.expect_archive(&want);
    assert_eq!(repeated, 0, "results the file sink had taken came again after a clean restart");
    poll_until(RESULTS, || sub.json_rows().len() >= want.values().filter(|r| r.get("cmd_id").is_some()).count());
    let upstream = sub.json_rows();
    let distinct = by_id(upstream.clone(), "upstream").len();
    assert_eq!(upstream.len(), distinct, "results delivered upstream twice after a clean restart");
    braid.terminate(Duration::from_secs(30));
}

/// The whole checkpoint a chain of deltas starts from is found damaged at the start: every
/// checkpoint of the chain fails with it, the start falls back to the newest checkpoint before
/// the chain, and the journal still holds the input after that one — every result comes, none
/// different (src/checkpoint/mod.rs, "Chains").
#[test]
fn a_damaged_chain_falls_back_to_the_checkpoint_before_it_without_losing_input() {
    let rig = Rig::new();
    let msgs = messages(23);
    let want = rig.expected(&msgs);
    let mut braid = rig.start();
    // About 10 s of publishing in real time (as a replay of the same messages sees them).
    let acked = Arc::new(AtomicUsize::new(0));
    let publisher = spawn_publisher(rig.devices.port(), mqtt_messages(&msgs), 2, Duration::from_millis(60), acked);
    // Killed until the newest checkpoint is a delta whose chain has a checkpoint before it (a
    // checkpoint every 500 ms; this rig's 2 s of journal retention covers chains of one delta;
    // a whole one first after each start); read only once braid is gone (reading checkpoints
    // sets damaged ones aside).
    let checkpoints = braid::checkpoint::CheckpointDir::new(rig.dir.path().join("state/checkpoints"), false);
    let mut rng = Rng::new(23);
    let mut manifest = None;
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(rng.range(700, 1_300) as u64));
        braid.kill9();
        let newest = checkpoints.latest().map(|l| l.manifest);
        if let Some(m) = newest.filter(|m| m.chain_from < m.epoch && m.chain_from > 1) {
            manifest = Some(m);
            break;
        }
        braid = rig.start();
    }
    let manifest = manifest.expect("a delta with a checkpoint before its chain");
    let whole = checkpoints.epoch_dir(manifest.chain_from).join("shard-0.snap");
    let mut bytes = std::fs::read(&whole).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&whole, bytes).unwrap();

    let mut braid = rig.start();
    let restored =
        braid.log().lines().rfind(|l| l.contains("state restored from the last checkpoint")).map(str::to_owned);
    let epoch: Option<u64> =
        restored.as_deref().and_then(|l| l.split("epoch=").nth(1)?.split_whitespace().next()?.parse().ok());
    assert!(
        epoch.is_some_and(|e| e < manifest.chain_from),
        "the start fell back before checkpoint {} (damaged): {restored:?}",
        manifest.chain_from
    );
    publisher.join().unwrap();
    let repeated = rig.expect_archive(&want);
    eprintln!("{} results; fell back from {} to {epoch:?}; {repeated} repeated", want.len(), manifest.epoch);
    braid.terminate(Duration::from_secs(30));
}

/// SIGHUP with a config in which only `last_command` changed: the other operators keep their
/// state through the reload (their windows and joins spanning it come out whole, as a replay of
/// all the messages gives them), and `last_command` is named in a warning as starting empty.
#[test]
fn a_reload_keeps_the_state_of_the_operators_it_did_not_change() {
    let rig = Rig::new();
    let msgs = messages(23);
    let kept = ["effect", "counts", "sessions"];
    let want = rig.expected_of(&msgs, &kept);
    let (first, second) = msgs.split_at(msgs.len() / 2);
    let mut braid = rig.start();
    common::mqtt::publish_all(rig.devices.port(), &mqtt_messages(first), QoS::AtLeastOnce);
    poll_until(Duration::from_secs(10), || !rig.archive().0.is_empty());
    std::thread::sleep(Duration::from_millis(700));
    let config = std::fs::read_to_string(&rig.config).unwrap();
    std::fs::write(&rig.config, config.replace("right.ts AS cmd_ts", "right.ts AS command_ts")).unwrap();
    braid.signal(libc::SIGHUP);
    braid.wait_log("restarting with the new plan", 1, START);
    braid.wait_log("ready: subscribed", 2, START);
    common::mqtt::publish_all(rig.devices.port(), &mqtt_messages(second), QoS::AtLeastOnce);
    poll_until(RESULTS, || {
        let got = by_id(rig.archive().0, "archive");
        want.keys().all(|id| got.contains_key(id))
    });
    let got = by_id(rig.archive().0, "archive");
    let missing: Vec<&Value> = want.iter().filter(|(id, _)| !got.contains_key(*id)).map(|(_, r)| r).take(5).collect();
    assert!(missing.is_empty(), "results of unchanged operators lost their state at the reload: {missing:#?}");
    for (id, row) in &want {
        assert_eq!(&got[id], row, "a result of an unchanged operator differs after the reload");
    }
    let log = braid.log();
    let warned = log.lines().any(|l| l.contains("new or changed since the checkpoint") && l.contains("last_command"));
    assert!(warned, "no warning names last_command as starting empty; log:\n{log}");
    assert!(
        !log.lines().any(|l| l.contains("new or changed since the checkpoint") && l.contains("operator=effect")),
        "effect did not change but was reported as starting empty"
    );
}

/// A checkpoint taken with another shard count is set aside with a warning, never misread: the
/// service starts from the journal and runs on.
#[test]
fn a_checkpoint_of_another_shard_count_is_set_aside() {
    let rig = Rig::new();
    let msgs = messages(24);
    let mut braid = rig.start();
    common::mqtt::publish_all(rig.devices.port(), &mqtt_messages(&msgs[..40]), QoS::AtLeastOnce);
    poll_until(Duration::from_secs(10), || braid.log().contains("ready: subscribed"));
    assert!(braid.terminate(Duration::from_secs(30)).success());
    let config = std::fs::read_to_string(&rig.config).unwrap();
    std::fs::write(&rig.config, config.replacen("shards = 2", "shards = 1", 1)).unwrap();
    let mut braid = rig.start();
    let log = braid.log();
    assert!(log.contains("Checkpoint taken with another shard count: set aside"), "{log}");
    assert!(rig.dir.path().join("state/checkpoints.2-shards.set-aside").is_dir());
    common::mqtt::publish_all(rig.devices.port(), &mqtt_messages(&msgs[40..]), QoS::AtLeastOnce);
    assert!(braid.terminate(Duration::from_secs(30)).success(), "{}", braid.log());
}
