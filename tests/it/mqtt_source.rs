//! The MQTT source against a real mosquitto (`/usr/sbin/mosquitto`, one instance per test on a
//! free loopback port, persistence in a temporary folder): delivery order, acks only after
//! confirmation, backpressure, broker restarts, oversized packets and QoS 0.
//!
//! The "feeder" here is the test itself: it reads the intake channel and confirms what the
//! scenario says is durable. mosquitto keeps at most 20 un-acked messages in flight per client
//! (`max_inflight_messages`), so a feeder that stops confirming stops the flow at about 20.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use braid::config::MqttConn;
use braid::source::mqtt::{SourceError, SourceSettings, SourceStatus, run};
use braid::source::{Confirmations, Delivery};
use crossbeam_channel::{Receiver, TryRecvError};
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long any one wait in these tests may take.
const PATIENCE: Duration = Duration::from_secs(10);
const TOPIC: &str = "devices/+device/status";

/// A mosquitto process owned by one test; killed on drop.
struct Mosquitto {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Mosquitto {
    fn start() -> Mosquitto {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\nuser root\npersistence true\n\
             persistence_location {}/\nautosave_interval 0\nlog_dest stderr\nlog_type error\n",
            dir.path().display()
        );
        std::fs::write(dir.path().join("mosquitto.conf"), config).unwrap();
        let mut broker = Mosquitto { port, dir, child: None };
        broker.spawn();
        broker
    }

    fn spawn(&mut self) {
        let child = Command::new("/usr/sbin/mosquitto")
            .arg("-c")
            .arg(self.config_path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        wait_for_port(self.port);
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("mosquitto.conf")
    }

    /// SIGTERM (mosquitto saves its persistence on a clean exit), then start again on the same
    /// port with the same folder.
    fn restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let terminated = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
            assert!(terminated.success());
            child.wait().unwrap();
        }
        assert!(Path::new(&self.dir.path().join("mosquitto.db")).exists(), "mosquitto saved no persistence");
        self.spawn();
    }

    fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A port nobody listens on (bind port 0, read it, close it).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_for_port(port: u16) {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    for _ in 0..250 {
        if TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("mosquitto did not listen on {port}");
}

fn settings(broker: &Mosquitto, client_id: &str, max_payload: u64) -> SourceSettings {
    SourceSettings {
        index: 0,
        name: "devices".into(),
        url: broker.url(),
        conn: MqttConn { client_id: Some(client_id.into()), keep_alive_ms: Some(5_000), ..MqttConn::default() },
        client_id: "unused: conn.client_id is set".into(),
        own_login: None,
        filters: vec![braid::source::mqtt::subscription_filter(TOPIC)],
        max_payload,
        qos: QoS::AtLeastOnce,
    }
}

/// A running source and the test's end of its intake channel.
struct Running {
    intake: Receiver<Delivery>,
    confirmations: Arc<Confirmations>,
    status: Arc<SourceStatus>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<Result<(), SourceError>>,
}

impl Running {
    /// Starts the source and waits until the broker holds its subscription.
    async fn start(settings: SourceSettings, intake_capacity: usize) -> Running {
        let (sender, intake) = crossbeam_channel::bounded(intake_capacity);
        let confirmations = Confirmations::new(1);
        let status = Arc::new(SourceStatus::default());
        let (shutdown, shutdown_rx) = watch::channel(false);
        // The doorbell would wake a feeder; here the test reads the channel itself.
        let (bell, _sleeper) = braid::shard::wake::Doorbell::new().unwrap();
        let sender = braid::source::Intake::new(sender, bell);
        let task = tokio::spawn(run(settings, sender, Arc::clone(&confirmations), Arc::clone(&status), shutdown_rx));
        let running = Running { intake, confirmations, status, shutdown, task };
        running.wait_until("subscribed", |s| s.subscribed.load(Ordering::Relaxed)).await;
        running
    }

    async fn wait_until(&self, what: &str, condition: impl Fn(&SourceStatus) -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !condition(&self.status) {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}: {:?}", self.status);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Reads `n` deliveries, confirming each one for which `confirm(payload)` holds (and, as the
    /// feeder does, only while every earlier one was confirmed too).
    async fn take(&self, n: usize, confirm: impl Fn(&str) -> bool) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut payloads = Vec::with_capacity(n);
        let mut confirming = true;
        while payloads.len() < n {
            match self.intake.try_recv() {
                Ok(delivery) => {
                    let payload = String::from_utf8_lossy(&delivery.payload).into_owned();
                    confirming &= confirm(&payload);
                    if confirming {
                        self.confirmations.confirm(0, delivery.seq);
                    }
                    payloads.push(payload);
                }
                Err(TryRecvError::Empty) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "timed out after {} of {n} deliveries: {:?}",
                        payloads.len(),
                        self.status
                    );
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(TryRecvError::Disconnected) => panic!("the source ended early"),
            }
        }
        payloads
    }

    /// Reads and confirms until every payload in `wanted` was seen; returns all (duplicates too).
    async fn take_all_of(&self, wanted: &BTreeSet<String>) -> Vec<String> {
        let mut seen = Vec::new();
        while !wanted.iter().all(|w| seen.contains(w)) {
            seen.extend(self.take(1, |_| true).await);
        }
        seen
    }

    async fn stop(self) {
        self.shutdown.send(true).unwrap();
        tokio::time::timeout(PATIENCE, self.task).await.unwrap().unwrap().unwrap();
    }
}

