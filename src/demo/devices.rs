//! Simulated devices over real MQTT, for `braid demo`, integration tests and load generation.
//!
//! Devices `pump-00` … publish JSON in the schema of configs/gateway.toml:
//! - `devices/{id}/status`: `{"device","ts","temp","state","seq"}` (`seq` counts per device),
//! - `devices/{id}/command`: `{"device","ts","cmd","arg","cmd_id"}` (`cmd_id` unique per run).
//!
//! `ts` is the wall clock in ms when the message is made, so an event-time join sees live data.
//! [`COMMAND_SHARE`] of the messages are commands; [`FOLLOW_SHARE`] of the commands are followed,
//! after [`FOLLOW_DELAY_MS`], by a status change of the same device (the state the command
//! asked for): the gateway's `effect` join (lower -3 s, upper 5 s) then finds matches and,
//! for the rest, `left_only` rows. The other statuses are periodic reports with a drifting temp.
//!
//! Pacing is a token bucket refilled every [`TICK`] at `rate` messages per second (bursts of at
//! most [`TICK`]'s worth: devices publish about evenly, not in bursts that would queue behind one
//! another on the simulator's one connection). Memory is bounded: at most [`WINDOW`] publishes
//! are in flight (written or waiting for their PUBACK), and at most [`MAX_FOLLOW_UPS`] follow-ups
//! wait.
//!
//! No silent loss: a message counts as sent when its PUBACK arrives (QoS 1) or when it was
//! written to the socket (QoS 0). The simulator uses a clean session, so when the connection
//! drops, rumqttc forgets every un-acked publish (research §1.4): those are counted in
//! [`SimStats::errors`], and nothing is published until the next ConnAck.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS};

/// Share of messages that are commands (the rest are statuses).
pub const COMMAND_SHARE: f64 = 0.2;
/// Share of commands followed by a status change of the same device.
pub const FOLLOW_SHARE: f64 = 0.8;
/// A follow-up status comes this long after its command (uniform in the range).
pub const FOLLOW_DELAY_MS: (u64, u64) = (200, 3_000);
/// Publishes in flight at most (also rumqttc's outgoing window).
pub const WINDOW: u16 = 100;
/// Follow-up statuses waiting at most (a command finding this full gets none).
pub const MAX_FOLLOW_UPS: usize = 4_096;
/// How often the token bucket is refilled. At 10 ms, 5 000 msg/s left in bursts of 50 stamped in
/// the same ms, and the last of a burst reached the broker 1–2 ms after its `ts`
/// (BENCHMARKS.md, "Latency timed to the µs").
pub const TICK: Duration = Duration::from_millis(1);
/// How long the simulator waits for the last PUBACKs after `limit` or `stop`.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// What to simulate and where to publish it.
#[derive(Clone, Debug)]
pub struct DeviceSim {
    pub url_host: String,
    pub port: u16,
    /// Number of devices, at least 1.
    pub devices: usize,
    /// Messages per second over all devices; > 0.
    pub rate: f64,
    pub seed: u64,
    pub qos: QoS,
    /// Stop after this many messages.
    pub limit: Option<u64>,
    /// When set, each message's making time is noted there ([`MadeAt`]).
    pub made_at: Option<Arc<MadeAt>>,
}

/// When each message was made, µs since the Unix epoch (its `ts` is the same time in ms), by
/// [`MadeAt::status_key`] or [`MadeAt::command_key`]: for benches that time publish → receipt
/// to the µs, which a `ts` truncated to the ms cannot (it adds 0–1 ms).
#[derive(Debug, Default)]
pub struct MadeAt(std::sync::Mutex<std::collections::HashMap<String, i64>>);

impl MadeAt {
    pub fn status_key(device: &str, seq: u64) -> String {
        format!("{device}#{seq}")
    }

    pub fn command_key(cmd_id: &str) -> String {
        cmd_id.to_owned()
    }

    /// The making time noted under `key`, µs.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(key).copied()
    }

    fn note(&self, key: String, made_us: i64) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, made_us);
    }
}

