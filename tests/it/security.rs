//! Edge security (README "Security"): `braid run` behind its embedded broker secured with a users
//! file (made by `mosquitto_passwd`) and an ACL file, and the same gateway behind a mosquitto
//! configured with README's recipe. Each tries what an attacker on the gateway's network would:
//! connect anonymously or with a wrong password, publish a command under another device's
//! topic, subscribe to `#`, connect with braid's own client id. And `validate`'s rules for an
//! exposed broker and clear-text MQTT.
//!
//! The gateway join of configs/gateway.toml runs with `idle_timeout = "1s"`: a forged command,
//! had it got through, would join the same status as the genuine one published after it, and
//! show in the file sink at the same time; the tests wait for the genuine result, then a little
//! more, and check that no forged one is there.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::mqtt::{Mosquitto, Subscriber, free_port, options, wait_accepting};
use common::service::{
    Braid, Setup, Source, gateway_config, http_get, metric, now_ms, poll_until, read_complete_jsonl,
};
use common::tls::{set_password, users_file};
use rumqttc::{AsyncClient, ConnectReturnCode, Event, MqttOptions, Packet, QoS, SubscribeReasonCode};
use serde_json::{Value, json};

const START: Duration = Duration::from_secs(15);
const RESULTS: Duration = Duration::from_secs(25);
/// Passwords long enough not to occur by chance in `/metrics` (which must not show them).
const D1: &str = "d1-pw-5b2e81";
const D2: &str = "d2-pw-9c41f0";
const BRAID: &str = "braid-pw-17ad3c";
/// README's per-device ACL: a device writes under its own topics and reads its commands.
const DEVICE_ACL: &str = "pattern write devices/%u/#\npattern read devices/%u/command\n";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn login(port: u16, id: &str, user: &str, password: &str) -> MqttOptions {
    let mut opts = options(port, id, true);
    opts.set_credentials(user, password);
    opts
}

/// The broker's answer to a CONNECT: `Ok` or the refusing code (an error: "closed").
fn connack(opts: MqttOptions) -> Result<(), String> {
    runtime().block_on(async {
        let (_client, mut el) = AsyncClient::new(opts, 4);
        match tokio::time::timeout(common::mqtt::WAIT, el.poll()).await.expect("no answer to CONNECT") {
            Ok(Event::Incoming(Packet::ConnAck(ack))) if ack.code == ConnectReturnCode::Success => Ok(()),
            Ok(other) => Err(format!("{other:?}")),
            Err(error) => Err(error.to_string()),
        }
    })
}

/// Publishes at QoS 1 as `user` and returns once every PUBACK came.
fn publish_as(port: u16, user: &str, password: &str, msgs: &[(String, Value)]) {
    publish_until(port, user, password, msgs, false);
}

/// Publishes one message the broker should refuse: returns on its PUBACK (braid's gate, like
/// mosquitto's ACL, drops it and acknowledges it) or when the broker closes the connection
/// (mosquitto 2.0.11 does after a refused QoS 1 publish, before its PUBACK reaches the client).
fn publish_refused(port: u16, user: &str, password: &str, msg: (String, Value)) {
    publish_until(port, user, password, &[msg], true);
}

fn publish_until(port: u16, user: &str, password: &str, msgs: &[(String, Value)], closing_ok: bool) {
    runtime().block_on(async {
        let (client, mut el) = AsyncClient::new(login(port, &format!("{user}-pub"), user, password), msgs.len());
        for (topic, payload) in msgs {
            client.try_publish(topic.as_str(), QoS::AtLeastOnce, false, payload.to_string()).unwrap();
        }
        let mut acked = 0;
        let all = async {
            while acked < msgs.len() {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                    Ok(_) => {}
                    Err(_) if closing_ok => return,
                    Err(e) => panic!("publishing as {user}: {e}"),
                }
            }
        };
        tokio::time::timeout(common::mqtt::WAIT, all).await.expect("PUBACKs in time");
    });
}

/// The SUBACK codes of one subscription to `filter` as `user`.
fn suback_as(port: u16, user: &str, password: &str, filter: &str) -> Vec<SubscribeReasonCode> {
    runtime().block_on(async {
        let (client, mut el) = AsyncClient::new(login(port, &format!("{user}-sub"), user, password), 4);
        client.try_subscribe(filter, QoS::AtLeastOnce).unwrap();
        let codes = async {
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(ack))) => return ack.return_codes,
                    Ok(_) => {}
                    Err(e) => panic!("subscribing as {user}: {e}"),
                }
            }
        };
        tokio::time::timeout(common::mqtt::WAIT, codes).await.expect("SUBACK in time")
    })
}

