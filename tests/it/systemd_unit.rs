//! The systemd packaging: `systemd/braid.service` has what the service needs (Type=notify, the
//! validate pre-check, reload, watchdog, restarts, state, a dedicated user, io_uring's locked
//! memory, the hardening), `configs/gateway.toml` is a valid config matching the unit's paths, and
//! braid's notifications reach a real notify socket (`common::notify::NotifyListener`).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use braid::ops::systemd::Notifier;
use common::notify::NotifyListener;

const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/braid.service");
const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/gateway.toml");

/// `[Section]` → key → every value given to it, in order (keys like SystemCallFilter repeat).
type Unit = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// systemd's unit syntax, as far as this unit uses it: sections, `Key=Value`, `#`/`;` comments.
fn parse_unit(text: &str) -> Unit {
    let mut unit = Unit::new();
    let mut section = String::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        assert!(!line.ends_with('\\'), "line {}: continuation lines are not expected here", n + 1);
        let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("line {}: not Key=Value: {line}", n + 1));
        assert!(!section.is_empty(), "line {}: a key before any section", n + 1);
        unit.entry(section.clone())
            .or_default()
            .entry(key.trim().to_owned())
            .or_default()
            .push(value.trim().to_owned());
    }
    unit
}

fn unit() -> Unit {
    parse_unit(&std::fs::read_to_string(UNIT).unwrap())
}

/// The value of `key` in `[Service]` (the last one, as systemd reads a repeated scalar key).
fn service<'a>(unit: &'a Unit, key: &str) -> &'a str {
    unit["Service"].get(key).and_then(|v| v.last()).unwrap_or_else(|| panic!("[Service] {key}= is missing"))
}

/// systemd's time span syntax for the values used here: "20s", "1min", "90s", "500ms".
fn seconds(span: &str) -> f64 {
    let split = span.find(|c: char| !c.is_ascii_digit()).unwrap_or(span.len());
    let (n, unit) = span.split_at(split);
    let n: f64 = n.parse().unwrap_or_else(|_| panic!("not a time span: {span}"));
    match unit {
        "" | "s" | "sec" => n,
        "ms" => n / 1000.0,
        "min" | "m" => n * 60.0,
        _ => panic!("unexpected unit in {span}"),
    }
}

#[test]
fn the_service_is_a_notify_service_that_validates_reloads_and_restarts() {
    let unit = unit();
    assert_eq!(service(&unit, "Type"), "notify");
    let pre = service(&unit, "ExecStartPre");
    let start = service(&unit, "ExecStart");
    assert!(pre.starts_with('/') && pre.contains(" validate --config /etc/braid/braid.toml"), "{pre}");
    assert!(start.starts_with('/') && start.contains(" run --config /etc/braid/braid.toml"), "{start}");
    assert_eq!(pre.split(' ').next(), start.split(' ').next(), "validate and run the same binary");
    assert_eq!(service(&unit, "ExecReload"), "/bin/kill -HUP $MAINPID");
    assert_eq!(service(&unit, "Restart"), "on-failure");
    assert!(seconds(service(&unit, "RestartSec")) >= 1.0, "restart loops must not spin");
    assert_eq!(unit["Install"]["WantedBy"], ["multi-user.target"]);
}

#[test]
fn watchdog_and_timeouts_are_sane() {
    let unit = unit();
    let watchdog = seconds(service(&unit, "WatchdogSec"));
    // braid pings at half the period; below a few seconds a slow disk causes false restarts,
    // above a minute a hang goes unnoticed too long.
    assert!((5.0..=60.0).contains(&watchdog), "WatchdogSec={watchdog}");
    let stop = seconds(service(&unit, "TimeoutStopSec"));
    assert!((10.0..=120.0).contains(&stop), "SIGTERM drains within a bounded time: {stop}");
}