/// Counters of a running simulator, readable while it runs.
#[derive(Debug, Default)]
pub struct SimStats {
    /// Statuses delivered (PUBACKed for QoS 1, written for QoS 0).
    pub status_sent: AtomicU64,
    /// Commands delivered.
    pub command_sent: AtomicU64,
    /// Messages lost: in flight when the connection dropped, or not acked by the end.
    pub errors: AtomicU64,
    /// Connection errors (each followed by a reconnect after a backoff).
    pub disconnects: AtomicU64,
}

impl SimStats {
    /// Statuses and commands delivered.
    pub fn sent(&self) -> u64 {
        self.status_sent.load(Ordering::Relaxed) + self.command_sent.load(Ordering::Relaxed)
    }
}

/// Starts the simulator on its own thread (own current-thread tokio runtime). It stops when
/// `stop` is set or `limit` messages were made, after waiting at most [`DRAIN_TIMEOUT`] for
/// their PUBACKs; the thread returns the same stats as the second element.
pub fn spawn(
    sim: DeviceSim,
    stop: Arc<AtomicBool>,
) -> std::io::Result<(std::thread::JoinHandle<Arc<SimStats>>, Arc<SimStats>)> {
    if sim.devices == 0 || !(sim.rate > 0.0 && sim.rate.is_finite()) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "simulator: devices and rate must be > 0"));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let stats = Arc::new(SimStats::default());
    let thread_stats = stats.clone();
    let handle = std::thread::Builder::new().name("braid-devices".into()).spawn(move || {
        rt.block_on(Publisher::new(sim, stop, thread_stats.clone()).run());
        thread_stats
    })?;
    Ok((handle, stats))
}

/// The simulator's wall clock in µs since the epoch: device timestamps are live (the one place
/// the demo reads it).
#[allow(clippy::disallowed_methods)]
fn wall_clock_us() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Status,
    Command,
}

/// A publish between `try_publish` and its delivery.
struct InFlight {
    kind: Kind,
    /// Set when rumqttc writes it (QoS 1 only; QoS 0 entries leave then).
    pkid: Option<u16>,
}

struct Publisher {
    sim: DeviceSim,
    stop: Arc<AtomicBool>,
    stats: Arc<SimStats>,
    fleet: Fleet,
    inflight: VecDeque<InFlight>,
    tokens: f64,
    made: u64,
    connected: bool,
}

impl Publisher {
    fn new(sim: DeviceSim, stop: Arc<AtomicBool>, stats: Arc<SimStats>) -> Publisher {
        let fleet = Fleet::new(sim.devices, sim.seed);
        Publisher { sim, stop, stats, fleet, inflight: VecDeque::new(), tokens: 0.0, made: 0, connected: false }
    }

    fn done_making(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.sim.limit.is_some_and(|l| self.made >= l)
    }

    async fn run(mut self) {
        let mut opts = MqttOptions::new(format!("braid-sim-{}", self.sim.seed), &self.sim.url_host, self.sim.port);
        opts.set_clean_session(true).set_inflight(WINDOW).set_keep_alive(Duration::from_secs(10));
        let (client, mut el) = AsyncClient::new(opts, usize::from(WINDOW) + 1);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = tokio::time::Instant::now();
        let mut backoff = BACKOFF_MIN;
        while !self.done_making() {
            tokio::select! {
                ev = el.poll() => backoff = self.on_event(ev, backoff).await,
                // Not while connecting: dropping poll() mid-connect would restart the connect.
                now = tick.tick(), if self.connected => {
                    self.refill(now.duration_since(last));
                    last = now;
                    self.publish(&client);
                }
            }
        }
        self.drain(&client, &mut el).await;
    }

    /// Handles one poll result; the backoff to use after the next error.
    async fn on_event(&mut self, ev: Result<Event, rumqttc::ConnectionError>, backoff: Duration) -> Duration {
        match ev {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                self.connected = true;
                return BACKOFF_MIN;
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => self.on_written(pkid),
            Ok(Event::Incoming(Packet::PubAck(ack))) => self.on_acked(ack.pkid),
            Ok(_) => {}
            Err(e) => {
                self.on_disconnect(&e);
                tokio::time::sleep(backoff).await;
                return (backoff * 2).min(BACKOFF_MAX);
            }
        }
        backoff
    }