fn command(device: &str, ts: i64, cmd_id: &str) -> (String, Value) {
    (format!("devices/{device}/command"), json!({"ts": ts, "cmd": "open", "arg": "", "cmd_id": cmd_id}))
}

fn status(device: &str, ts: i64, seq: i64) -> (String, Value) {
    (format!("devices/{device}/status"), json!({"ts": ts, "temp": 21.5, "state": "on", "seq": seq}))
}

/// braid running the gateway join behind `source` (plus `source_keys` in `[sources.devices]`),
/// results to an upstream mosquitto and the file sink.
struct Gateway {
    dir: tempfile::TempDir,
    _up: Mosquitto,
    ops: u16,
    file: PathBuf,
    braid: Braid,
}

impl Gateway {
    fn start(dir: tempfile::TempDir, source: Source, source_keys: &str) -> Gateway {
        let up = Mosquitto::start();
        let ops = free_port();
        let file = dir.path().join("archive.jsonl");
        let state = dir.path().join("state");
        let setup = Setup {
            source,
            upstream_url: &up.url(),
            topic: "up/effect/{device}",
            state_dir: &state,
            file: &file,
            ops_port: ops,
            max_payload: None,
            idle_timeout: "1s",
        };
        let mut config: toml::Table = gateway_config(&setup).parse().unwrap();
        let keys: toml::Table = source_keys.parse().unwrap();
        config["sources"]["devices"].as_table_mut().unwrap().extend(keys);
        let path = dir.path().join("braid.toml");
        std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
        let mut braid = Braid::start(&path, &dir.path().join("braid.log"));
        braid.wait_log("ready: subscribed", 1, START);
        Gateway { dir, _up: up, ops, file, braid }
    }

    /// The `cmd_id`s of the join results in the file sink so far.
    fn joined(&self) -> Vec<String> {
        read_complete_jsonl(&self.file)
            .iter()
            .filter(|row| row.get("_kind").is_some())
            .filter_map(|row| row["cmd_id"].as_str().map(str::to_owned))
            .collect()
    }

    /// Waits for `cmd_id`'s result, waits a little more (a forged row would have come with it),
    /// and returns every `cmd_id` joined.
    fn joined_after(&self, cmd_id: &str) -> Vec<String> {
        let arrived = poll_until(RESULTS, || self.joined().iter().any(|id| id == cmd_id));
        assert!(arrived, "no result for {cmd_id}; braid log:\n{}", self.braid.log());
        std::thread::sleep(Duration::from_millis(500));
        self.joined()
    }

    /// braid's own client id (made at its first start, kept in STATE_DIR).
    fn client_id(&self) -> String {
        let path = self.dir.path().join("state").join("client-id.devices");
        std::fs::read_to_string(path).unwrap().trim().to_owned()
    }

    fn metrics(&self) -> String {
        http_get(self.ops, "/metrics").expect("/metrics answers").1
    }
}

/// A forged command from d2 under d1's topic, then d1's genuine command and status: the
/// genuine one is joined, the forged one never.
fn forged_command_is_never_joined(gateway: &Gateway, port: u16, base: i64) {
    publish_refused(port, "d2", D2, command("d1", base, "INJECTED"));
    publish_as(port, "d1", D1, &[command("d1", base + 1, "OK1"), status("d1", base + 2, 1)]);
    let joined = gateway.joined_after("OK1");
    assert!(!joined.iter().any(|id| id == "INJECTED"), "the forged command was joined: {joined:?}");
}

/// A device connects with braid's client id (a persistent session, as braid's) and stays
/// connected while d1 sends a command: braid still gets it, and never lost its connection.
fn braids_client_id_takes_nothing(gateway: &Gateway, port: u16, base: i64) {
    let braid_id = gateway.client_id();
    assert!(braid_id.len() > 20, "no random part in {braid_id:?}");
    let mut thief_opts = options(port, &braid_id, false);
    thief_opts.set_credentials("d1", D1);
    let thief = Subscriber::connect_opts(thief_opts, "devices/d1/command", QoS::AtLeastOnce);
    publish_as(port, "d1", D1, &[command("d1", base + 10, "OK2"), status("d1", base + 11, 2)]);
    gateway.joined_after("OK2");
    thief.close();
    let log = gateway.braid.log();
    assert!(!log.contains("MQTT source disconnected"), "a device took braid's session; log:\n{log}");
}

