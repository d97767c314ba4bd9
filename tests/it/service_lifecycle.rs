//! The service's lifecycle under systemd (`braid run`, `Type=notify`), end to end: the real braid
//! binary as a child with `NOTIFY_SOCKET` pointing at a [`NotifyListener`] (and `WATCHDOG_USEC`
//! where the watchdog is tested), real signals (`kill(2)`), a private mosquitto per test, and a
//! file sink whose lines the test reads back.
//!
//! - readiness: `READY=1` only once the source is subscribed (not while its broker is down), so a
//!   message published right after READY is not lost; then periodic `STATUS=` lines;
//! - the watchdog: `WATCHDOG=1` every half `WATCHDOG_USEC`, none without it;
//! - SIGTERM while messages flow: `STOPPING=1`, exit 0 within a bound, no partial last line;
//! - SIGHUP: a changed valid config is applied (RELOADING=1, then one READY=1, results go to the
//!   new path); an invalid one is refused with the reason on stderr and the old one keeps
//!   running; an unchanged one restarts nothing;
//! - `/healthz` and `/metrics` follow the source's broker going away;
//! - a second `braid run` on a locked state directory refuses to start;
//! - `braid demo` runs for `--duration`, prints its summary and writes joined results, also when
//!   its `--listen` port is taken.
//!
//! (`braid validate` exiting 78 on an invalid config is tested in `config_errors.rs`.)
//!
//! Every wait is bounded and polls a condition; children are killed when a test fails.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rumqttc::QoS;
use serde_json::Value;

use common::mqtt::{Mosquitto, free_port, publish_all};
use common::notify::NotifyListener;
use common::run::braid;

/// How long braid may take to say READY=1 once its broker is up (the source reconnects with a
/// backoff that has grown while the broker was down).
const READY_WAIT: Duration = Duration::from_secs(10);
/// How long a result may take from publish to the file sink.
const RESULT_WAIT: Duration = Duration::from_secs(8);
/// The bound on a clean stop after SIGTERM.
const STOP_WAIT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(20);

fn is_ready(m: &str) -> bool {
    m.lines().any(|l| l == "READY=1")
}

fn is_reloading(m: &str) -> bool {
    m.lines().any(|l| l == "RELOADING=1")
}

fn is_stopping(m: &str) -> bool {
    m.lines().any(|l| l == "STOPPING=1")
}

/// The test's own waits, not engine time.
#[allow(clippy::disallowed_methods)]
fn clock() -> Instant {
    Instant::now()
}

/// Wall-clock ms, for event times braid accepts (within its max_age and max_skew of now).
#[allow(clippy::disallowed_methods)]
fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Polls `f` until it returns `Some`, for at most `timeout`.
fn poll_until<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = clock() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if clock() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// One test's gateway: a state directory, a config file and the file sink's paths.
struct Gateway {
    dir: tempfile::TempDir,
    broker_port: u16,
    ops_port: u16,
}

impl Gateway {
    fn new(broker_port: u16) -> Gateway {
        let dir = tempfile::Builder::new().prefix("braid-lifecycle-").tempdir().unwrap();
        let gateway = Gateway { dir, broker_port, ops_port: free_port() };
        gateway.write_config(&gateway.results("a"), "");
        gateway
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("braid.toml")
    }

