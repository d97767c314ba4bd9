//! `braid run` as a child process for the service tests (`tests/it/service_mqtt.rs`): the gateway
//! configuration with an MQTT or embedded source, an MQTT sink and a file sink; a seeded device
//! workload published over MQTT and written as replay inputs; a publisher that reconnects and
//! republishes what was not acknowledged; `/metrics` and `/healthz` over plain HTTP; and
//! result sets deduplicated by `_id`.
//!
//! Every wait polls a condition until a deadline and fails the test with what it waited for.
#![allow(clippy::disallowed_methods)] // deadlines of the test itself and the workload's base time, not engine time

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};
use serde_json::{Value, json};

use super::rng::Rng;
use super::run::braid;

const POLL: Duration = Duration::from_millis(25);

/// Polls `done` every 25 ms until it holds; false after `timeout`.
pub fn poll_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// Wall-clock ms since the Unix epoch: the workload's base event time (braid checks event times
/// against its own clock: `max_skew`, `max_age`).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Where the devices' messages come from.
pub enum Source {
    /// An external broker (mosquitto) at this URL.
    Mqtt(String),
    /// braid's embedded broker listening on 127.0.0.1:PORT.
    Embedded(u16),
}

/// What varies between the tests' configurations of the gateway join.
pub struct Setup<'a> {
    pub source: Source,
    pub upstream_url: &'a str,
    /// The MQTT sink's topic template (`up/effect/{device}`).
    pub topic: &'a str,
    pub state_dir: &'a Path,
    /// The file sink's path.
    pub file: &'a Path,
    pub ops_port: u16,
    /// The streams' `max_payload` (None: the default).
    pub max_payload: Option<&'a str>,
    pub idle_timeout: &'a str,
}

/// The streams and the join of `configs/gateway.toml` (the default deployment), without its
/// deployment sections (`[runtime]`, `[ops]`, `[sources]`, `[sinks]`): tests add their own.
pub fn gateway_pipeline() -> toml::Table {
    let mut table: toml::Table = include_str!("../../../configs/gateway.toml").parse().expect("configs/gateway.toml");
    table.retain(|section, _| section == "streams" || section == "operators");
    table
}

/// Merges the TOML `text` into `table`, section by section.
pub fn with_sections(mut table: toml::Table, text: &str) -> String {
    table.extend(text.parse::<toml::Table>().expect("test config sections"));
    toml::to_string(&table).expect("a config table")
}

/// The gateway join (configs/gateway.toml): streams `status` and `command` on
/// `devices/+device/...`, interval join `effect` (left, −3 s..5 s), an MQTT sink `up` of `effect`
/// and a file sink `archive` of `effect`, `effect.late` and `dead_letter`.
pub fn gateway_config(s: &Setup<'_>) -> String {
    let mut pipeline = gateway_pipeline();
    let streams = pipeline["streams"].as_table_mut().expect("[streams]");
    for (_, stream) in streams.iter_mut() {
        let stream = stream.as_table_mut().expect("a stream table");
        stream.insert("idle_timeout".into(), s.idle_timeout.into());
        if let Some(max_payload) = s.max_payload {
            stream.insert("max_payload".into(), max_payload.into());
        }
    }
    let source = match &s.source {
        Source::Mqtt(url) => format!("kind = \"mqtt\"\nurl = \"{url}\"\nkeep_alive = \"5s\""),
        Source::Embedded(port) => format!("kind = \"embedded\"\nlisten = \"127.0.0.1:{port}\""),
    };
    let deployment = format!(
        "[runtime]\nshards = 2\nstate_dir = \"{state}\"\nidle_advance = true\n\n\
         [ops]\nlisten = \"127.0.0.1:{ops}\"\n\n\
         [sources.devices]\n{source}\n\n\
         [sinks.up]\nkind = \"mqtt\"\ninputs = [\"effect\"]\nurl = \"{up}\"\ntopic = \"{topic}\"\nqos = 1\n\n\
         [sinks.archive]\nkind = \"file\"\ninputs = [\"effect\", \"effect.late\", \"dead_letter\"]\npath = \"{file}\"\n",
        state = s.state_dir.display(),
        ops = s.ops_port,
        up = s.upstream_url,
        topic = s.topic,
        file = s.file.display(),
    );
    with_sections(pipeline, &deployment)
}

/// One device message: its stream, device (the topic's `+device`), event time and payload
/// (without `device`, which the topic carries).
#[derive(Clone, Debug)]
pub struct DeviceMsg {
    pub stream: &'static str,
    pub device: String,
    pub ts: i64,
    pub payload: Value,
}

impl DeviceMsg {
    pub fn topic(&self) -> String {
        format!("devices/{}/{}", self.device, self.stream)
    }

    /// The replay input line: the payload plus `device`.
    pub fn line(&self) -> String {
        let mut v = self.payload.clone();
        v["device"] = json!(self.device);
        v.to_string()
    }
}