#[test]
fn the_embedded_broker_lets_in_only_its_users_and_only_onto_their_own_topics() {
    let dir = tempfile::Builder::new().prefix("braid-security-").tempdir().unwrap();
    let users = users_file(&dir.path().join("users"), &[("d1", D1), ("d2", D2)]);
    std::fs::write(dir.path().join("acl"), DEVICE_ACL).unwrap();
    let port = free_port();
    let keys = format!("users_file = {:?}\nacl_file = {:?}\n", users, dir.path().join("acl"));
    let gateway = Gateway::start(dir, Source::Embedded(port), &keys);
    let base = now_ms();

    // Loopback is no exception: no credentials, or wrong ones, no connection.
    let anonymous = connack(options(port, "anon", true));
    assert!(anonymous.as_ref().is_err_and(|e| e.contains("NotAuthorized")), "{anonymous:?}");
    let wrong = connack(login(port, "x", "d1", D2));
    assert!(wrong.as_ref().is_err_and(|e| e.contains("BadUserNamePassword")), "{wrong:?}");
    assert_eq!(connack(login(port, "y", "d1", D1)), Ok(()));

    forged_command_is_never_joined(&gateway, port, base);
    assert_eq!(suback_as(port, "d1", D1, "#"), [SubscribeReasonCode::Failure]);
    assert_eq!(suback_as(port, "d1", D1, "devices/d1/command"), [SubscribeReasonCode::Success(QoS::AtLeastOnce)]);
    braids_client_id_takes_nothing(&gateway, port, base);

    // Refusals are counted; /metrics and /healthz show neither passwords nor hashes.
    let metrics = gateway.metrics();
    let refused =
        |what: &str| metric(&metrics, "braid_broker_refused_total", &format!("source=\"devices\",what=\"{what}\""));
    assert_eq!((refused("connection"), refused("publish"), refused("subscription")), (Some(2.0), Some(1.0), Some(1.0)));
    let health = http_get(gateway.ops, "/healthz").unwrap().1;
    for text in [&metrics, &health] {
        for secret in [D1, D2, "$7$"] {
            assert!(!text.contains(secret), "{secret} in the ops endpoint:\n{text}");
        }
    }

    // SIGHUP reads the users file again: a rotated password takes effect, the old one is refused.
    let rotated = "d1-pw-rotated-44c9";
    set_password(&users, "d1", rotated, false);
    gateway.braid.signal(libc::SIGHUP);
    let applied = poll_until(Duration::from_secs(10), || connack(login(port, "z", "d1", rotated)).is_ok());
    assert!(applied, "the rotated password was not taken; log:\n{}", gateway.braid.log());
    assert!(connack(login(port, "z", "d1", D1)).is_err(), "the old password still works after SIGHUP");
}