    /// The file sink's path for `name`.
    fn results(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("effect-{name}.jsonl"))
    }

    /// The gateway join of configs/gateway.toml on this test's broker, results to `results`;
    /// `extra_operator_key` (TOML) joins the operator's keys.
    fn config_text(&self, results: &Path, extra_operator_key: &str) -> String {
        let mut pipeline = common::service::gateway_pipeline();
        let extra: toml::Table = extra_operator_key.parse().unwrap();
        pipeline["operators"]["effect"].as_table_mut().unwrap().extend(extra);
        let deployment = format!(
            r#"[runtime]
shards = 1
state_dir = "{state}"

[ops]
listen = "127.0.0.1:{ops}"

[sources.devices]
kind = "mqtt"
url = "mqtt://127.0.0.1:{broker}"

[sinks.archive]
kind = "file"
inputs = ["effect"]
path = "{results}"
"#,
            state = self.dir.path().join("state").display(),
            ops = self.ops_port,
            broker = self.broker_port,
            results = results.display(),
        );
        common::service::with_sections(pipeline, &deployment)
    }

    /// (Re)writes the config file: results to `results`, plus an extra line in the operator.
    fn write_config(&self, results: &Path, extra_operator_key: &str) {
        std::fs::write(self.config(), self.config_text(results, extra_operator_key)).unwrap();
    }

    /// `braid run --config` with `NOTIFY_SOCKET` (and `WATCHDOG_USEC` when given).
    fn run(&self, systemd: Option<&NotifyListener>, watchdog_usec: Option<&str>) -> Service {
        let name = format!("stderr-{}.log", free_port());
        let stderr_path = self.dir.path().join(name);
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut cmd = braid();
        cmd.arg("run")
            .arg("--config")
            .arg(self.config())
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env_remove("BRAID_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if let Some(systemd) = systemd {
            cmd.env("NOTIFY_SOCKET", systemd.path());
        }
        if let Some(usec) = watchdog_usec {
            cmd.env("WATCHDOG_USEC", usec);
        }
        let child = cmd.spawn().unwrap();
        Service { child: Some(child), stderr: stderr_path }
    }

    /// `GET path` on the ops endpoint: (status code, body); `None` when it does not answer.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.ops_port, path)
    }
}

/// A `braid run` child: killed (SIGKILL) when dropped while still running.
struct Service {
    child: Option<Child>,
    stderr: PathBuf,
}

impl Service {
    fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().expect("the service runs");
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: kill(2) on our own child, which has not been waited for: the pid is still ours.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "kill({pid}, {signal}): {}", std::io::Error::last_os_error());
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Whether it still runs.
    fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Waits for the exit, at most `timeout`; `None` if it still runs.
    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        poll_until(timeout, || child.try_wait().unwrap())
    }

    /// SIGTERM, then the exit within [`STOP_WAIT`]: its status (the test fails otherwise).
    fn terminate(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        let status = self.wait_exit(STOP_WAIT);
        status
            .unwrap_or_else(|| panic!("braid did not stop within {STOP_WAIT:?} of SIGTERM; stderr:\n{}", self.stderr()))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A minimal HTTP/1.1 GET (`Connection: close`): (status code, body).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// For each of `cmd_ids`: a command of device `dev-<cmd_id>` and, 100 ms of event time later, a
/// status of the same device — an inner interval-join match as soon as both arrived.
fn pairs(cmd_ids: &[String]) -> Vec<(String, Vec<u8>)> {
    let ts = wall_ms();
    let mut msgs = Vec::new();
    for (seq, id) in cmd_ids.iter().enumerate() {
        let device = format!("dev-{id}");
        let command = serde_json::json!({"device": device, "ts": ts, "cmd": "open", "arg": "1", "cmd_id": id});
        let status =
            serde_json::json!({"device": device, "ts": ts + 100, "temp": 20.5, "state": "open", "seq": seq as i64});
        msgs.push((format!("devices/{device}/command"), command.to_string().into_bytes()));
        msgs.push((format!("devices/{device}/status"), status.to_string().into_bytes()));
    }
    msgs
}

/// Publishes 5 command/status pairs tagged `tag` and waits until their results are in
/// `results`; false when they are not there within [`RESULT_WAIT`].
fn joined(broker: &Mosquitto, results: &Path, tag: &str) -> bool {
    let wanted = ids(tag, 5);
    publish_all(broker.port(), &pairs(&wanted), QoS::AtLeastOnce);
    wait_results(results, &wanted, RESULT_WAIT)
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// The complete lines of a JSON-lines file, parsed (a partial last line is left out).
fn complete_rows(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{} holds a line that is no JSON ({e}): {l}", path.display()))
        })
        .collect()
}

/// The `cmd_id`s of the results in `path`.
fn result_ids(path: &Path) -> Vec<String> {
    complete_rows(path).iter().filter_map(|r| r["cmd_id"].as_str().map(str::to_owned)).collect()
}

/// Waits until every one of `wanted` has a result in `path`; false after `timeout`.
fn wait_results(path: &Path, wanted: &[String], timeout: Duration) -> bool {
    poll_until(timeout, || {
        let have = result_ids(path);
        wanted.iter().all(|w| have.contains(w)).then_some(())
    })
    .is_some()
}

/// A started service: READY=1 within [`READY_WAIT`] (the test fails otherwise).
fn wait_ready(systemd: &mut NotifyListener, service: &Service) -> String {
    systemd
        .wait_for(is_ready, READY_WAIT)
        .unwrap_or_else(|| panic!("no READY=1 within {READY_WAIT:?}; stderr:\n{}", service.stderr()))
}

