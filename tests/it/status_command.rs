//! `braid status` against a real `braid run` (the gateway join, a private mosquitto for the
//! devices and one for the uplink), read through its ops endpoint:
//!
//! - `--once --ops ADDR` prints one frame naming every stream, the operator and the MQTT sink,
//!   with the figures of what the test published (rows, a join rate, acked results);
//! - `--config F` finds the address in `[ops] listen`;
//! - an address nothing listens on exits 1 naming it; an invalid config exits 78;
//! - the live view in a real pseudo-terminal (tmux, which CI installs: a missing tmux fails the
//!   test): the screen is redrawn in place every second and follows new rows; the captured
//!   screen is printed in the test output.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use rumqttc::QoS;

use common::mqtt::{Mosquitto, free_port, publish_all};
use common::run::braid;
use common::service::{
    Braid, DeviceMsg, Setup, Source, gateway_config, http_get, metric, mqtt_messages, now_ms, poll_until, workload,
};

const START: Duration = Duration::from_secs(20);
const WAIT: Duration = Duration::from_secs(15);

/// A running gateway and what was published to it.
/// (Fields drop in order: braid stops before its brokers and its folder go.)
struct Gateway {
    _braid: Braid,
    devices: Mosquitto,
    _up: Mosquitto,
    ops: u16,
    config: PathBuf,
    dir: tempfile::TempDir,
}

impl Gateway {
    fn start() -> Gateway {
        let dir = tempfile::Builder::new().prefix("braid-status-").tempdir().unwrap();
        let devices = Mosquitto::start();
        let up = Mosquitto::start();
        let ops = free_port();
        let setup = Setup {
            source: Source::Mqtt(devices.url()),
            upstream_url: &up.url(),
            topic: "up/effect/{device}",
            state_dir: &dir.path().join("state"),
            file: &dir.path().join("archive.jsonl"),
            ops_port: ops,
            max_payload: None,
            idle_timeout: "30s",
        };
        let config = dir.path().join("braid.toml");
        std::fs::write(&config, gateway_config(&setup)).unwrap();
        let mut braid = Braid::start(&config, &dir.path().join("braid.log"));
        braid.wait_log("ready: subscribed", 1, START);
        Gateway { _braid: braid, devices, _up: up, ops, config, dir }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.ops)
    }

    /// Publishes `msgs` and waits until `/metrics` counts `total` rows of each stream (and the
    /// uplink is connected).
    fn publish(&self, msgs: &[DeviceMsg], total: &[(&str, usize)]) {
        publish_all(self.devices.port(), &mqtt_messages(msgs), QoS::AtLeastOnce);
        let counted = poll_until(WAIT, || {
            let Some((200, text)) = http_get(self.ops, "/metrics") else { return false };
            if metric(&text, "braid_sink_connected", "sink=\"up\"") != Some(1.0) {
                return false;
            }
            total.iter().all(|(stream, n)| {
                metric(&text, "braid_stream_rows_total", &format!("stream=\"{stream}\"")) == Some(*n as f64)
            })
        });
        assert!(counted, "/metrics never counted {total:?}: {:?}", http_get(self.ops, "/metrics"));
    }
}

fn count(msgs: &[DeviceMsg], stream: &str) -> usize {
    msgs.iter().filter(|m| m.stream == stream).count()
}

fn status(args: &[&str]) -> Output {
    braid().arg("status").args(args).output().unwrap()
}

/// The whitespace-separated cells of the screen line whose first cell is `name`.
fn row<'a>(screen: &'a str, name: &str) -> Vec<&'a str> {
    let line = screen.lines().find(|l| l.split_whitespace().next() == Some(name));
    line.unwrap_or_else(|| panic!("no row {name:?} on the screen:\n{screen}")).split_whitespace().collect()
}

