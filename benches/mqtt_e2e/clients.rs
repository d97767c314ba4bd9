//! The bench's MQTT clients (rumqttc, each on a thread of its own with a current-thread tokio
//! runtime): the load generator that publishes prepared messages as fast as the broker acks
//! them, and a subscriber that counts what it receives and, for braid's results, measures
//! publish → result latency.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use braid::demo::devices::MadeAt;
use hdrhistogram::Histogram;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS};

/// Un-acked publishes one generator client keeps in flight (also its rumqttc window).
const WINDOW: u16 = 1000;
/// The bound on any wait for a connection, a subscription or the last acknowledgements.
const PATIENCE: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn options(port: u16, client_id: &str) -> MqttOptions {
    let mut o = MqttOptions::new(client_id, "127.0.0.1", port);
    o.set_clean_session(true).set_keep_alive(Duration::from_secs(30)).set_max_packet_size(1 << 20, 1 << 20);
    o
}

/// Wall clock, µs since the Unix epoch.
pub fn wall_us() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

/// One prepared message.
pub type Message = (String, Vec<u8>);

/// The saturation workload: `devices` devices (`dev-000000` …), each publishing one status and
/// then one command, all with event time `ts`, dealt round-robin by device to `clients` lists
/// (a device's two messages stay with one client, in order). Every command then finds exactly
/// one status: the join emits one `match` per command, `devices` results in all, and no row can
/// be late (the event times are all equal).
pub fn saturation_messages(devices: usize, clients: usize, ts: i64) -> Vec<Vec<Message>> {
    let mut out = vec![Vec::with_capacity(2 * devices / clients + 2); clients];
    for i in 0..devices {
        let device = format!("dev-{i:06}");
        let status = format!(
            r#"{{"device":"{device}","ts":{ts},"temp":{}.5,"state":"on","seq":{}}}"#,
            20 + i % 40,
            1 + i % 1000
        );
        let command = format!(r#"{{"device":"{device}","ts":{ts},"cmd":"start","arg":"1","cmd_id":"c{i:08}"}}"#);
        let list = &mut out[i % clients];
        list.push((format!("devices/{device}/status"), status.into_bytes()));
        list.push((format!("devices/{device}/command"), command.into_bytes()));
    }
    out
}

/// What a generator run took.
#[derive(Clone, Copy, Debug)]
pub struct Published {
    /// When the clients started publishing (all connected).
    pub start: Instant,
    /// When the last PUBACK arrived.
    pub end: Instant,
    pub messages: u64,
}

/// Publishes every list from a client of its own (QoS 1, at most [`WINDOW`] un-acked each), all
/// clients starting together once connected; returns when every message is PUBACKed.
pub fn publish_all(port: u16, lists: Vec<Vec<Message>>, tag: &str) -> Published {
    let barrier = Arc::new(Barrier::new(lists.len() + 1));
    let messages = lists.iter().map(|l| l.len() as u64).sum();
    let threads: Vec<_> = lists
        .into_iter()
        .enumerate()
        .map(|(i, list)| {
            let (barrier, id) = (Arc::clone(&barrier), format!("bench-pub-{tag}-{i}"));
            std::thread::Builder::new()
                .name(format!("bench-pub-{i}"))
                .spawn(move || runtime().block_on(publish_list(port, &id, list, &barrier)))
                .unwrap()
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for t in threads {
        t.join().unwrap();
    }
    Published { start, end: Instant::now(), messages }
}

async fn publish_list(port: u16, id: &str, list: Vec<Message>, barrier: &Barrier) {
    let mut o = options(port, id);
    o.set_inflight(WINDOW);
    // The window bounds the requests in the channel too, so try_publish never finds it full.
    let (client, mut el) = AsyncClient::new(o, usize::from(WINDOW) + 8);
    wait_connack(&mut el).await;
    barrier.wait();
    let total = list.len();
    let mut messages = list.into_iter();
    let (mut sent, mut acked) = (0usize, 0usize);
    while acked < total {
        while sent < total && sent - acked < usize::from(WINDOW) {
            let Some((topic, payload)) = messages.next() else { break };
            client.try_publish(topic, QoS::AtLeastOnce, false, payload).unwrap();
            sent += 1;
        }
        match tokio::time::timeout(PATIENCE, el.poll()).await {
            Ok(Ok(Event::Incoming(Packet::PubAck(_)))) => acked += 1,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("publisher {id}: {e}"),
            Err(_) => panic!("publisher {id}: no PUBACK within {PATIENCE:?} ({acked} of {total} acked)"),
        }
    }
    disconnect(&client, &mut el).await;
}

async fn wait_connack(el: &mut EventLoop) {
    let connected = async {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => return,
                Ok(_) => {}
                Err(e) => panic!("connecting to the broker: {e}"),
            }
        }
    };
    tokio::time::timeout(PATIENCE, connected).await.expect("no ConnAck");
}

async fn disconnect(client: &AsyncClient, el: &mut EventLoop) {
    if client.try_disconnect().is_err() {
        return;
    }
    let flushed = async {
        while let Ok(ev) = el.poll().await {
            if matches!(ev, Event::Outgoing(Outgoing::Disconnect)) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), flushed).await;
}

/// What a [`Subscriber`] saw.
#[derive(Debug)]
pub struct Received {
    pub count: u64,
    pub first: Option<Instant>,
    pub last: Option<Instant>,
    /// Receive time − `_ts` of results with `_kind` = `match`, or − `ts` of device messages, µs
    /// (as [`Timing`] says).
    pub latency_us: Histogram<u64>,
    /// The same, from the making time the simulator noted to the µs ([`MadeAt`]; for a result,
    /// of the later of its two rows) instead of the ms of `ts`: empty without a [`MadeAt`].
    pub made_latency_us: Histogram<u64>,
    /// Results of another kind (`left_only`: emitted when the watermark passes, not timed).
    pub unmatched: u64,
}

impl Received {
    /// Messages per second from the first to the last receipt.
    pub fn rate(&self) -> f64 {
        match (self.first, self.last) {
            (Some(first), Some(last)) if last > first => self.count as f64 / (last - first).as_secs_f64(),
            _ => f64::NAN,
        }
    }
}

/// A QoS 1 subscriber (rumqttc acknowledges each message as it arrives) that counts what it
/// receives, except topics ending in `ignore_suffix` (the warm-up's).
pub struct Subscriber {
    count: Arc<AtomicU64>,
    ignored: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Received>,
}

impl Subscriber {
    /// Returns once the broker acknowledged the subscription; `timing` says which payloads are
    /// timed.
    pub fn start(port: u16, filter: &str, ignore_suffix: &'static str, timing: Timing) -> Subscriber {
        Subscriber::start_timed(port, filter, ignore_suffix, timing, None)
    }

    /// [`start`](Self::start), timing also from the making times in `made_at`.
    pub fn start_timed(
        port: u16,
        filter: &str,
        ignore_suffix: &'static str,
        timing: Timing,
        made_at: Option<Arc<MadeAt>>,
    ) -> Subscriber {
        let (count, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let ignored = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let opts = options(port, &format!("bench-sub-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        let counters = Counters { count: Arc::clone(&count), ignored: Arc::clone(&ignored), stop: Arc::clone(&stop) };
        let (filter, wanted) = (filter.to_owned(), Wanted { ignore_suffix, timing, made_at });
        let thread = std::thread::Builder::new()
            .name("bench-sub".into())
            .spawn(move || runtime().block_on(subscribe(opts, filter, wanted, counters, ready_tx)))
            .unwrap();
        ready_rx.recv_timeout(PATIENCE).expect("no SubAck");
        Subscriber { count, ignored, stop, thread }
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Messages received on the ignored topics.
    pub fn ignored(&self) -> u64 {
        self.ignored.load(Ordering::Relaxed)
    }

    /// Waits until `n` messages arrived (true) or `timeout` passed (false).
    pub fn wait_for(&self, n: u64, timeout: Duration) -> bool {
        let since = Instant::now();
        while self.count() < n {
            if since.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    pub fn finish(self) -> Received {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// What a subscriber does with a message.
struct Wanted {
    ignore_suffix: &'static str,
    timing: Timing,
    made_at: Option<Arc<MadeAt>>,
}

/// Which payloads a [`Subscriber`] times (publish → receipt, into [`Received::latency_us`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// None: it only counts.
    Off,
    /// braid's `match` results, by their `_ts`.
    Results,
    /// The devices' own messages, by their `ts`: the broker alone, the baseline of `Results`.
    Inputs,
}

/// What a subscriber shares with its owner.
struct Counters {
    count: Arc<AtomicU64>,
    ignored: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

async fn subscribe(
    opts: MqttOptions,
    filter: String,
    wanted: Wanted,
    counters: Counters,
    ready: std::sync::mpsc::Sender<()>,
) -> Received {
    let Counters { count, ignored, stop } = counters;
    let (client, mut el) = AsyncClient::new(opts, 16);
    client.try_subscribe(filter, QoS::AtLeastOnce).unwrap();
    let mut got = Received {
        count: 0,
        first: None,
        last: None,
        latency_us: Histogram::new_with_bounds(1, 600_000_000, 3).unwrap(),
        made_latency_us: Histogram::new_with_bounds(1, 600_000_000, 3).unwrap(),
        unmatched: 0,
    };
    let mut check = tokio::time::interval(Duration::from_millis(20));
    while !stop.load(Ordering::Relaxed) {
        tokio::select! {
            ev = el.poll() => match ev {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if p.topic.ends_with(wanted.ignore_suffix) {
                        ignored.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let now = Instant::now();
                    got.first.get_or_insert(now);
                    got.last = Some(now);
                    got.count += 1;
                    count.store(got.count, Ordering::Relaxed);
                    match wanted.timing {
                        Timing::Off => {}
                        Timing::Results => time_result(&p.topic, &p.payload, wanted.made_at.as_deref(), &mut got),
                        Timing::Inputs => time_input(&p.topic, &p.payload, wanted.made_at.as_deref(), &mut got),
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = ready.send(());
                }
                Ok(_) => {}
                Err(e) => panic!("subscriber: {e}"),
            },
            _ = check.tick() => {}
        }
    }
    disconnect(&client, &mut el).await;
    got
}

/// A `match` result's publish → receipt time: `_ts` is the later of its two rows' `ts`, the wall
/// clock in ms when that row was made, so this is truncated to the ms (0 … 1 ms too long). With
/// `made_at`, also from the later row's making time to the µs: the result names its command by
/// `cmd_id` and its status by the device (the last level of its topic, `up/effect/{device}`) and
/// `seq`.
fn time_result(topic: &str, payload: &[u8], made_at: Option<&MadeAt>, got: &mut Received) {
    let now = wall_us();
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(payload) else { return };
    if v["_kind"].as_str() != Some("match") {
        got.unmatched += 1;
        return;
    }
    if let Some(ts) = v["_ts"].as_i64() {
        record(&mut got.latency_us, now - ts * 1000);
    }
    let device = topic.rsplit('/').next().unwrap_or_default();
    let made = |key: Option<String>| made_at.zip(key).and_then(|(m, key)| m.get(&key));
    let command = made(v["cmd_id"].as_str().map(MadeAt::command_key));
    let status = made(v["seq"].as_u64().map(|seq| MadeAt::status_key(device, seq)));
    if let (Some(command), Some(status)) = (command, status) {
        record(&mut got.made_latency_us, now - command.max(status));
    }
}

/// A device message's publish → receipt time, by its `ts` (the wall clock in ms when it was
/// made, as a result's `_ts`: the same truncation, so the two compare), and with `made_at` to
/// the µs (a status by its device and `seq`, a command by its `cmd_id`).
fn time_input(topic: &str, payload: &[u8], made_at: Option<&MadeAt>, got: &mut Received) {
    let now = wall_us();
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(payload) else { return };
    if let Some(ts) = v["ts"].as_i64() {
        record(&mut got.latency_us, now - ts * 1000);
    }
    let key = match (v["cmd_id"].as_str(), v["device"].as_str(), v["seq"].as_u64()) {
        (Some(cmd_id), _, _) => Some(MadeAt::command_key(cmd_id)),
        (None, Some(device), Some(seq)) if topic.ends_with("/status") => Some(MadeAt::status_key(device, seq)),
        _ => None,
    };
    if let Some(made) = made_at.zip(key).and_then(|(m, key)| m.get(&key)) {
        record(&mut got.made_latency_us, now - made);
    }
}

/// Records a latency in µs, at least 1.
fn record(histogram: &mut Histogram<u64>, micros: i64) {
    let _ = histogram.record(u64::try_from(micros.max(1)).unwrap_or(1));
}

/// Publishes one status and one command of device `device` (event time: now) and waits for
/// their PUBACKs: braid's warm-up.
pub fn publish_pair(port: u16, device: &str) {
    let ts = wall_us() / 1000;
    let status = format!(r#"{{"device":"{device}","ts":{ts},"temp":20.5,"state":"on","seq":1}}"#);
    let command = format!(r#"{{"device":"{device}","ts":{ts},"cmd":"start","arg":"1","cmd_id":"w{ts}"}}"#);
    let list = vec![
        (format!("devices/{device}/status"), status.into_bytes()),
        (format!("devices/{device}/command"), command.into_bytes()),
    ];
    publish_all(port, vec![list], device);
}
