//! `braid explain --live` against a running `braid run` (issue 15): devices publish through a
//! real mosquitto, then explain fetches what the service's journal still holds from its ops
//! endpoint (`GET /journal`) and tells the fate of the key's rows, and of a pair.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use rumqttc::QoS;
use serde_json::{Value, json};

use crate::common;
use common::mqtt::{Mosquitto, free_port, publish_all};
use common::run::braid;
use common::service::{Braid, Setup, Source, gateway_config, http_get, now_ms, poll_until};

/// `braid explain --live --config CONFIG ARGS...`: success, stdout, stderr.
fn explain_live(config: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = braid().arg("explain").arg("--live").arg("--config").arg(config).args(args).output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

#[test]
fn explain_live_tells_the_fates_of_what_the_journal_holds() {
    let dir = tempfile::Builder::new().prefix("braid-explain-live-").tempdir().unwrap();
    let (devices, up) = (Mosquitto::start(), Mosquitto::start());
    let ops_port = free_port();
    let setup = Setup {
        source: Source::Mqtt(devices.url()),
        upstream_url: &up.url(),
        topic: "up/effect/{device}",
        state_dir: &dir.path().join("state"),
        file: &dir.path().join("archive.jsonl"),
        ops_port,
        max_payload: None,
        idle_timeout: "30s",
    };
    // Checkpoints rarely: a committed one lets the journal go of what it covers.
    let text = gateway_config(&setup).replacen("[runtime]\n", "[runtime]\ncheckpoint_interval = \"1h\"\n", 1);
    let config = dir.path().join("braid.toml");
    std::fs::write(&config, text).unwrap();
    let log = dir.path().join("braid.log");
    let mut run = Braid::start(&config, &log);
    run.wait_log("ready: subscribed", 1, Duration::from_secs(15));

    // d01: a status 6 s before its command (outside the bound [-3 s, +5 s] by 3000 ms), then the
    // command and a status 500 ms after it (they join). The device is the topic's `+device`.
    let t = now_ms();
    let msgs = [
        ("devices/d01/status", json!({"ts": t - 6000, "temp": 20.5, "state": "off", "seq": 1})),
        ("devices/d01/command", json!({"ts": t, "cmd": "on", "arg": "x", "cmd_id": "c1"})),
        ("devices/d01/status", json!({"ts": t + 500, "temp": 21.0, "state": "on", "seq": 2})),
        ("devices/d02/status", json!({"ts": t + 600, "temp": 19.0, "state": "on", "seq": 1})),
    ];
    let msgs: Vec<(String, Vec<u8>)> = msgs.iter().map(|(t, p)| (t.to_string(), p.to_string().into_bytes())).collect();
    publish_all(devices.port(), &msgs, QoS::AtLeastOnce);

    // The journal as replay input lines, the captured device filled in, each with its arrival.
    let mut journal = Vec::new();
    let held = poll_until(Duration::from_secs(10), || {
        let Some((200, body)) = http_get(ops_port, "/journal") else { return false };
        journal = body.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).collect();
        journal.len() == 4
    });
    assert!(held, "GET /journal: {journal:?}\n{}", run.log());
    for entry in &journal {
        assert!(entry["line"]["device"].is_string() && entry["line"]["arrival"].is_i64(), "{entry}");
    }
    assert_eq!(journal.iter().filter(|e| e["stream"] == "status").count(), 3);
    assert_eq!(journal[1]["line"]["cmd_id"], "c1");

    let (ok, out, err) = explain_live(&config, &["--key", "d01"]);
    assert!(ok, "{err}");
    println!("braid explain --live --key d01:\n{out}");
    assert!(err.contains("the journal holds 4 line(s)"), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "key 'd01': 3 rows", "{out}");
    let fate = |head: &str| {
        let at = lines.iter().position(|l| l.starts_with(head)).unwrap_or_else(|| panic!("no {head} in\n{out}"));
        lines[at + 1].to_owned()
    };
    assert!(fate(&format!("status ts {}:", t - 6000)).contains("outside the bound by 3000 ms"), "{out}");
    assert!(fate(&format!("command ts {t}:")).contains(&format!("paired with status ts {}", t + 500)), "{out}");
    assert!(fate(&format!("status ts {}:", t + 500)).contains(&format!("paired with command ts {t}")), "{out}");

    // A pair, the address given; JSON.
    let ops = format!("127.0.0.1:{ops_port}");
    let pair = ["--row", "command:cmd_id=c1", "--row", "status:seq=1,device=d01", "--ops", &ops, "--json"];
    let (ok, out, err) = explain_live(&config, &pair);
    assert!(ok, "{err}");
    let verdict: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((verdict["verdict"].as_str(), verdict["by_ms"].as_i64()), (Some("outside_bound"), Some(3000)), "{out}");

    // Nothing listens there: a clear error.
    let (ok, _, err) = explain_live(&config, &["--key", "d01", "--ops", &format!("127.0.0.1:{}", free_port())]);
    assert!(!ok && err.contains("cannot reach"), "{err}");
    assert_eq!(http_get(ops_port, "/journal?x").map(|a| a.0), Some(200));
    run.terminate(Duration::from_secs(10));
}