/// Seeded commands and statuses of `devices` devices over `span_ms` of event time from `base`,
/// in ts order (ties broken by a 1 ms shift, so arrival order is ts order everywhere). Every
/// fourth device sends few statuses, so some commands end up `left_only`.
pub fn workload(seed: u64, devices: usize, base: i64, span_ms: i64) -> Vec<DeviceMsg> {
    let mut rng = Rng::new(seed);
    let mut msgs = Vec::new();
    for d in 0..devices {
        let device = format!("d{d:02}");
        let statuses = if d % 4 == 0 { rng.range(0, 2) } else { rng.range(8, 14) };
        for seq in 0..statuses {
            let ts = base + rng.range(0, span_ms);
            let state = rng.pick(&["on", "off", "idle"]);
            let temp = rng.range(150, 300) as f64 / 10.0;
            let payload = json!({"ts": ts, "temp": temp, "state": state, "seq": seq});
            msgs.push(DeviceMsg { stream: "status", device: device.clone(), ts, payload });
        }
        for n in 0..rng.range(3, 7) {
            let ts = base + rng.range(0, span_ms);
            let cmd = rng.pick(&["on", "off", "reboot"]);
            let payload = json!({"ts": ts, "cmd": cmd, "arg": "x", "cmd_id": format!("{device}-c{n}")});
            msgs.push(DeviceMsg { stream: "command", device: device.clone(), ts, payload });
        }
    }
    msgs.sort_by_key(|m| m.ts);
    let mut last = i64::MIN;
    for m in &mut msgs {
        m.ts = m.ts.max(last + 1);
        last = m.ts;
        m.payload["ts"] = json!(m.ts);
    }
    msgs
}

/// (topic, payload bytes) for MQTT publishing, in order.
pub fn mqtt_messages(msgs: &[DeviceMsg]) -> Vec<(String, Vec<u8>)> {
    msgs.iter().map(|m| (m.topic(), m.payload.to_string().into_bytes())).collect()
}

/// The replay input text of `stream`: one line per message of that stream, in order.
pub fn jsonl(msgs: &[DeviceMsg], stream: &str) -> String {
    msgs.iter().filter(|m| m.stream == stream).map(|m| m.line() + "\n").collect()
}

/// `braid run --config CONFIG` as a child process; SIGKILLed when dropped.
pub struct Braid {
    child: Option<Child>,
    log: PathBuf,
}

impl Braid {
    /// Starts it with stderr (its log) appended to `log`.
    pub fn start(config: &Path, log: &Path) -> Braid {
        Braid::start_with_env(config, log, &[])
    }

    /// [`Braid::start`] with these environment variables set (`NOTIFY_SOCKET`, `WATCHDOG_USEC`,
    /// `RUNTIME_DIRECTORY`: systemd's, otherwise removed).
    pub fn start_with_env(config: &Path, log: &Path, env: &[(&str, &std::ffi::OsStr)]) -> Braid {
        let err = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let mut cmd = braid();
        cmd.arg("run").arg("--config").arg(config);
        for systemd in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "RUNTIME_DIRECTORY"] {
            cmd.env_remove(systemd);
        }
        for (name, value) in env {
            cmd.env(name, value);
        }
        let child = cmd
            .env("BRAID_LOG", "info,rumqttd=off")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("starting braid run");
        Braid { child: Some(child), log: log.to_owned() }
    }

    /// Its process id (`/proc/PID/...`).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("braid runs").id()
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until its log holds `needle` `count` times (or more); fails the test after
    /// `timeout` or when braid exits.
    pub fn wait_log(&mut self, needle: &str, count: usize, timeout: Duration) {
        let ok = poll_until(timeout, || {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("braid exited with {status} while waiting for {needle:?}; log:\n{}", self.log());
            }
            self.log().matches(needle).count() >= count
        });
        assert!(ok, "braid's log has no {needle:?} (×{count}) within {timeout:?}; log:\n{}", self.log());
    }

    /// Sends `sig` (e.g. SIGHUP: reload) to the running braid.
    pub fn signal(&self, sig: libc::c_int) {
        signal(self.child.as_ref().expect("braid runs"), sig);
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(&child, libc::SIGKILL);
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for the exit (at most `timeout`); its exit status.
    pub fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("braid runs");
        signal(&child, libc::SIGTERM);
        let mut status = None;
        let exited = poll_until(timeout, || {
            status = child.try_wait().unwrap();
            status.is_some()
        });
        if !exited {
            signal(&child, libc::SIGKILL);
            let _ = child.wait();
            panic!("braid did not exit within {timeout:?} of SIGTERM; log:\n{}", self.log());
        }
        status.unwrap()
    }
}

impl Drop for Braid {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
    // SAFETY: kill(2) on our own child, not yet reaped, so the pid is still ours.
    unsafe { libc::kill(pid, sig) };
}

/// `GET path` on 127.0.0.1:`port` (`braid status`'s client): status code and body; None when
/// nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    braid::ops::status::fetch::get(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path).ok()
}

/// The value of the sample `name{labels}` in Prometheus text (labels as rendered, e.g.
/// `stream="command"`; "" for a sample without labels).
pub fn metric(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = if labels.is_empty() { format!("{name} ") } else { format!("{name}{{{labels}}} ") };
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok())
}

