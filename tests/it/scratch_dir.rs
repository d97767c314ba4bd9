//! Scratch off the flash (issue 12, item 7): `braid run` keeps its rings and arenas in
//! `$RUNTIME_DIRECTORY` (systemd's `RuntimeDirectory=`), else `/dev/shm`, in a directory of its
//! own per state directory, never under `STATE_DIR`, and removes it at the stop.
//!
//! The measurement behind BENCHMARKS.md "Bytes written to the state disk" is here too, ignored
//! by default (it runs for a minute):
//!
//! ```text
//! cargo test --test it scratch_dir::bytes_written -- --ignored --nocapture
//! ```
// The test's own deadlines; the measurement prints its figures.
#![allow(clippy::unwrap_used, clippy::disallowed_methods, clippy::print_stdout)]

use crate::common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::mqtt::{Mosquitto, free_port};
use common::service::{Braid, Setup, Source, gateway_config, http_get, now_ms, poll_until, publish_reconnecting};

const START: Duration = Duration::from_secs(15);

fn write_config(dir: &Path, name: &str, devices: &Mosquitto, up: &Mosquitto, runtime_keys: &str) -> PathBuf {
    let setup = Setup {
        source: Source::Mqtt(devices.url()),
        upstream_url: &up.url(),
        topic: "up/effect/{device}",
        state_dir: &dir.join(format!("{name}-state")),
        file: &dir.join(format!("{name}-archive.jsonl")),
        ops_port: free_port(),
        max_payload: None,
        idle_timeout: "1s",
    };
    let text = gateway_config(&setup).replacen("[runtime]\n", &format!("[runtime]\n{runtime_keys}"), 1);
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The scratch directory braid's log names (`rings and arenas (scratch) path=...`).
fn scratch_of(braid: &Braid) -> PathBuf {
    let log = braid.log();
    let line = log.lines().find(|l| l.contains("rings and arenas (scratch)")).expect("the scratch line in the log");
    let path = line.split("path=").nth(1).and_then(|rest| rest.split_whitespace().next()).expect("path=...");
    PathBuf::from(path)
}

/// Every file under `dir` whose name ends with `.ring`, and any `run` directory.
fn rings_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name() == Some(OsStr::new("run")) {
                found.push(path.clone());
            }
            found.extend(rings_under(&path));
        } else if path.extension() == Some(OsStr::new("ring")) {
            found.push(path);
        }
    }
    found
}

#[test]
fn rings_and_arenas_live_off_the_state_dir_one_directory_per_service_removed_at_stop() {
    let dir = tempfile::Builder::new().prefix("braid-scratch-").tempdir().unwrap();
    let runtime_directory = dir.path().join("runtime");
    std::fs::create_dir_all(&runtime_directory).unwrap();
    let devices = Mosquitto::start();
    let up = Mosquitto::start();
    // Service a under systemd (RUNTIME_DIRECTORY), service b without: /dev/shm.
    let config_a = write_config(dir.path(), "a", &devices, &up, "");
    let config_b = write_config(dir.path(), "b", &devices, &up, "");
    let mut a = Braid::start_with_env(
        &config_a,
        &dir.path().join("a.log"),
        &[("RUNTIME_DIRECTORY", runtime_directory.as_os_str())],
    );
    let mut b = Braid::start(&config_b, &dir.path().join("b.log"));
    a.wait_log("ready: subscribed", 1, START);
    b.wait_log("ready: subscribed", 1, START);

    let (scratch_a, scratch_b) = (scratch_of(&a), scratch_of(&b));
    assert_eq!(scratch_a.parent(), Some(runtime_directory.as_path()), "a: not in $RUNTIME_DIRECTORY");
    if Path::new("/dev/shm").is_dir() {
        assert_eq!(scratch_b.parent(), Some(Path::new("/dev/shm")), "b: not in /dev/shm");
    }
    assert_ne!(scratch_a.file_name(), scratch_b.file_name(), "two services share one name");
    for (scratch, state) in [(&scratch_a, "a-state"), (&scratch_b, "b-state")] {
        assert!(scratch.join("shard-0.in.ring").is_file(), "no ring in {}", scratch.display());
        let on_disk = rings_under(&dir.path().join(state));
        assert!(on_disk.is_empty(), "rings under the state directory: {on_disk:?}");
    }

    assert!(a.terminate(Duration::from_secs(20)).success());
    assert!(!scratch_a.exists(), "a's scratch outlived it: {}", scratch_a.display());
    assert!(scratch_b.join("shard-0.in.ring").is_file(), "stopping a took b's rings");
    assert!(b.terminate(Duration::from_secs(20)).success());
    assert!(!scratch_b.exists(), "b's scratch outlived it: {}", scratch_b.display());
}

