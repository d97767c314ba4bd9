//! Backpressure is no hang (issue 12, item 8): `braid run` with an MQTT sink on
//! `overflow = "block"` and its upstream broker gone. The buffer fills, the intake waits for room
//! (on purpose: the device broker keeps the messages braid does not acknowledge), and meanwhile
//! systemd must not take braid for hung: `WATCHDOG=1` keeps coming, `STATUS=` and `/healthz` say
//! why. Once the upstream broker is back every result arrives, nothing lost (compared with
//! `braid replay` of the same messages, by `_id`), and nothing late: the time the intake stood
//! still is braid's, not the devices' silence, so it is no idleness (journaled as a start).
//!
//! And a silent uplink (its packets vanish, no FIN, no RST: a dead mobile link) is noticed within
//! seconds: the sink's default keep-alive is 5 s, so the connection is dropped at the second
//! unanswered ping, 5–10 s after the link died (rumqttc's 30 s would take 30–60 s).
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // the test's own deadlines

use crate::common;

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::mqtt::{Mosquitto, Subscriber, free_port, publish_all};
use common::notify::NotifyListener;
use common::run::{replay, write_inputs};
use common::service::{
    Braid, Setup, Source, assert_same_rows, by_id, gateway_config, http_get, jsonl, metric, mqtt_messages, now_ms,
    poll_until, workload,
};
use rumqttc::QoS;

const START: Duration = Duration::from_secs(15);
const RESULTS: Duration = Duration::from_secs(25);

/// The gateway join (`common::service::gateway_config`) with its MQTT sink `up` sending to
/// `upstream_url`, plus `sink_keys` (TOML lines) in `[sinks.up]`.
fn write_config(dir: &Path, name: &str, devices: &Mosquitto, upstream_url: &str, ops: u16, sink_keys: &str) -> PathBuf {
    let setup = Setup {
        source: Source::Mqtt(devices.url()),
        upstream_url,
        topic: "up/effect/{device}",
        state_dir: &dir.join(format!("{name}-state")),
        file: &dir.join(format!("{name}-archive.jsonl")),
        ops_port: ops,
        max_payload: None,
        idle_timeout: "1s",
    };
    let mut config: toml::Table = gateway_config(&setup).parse().unwrap();
    let extra: toml::Table = sink_keys.parse().unwrap();
    let up = config["sinks"].as_table_mut().unwrap()["up"].as_table_mut().unwrap();
    up.extend(extra);
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    path
}

fn healthz(ops: u16) -> (u16, String) {
    http_get(ops, "/healthz").unwrap_or((0, String::new()))
}