#[test]
fn once_prints_one_frame_with_every_stream_operator_and_sink() {
    let gw = Gateway::start();
    let msgs = workload(15, 8, now_ms(), 3_000);
    let (statuses, commands) = (count(&msgs, "status"), count(&msgs, "command"));
    gw.publish(&msgs, &[("status", statuses), ("command", commands)]);

    let out = status(&["--once", "--ops", &gw.addr()]);
    let screen = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("braid status --once --ops {}:\n{screen}", gw.addr());
    assert!(out.status.success(), "exit {}; stderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(!screen.contains('\x1b'), "no escapes when stdout is not a terminal:\n{screen:?}");
    for line in screen.lines() {
        assert!(line.chars().count() <= 80, "wider than 80 columns: {line:?}");
    }
    let header = screen.lines().next().unwrap();
    assert_eq!(header, format!("braid status  {}  health: ok", gw.addr()));
    assert!(screen.contains("source devices connected"), "{screen}");

    // STREAM ROWS/S ROWS WATERMARK-LAG IDLE: every row counted, a rate (a second after the last
    // publish: nothing new), a lag behind processing time of the published event times.
    for (stream, n) in [("status", statuses), ("command", commands)] {
        let cells = row(&screen, stream);
        assert_eq!(cells.len(), 5, "{cells:?}");
        assert!(cells[1].parse::<f64>().is_ok_and(|r| r >= 0.0), "{stream} rate {:?}", cells[1]);
        assert_eq!(cells[2], n.to_string(), "{stream} rows");
        assert_ne!(cells[3], "–", "{stream} has a watermark");
        assert_eq!(cells[4], "no", "{stream} is not idle (idle_timeout 30s)");
    }
    // OPERATOR ROWS/S JOIN-RATE LATE STATE-ROWS STATE.
    let effect = row(&screen, "effect");
    assert_eq!(effect.len(), 6, "{effect:?}");
    assert!(effect[1].parse::<f64>().is_ok(), "effect rate {:?}", effect[1]);
    assert!(effect[3].parse::<u64>().is_ok() && effect[4].parse::<u64>().is_ok(), "{effect:?}");
    // The join rate is "–" until a row has left the join, else a percentage.
    let join_rate = effect[2];
    assert!(
        join_rate == "–"
            || join_rate
                .strip_suffix('%')
                .and_then(|p| p.parse::<f64>().ok())
                .is_some_and(|p| (0.0..=100.0).contains(&p)),
        "join rate {join_rate:?}"
    );
    // SINK UPLINK QUEUED ACKED ACKED/S: the MQTT uplink.
    let up = row(&screen, "up");
    assert_eq!(up.len(), 5, "{up:?}");
    assert_eq!(up[1], "up", "the uplink is connected");
    assert!(up[3].parse::<u64>().is_ok(), "{up:?}");

    // --config: the address comes from [ops] listen.
    let out = status(&["--once", "--config", gw.config.to_str().unwrap()]);
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {}; stderr:\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(screen.starts_with(&format!("braid status  {}  ", gw.addr())), "{screen}");
}

#[test]
fn an_unreachable_endpoint_exits_1_naming_it_and_a_bad_config_78() {
    let addr = format!("127.0.0.1:{}", free_port());
    let out = status(&["--once", "--ops", &addr]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(stderr.contains(&format!("cannot reach {addr}")), "{stderr}");
    // The live view too: its first scrape must succeed.
    let out = status(&["--ops", &addr]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[ops]\nlisten = 9464\n").unwrap();
    let out = status(&["--once", "--config", bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "stderr:\n{stderr}");
    assert!(stderr.contains("bad.toml:2:"), "errors name file:line: {stderr}");
}

/// A private tmux server (its own socket) with one 80×24 session; killed when dropped.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn command(&self) -> Command {
        let mut cmd = Command::new("tmux");
        // A private server even when the tests themselves run inside tmux.
        cmd.env_remove("TMUX").arg("-S").arg(&self.socket);
        cmd
    }

    /// Starts `shell_command` in a detached session; the pane stays after it exits.
    fn start(dir: &Path, shell_command: &str) -> Tmux {
        let version = Command::new("tmux").arg("-V").output();
        assert!(
            version.as_ref().is_ok_and(|o| o.status.success()),
            "tmux is missing: this test drives `braid status` through a real pseudo-terminal \
             (apt-get install -y tmux): {version:?}"
        );
        let tmux = Tmux { socket: dir.join("tmux.sock") };
        let held = format!("{shell_command}; echo \"[exit $?]\"; sleep 600");
        let started = tmux
            .command()
            .args(["-f", "/dev/null", "new-session", "-d", "-x", "80", "-y", "24", "-s", "status"])
            .arg(held)
            .status()
            .unwrap();
        assert!(started.success(), "tmux new-session: {started}");
        tmux
    }

    fn screen(&self) -> String {
        let out = self.command().args(["capture-pane", "-p", "-t", "status"]).output().unwrap();
        assert!(out.status.success(), "tmux capture-pane: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Polls the screen until `done` holds; fails the test with the last screen.
    fn wait(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        if poll_until(WAIT, || {
            last = self.screen();
            done(&last)
        }) {
            return last;
        }
        panic!("the screen never showed {what}:\n{last}");
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command().arg("kill-server").status();
    }
}

#[test]
fn the_live_view_redraws_in_a_real_terminal() {
    let gw = Gateway::start();
    let first = workload(16, 4, now_ms(), 2_000);
    gw.publish(&first, &[("status", count(&first, "status")), ("command", count(&first, "command"))]);

    let command = format!("env -u BRAID_CONFIG {} status --ops {}", env!("CARGO_BIN_EXE_braid"), gw.addr());
    let tmux = Tmux::start(gw.dir.path(), &command);
    // The second frame has rates: the status row's ROWS/S is a number, not "–".
    let screen = tmux.wait("a frame with rates", |s| {
        s.lines()
            .any(|l| l.starts_with("status ") && l.split_whitespace().nth(1).is_some_and(|r| r.parse::<f64>().is_ok()))
    });
    println!("tmux capture-pane, 80×24, `{command}`:\n{screen}");
    assert!(screen.starts_with(&format!("braid status  {}  health: ok\n", gw.addr())), "{screen}");
    assert_eq!(screen.matches("braid status  ").count(), 1, "frames are redrawn in place, not scrolled:\n{screen}");
    for name in ["status", "command", "effect", "up"] {
        row(&screen, name);
    }
    assert_eq!(row(&screen, "status")[2], count(&first, "status").to_string());

    // New rows show up in the next frames.
    let more = workload(17, 4, now_ms(), 2_000);
    let statuses = count(&first, "status") + count(&more, "status");
    gw.publish(&more, &[("status", statuses), ("command", count(&first, "command") + count(&more, "command"))]);
    let screen = tmux.wait("the new status rows", |s| {
        s.lines().any(|l| l.starts_with("status ") && l.split_whitespace().nth(2) == Some(&statuses.to_string()))
    });
    println!("after {} more status rows:\n{screen}", count(&more, "status"));
    assert_eq!(screen.matches("braid status  ").count(), 1, "{screen}");
    // Still running (no "[exit N]" line from the held shell).
    assert!(!screen.contains("[exit "), "{screen}");
}
