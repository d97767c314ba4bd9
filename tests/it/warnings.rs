//! The warnings of a running service (`braid run` against a private mosquitto): one workload
//! that triggers each of them, read back from `/metrics` (`braid_warning_active`), `/healthz`
//! (200, the warnings listed after `ok`), the log and `braid status --once`.
//!
//! - `nomatch` joins `a` (keys `x-…`) with `b` (keys `y-…`): nothing ever matches while both flow
//!   (`no_match`, after `[ops] no_match_warning = "2s"`), and `b`'s event times are 10 s behind
//!   `a`'s, more than the join's 2 s span can bridge (`watermark_skew` on `nomatch/b`);
//! - `stuck` joins `a` with `d`, which never sends and never turns idle: `a`'s rows pile up under
//!   a watermark at −∞ (`state_stalled`, after `state_stall_warning = "2s"`);
//! - `c` brings 30 rows in the first 1.5 s, then nothing (`silent_stream`, after the 5 s floor);
//! - nine of ten `a` rows carry key `x-hot` (`hot_key` on shard 0, its only shard).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use rumqttc::QoS;

use common::mqtt::{Mosquitto, free_port, publish_all};
use common::run::braid;
use common::service::{Braid, http_get, metric, now_ms, poll_until};

/// At most this many chunks (the test stops the publisher once it has seen everything).
const CHUNKS: i64 = 250;
const CHUNK_EVERY: Duration = Duration::from_millis(100);

fn config(devices: &str, ops: u16, state: &std::path::Path) -> String {
    let stream = |name: &str, idle: &str| {
        format!(
            "[streams.{name}]\nsource = \"devices\"\ntopic = \"w/+device/{name}\"\nkey = \"device\"\n\
             time = {{ field = \"ts\", unit = \"ms\" }}\nidle_timeout = \"{idle}\"\n\
             fields = {{ device = \"string\", ts = \"int\" }}\n\n"
        )
    };
    let join = |name: &str, right: &str| {
        format!(
            "[operators.{name}]\nkind = \"interval_join\"\nleft = \"a\"\nright = \"{right}\"\n\
             lower = \"-1s\"\nupper = \"1s\"\nselect = [\"left.device\"]\n\n"
        )
    };
    format!(
        "[runtime]\nshards = 1\nstate_dir = \"{}\"\n\n\
         [ops]\nlisten = \"127.0.0.1:{ops}\"\nno_match_warning = \"2s\"\nstate_stall_warning = \"2s\"\n\n\
         [sources.devices]\nkind = \"mqtt\"\nurl = \"{devices}\"\n\n{}{}{}{}{}{}",
        state.display(),
        stream("a", "30s"),
        stream("b", "30s"),
        stream("c", "30s"),
        stream("d", "0ms"),
        join("nomatch", "b"),
        join("stuck", "d"),
    )
}

/// One chunk of the workload (`i`: its index): `a` rows, `b` rows 10 s behind, `c` at first.
fn chunk(i: i64, base: i64) -> Vec<(String, Vec<u8>)> {
    let ts = base + i * CHUNK_EVERY.as_millis() as i64;
    let msg = |stream: &str, device: String, ts: i64| {
        (format!("w/{device}/{stream}"), format!("{{\"ts\":{ts}}}").into_bytes())
    };
    let mut msgs = Vec::new();
    for j in 0..10 {
        let device = if j == 0 { format!("x-{}", i % 5) } else { "x-hot".to_owned() };
        msgs.push(msg("a", device, ts));
    }
    msgs.push(msg("b", format!("y-{}", i % 7), ts - 10_000));
    if i < 15 {
        msgs.push(msg("c", format!("z-{}", i % 3), ts));
        msgs.push(msg("c", format!("z-{}", (i + 1) % 3), ts));
    }
    msgs
}

#[test]
fn a_workload_triggers_every_warning_listed_in_metrics_healthz_status_and_the_log() {
    let dir = tempfile::Builder::new().prefix("braid-warnings-").tempdir().unwrap();
    let devices = Mosquitto::start();
    let ops = free_port();
    let path = dir.path().join("braid.toml");
    std::fs::write(&path, config(&devices.url(), ops, &dir.path().join("state"))).unwrap();
    let mut service = Braid::start(&path, &dir.path().join("braid.log"));
    service.wait_log("ready: subscribed", 1, Duration::from_secs(20));

    let port = devices.port();
    let base = now_ms();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = std::sync::Arc::clone(&stop);
    let publisher = std::thread::spawn(move || {
        for i in 0..CHUNKS {
            if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            publish_all(port, &chunk(i, base), QoS::AtLeastOnce);
            std::thread::sleep(CHUNK_EVERY);
        }
    });

    let want = [
        ("no_match", "nomatch"),
        ("watermark_skew", "nomatch/b"),
        ("state_stalled", "stuck"),
        ("silent_stream", "c"),
        ("hot_key", "shard 0"),
    ];
    let mut seen = BTreeSet::new();
    let mut last = String::new();
    let all_seen = poll_until(Duration::from_secs(25), || {
        let Some((200, text)) = http_get(ops, "/metrics") else { return false };
        for (warning, subject) in want {
            if metric(&text, "braid_warning_active", &format!("warning=\"{warning}\",subject=\"{subject}\""))
                == Some(1.0)
            {
                seen.insert((warning, subject));
            }
        }
        last = text;
        seen.len() == want.len()
    });
    assert!(all_seen, "warnings seen: {seen:?} of {want:?}; last /metrics:\n{last}\nlog:\n{}", service.log());

    // No warning makes the service unhealthy: /healthz stays 200 and lists what is active.
    let (status, body) = http_get(ops, "/healthz").unwrap();
    println!("/healthz ({status}):\n{body}");
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ok\n"), "{body}");
    assert!(body.contains("warning no_match nomatch: matched nothing for "), "{body}");
    assert!(body.contains("warning hot_key shard 0: key 'x-hot' carries "), "{body}");

    // The lag of b's watermark behind a's: its event times are 10 s behind.
    let lag = metric(
        &last,
        "braid_operator_input_watermark_lag_seconds",
        "operator=\"nomatch\",input=\"b\",behind=\"other_input\"",
    );
    assert!(lag.is_some_and(|l| (9.0..=11.0).contains(&l)), "lag {lag:?}");
    let behind_now = metric(
        &last,
        "braid_operator_input_watermark_lag_seconds",
        "operator=\"nomatch\",input=\"a\",behind=\"processing_time\"",
    );
    assert!(behind_now.is_some_and(|l| (0.0..5.0).contains(&l)), "a's lag behind processing time {behind_now:?}");

    let out = braid().args(["status", "--once", "--ops", &format!("127.0.0.1:{ops}")]).output().unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    println!("braid status --once:\n{screen}");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(screen.lines().next().unwrap().ends_with("health: ok"), "{screen}");
    assert!(screen.contains("! warning no_match nomatch"), "{screen}");

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    publisher.join().unwrap();
    let log = service.log();
    for (warning, subject) in want {
        let fields = [format!("warning=\"{warning}\""), format!("subject={subject}")];
        let logged = log.lines().any(|l| l.contains("WARN") && fields.iter().all(|f| l.contains(f.as_str())));
        assert!(logged, "no log line for {warning} {subject}:\n{log}");
    }
}