/// Publishes `messages` (topic, payload, qos) with a rumqttc client and returns once the broker
/// acked every QoS 1 one and every QoS 0 one was written.
async fn publish(port: u16, messages: Vec<(String, Vec<u8>, QoS)>) {
    let mut options = MqttOptions::new(format!("publisher-{port}"), "127.0.0.1", port);
    // Room for the 20 MiB publish of the oversized test.
    options.set_max_packet_size(32 << 20, 32 << 20);
    let (client, mut eventloop) = AsyncClient::new(options, 16);
    let total = messages.len();
    let qos1 = messages.iter().filter(|(_, _, qos)| *qos == QoS::AtLeastOnce).count();
    let send = async {
        for (topic, payload, qos) in messages {
            client.publish(topic, qos, false, payload).await.unwrap();
        }
    };
    let drive = async {
        let (mut written, mut acked) = (0, 0);
        while written < total || acked < qos1 {
            match eventloop.poll().await.unwrap() {
                Event::Outgoing(Outgoing::Publish(_)) => written += 1,
                Event::Incoming(Packet::PubAck(_)) => acked += 1,
                _ => {}
            }
        }
    };
    tokio::time::timeout(PATIENCE, async { tokio::join!(send, drive) }).await.unwrap();
}

fn numbered(range: std::ops::Range<usize>, qos: QoS) -> Vec<(String, Vec<u8>, QoS)> {
    range.map(|i| (format!("devices/d{}/status", i % 7), i.to_string().into_bytes(), qos)).collect()
}

fn strings(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| i.to_string()).collect()
}

/// (a) All arrive in order; only confirmed ones are acked, so after a restart of the source the
/// unconfirmed ones come back, same payloads, in order.
#[tokio::test]
async fn unconfirmed_messages_are_redelivered_after_a_source_restart() {
    let broker = Mosquitto::start();
    let source = Running::start(settings(&broker, "braid-test-redeliver", 4096), 1024).await;
    publish(broker.port, numbered(0..200, QoS::AtLeastOnce)).await;

    let confirmed_half = |payload: &str| payload.parse::<usize>().unwrap() < 100;
    // The broker stops at its in-flight window (20) past the last ack, so read 110.
    let first = source.take(110, confirmed_half).await;
    assert_eq!(first, strings(0..110));
    source.wait_until("100 acked", |s| s.acked.load(Ordering::Relaxed) == 100).await;
    source.stop().await;

    let source = Running::start(settings(&broker, "braid-test-redeliver", 4096), 1024).await;
    let second = source.take(100, |_| true).await;
    assert_eq!(second, strings(100..200), "exactly the unconfirmed half, in order");
    source.stop().await;
}