#[test]
fn a_full_sink_buffer_keeps_the_watchdog_fed_says_why_and_loses_nothing() {
    let dir = tempfile::Builder::new().prefix("braid-backpressure-").tempdir().unwrap();
    let devices = Mosquitto::start();
    let mut up = Mosquitto::start();
    let ops = free_port();
    // 8 KiB hold about 40 results: the workload's ~100 fill it.
    let config = write_config(dir.path(), "braid", &devices, &up.url(), ops, "overflow = \"block\"\nbuffer = \"8KiB\"");
    let replay_config = write_config(dir.path(), "replay", &devices, &up.url(), ops, "");
    let msgs = workload(12, 20, now_ms(), 20_000);
    let inputs = write_inputs(dir.path(), [("command", jsonl(&msgs, "command")), ("status", jsonl(&msgs, "status"))]);
    let want = by_id(
        replay(dir.path(), &replay_config, None, &inputs, &["effect"], RESULTS).unwrap().take("effect"),
        "replay",
    );
    assert!(want.len() > 60, "the workload must overfill the buffer: {} results", want.len());

    // A kept session upstream: what braid sends after the broker is back reaches it.
    let sub =
        Subscriber::connect_with(up.port(), "up/#", QoS::AtLeastOnce, &format!("bp-sub-{}", std::process::id()), false);
    let mut systemd = NotifyListener::bind();
    let env: [(&str, &OsStr); 2] =
        [("NOTIFY_SOCKET", systemd.path().as_os_str()), ("WATCHDOG_USEC", OsStr::new("1000000"))];
    let mut braid = Braid::start_with_env(&config, &dir.path().join("braid.log"), &env);
    let ready = systemd.wait_for(|m| m.contains("READY=1"), START);
    assert!(ready.is_some(), "never READY=1; log:\n{}", braid.log());

    up.stop();
    publish_all(devices.port(), &mqtt_messages(&msgs), QoS::AtLeastOnce);
    let mut body = String::new();
    let blocked = poll_until(RESULTS, || {
        systemd.messages();
        let (code, text) = healthz(ops);
        body = text;
        code == 503 && body.contains("backpressure: sink up full")
    });
    assert!(blocked, "/healthz never said backpressure; last body:\n{body}\nlog:\n{}", braid.log());
    assert!(body.contains("uplink down"), "/healthz does not say the uplink is down:\n{body}");
    let status =
        systemd.wait_for(|m| m.contains("STATUS=degraded: backpressure: sink up full"), Duration::from_secs(3));
    assert!(status.is_some(), "no STATUS= saying backpressure; got {:?}", systemd.messages());

    // Blocked for 3 s: 6 watchdog periods (WATCHDOG_USEC = 1 s, a ping every 0.5 s), the pings go on.
    let since = Instant::now();
    let mut pings = 0;
    while since.elapsed() < Duration::from_secs(3) {
        if systemd.wait_for(|m| m.contains("WATCHDOG=1"), Duration::from_millis(1200)).is_some() {
            pings += 1;
        } else {
            panic!("no WATCHDOG=1 for 1.2 s while blocked by backpressure ({pings} before); log:\n{}", braid.log());
        }
    }
    assert!(pings >= 4, "{pings} watchdog pings in 3 s of backpressure");
    assert!(braid.running(), "braid stopped while blocked");
    assert!(healthz(ops).1.contains("backpressure"), "the wait ended while the uplink was down");

    up.restart();
    let arrived = poll_until(RESULTS, || {
        // Keep reading the notify socket, as systemd does.
        systemd.messages();
        by_id(sub.json_rows(), "upstream").len() >= want.len()
    });
    let got = by_id(sub.json_rows(), "upstream");
    if !arrived {
        let archive = common::service::read_complete_jsonl(&dir.path().join("braid-archive.jsonl"));
        let metrics = http_get(ops, "/metrics").unwrap_or_default().1;
        let sink_lines: Vec<&str> = metrics
            .lines()
            .filter(|l| {
                l.starts_with("braid_sink")
                    || l.starts_with("braid_ingest")
                    || l.starts_with("braid_source")
                    || l.starts_with("braid_stream_rows")
                    || l.starts_with("braid_operator_rows")
            })
            .collect();
        panic!(
            "{} of {} results upstream after the broker came back ({} rows in the archive, {} messages); metrics:\n{}\nlog:\n{}",
            got.len(),
            want.len(),
            archive.len(),
            msgs.len(),
            sink_lines.join("\n"),
            braid.log()
        );
    }
    assert_same_rows(&got, &want, "upstream after backpressure");
    // The time the intake stood still is no idleness: nothing turned late meanwhile.
    let archive = common::service::read_complete_jsonl(&dir.path().join("braid-archive.jsonl"));
    let late: Vec<_> = archive.iter().filter(|r| r.get("_kind").is_none() && r.get("_reason").is_none()).collect();
    assert!(
        late.is_empty(),
        "{} rows turned late while the intake waited: {:?}",
        late.len(),
        &late[..late.len().min(3)]
    );
    let text = http_get(ops, "/metrics").unwrap().1;
    assert_eq!(metric(&text, "braid_sink_dropped_total", "sink=\"up\""), Some(0.0));
    assert!(
        poll_until(Duration::from_secs(5), || healthz(ops).0 == 200),
        "/healthz stays degraded: {:?}",
        healthz(ops)
    );
    let back = systemd.wait_for(|m| m.contains("STATUS=") && !m.contains("degraded"), Duration::from_secs(6));
    assert!(back.is_some(), "STATUS= still degraded after the uplink came back");
    assert!(braid.terminate(Duration::from_secs(20)).success());
}

/// Copies bytes both ways between accepted clients and `upstream` until `frozen`: then nothing
/// passes any more and every socket stays open, like a link that died without a word.
struct Blackhole {
    port: u16,
    frozen: Arc<AtomicBool>,
}

impl Blackhole {
    fn start(upstream: u16) -> Blackhole {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&frozen);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                for (from, to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                    let flag = Arc::clone(&flag);
                    std::thread::spawn(move || pump(from, to, &flag));
                }
            }
        });
        Blackhole { port, frozen }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if frozen.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

#[test]
fn a_silent_uplink_is_noticed_within_seconds() {
    let dir = tempfile::Builder::new().prefix("braid-silent-uplink-").tempdir().unwrap();
    let devices = Mosquitto::start();
    let up = Mosquitto::start();
    let hole = Blackhole::start(up.port());
    let ops = free_port();
    // No keep_alive in the sink: its default is what is tested.
    let config = write_config(dir.path(), "braid", &devices, &format!("mqtt://127.0.0.1:{}", hole.port), ops, "");
    let mut braid = Braid::start(&config, &dir.path().join("braid.log"));
    braid.wait_log("ready: subscribed", 1, START);
    let connected = || metric(&http_get(ops, "/metrics").unwrap_or_default().1, "braid_sink_connected", "sink=\"up\"");
    assert!(poll_until(START, || connected() == Some(1.0)), "the sink never connected; log:\n{}", braid.log());

    hole.frozen.store(true, Ordering::Relaxed);
    let died = Instant::now();
    let noticed = poll_until(Duration::from_secs(15), || connected() == Some(0.0));
    let after = died.elapsed();
    assert!(noticed, "a silent uplink still counts as connected after 15 s; log:\n{}", braid.log());
    // Two keep-alive periods (5 s) at most, plus the poll's and the scheduler's slack.
    assert!(after <= Duration::from_secs(11), "noticed after {after:?}");
    assert!(healthz(ops).1.contains("sink up: uplink down"), "/healthz: {:?}", healthz(ops));

    hole.frozen.store(false, Ordering::Relaxed);
    assert!(poll_until(RESULTS, || connected() == Some(1.0)), "no reconnection once the link is back");
}