#[test]
fn ready_only_once_the_source_is_subscribed_then_status_lines() {
    // The broker's port is known but nothing listens there yet.
    let mut broker = Mosquitto::start();
    broker.stop();
    let gateway = Gateway::new(broker.port());
    let mut systemd = NotifyListener::bind();
    let mut service = gateway.run(Some(&systemd), None);

    let early = systemd.wait_for(is_ready, Duration::from_millis(1500));
    assert_eq!(early, None, "READY=1 while the source's broker is down; stderr:\n{}", service.stderr());
    assert!(service.running(), "braid exited while its broker was down; stderr:\n{}", service.stderr());

    broker.restart();
    let ready = wait_ready(&mut systemd, &service);
    assert!(ready.contains("STATUS="), "READY=1 comes with a status: {ready:?}");
    // Subscribed at READY: a message published right now (no session kept it before) is joined.
    let first = ids("first", 3);
    publish_all(broker.port(), &pairs(&first), QoS::AtLeastOnce);
    let results = gateway.results("a");
    assert!(
        wait_results(&results, &first, RESULT_WAIT),
        "messages published right after READY=1 were not joined: {:?}; stderr:\n{}",
        result_ids(&results),
        service.stderr()
    );

    // STATUS= lines every 5 s, with the rates.
    let status = systemd.wait_for(|m| m.starts_with("STATUS=") && !is_ready(m), Duration::from_secs(8));
    let status = status.unwrap_or_else(|| panic!("no STATUS= line within 8 s: {:?}", systemd.messages()));
    assert!(status.contains("/s") && status.contains("results"), "{status:?}");

    let exit = service.terminate();
    assert!(exit.success(), "exit {exit} after SIGTERM; stderr:\n{}", service.stderr());
    assert!(systemd.messages().iter().all(|m| !m.contains("WATCHDOG=1")), "watchdog pings without WATCHDOG_USEC");
}

#[test]
fn watchdog_pings_every_half_period() {
    let broker = Mosquitto::start();
    let gateway = Gateway::new(broker.port());
    let mut systemd = NotifyListener::bind();
    let mut service = gateway.run(Some(&systemd), Some("1000000"));
    wait_ready(&mut systemd, &service);

    let mut times = Vec::new();
    for _ in 0..5 {
        let ping = systemd.wait_for(|m| m == "WATCHDOG=1\n", Duration::from_secs(2));
        assert!(ping.is_some(), "no WATCHDOG=1 within 2 s (WATCHDOG_USEC=1000000); stderr:\n{}", service.stderr());
        times.push(clock());
    }
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // Half of 1 s, checked every 100 ms: about 500–600 ms; never as long as the period itself
    // (systemd would kill braid), never a flood.
    for gap in &gaps {
        assert!(
            (Duration::from_millis(350)..Duration::from_millis(1000)).contains(gap),
            "watchdog gaps {gaps:?}: want about 500 ms"
        );
    }
    let exit = service.terminate();
    assert!(exit.success(), "exit {exit} after SIGTERM; stderr:\n{}", service.stderr());
}