#[test]
fn state_config_user_and_credentials() {
    let unit = unit();
    assert_eq!(service(&unit, "StateDirectory"), "braid");
    assert_eq!(service(&unit, "ConfigurationDirectory"), "braid");
    // Rings and arenas go to $RUNTIME_DIRECTORY (a tmpfs), not to the state directory's flash.
    assert_eq!(service(&unit, "RuntimeDirectory"), "braid");
    assert!(!std::fs::read_to_string(CONFIG).unwrap().contains("scratch_dir"), "the shipped config overrides it");
    let dedicated = unit["Service"].get("DynamicUser").is_some_and(|v| v.last().is_some_and(|v| v == "yes"))
        || unit["Service"].get("User").is_some_and(|v| v.last().is_some_and(|u| u != "root" && !u.is_empty()));
    assert!(dedicated, "braid runs as a dedicated user (DynamicUser=yes or User=)");
    assert_eq!(service(&unit, "LimitMEMLOCK"), "infinity", "io_uring needs locked memory");

    // The config reads the credential where systemd puts it for this unit.
    let credential = service(&unit, "LoadCredential");
    let (name, source) = credential.split_once(':').unwrap();
    assert!(source.starts_with("/etc/braid/"), "{source}");
    let config = std::fs::read_to_string(CONFIG).unwrap();
    let wanted = format!("password_file = \"/run/credentials/braid.service/{name}\"");
    assert!(config.contains(&wanted), "configs/gateway.toml should say {wanted}");
    assert!(config.contains("state_dir = \"/var/lib/braid\""), "state_dir is the StateDirectory");
}

#[test]
fn hardening() {
    let unit = unit();
    for (key, value) in [
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallArchitectures", "native"),
        ("CapabilityBoundingSet", ""),
    ] {
        assert_eq!(service(&unit, key), value, "{key}=");
    }
    let filters = &unit["Service"]["SystemCallFilter"];
    assert!(filters.iter().any(|f| f == "@system-service"), "{filters:?}");
    // io_uring's syscalls are in @system-service (via @aio) on systemd 252; make sure no later
    // deny list takes them away again.
    for denied in filters.iter().filter(|f| f.starts_with('~')) {
        assert!(!denied.contains("@aio") && !denied.contains("io_uring"), "{denied}");
        assert!(!denied.contains("@resources"), "shards pin themselves with sched_setaffinity: {denied}");
    }
}

#[test]
fn the_installed_config_is_valid() {
    let out = Command::new(env!("CARGO_BIN_EXE_braid")).args(["validate", "--config", CONFIG]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `systemd-analyze verify` where it exists (with the binary path pointed at the one under test,
/// since it checks that ExecStart= is executable); skipped without systemd.
#[test]
fn systemd_analyze_accepts_the_unit() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        eprintln!("systemd-analyze not found; skipping");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(UNIT).unwrap().replace("/usr/local/bin/braid", env!("CARGO_BIN_EXE_braid"));
    let copy = dir.path().join("braid.service");
    std::fs::write(&copy, text).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&copy).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "systemd-analyze verify: {stderr}");
}

#[test]
fn notifications_reach_the_notify_socket_in_order() {
    let mut systemd = NotifyListener::bind();
    let notifier = Notifier::new(Some(systemd.path().as_os_str()), Some(Duration::from_millis(400)));
    assert_eq!(notifier.watchdog_period(), Some(Duration::from_millis(200)));
    notifier.ready("running");
    notifier.watchdog();
    notifier.reloading();
    notifier.ready("reloaded");
    notifier.stopping("draining");

    let wait = |systemd: &mut NotifyListener, what: &str| {
        systemd.wait_for(|m| m.lines().any(|l| l == what), Duration::from_secs(5))
    };
    assert_eq!(wait(&mut systemd, "READY=1").as_deref(), Some("READY=1\nSTATUS=running\n"));
    assert!(wait(&mut systemd, "RELOADING=1").is_some());
    assert_eq!(wait(&mut systemd, "READY=1").as_deref(), Some("READY=1\nSTATUS=reloaded\n"));
    assert!(wait(&mut systemd, "STOPPING=1").is_some());
    assert_eq!(systemd.wait_for(|m| m.contains("READY=1"), Duration::from_millis(100)), None, "nothing after STOPPING");
    assert_eq!(systemd.messages().len(), 5);
    assert_eq!(systemd.messages()[1], "WATCHDOG=1\n");
}