/// (b) A full intake channel (capacity 1, unread for a while) loses nothing and keeps the
/// connection alive.
#[tokio::test]
async fn a_full_intake_channel_loses_nothing() {
    let broker = Mosquitto::start();
    let source = Running::start(settings(&broker, "braid-test-backpressure", 4096), 1).await;
    publish(broker.port, numbered(0..300, QoS::AtLeastOnce)).await;
    source.wait_until("deliveries wait", |s| s.waiting.load(Ordering::Relaxed) > 0).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(source.status.acked.load(Ordering::Relaxed), 0, "nothing confirmed, nothing acked");

    assert_eq!(source.take(300, |_| true).await, strings(0..300));
    source.wait_until("all acked", |s| s.acked.load(Ordering::Relaxed) == 300).await;
    assert_eq!(source.status.reconnects.load(Ordering::Relaxed), 0);
    source.stop().await;
}

/// (c) The broker restarts mid-stream: everything arrives (duplicates allowed).
#[tokio::test]
async fn a_broker_restart_loses_nothing() {
    let mut broker = Mosquitto::start();
    let source = Running::start(settings(&broker, "braid-test-restart", 4096), 1024).await;
    publish(broker.port, numbered(0..200, QoS::AtLeastOnce)).await;
    // Read some, confirm fewer: the restart catches acked, confirmed-not-acked and unread ones.
    source.take(50, |p| p.parse::<usize>().unwrap() < 30).await;
    broker.restart();
    source.wait_until("reconnected", |s| s.connected.load(Ordering::Relaxed)).await;
    publish(broker.port, numbered(200..300, QoS::AtLeastOnce)).await;

    let wanted: BTreeSet<String> = strings(30..300).into_iter().collect();
    let seen = source.take_all_of(&wanted).await;
    assert!(source.status.reconnects.load(Ordering::Relaxed) >= 1);
    assert!(seen.len() >= wanted.len());
    source.stop().await;
}

/// (d) A packet beyond `max_payload` + topic headroom (20 MiB) comes through the trimming relay
/// with its first `max_payload + 1` bytes (the feeder dead-letters it) and does not block the
/// messages behind it.
#[tokio::test]
async fn an_oversized_payload_does_not_block_the_queue() {
    let broker = Mosquitto::start();
    let max_payload = 1000;
    let source = Running::start(settings(&broker, "braid-test-oversized", max_payload), 1024).await;
    let big = vec![b'x'; 20 << 20];
    let topic = "devices/d1/status".to_owned();
    let messages = vec![
        (topic.clone(), b"before".to_vec(), QoS::AtLeastOnce),
        (topic.clone(), big.clone(), QoS::AtLeastOnce),
        (topic.clone(), b"after-1".to_vec(), QoS::AtLeastOnce),
        (topic, b"after-2".to_vec(), QoS::AtLeastOnce),
    ];
    publish(broker.port, messages).await;

    let seen = source.take_all_of(&["before", "after-1", "after-2"].map(String::from).into()).await;
    let trimmed = String::from_utf8(big[..max_payload as usize + 1].to_vec()).unwrap();
    assert!(
        seen.contains(&trimmed),
        "the oversized payload reached the feeder, trimmed: {:?}",
        seen.iter().map(String::len).collect::<Vec<_>>()
    );
    let after = seen.iter().position(|p| p == "after-1").unwrap();
    assert!(seen.iter().position(|p| *p == trimmed).unwrap() < after, "order kept");
    assert_eq!(source.status.oversized_relayed.load(Ordering::Relaxed), 1);
    assert_eq!(source.status.oversized_trimmed.load(Ordering::Relaxed), 1);
    source.stop().await;
}