#[test]
fn sigterm_while_messages_flow_stops_cleanly_and_loses_nothing() {
    let broker = Mosquitto::start();
    let gateway = Gateway::new(broker.port());
    let mut systemd = NotifyListener::bind();
    let mut service = gateway.run(Some(&systemd), None);
    wait_ready(&mut systemd, &service);

    // Batches of 100 pairs, back to back, each returning once mosquitto acknowledged it.
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = std::thread::spawn({
        let (stop, port) = (Arc::clone(&stop), broker.port());
        move || {
            let mut published = Vec::new();
            for batch in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let batch = ids(&format!("flow{batch}"), 100);
                publish_all(port, &pairs(&batch), QoS::AtLeastOnce);
                published.extend(batch);
            }
            published
        }
    });
    let results = gateway.results("a");
    let flowing = poll_until(RESULT_WAIT, || (complete_rows(&results).len() >= 300).then_some(()));
    assert!(flowing.is_some(), "fewer than 300 results within {RESULT_WAIT:?}; stderr:\n{}", service.stderr());

    let started = clock();
    let exit = service.terminate();
    let took = clock() - started;
    stop.store(true, Ordering::Relaxed);
    let published = publisher.join().unwrap();
    assert!(exit.success(), "exit {exit} after SIGTERM while messages flow; stderr:\n{}", service.stderr());
    assert!(systemd.wait_for(is_stopping, Duration::from_secs(1)).is_some(), "no STOPPING=1: {:?}", systemd.messages());
    let text = std::fs::read_to_string(&results).unwrap();
    assert!(
        text.ends_with('\n'),
        "the file sink's last line is partial: {:?}",
        &text[text.len().saturating_sub(200)..]
    );
    let rows = complete_rows(&results);
    assert!(rows.iter().all(|r| r["_kind"] == "match" && r["cmd_id"].is_string()), "unexpected rows");
    let joined = result_ids(&results);
    let missing = published.iter().filter(|id| !joined.contains(id)).count();

    // What braid did not acknowledge stayed with mosquitto: the next run joins every pair.
    let mut systemd = NotifyListener::bind();
    let mut service = gateway.run(Some(&systemd), None);
    wait_ready(&mut systemd, &service);
    assert!(
        wait_results(&results, &published, RESULT_WAIT),
        "after a restart, {} of {} published pairs are still not joined; stderr:\n{}",
        published.iter().filter(|id| !result_ids(&results).contains(id)).count(),
        published.len(),
        service.stderr()
    );
    let exit = service.terminate();
    assert!(exit.success(), "exit {exit} after SIGTERM; stderr:\n{}", service.stderr());
    eprintln!(
        "stopped in {took:?} after {} results; {} pairs published, {missing} joined only after the restart",
        rows.len(),
        published.len()
    );
}

#[test]
fn sighup_with_a_changed_config_applies_it() {
    let broker = Mosquitto::start();
    let gateway = Gateway::new(broker.port());
    let mut systemd = NotifyListener::bind();
    let mut service = gateway.run(Some(&systemd), None);
    wait_ready(&mut systemd, &service);
    let (old, new) = (gateway.results("a"), gateway.results("b"));
    assert!(joined(&broker, &old, "before"), "no results before the reload: {}", service.stderr());

    gateway.write_config(&new, "");
    service.signal(libc::SIGHUP);
    assert!(
        systemd.wait_for(is_reloading, Duration::from_secs(5)).is_some(),
        "no RELOADING=1 after SIGHUP: {:?}",
        systemd.messages()
    );
    wait_ready(&mut systemd, &service);
    // READY=1 after RELOADING=1 says the reload is done: it comes once, from the new generation.
    let again = systemd.wait_for(is_ready, Duration::from_millis(1500));
    assert_eq!(
        again,
        None,
        "a second READY=1 after one SIGHUP (the first came before the new config applied): {:?}; stderr:\n{}",
        systemd.messages(),
        service.stderr()
    );
    let stderr = service.stderr();
    assert!(stderr.contains("restarting with the new plan"), "{stderr}");

    assert!(
        joined(&broker, &new, "after"),
        "results after the reload are not in the new path: {:?}; stderr:\n{}",
        result_ids(&new),
        service.stderr()
    );
    let in_old = result_ids(&old);
    let after = ids("after", 5);
    assert!(after.iter().all(|id| !in_old.contains(id)), "results after the reload went to the old path too");

    let exit = service.terminate();
    assert!(exit.success(), "exit {exit} after SIGTERM; stderr:\n{}", service.stderr());
}