/// The complete lines of a JSON-lines file that may be being written (a last line without its
/// newline is left out), parsed.
pub fn read_complete_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |i| &text[..=i]);
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: not JSON ({e}): {l}", path.display())))
        .collect()
}

/// Rows by `_id`; a repeated `_id` must repeat the same row exactly (else the test fails).
pub fn by_id(rows: impl IntoIterator<Item = Value>, what: &str) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for row in rows {
        let id = row["_id"].as_str().unwrap_or_else(|| panic!("{what}: a row without _id: {row}")).to_owned();
        if let Some(before) = map.get(&id) {
            assert_eq!(before, &row, "{what}: two different rows with _id {id}");
        } else {
            map.insert(id, row);
        }
    }
    map
}

/// Fails the test, listing a few differences, unless `got` and `want` hold the same rows.
pub fn assert_same_rows(got: &BTreeMap<String, Value>, want: &BTreeMap<String, Value>, what: &str) {
    if got == want {
        return;
    }
    let missing: Vec<&Value> = want.iter().filter(|(id, _)| !got.contains_key(*id)).map(|(_, v)| v).collect();
    let extra: Vec<&Value> = got.iter().filter(|(id, _)| !want.contains_key(*id)).map(|(_, v)| v).collect();
    let differ: Vec<(&Value, &Value)> =
        want.iter().filter_map(|(id, w)| got.get(id).filter(|g| *g != w).map(|g| (g, w))).collect();
    panic!(
        "{what}: {} rows, {} expected; {} missing, {} extra, {} differ\nmissing (first 5): {:#?}\nextra (first 5): \
         {:#?}\ndiffer (got, want; first 5): {:#?}",
        got.len(),
        want.len(),
        missing.len(),
        extra.len(),
        differ.len(),
        &missing[..missing.len().min(5)],
        &extra[..extra.len().min(5)],
        &differ[..differ.len().min(5)],
    );
}

/// Publishes `msgs` in order at QoS 1, `chunk` at a time with `pause` between chunks, until the
/// broker acknowledged every one. A broken connection (a broker restart) is reconnected and every
/// message not yet acknowledged is published again, in order (the broker may then hold some
/// twice). `acked` counts the messages acknowledged so far (the test watches it). Fails the test
/// after `timeout`.
pub fn publish_reconnecting(
    port: u16,
    msgs: &[(String, Vec<u8>)],
    chunk: usize,
    pause: Duration,
    acked: &AtomicUsize,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    let mut done = vec![false; msgs.len()];
    let mut attempt = 0;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    while done.iter().any(|d| !d) {
        assert!(
            Instant::now() < deadline,
            "publish_reconnecting: {} of {} acked",
            acked.load(Ordering::Relaxed),
            msgs.len()
        );
        attempt += 1;
        let id = format!("braid-svc-pub-{}-{attempt}", std::process::id());
        let mut opts = MqttOptions::new(id, "127.0.0.1", port);
        opts.set_clean_session(true).set_keep_alive(Duration::from_secs(5));
        let pending: Vec<usize> = (0..msgs.len()).filter(|&i| !done[i]).collect();
        let broke = rt.block_on(async {
            let (client, mut el) = AsyncClient::new(opts, pending.len().max(1));
            // The i-th outgoing publish of this connection is pending[i]; its pkid maps back.
            let mut sent = 0;
            let mut queued = 0;
            let mut pkid_to = std::collections::HashMap::new();
            let mut next_chunk = tokio::time::Instant::now();
            loop {
                if queued < pending.len() && tokio::time::Instant::now() >= next_chunk {
                    for &i in pending.iter().skip(queued).take(chunk) {
                        let (topic, payload) = &msgs[i];
                        client.try_publish(topic.as_str(), QoS::AtLeastOnce, false, payload.clone()).unwrap();
                        queued += 1;
                    }
                    next_chunk = tokio::time::Instant::now() + pause;
                }
                if pending.iter().all(|&i| done[i]) {
                    return false;
                }
                let wait = next_chunk.max(tokio::time::Instant::now() + Duration::from_millis(1));
                let event = tokio::select! {
                    ev = el.poll() => ev,
                    _ = tokio::time::sleep_until(wait), if queued < pending.len() => continue,
                };
                match event {
                    Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                        pkid_to.insert(pkid, pending[sent]);
                        sent += 1;
                    }
                    Ok(Event::Incoming(Packet::PubAck(ack))) => {
                        if let Some(i) = pkid_to.remove(&ack.pkid)
                            && !done[i]
                        {
                            done[i] = true;
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return true,
                }
            }
        });
        if broke {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// [`publish_reconnecting`] on its own thread; joined by the caller.
pub fn spawn_publisher(
    port: u16,
    msgs: Vec<(String, Vec<u8>)>,
    chunk: usize,
    pause: Duration,
    acked: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || publish_reconnecting(port, &msgs, chunk, pause, &acked, Duration::from_secs(30)))
}