/// (e) QoS 0 messages arrive too (and need no ack).
#[tokio::test]
async fn qos0_messages_arrive() {
    let broker = Mosquitto::start();
    let source = Running::start(settings(&broker, "braid-test-qos0", 4096), 1024).await;
    publish(broker.port, numbered(0..100, QoS::AtMostOnce)).await;
    assert_eq!(source.take(100, |_| true).await, strings(0..100));
    assert_eq!(source.status.acked.load(Ordering::Relaxed), 0);
    source.stop().await;
}

/// (f) Messages read in the same batch as an oversized packet are handed out once. rumqttc
/// queues the packets it parsed before the one that broke the connection and would hand them
/// out after the next ConnAck, with the old connection's packet ids, while the broker redelivers
/// them anyway. The backlog the broker sends right after the ConnAck reaches the source through
/// [`Gathering`], in one write: the small messages and the oversized one's header in one read.
#[tokio::test]
async fn messages_read_with_an_oversized_one_are_handed_out_once() {
    let broker = Mosquitto::start();
    let max_payload = 1000;
    let client_id = "braid-test-oversized-backlog";
    Running::start(settings(&broker, client_id, max_payload), 1024).await.stop().await;
    let topic = "devices/d1/status".to_owned();
    let mut messages: Vec<_> = (0..5).map(|i| (topic.clone(), i.to_string().into_bytes(), QoS::AtLeastOnce)).collect();
    messages.push((topic.clone(), vec![b'x'; 256 << 10], QoS::AtLeastOnce));
    messages.push((topic, b"after".to_vec(), QoS::AtLeastOnce));
    publish(broker.port, messages).await;

    let gathering = Gathering::start(broker.port);
    let via = SourceSettings {
        url: format!("mqtt://127.0.0.1:{}", gathering.port),
        ..settings(&broker, client_id, max_payload)
    };
    let source = Running::start(via, 1024).await;
    let mut seen = source.take_all_of(&["0", "1", "2", "3", "4", "after"].map(String::from).into()).await;
    source.wait_until("all acked", |s| s.acked.load(Ordering::Relaxed) >= 7).await;
    // Anything handed out twice would be in the channel by now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    while let Ok(delivery) = source.intake.try_recv() {
        seen.push(String::from_utf8_lossy(&delivery.payload).into_owned());
    }
    let small: Vec<_> = seen.iter().filter(|p| p.len() < 10).cloned().collect();
    assert_eq!(small, ["0", "1", "2", "3", "4", "after"], "each once, in order");
    assert_eq!(source.status.oversized_relayed.load(Ordering::Relaxed), 1);
    assert_eq!(source.status.received.load(Ordering::Relaxed), 7);
    source.stop().await;
}

/// A loopback TCP proxy to a broker that passes what the client sends at once and what the
/// broker sends in gathered writes: everything that arrives within [`Gathering::WINDOW`] of a
/// first byte goes on in one write, so the client reads it in one go.
struct Gathering {
    port: u16,
}

impl Gathering {
    const WINDOW: Duration = Duration::from_millis(100);

    fn start(broker_port: u16) -> Gathering {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(broker) = TcpStream::connect(("127.0.0.1", broker_port)) else { return };
                let (mut to_broker, mut from_client) = (broker.try_clone().unwrap(), client.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_client, &mut to_broker);
                    let _ = to_broker.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || Gathering::pass_gathered(broker, client));
            }
        });
        Gathering { port }
    }

    fn pass_gathered(mut broker: TcpStream, mut client: TcpStream) {
        use std::io::{Read, Write};
        let mut chunk = vec![0; 1 << 20];
        loop {
            broker.set_read_timeout(None).unwrap();
            let mut gathered = match broker.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => chunk[..n].to_vec(),
            };
            broker.set_read_timeout(Some(Gathering::WINDOW)).unwrap();
            let mut open = true;
            while open {
                match broker.read(&mut chunk) {
                    Ok(0) => open = false,
                    Ok(n) => gathered.extend_from_slice(&chunk[..n]),
                    Err(_) => break,
                }
            }
            if client.write_all(&gathered).is_err() || !open {
                break;
            }
        }
        let _ = client.shutdown(std::net::Shutdown::Write);
    }
}