#[test]
fn sighup_with_an_invalid_or_unchanged_config_keeps_the_running_one() {
    let broker = Mosquitto::start();
    let gateway = Gateway::new(broker.port());
    let mut systemd = NotifyListener::bind();
    let mut service = gateway.run(Some(&systemd), None);
    wait_ready(&mut systemd, &service);
    let results = gateway.results("a");
    assert!(joined(&broker, &results, "before"), "no results: {}", service.stderr());
    let original = std::fs::read_to_string(gateway.config()).unwrap();

    // Invalid: an unknown key (and a new path, which must not be used).
    gateway.write_config(&gateway.results("never"), "no_such_key = 1");
    service.signal(libc::SIGHUP);
    assert!(systemd.wait_for(is_reloading, Duration::from_secs(5)).is_some(), "no RELOADING=1");
    let ready = wait_ready(&mut systemd, &service);
    assert!(ready.contains("invalid"), "READY=1 after a refused reload says why: {ready:?}");
    let stderr = service.stderr();
    assert!(stderr.contains("no_such_key") && stderr.contains("keeping the running one"), "{stderr}");
    assert!(
        joined(&broker, &results, "invalid"),
        "results stopped after an invalid reload; stderr:\n{}",
        service.stderr()
    );
    assert!(!gateway.results("never").exists(), "the invalid config's sink was opened");

    // Unchanged: the running text again. Nothing restarts: no journal replay, no duplicate rows.
    std::fs::write(gateway.config(), original).unwrap();
    let lines = complete_rows(&results).len();
    service.signal(libc::SIGHUP);
    assert!(systemd.wait_for(is_reloading, Duration::from_secs(5)).is_some(), "no RELOADING=1");
    let ready = wait_ready(&mut systemd, &service);
    assert!(ready.contains("unchanged"), "{ready:?}");
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(complete_rows(&results).len(), lines, "an unchanged config re-emitted results (restarted)");
    let stderr = service.stderr();
    assert!(!stderr.contains("restarting with the new plan"), "{stderr}");
    assert!(joined(&broker, &results, "unchanged"), "no results after SIGHUP: {}", service.stderr());

    let exit = service.terminate();
    assert!(exit.success(), "exit {exit} after SIGTERM (after a refused reload); stderr:\n{}", service.stderr());
}

/// A configuration that validates but cannot start (its file sink's folder is a regular file):
/// the service goes back to the running configuration instead of exiting.
#[test]
fn sighup_with_a_config_that_cannot_start_goes_back_to_the_running_one() {
    let broker = Mosquitto::start();
    let gateway = Gateway::new(broker.port());
    let mut systemd = NotifyListener::bind();
    let mut service = gateway.run(Some(&systemd), None);
    wait_ready(&mut systemd, &service);
    let results = gateway.results("a");
    assert!(joined(&broker, &results, "before"), "no results: {}", service.stderr());

    let blocker = gateway.results("blocker");
    std::fs::write(&blocker, "a file, not a folder").unwrap();
    gateway.write_config(&blocker.join("x.jsonl"), "");
    service.signal(libc::SIGHUP);
    assert!(systemd.wait_for(is_reloading, Duration::from_secs(5)).is_some(), "no RELOADING=1");
    wait_ready(&mut systemd, &service);
    let stderr = poll_until(Duration::from_secs(5), || {
        Some(service.stderr()).filter(|e| e.contains("going back to the running one"))
    });
    assert!(stderr.is_some(), "no fallback logged: {}", service.stderr());
    assert!(
        joined(&broker, &results, "after"),
        "results stopped after a reload that could not start; stderr:\n{}",
        service.stderr()
    );
    let exit = service.terminate();
    assert!(exit.success(), "exit {exit} after SIGTERM; stderr:\n{}", service.stderr());
}

#[test]
fn healthz_and_metrics_follow_the_source_broker() {
    let mut broker = Mosquitto::start();
    let gateway = Gateway::new(broker.port());
    let mut systemd = NotifyListener::bind();
    let mut service = gateway.run(Some(&systemd), None);
    wait_ready(&mut systemd, &service);

    let healthy = poll_until(Duration::from_secs(3), || gateway.get("/healthz").filter(|(code, _)| *code == 200));
    let (_, body) = healthy.unwrap_or_else(|| panic!("/healthz: {:?}", gateway.get("/healthz")));
    assert_eq!(body.trim(), "ok");
    let (code, metrics) = gateway.get("/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(metrics.contains("braid_source_connected{source=\"devices\"} 1"), "{metrics}");
    assert!(metrics.contains("braid_shard_ring_used_bytes{shard=\"0\"} "), "CONTRACT.md metric missing: {metrics}");
    // Every result the shards sent is counted in the histogram of how long they held it (the
    // shards' figures reach /metrics once per tick).
    assert!(joined(&broker, &gateway.results("a"), "held"), "no results; stderr:\n{}", service.stderr());
    let counted = |text: &str, line: &str| common::service::metric(text, line, "").unwrap_or(0.0);
    let held = poll_until(Duration::from_secs(5), || {
        let (_, text) = gateway.get("/metrics")?;
        (counted(&text, "braid_shard_result_latency_seconds_count") >= 5.0).then_some(text)
    });
    let text = held.unwrap_or_else(|| panic!("results not counted: {:?}", gateway.get("/metrics")));
    assert!(counted(&text, "braid_shard_result_latency_seconds_sum") > 0.0, "{text}");
    // The CPU time of a sample of the same stretches (one in 16), and the results made as time
    // advanced, apart.
    for held in [
        "braid_shard_result_latency_seconds",
        "braid_shard_result_cpu_seconds",
        "braid_shard_time_result_latency_seconds",
    ] {
        let all = counted(&text, &format!("{held}_count"));
        assert_eq!(counted(&text, &format!("{held}_bucket{{le=\"+Inf\"}}")), all, "{text}");
    }

    broker.kill();
    let degraded = poll_until(Duration::from_secs(10), || gateway.get("/healthz").filter(|(code, _)| *code == 503));
    let (_, reasons) =
        degraded.unwrap_or_else(|| panic!("no 503 after the broker died: {:?}", gateway.get("/healthz")));
    assert!(reasons.contains("source devices: not connected"), "{reasons:?}");
    let (_, metrics) = gateway.get("/metrics").unwrap();
    assert!(metrics.contains("braid_source_connected{source=\"devices\"} 0"), "{metrics}");

    let exit = service.terminate();
    assert!(exit.success(), "exit {exit} after SIGTERM with the broker down; stderr:\n{}", service.stderr());
}