#[test]
fn mosquitto_with_the_readme_recipe_keeps_devices_and_braids_session_apart() {
    let dir = tempfile::Builder::new().prefix("braid-security-mosquitto-").tempdir().unwrap();
    let users = users_file(&dir.path().join("users"), &[("braid", BRAID), ("d1", D1), ("d2", D2)]);
    let acl = dir.path().join("acl");
    std::fs::write(
        &acl,
        format!("user braid\ntopic read devices/+/status\ntopic read devices/+/command\n\n{DEVICE_ACL}"),
    )
    .unwrap();
    let password = dir.path().join("braid-password");
    std::fs::write(&password, format!("{BRAID}\n")).unwrap();
    // README's listener; the harness keeps a plain anonymous first listener it does not use here.
    let port = free_port();
    let listener = format!(
        "listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\nacl_file {}\nuse_username_as_clientid true\n",
        users.display(),
        acl.display()
    );
    let devices = Mosquitto::start_with_listener(&listener);
    wait_accepting(port, &devices);
    let keys = format!("username = \"braid\"\npassword_file = {password:?}\n");
    let gateway = Gateway::start(dir, Source::Mqtt(format!("mqtt://127.0.0.1:{port}")), &keys);
    let base = now_ms();

    assert!(connack(options(port, "anon", true)).is_err(), "mosquitto let an anonymous client in");
    assert!(connack(login(port, "x", "d1", D2)).is_err(), "mosquitto took a wrong password");

    forged_command_is_never_joined(&gateway, port, base);
    // mosquitto grants `#` but delivers only what the ACL lets d1 read: nothing of d2's.
    let mut wide_opts = options(port, "wide", true);
    wide_opts.set_credentials("d1", D1);
    let wide = Subscriber::connect_opts(wide_opts, "#", QoS::AtLeastOnce);
    publish_as(port, "d2", D2, &[status("d2", base + 5, 1)]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(wide.messages().is_empty(), "d1 read {:?}", wide.messages());
    wide.close();
    // use_username_as_clientid: the thief's id becomes "d1", braid's session stays braid's.
    braids_client_id_takes_nothing(&gateway, port, base);
}

fn parse(text: &str) -> Result<Vec<String>, String> {
    braid::config::parse("braid.toml", text).map(|plan| plan.warnings).map_err(|e| e.to_string())
}

/// A gateway config with an embedded source made of `source` lines.
fn embedded(source: &str) -> String {
    format!(
        "[sources.devices]\nkind = \"embedded\"\n{source}\n\n[streams.status]\nsource = \"devices\"\n\
         topic = \"devices/+device/status\"\nkey = \"device\"\nfields = {{ device = \"string\", seq = \"int\" }}\n"
    )
}

#[test]
fn validate_refuses_an_exposed_embedded_broker_without_credentials() {
    let error = parse(&embedded("listen = \"0.0.0.0:1883\"")).unwrap_err();
    assert!(
        error.contains("braid.toml:3:1: sources.devices.listen: 0.0.0.0:1883 is not a loopback address"),
        "{error}"
    );
    assert!(error.contains("users_file") && error.contains("anonymous = true"), "{error}");

    let warnings = parse(&embedded("listen = \"0.0.0.0:1883\"\nanonymous = true")).unwrap();
    assert!(warnings.iter().any(|w| w.contains("anonymous = true on 0.0.0.0:1883")), "{warnings:?}");

    let warnings = parse(&embedded("listen = \"0.0.0.0:1883\"\nusers_file = \"/etc/braid/users\"")).unwrap();
    assert!(warnings.iter().any(|w| w.contains("no acl_file")), "{warnings:?}");

    let secure = "listen = \"0.0.0.0:1883\"\nusers_file = \"/etc/braid/users\"\nacl_file = \"/etc/braid/acl\"";
    assert_eq!(parse(&embedded(secure)), Ok(vec![]));
    assert_eq!(parse(&embedded("")), Ok(vec![]), "the default listen is loopback");
    assert_eq!(parse(&embedded("listen = \"127.0.0.1:1884\"")), Ok(vec![]));

    let misplaced = "[sources.devices]\nkind = \"mqtt\"\nurl = \"mqtt://127.0.0.1\"\nacl_file = \"/etc/braid/acl\"\n";
    let error = parse(misplaced).unwrap_err();
    assert!(error.contains("sources.devices.acl_file: only for kind = \"embedded\""), "{error}");
}

#[test]
fn validate_warns_about_clear_text_mqtt_to_another_host() {
    let source = |url: &str| format!("[sources.devices]\nkind = \"mqtt\"\nurl = \"{url}\"\n");
    for url in ["mqtt://192.0.2.7:1883", "mqtt://broker.plant.local"] {
        let warnings = parse(&source(url)).unwrap();
        assert!(warnings.iter().any(|w| w.contains("clear text") && w.contains("sources.devices.url")), "{warnings:?}");
    }
    for url in ["mqtt://127.0.0.1:1883", "mqtt://localhost", "mqtt://[::1]:1883", "mqtts://broker.plant.local"] {
        assert_eq!(parse(&source(url)), Ok(vec![]), "{url}");
    }
    let sink =
        "[sinks.up]\nkind = \"mqtt\"\ninputs = [\"dead_letter\"]\nurl = \"mqtt://cloud.example.com\"\ntopic = \"t\"\n";
    let warnings = parse(sink).unwrap();
    assert!(warnings.iter().any(|w| w.contains("sinks.up.url") && w.contains("clear text")), "{warnings:?}");
}

#[test]
fn the_shipped_gateway_config_and_the_ops_endpoint_default_to_safe_settings() {
    let text = std::fs::read_to_string("configs/gateway.toml").unwrap();
    assert_eq!(parse(&text), Ok(vec![]), "configs/gateway.toml warns");
    let plan = braid::config::parse("c.toml", &embedded("")).unwrap();
    assert_eq!(plan.ops_listen, "127.0.0.1:9464", "/metrics and /healthz are loopback by default");
}