/// `write_bytes` and `cancelled_write_bytes` of `/proc/PID/io`: bytes this process dirtied in the
/// page cache of files on a block device (mapped pages included, once per writeback cycle), and
/// of those, bytes of files truncated or deleted before writeback (a checkpoint replaced within
/// `vm.dirty_expire_centisecs`, 30 s by default). Pages of tmpfs (`/dev/shm`) never count.
fn disk_bytes_written(pid: u32) -> (u64, u64) {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    let field = |name: &str| -> u64 {
        io.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().parse().unwrap()).unwrap()
    };
    (field("write_bytes:"), field("cancelled_write_bytes:"))
}

fn du(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() { du(&path) } else { e.metadata().map_or(0, |m| m.len()) }
        })
        .sum()
}

/// `messages` alternating command and status of 100 devices, to be published at `per_second`:
/// message i's event time is now + i / `per_second` s, so event time follows arrival.
fn steady_messages(messages: usize, per_second: usize) -> Vec<(String, Vec<u8>)> {
    let base = now_ms();
    (0..messages)
        .map(|i| {
            let device = format!("d{:03}", i % 100);
            let ts = base + (i * 1000 / per_second) as i64;
            if i % 2 == 0 {
                let payload = serde_json::json!({"ts": ts, "cmd": "on", "arg": "x", "cmd_id": format!("c{i}")});
                (format!("devices/{device}/command"), payload.to_string().into_bytes())
            } else {
                let payload = serde_json::json!({"ts": ts, "temp": 21.5, "state": "on", "seq": i});
                (format!("devices/{device}/status"), payload.to_string().into_bytes())
            }
        })
        .collect()
}

/// Bytes braid's `/proc/PID/io` counts between two points of a steady flow: when a quarter of
/// the messages were acknowledged and when nine tenths were, so that pages dirtied before the
/// window and cancelled in it balance those dirtied in it and cancelled after it.
struct Window {
    messages: usize,
    seconds: f64,
    dirtied: u64,
    cancelled: u64,
}

/// Samples `pid`'s io counters as `acked` passes a quarter and nine tenths of `messages`.
fn sample_window(pid: u32, acked: Arc<AtomicUsize>, messages: usize) -> std::thread::JoinHandle<Window> {
    std::thread::spawn(move || {
        let at = |count: usize| {
            while acked.load(Ordering::Relaxed) < count {
                std::thread::sleep(Duration::from_millis(5));
            }
            (acked.load(Ordering::Relaxed), Instant::now(), disk_bytes_written(pid))
        };
        let (from, started, before) = at(messages / 4);
        let (to, ended, after) = at(messages * 9 / 10);
        Window {
            messages: to - from,
            seconds: (ended - started).as_secs_f64(),
            dirtied: after.0 - before.0,
            cancelled: after.1 - before.1,
        }
    })
}

