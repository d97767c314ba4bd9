//! The MQTT sink against a real mosquitto (one instance per test, on a free port): order,
//! outages, overflow policies and the retained status with its last will.
#![allow(clippy::unwrap_used)] // test helpers: a panic is a failed test
#![allow(clippy::disallowed_methods)] // timing the test itself (deadlines), not engine time

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use braid::config::{MqttConn, Overflow, SinkDef, SinkKind};
use braid::sink::mqtt::{Uplink, UplinkError, run};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::{mpsc, watch};

const CHILD_PORT: &str = "BRAID_SINK_TEST_CHILD_PORT";
const CHILD_DIR: &str = "BRAID_SINK_TEST_CHILD_DIR";

/// A mosquitto of our own: its port, config and persistence in a temp dir.
struct Broker {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Broker {
    fn new() -> Broker {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let conf = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\nuser root\npersistence true\n\
             persistence_location {}/\nautosave_interval 0\nmax_queued_messages 0\n\
             log_dest stderr\nlog_type error\n",
            dir.path().display()
        );
        std::fs::write(dir.path().join("mosquitto.conf"), conf).unwrap();
        Broker { port, dir, child: None }
    }

    fn start(&mut self) {
        let child = Command::new("/usr/sbin/mosquitto")
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "mosquitto did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (mosquitto saves its persistence) and wait.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn def(port: u16, name: &str, buffer: u64, overflow: Overflow) -> SinkDef {
    SinkDef {
        name: name.into(),
        kind: SinkKind::Mqtt,
        inputs: vec!["effect".into()],
        url: Some(format!("mqtt://127.0.0.1:{port}")),
        topic: Some("results/{device}".into()),
        qos: 1,
        buffer,
        overflow,
        path: None,
        conn: MqttConn { client_id: Some(format!("sink-{name}")), max_inflight: Some(20), ..MqttConn::default() },
        status_topic: Some(format!("status/{name}")),
    }
}

type Received = mpsc::UnboundedReceiver<(String, Vec<u8>)>;

/// A subscriber task; returns once its subscription is acknowledged. `persistent`: a session
/// the broker keeps (and fills) while the subscriber or the broker is down.
async fn subscribe(port: u16, id: &str, filter: &str, persistent: bool) -> Received {
    let mut options = MqttOptions::new(id, "127.0.0.1", port);
    options.set_clean_session(!persistent).set_keep_alive(Duration::from_secs(5));
    let (client, mut events) = AsyncClient::new(options, 100);
    client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _client = client; // dropping it would end the event loop
        let mut ready = Some(ready_tx);
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let _ = tx.send((p.topic, p.payload.to_vec()));
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(5), ready_rx).await.unwrap().unwrap();
    rx
}

/// Subscribes with a persistent session, then stops the broker: results published while the
/// subscriber is away are kept for it.
async fn persistent_subscriber_then_stop(broker: &mut Broker, id: &str) -> Received {
    broker.start();
    let rx = subscribe(broker.port, id, "results/#", true).await;
    broker.stop();
    rx
}