#[test]
fn a_second_service_on_the_same_state_dir_refuses_to_start() {
    let broker = Mosquitto::start();
    let gateway = Gateway::new(broker.port());
    let mut systemd = NotifyListener::bind();
    let mut first = gateway.run(Some(&systemd), None);
    wait_ready(&mut systemd, &first);

    let mut second = gateway.run(None, None);
    let exit = second.wait_exit(Duration::from_secs(10));
    let exit = exit.unwrap_or_else(|| panic!("the second braid runs on a locked state dir: {}", second.stderr()));
    assert!(!exit.success(), "the second braid exited {exit}");
    let stderr = second.stderr();
    assert!(stderr.contains("in use by another braid"), "no clear message: {stderr}");

    assert!(first.running(), "the first braid stopped: {}", first.stderr());
    let still = ids("still", 3);
    publish_all(broker.port(), &pairs(&still), QoS::AtLeastOnce);
    assert!(wait_results(&gateway.results("a"), &still, RESULT_WAIT), "the first braid stopped joining");
    let exit = first.terminate();
    assert!(exit.success(), "exit {exit} after SIGTERM; stderr:\n{}", first.stderr());
}

/// `braid demo` with `args`, its state in `state_dir`: exit status and stderr (at most 30 s).
fn demo(state_dir: &Path, args: &[&str]) -> (ExitStatus, String) {
    let mut cmd = braid();
    cmd.arg("demo").args(args).arg("--state-dir").arg(state_dir).env_remove("BRAID_LOG");
    common::run::run_with_timeout(&mut cmd, Duration::from_secs(30)).unwrap()
}

#[test]
fn demo_runs_for_its_duration_and_writes_joined_results() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    // Many devices, few messages: a command often finds no status of its device in its 8 s span.
    let args = ["--duration", "8s", "--listen", &listen, "--devices", "2000", "--rate", "300"];
    let (status, stderr) = demo(dir.path(), &args);
    assert!(status.success(), "braid demo exited {status}; stderr:\n{stderr}");
    assert!(stderr.contains(&listen), "{stderr}");
    assert!(stderr.contains("results") && stderr.contains("/s"), "no summary with rates: {stderr}");
    let rows = complete_rows(&dir.path().join("effect.jsonl"));
    let kinds = |kind: &str| rows.iter().filter(|r| r["_kind"] == kind).count();
    assert!(kinds("match") > 0, "no matches in effect.jsonl ({} rows); stderr:\n{stderr}", rows.len());
    // A command without a status change is reported once its 5 s span passed.
    assert!(kinds("left_only") > 0, "no left_only in 8 s ({} rows); stderr:\n{stderr}", rows.len());
}

#[test]
fn demo_on_a_taken_port_uses_another() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let args = ["--duration", "3s", "--listen", &listen, "--devices", "20", "--rate", "200"];
    let (status, stderr) = demo(dir.path(), &args);
    assert!(status.success(), "braid demo exited {status}; stderr:\n{stderr}");
    assert!(stderr.contains(&format!("{listen} is taken")), "{stderr}");
    let rows = complete_rows(&dir.path().join("effect.jsonl"));
    assert!(!rows.is_empty(), "no results; stderr:\n{stderr}");
    drop(taken);
}