/// One run: `messages` published at `per_second`; bytes written to the disk per message in the
/// steady part of the flow ([`Window`]), and the state directory's size at the end.
fn measure(label: &str, runtime_keys: &str, messages: usize, per_second: usize) -> (f64, u64) {
    let dir = tempfile::Builder::new().prefix("braid-written-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let devices = Mosquitto::start();
    let up = Mosquitto::start();
    let runtime_keys = runtime_keys.replace("DIR", &dir.path().display().to_string());
    let config = write_config(dir.path(), "m", &devices, &up, &runtime_keys);
    // No file sink: the result file is output, not state. The log goes to tmpfs.
    let text = std::fs::read_to_string(&config).unwrap();
    let mut table: toml::Table = text.parse().unwrap();
    table["sinks"].as_table_mut().unwrap().remove("archive");
    let ops: u16 = table["ops"]["listen"].as_str().unwrap().rsplit(':').next().unwrap().parse().unwrap();
    std::fs::write(&config, toml::to_string(&table).unwrap()).unwrap();
    let log = Path::new("/dev/shm").join(format!("braid-written-{}-{}.log", std::process::id(), label.len()));
    let braid = Braid::start_with_env(&config, &log, &[]);
    assert!(poll_until(START, || http_get(ops, "/healthz").is_some_and(|(code, _)| code == 200)), "never healthy");
    std::thread::sleep(Duration::from_secs(2));
    let acked = Arc::new(AtomicUsize::new(0));
    let window = sample_window(braid.pid(), acked.clone(), messages);
    // A tenth of a second's messages every 100 ms.
    let msgs = steady_messages(messages, per_second);
    publish_reconnecting(
        devices.port(),
        &msgs,
        per_second / 10,
        Duration::from_millis(100),
        &acked,
        Duration::from_secs(900),
    );
    let window = window.join().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let written = window.dirtied.saturating_sub(window.cancelled);
    let state = du(&dir.path().join("m-state"));
    let payload = msgs.iter().map(|(_, p)| p.len()).sum::<usize>() as f64 / messages as f64;
    let metrics = http_get(ops, "/metrics").unwrap().1;
    let sent = common::service::metric(&metrics, "braid_sink_sent_total", "sink=\"up\"");
    let figures: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("braid_checkpoint_")
                || l.starts_with("braid_operator_state_")
                || l.starts_with("braid_journal_bytes")
        })
        .collect();
    println!("{label}: {}", figures.join(" · "));
    let per_message = written as f64 / window.messages as f64;
    println!(
        "{label}: {messages} messages ({payload:.0} B payload each), {sent:?} results sent; window of {} messages \
         in {:.1} s ({:.0}/s): {written} B written to the disk = {per_message:.0} B/message ({:.2}x the payload; \
         dirtied {} B, {} B of it cancelled); state dir {state} B at the end",
        window.messages,
        window.seconds,
        window.messages as f64 / window.seconds,
        per_message / payload,
        window.dirtied,
        window.cancelled,
    );
    let _ = std::fs::remove_file(&log);
    (per_message, state)
}

#[test]
#[ignore = "a measurement (about a minute): BENCHMARKS.md \"Bytes written to the state disk\""]
fn bytes_written_to_the_state_dir_per_input_message() {
    let messages = 30_000;
    let (shm, _) = measure("scratch in /dev/shm (default)", "", messages, 1_000);
    let (disk, _) =
        measure("scratch on the state disk (scratch_dir)", "scratch_dir = \"DIR/scratch\"\n", messages, 1_000);
    assert!(shm < disk, "scratch off the disk writes more: {shm:.0} vs {disk:.0} B/message");
}

/// Issue 11's figure: bytes written to the state disk per input message at the gateway bench's
/// rate (5 000 messages a second, a checkpoint a second), with the default durability and with
/// `durability = "power"` (everything synced before it is acknowledged or released); and, to
/// split the latter, `power` without checkpoints (the journal synced per batch of acks).
#[test]
#[ignore = "a measurement (about two minutes): BENCHMARKS.md \"Bytes written to the state disk\""]
fn bytes_written_at_the_gateway_rate() {
    let messages = 150_000;
    let power = "durability = \"power\"\n";
    let (process, _) = measure("durability = process", "", messages, 5_000);
    let (synced, _) = measure("durability = power", power, messages, 5_000);
    let journal_only = format!("{power}checkpoint_interval = \"1h\"\n");
    let (journal, _) = measure("durability = power, no checkpoint", &journal_only, messages, 5_000);
    assert!(process < synced, "syncing writes less: {process:.0} vs {synced:.0} B/message");
    assert!(journal < synced, "checkpoints write nothing under power: {journal:.0} vs {synced:.0} B/message");
}