/// Results (numbers) in order of first arrival, until `done` says so or 30 s pass.
async fn receive(rx: &mut Received, seen: &mut Vec<u64>, mut done: impl FnMut(&[u64]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done(seen) {
        let got = tokio::time::timeout_at(deadline, rx.recv()).await;
        let (_, payload) = got.unwrap_or_else(|_| panic!("timed out; first arrivals so far: {}", seen.len())).unwrap();
        let n: u64 = std::str::from_utf8(&payload).unwrap().parse().unwrap();
        if !seen.contains(&n) {
            seen.push(n);
        }
    }
}

/// The next message on a status subscription.
async fn next_status(rx: &mut Received) -> String {
    let (_, payload) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
    String::from_utf8(payload).unwrap()
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn push_range(uplink: &Uplink, range: std::ops::Range<u64>) {
    let stop = AtomicBool::new(false);
    for i in range {
        uplink.push("results/dev", i.to_string().as_bytes(), &stop).unwrap();
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn results_arrive_in_order_and_leave_the_spool() {
    rt().block_on(async {
        let mut broker = Broker::new();
        broker.start();
        let mut rx = subscribe(broker.port, "sub-a", "results/#", false).await;
        let state = tempfile::tempdir().unwrap();
        let def = def(broker.port, "a", 1 << 20, Overflow::Block);
        let uplink = Uplink::open(&def, state.path()).unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(uplink.clone(), def, stop_rx, Duration::from_secs(5)));
        push_range(&uplink, 0..1000);
        let mut seen = Vec::new();
        receive(&mut rx, &mut seen, |s| s.len() == 1000).await;
        assert_eq!(seen, (0..1000).collect::<Vec<_>>());
        until("an empty spool", || uplink.stats().queued_rows == 0).await;
        let stats = uplink.stats();
        assert_eq!((stats.queued_bytes, stats.sent_total, stats.dropped_total), (0, 1000, 0));
        assert!(stats.connected);
        assert_eq!(stats.reconnects, 0, "the broker took every packet the sink wrote");

        let mut status = subscribe(broker.port, "status-a1", "status/a", false).await;
        assert_eq!(next_status(&mut status).await, "online", "retained after connecting");
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap().unwrap();
        assert_eq!(next_status(&mut status).await, "offline", "published on shutdown");
        assert!(!uplink.stats().connected);
    });
}

/// At QoS 0 a result leaves the spool once rumqttc wrote it (no acknowledgement will come).
#[test]
fn qos_0_results_arrive_in_order_and_leave_the_spool_once_written() {
    rt().block_on(async {
        let mut broker = Broker::new();
        broker.start();
        let mut rx = subscribe(broker.port, "sub-q0", "results/#", false).await;
        let state = tempfile::tempdir().unwrap();
        let def = SinkDef { qos: 0, ..def(broker.port, "q0", 1 << 20, Overflow::Block) };
        let uplink = Uplink::open(&def, state.path()).unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(uplink.clone(), def, stop_rx, Duration::from_secs(5)));
        for chunk in 0..10 {
            push_range(&uplink, chunk * 100..(chunk + 1) * 100);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut seen = Vec::new();
        receive(&mut rx, &mut seen, |s| s.len() == 1000).await;
        assert_eq!(seen, (0..1000).collect::<Vec<_>>());
        until("an empty spool", || uplink.stats().queued_rows == 0).await;
        assert_eq!(uplink.stats().sent_total, 1000);
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap().unwrap();
    });
}

#[test]
fn nothing_is_lost_when_the_broker_is_down_or_restarts() {
    rt().block_on(async {
        let mut broker = Broker::new();
        let mut rx = persistent_subscriber_then_stop(&mut broker, "sub-b").await;
        let state = tempfile::tempdir().unwrap();
        let def = def(broker.port, "b", 1 << 20, Overflow::Block);
        let uplink = Uplink::open(&def, state.path()).unwrap();
        let (_stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(run(uplink.clone(), def, stop_rx, Duration::from_secs(5)));
        push_range(&uplink, 0..300);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!((uplink.stats().connected, uplink.stats().queued_rows), (false, 300));

        broker.start();
        let mut seen = Vec::new();
        receive(&mut rx, &mut seen, |s| s.len() >= 100).await;
        broker.stop(); // mid-stream
        push_range(&uplink, 300..600);
        broker.start();
        receive(&mut rx, &mut seen, |s| s.len() == 600).await;
        assert_eq!(seen, (0..600).collect::<Vec<_>>(), "every result, in order of first arrival");
        until("an empty spool", || uplink.stats().queued_rows == 0).await;
        assert!(uplink.stats().reconnects >= 1);
    });
}

#[test]
fn block_waits_for_space_until_the_broker_is_back() {
    rt().block_on(async {
        let mut broker = Broker::new();
        let mut rx = persistent_subscriber_then_stop(&mut broker, "sub-c").await;
        let state = tempfile::tempdir().unwrap();
        let def = def(broker.port, "c", 2048, Overflow::Block);
        let uplink = Uplink::open(&def, state.path()).unwrap();
        let (_stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(run(uplink.clone(), def, stop_rx, Duration::from_secs(5)));
        let feeder = {
            let uplink = uplink.clone();
            std::thread::spawn(move || push_range(&uplink, 0..100))
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!feeder.is_finished(), "push waits while the buffer is full");
        let stats = uplink.stats();
        assert!(stats.queued_bytes <= 2048 && stats.queued_rows < 100, "{stats:?}");
        // The wait shows (the watchdog and /healthz read it), and its rounds move while it lasts.
        let blocked = uplink.blocked().expect("a push waiting for room shows as blocked");
        assert!(!blocked.connected && blocked.buffer_bytes == 2048, "{blocked:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let later = uplink.blocked().expect("still blocked");
        assert!(later.rounds > blocked.rounds, "the wait's rounds stand still: {blocked:?} then {later:?}");
        let stopped = uplink.push("results/dev", b"x", &AtomicBool::new(true));
        assert!(matches!(stopped, Err(UplinkError::Stopped { .. })), "a set stop flag ends the wait");

        broker.start();
        let mut seen = Vec::new();
        receive(&mut rx, &mut seen, |s| s.len() == 100).await;
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        until("the feeder", || feeder.is_finished()).await;
        assert_eq!(uplink.stats().dropped_total, 0);
        assert_eq!(uplink.blocked(), None, "no push waits any more");
    });
}

#[test]
fn drop_oldest_keeps_the_newest_and_counts_the_rest() {
    rt().block_on(async {
        let mut broker = Broker::new();
        let mut rx = persistent_subscriber_then_stop(&mut broker, "sub-e").await;
        let state = tempfile::tempdir().unwrap();
        let def = def(broker.port, "e", 2048, Overflow::DropOldest);
        let uplink = Uplink::open(&def, state.path()).unwrap();
        let (_stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(run(uplink.clone(), def, stop_rx, Duration::from_secs(5)));
        push_range(&uplink, 0..100); // never waits
        let stats = uplink.stats();
        assert!(stats.dropped_total > 0);
        assert_eq!(stats.dropped_total + stats.queued_rows, 100);
        let kept = stats.dropped_total..100;

        broker.start();
        let mut seen = Vec::new();
        receive(&mut rx, &mut seen, |s| s.last() == Some(&99)).await;
        assert_eq!(seen, kept.collect::<Vec<_>>(), "the newest arrive, in order; the dropped never");
    });
}

#[test]
fn a_killed_sink_leaves_a_retained_offline() {
    if let (Some(port), Some(dir)) = (std::env::var_os(CHILD_PORT), std::env::var_os(CHILD_DIR)) {
        return sink_child(port.to_str().unwrap().parse().unwrap(), Path::new(&dir));
    }
    rt().block_on(async {
        let mut broker = Broker::new();
        broker.start();
        let mut status = subscribe(broker.port, "status-d1", "status/d", false).await;
        let state = tempfile::tempdir().unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["mqtt_sink::a_killed_sink_leaves_a_retained_offline", "--exact", "--test-threads=1"])
            .env(CHILD_PORT, broker.port.to_string())
            .env(CHILD_DIR, state.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert_eq!(next_status(&mut status).await, "online");
        child.kill().unwrap(); // SIGKILL: no goodbye, the broker fires the will
        child.wait().unwrap();
        assert_eq!(next_status(&mut status).await, "offline");
        let mut fresh = subscribe(broker.port, "status-d2", "status/d", false).await;
        assert_eq!(next_status(&mut fresh).await, "offline", "retained");
    });
}

/// The child: a sink that runs until it is killed.
fn sink_child(port: u16, dir: &Path) {
    rt().block_on(async {
        let def = def(port, "d", 1 << 20, Overflow::Block);
        let uplink: Arc<Uplink> = Uplink::open(&def, dir).unwrap();
        let (_stop_tx, stop_rx) = watch::channel(false);
        run(uplink, def, stop_rx, Duration::ZERO).await.unwrap();
    });
}