    fn on_written(&mut self, pkid: u16) {
        let Some(pos) = self.inflight.iter().position(|f| f.pkid.is_none()) else { return };
        if self.sim.qos == QoS::AtMostOnce {
            if let Some(f) = self.inflight.remove(pos) {
                self.count_sent(f.kind);
            }
        } else if let Some(f) = self.inflight.get_mut(pos) {
            f.pkid = Some(pkid);
        }
    }

    fn on_acked(&mut self, pkid: u16) {
        if let Some(pos) = self.inflight.iter().position(|f| f.pkid == Some(pkid))
            && let Some(f) = self.inflight.remove(pos)
        {
            self.count_sent(f.kind);
        }
    }

    fn count_sent(&self, kind: Kind) {
        let counter = match kind {
            Kind::Status => &self.stats.status_sent,
            Kind::Command => &self.stats.command_sent,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// rumqttc drops every un-acked publish of a clean session on reconnect: count them lost.
    fn on_disconnect(&mut self, e: &rumqttc::ConnectionError) {
        if self.connected || !self.inflight.is_empty() {
            tracing::warn!(error = %e, lost = self.inflight.len(), "Device simulator lost its connection");
        }
        self.stats.disconnects.fetch_add(1, Ordering::Relaxed);
        self.stats.errors.fetch_add(self.inflight.len() as u64, Ordering::Relaxed);
        self.inflight.clear();
        self.connected = false;
    }

    fn refill(&mut self, elapsed: Duration) {
        let burst = (self.sim.rate * TICK.as_secs_f64()).max(1.0);
        self.tokens = (self.tokens + self.sim.rate * elapsed.as_secs_f64()).min(burst);
    }

    /// Publishes while tokens, window and limit allow.
    fn publish(&mut self, client: &AsyncClient) {
        while self.tokens >= 1.0 && self.inflight.len() < usize::from(WINDOW) && !self.done_making() {
            let made_us = wall_clock_us();
            let (kind, topic, payload, id) = self.fleet.next_message(made_us.div_euclid(1000));
            if let Some(made_at) = &self.sim.made_at {
                made_at.note(id.key(), made_us);
            }
            self.tokens -= 1.0;
            self.made += 1;
            match client.try_publish(topic, self.sim.qos, false, payload) {
                Ok(()) => self.inflight.push_back(InFlight { kind, pkid: None }),
                // The channel holds WINDOW + 1, so this is a closed event loop: count the loss.
                Err(_) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Waits (bounded) for the PUBACKs of what is in flight, then disconnects cleanly.
    async fn drain(&mut self, client: &AsyncClient, el: &mut EventLoop) {
        let wait = async {
            // An error here ends the drain: on_disconnect counts what was in flight as lost.
            while self.connected && !self.inflight.is_empty() {
                self.on_event(el.poll().await, BACKOFF_MIN).await;
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, wait).await;
        self.stats.errors.fetch_add(self.inflight.len() as u64, Ordering::Relaxed);
        self.inflight.clear();
        if self.connected && client.try_disconnect().is_ok() {
            let flushed = async {
                while let Ok(ev) = el.poll().await {
                    if matches!(ev, Event::Outgoing(Outgoing::Disconnect)) {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(1), flushed).await;
        }
    }
}

/// The devices' state and the message generator (no I/O: `now` is passed in).
struct Fleet {
    devices: Vec<Device>,
    /// (due ms, device index, state), in due order (delays are drawn per command, so a later
    /// command may be due earlier: inserted in place).
    follow_ups: VecDeque<(i64, usize, &'static str)>,
    rng: SplitMix,
    next_cmd: u64,
}

struct Device {
    id: String,
    temp: f64,
    state: &'static str,
    seq: u64,
}

const COMMANDS: [(&str, &str); 3] = [("start", "on"), ("stop", "off"), ("set_speed", "on")];

impl Fleet {
    fn new(n: usize, seed: u64) -> Fleet {
        let mut rng = SplitMix(seed);
        let width = n.saturating_sub(1).to_string().len().max(2);
        let devices = (0..n)
            .map(|i| Device {
                id: format!("pump-{i:0width$}"),
                temp: 20.0 + rng.unit() * 40.0,
                state: if rng.unit() < 0.5 { "on" } else { "off" },
                seq: 0,
            })
            .collect();
        Fleet { devices, follow_ups: VecDeque::new(), rng, next_cmd: 0 }
    }

    /// The next message at wall-clock `now` (ms): a follow-up that is due, else a command or a
    /// periodic status of a random device; with what names it in a [`MadeAt`].
    fn next_message(&mut self, now: i64) -> (Kind, String, Vec<u8>, MessageId<'_>) {
        if self.follow_ups.front().is_some_and(|f| f.0 <= now)
            && let Some((_, dev, state)) = self.follow_ups.pop_front()
        {
            self.devices[dev].state = state;
            return self.status(dev, now);
        }
        let dev = self.rng.below(self.devices.len());
        if self.rng.unit() < COMMAND_SHARE { self.command(dev, now) } else { self.status(dev, now) }
    }

    fn status(&mut self, dev: usize, now: i64) -> (Kind, String, Vec<u8>, MessageId<'_>) {
        let drift = (self.rng.unit() - 0.5) * 0.6;
        let d = &mut self.devices[dev];
        d.seq += 1;
        d.temp = (d.temp + drift).clamp(-20.0, 90.0);
        let temp = (d.temp * 10.0).round() / 10.0;
        let body = serde_json::json!({"device": d.id, "ts": now, "temp": temp, "state": d.state, "seq": d.seq});
        let topic = format!("devices/{}/status", d.id);
        (Kind::Status, topic, body.to_string().into_bytes(), MessageId::Status(&d.id, d.seq))
    }

    fn command(&mut self, dev: usize, now: i64) -> (Kind, String, Vec<u8>, MessageId<'_>) {
        let (cmd, effect) = COMMANDS[self.rng.below(COMMANDS.len())];
        let arg = (1 + self.rng.below(5)).to_string();
        self.next_cmd += 1;
        let cmd_id = format!("c{:05}", self.next_cmd);
        if self.rng.unit() < FOLLOW_SHARE && self.follow_ups.len() < MAX_FOLLOW_UPS {
            let (lo, hi) = FOLLOW_DELAY_MS;
            let delay = lo + self.rng.next() % (hi - lo + 1);
            let due = now.saturating_add(i64::try_from(delay).unwrap_or(i64::MAX));
            let at = self.follow_ups.partition_point(|f| f.0 <= due);
            self.follow_ups.insert(at, (due, dev, effect));
        }
        let id = &self.devices[dev].id;
        let body = serde_json::json!({"device": id, "ts": now, "cmd": cmd, "arg": arg, "cmd_id": cmd_id});
        (Kind::Command, format!("devices/{id}/command"), body.to_string().into_bytes(), MessageId::Command(cmd_id))
    }
}

/// What names a message in a [`MadeAt`]; its key is made only when a time is noted.
enum MessageId<'a> {
    Status(&'a str, u64),
    Command(String),
}

impl MessageId<'_> {
    fn key(&self) -> String {
        match self {
            MessageId::Status(device, seq) => MadeAt::status_key(device, *seq),
            MessageId::Command(cmd_id) => MadeAt::command_key(cmd_id),
        }
    }
}

/// splitmix64: small, seedable, good enough for simulated devices.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n) for n > 0 (the modulo bias is irrelevant here).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message's payload decodes into the gateway schema (types and the topic's device).
    fn check_schema(topic: &str, payload: &[u8]) -> Kind {
        let v: serde_json::Value = serde_json::from_slice(payload).unwrap();
        let device = v["device"].as_str().unwrap();
        assert!(v["ts"].is_i64(), "{v}");
        let kind = if topic == format!("devices/{device}/status") {
            assert!(v["temp"].is_f64() || v["temp"].is_i64(), "{v}");
            assert!(["on", "off"].contains(&v["state"].as_str().unwrap()), "{v}");
            assert!(v["seq"].is_i64(), "{v}");
            Kind::Status
        } else {
            assert_eq!(topic, format!("devices/{device}/command"));
            for f in ["cmd", "arg", "cmd_id"] {
                assert!(v[f].is_string(), "{v}");
            }
            Kind::Command
        };
        assert_eq!(v.as_object().unwrap().len(), 5, "{v}");
        kind
    }

    #[test]
    fn commands_are_mostly_followed_by_a_status_change_of_their_device() {
        let mut fleet = Fleet::new(5, 7);
        let mut commands = Vec::new();
        let mut changes = Vec::new();
        // 20 s of messages at 50 per second.
        for i in 0..1_000 {
            let now = 1_796_040_000_000 + i * 20;
            let (kind, topic, payload, _) = fleet.next_message(now);
            assert_eq!(check_schema(&topic, &payload), kind);
            let v: serde_json::Value = serde_json::from_slice(&payload).unwrap();
            match kind {
                Kind::Command => commands.push(v),
                Kind::Status => changes.push(v),
            }
        }
        let followed = commands
            .iter()
            .filter(|c| {
                changes.iter().any(|s| {
                    s["device"] == c["device"]
                        && (0..=5_000).contains(&(s["ts"].as_i64().unwrap() - c["ts"].as_i64().unwrap()))
                })
            })
            .count();
        assert!(commands.len() > 100, "{}", commands.len());
        assert!(followed >= commands.len() / 2, "{followed} of {}", commands.len());
        let ids: std::collections::HashSet<_> = commands.iter().map(|c| c["cmd_id"].clone()).collect();
        assert_eq!(ids.len(), commands.len(), "cmd_id repeats");
    }

    #[test]
    fn bad_settings_are_refused() {
        let sim = DeviceSim {
            url_host: "127.0.0.1".into(),
            port: 1,
            devices: 0,
            rate: 10.0,
            seed: 1,
            qos: QoS::AtLeastOnce,
            limit: Some(1),
            made_at: None,
        };
        assert!(spawn(sim.clone(), Arc::default()).is_err());
        assert!(spawn(DeviceSim { devices: 1, rate: f64::NAN, ..sim }, Arc::default()).is_err());
    }

    #[cfg(feature = "embedded-broker")]
    #[test]
    fn publishes_exactly_limit_messages_in_the_gateway_schema() {
        use crate::broker::{self, tests as bt};

        let broker = broker::start(bt::settings()).unwrap();
        let addr = broker.addr();
        let limit = 300;
        bt::runtime().block_on(async {
            let (_sub, mut el, _) =
                bt::subscriber(bt::options(addr, "watcher", true), "devices/#", QoS::AtLeastOnce).await;
            let sim = DeviceSim {
                url_host: addr.ip().to_string(),
                port: addr.port(),
                devices: 8,
                rate: 2_000.0,
                seed: 42,
                qos: QoS::AtLeastOnce,
                limit: Some(limit),
                made_at: None,
            };
            let (handle, stats) = spawn(sim, Arc::default()).unwrap();
            let got = bt::receive(&mut el, limit as usize).await;
            let kinds: Vec<Kind> = got.iter().map(|p| check_schema(&p.topic, &p.payload)).collect();
            // Nothing more arrives after the limit.
            let extra = tokio::time::timeout(Duration::from_millis(300), bt::receive(&mut el, 1)).await;
            assert!(extra.is_err(), "more than {limit} messages");
            let done = tokio::task::spawn_blocking(move || handle.join().unwrap()).await.unwrap();
            assert!(Arc::ptr_eq(&done, &stats));
            assert_eq!(stats.sent(), limit);
            assert_eq!(stats.errors.load(Ordering::Relaxed), 0);
            let commands = kinds.iter().filter(|k| **k == Kind::Command).count() as u64;
            assert_eq!(stats.command_sent.load(Ordering::Relaxed), commands);
            assert!(commands > 0 && commands < limit);
        });
    }
}
