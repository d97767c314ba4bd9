//! braid's MQTT TLS and credentials against a real mosquitto: the source and the sink over
//! `mqtts://` with `ca_file`, mutual TLS with `cert_file`/`key_file`, and `username` +
//! `password_file`. Each secured case has its refused twin (another CA, no client certificate,
//! a wrong password): braid keeps retrying without connecting, without panicking, and logs why.
//!
//! The certificates are made per test with the openssl CLI (`common/tls.rs`). The test's own
//! publisher and subscriber use the broker's plain anonymous listener, so what they see does
//! not depend on the TLS code under test.
#![allow(clippy::unwrap_used)] // test helpers: a panic is a failed test
#![allow(clippy::disallowed_methods)] // timing the test itself (deadlines), not engine time

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use braid::config::{MqttConn, Overflow, SinkDef, SinkKind};
use braid::sink::mqtt::{Uplink, UplinkError};
use braid::source::mqtt::{SourceError, SourceSettings, SourceStatus, subscription_filter};
use braid::source::{Confirmations, Delivery, Intake};
use common::mqtt::{Subscriber, WAIT, publish_all};
use common::tls::{Pki, SecureBroker, Security, password_file};
use crossbeam_channel::Receiver;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::watch;

/// How long a refused client is watched to make sure it never connects.
const REFUSED_FOR: Duration = Duration::from_secs(2);
const TOPIC: &str = "devices/+device/status";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Everything braid logged on one thread (the source's or the sink's io thread).
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;

    fn make_writer(&'a self) -> Log {
        self.clone()
    }
}

/// Runs `future` on a new thread with its own current-thread runtime (as braid's io thread
/// does), logging into `log`.
fn io_thread<T: Send + 'static>(
    log: &Log,
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> JoinHandle<T> {
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    std::thread::spawn(move || tracing::subscriber::with_default(subscriber, || rt().block_on(future)))
}

/// Polls `condition` every 10 ms for `period`; false as soon as it holds.
fn never_within(period: Duration, condition: impl Fn() -> bool) -> bool {
    let end = Instant::now() + period;
    while Instant::now() < end {
        if condition() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out after {WAIT:?} waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn numbered(range: std::ops::Range<usize>) -> Vec<(String, Vec<u8>)> {
    range.map(|i| (format!("devices/d{}/status", i % 3), i.to_string().into_bytes())).collect()
}

fn strings(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| i.to_string()).collect()
}

/// Publishes QoS 1 with options from braid's own builder (TLS, credentials) and returns once
/// every PUBACK arrived.
fn publish_with(options: MqttOptions, msgs: &[(String, Vec<u8>)]) {
    rt().block_on(async {
        let (client, mut events) = AsyncClient::new(options, msgs.len() + 1);
        for (topic, payload) in msgs {
            client.try_publish(topic.as_str(), QoS::AtLeastOnce, false, payload.clone()).unwrap();
        }
        let acked = async {
            let mut acked = 0;
            while acked < msgs.len() {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                    Ok(_) => {}
                    Err(e) => panic!("publishing over TLS: {e}"),
                }
            }
            client.try_disconnect().unwrap();
            while !matches!(events.poll().await, Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_)) {}
        };
        tokio::time::timeout(WAIT, acked).await.expect("every PUBACK within the wait");
    });
}

fn conn(client_id: &str) -> MqttConn {
    MqttConn { client_id: Some(client_id.into()), keep_alive_ms: Some(5_000), ..MqttConn::default() }
}

/// A braid MQTT source on its own io thread; the test is its feeder.
struct Source {
    intake: Receiver<Delivery>,
    confirmations: Arc<Confirmations>,
    status: Arc<SourceStatus>,
    shutdown: watch::Sender<bool>,
    thread: Option<JoinHandle<Result<(), SourceError>>>,
    log: Log,
}

impl Source {
    fn start(url: String, conn: MqttConn) -> Source {
        let settings = SourceSettings {
            index: 0,
            name: "devices".into(),
            url,
            conn,
            client_id: "braid-test-tls-devices".into(),
            own_login: None,
            filters: vec![subscription_filter(TOPIC)],
            max_payload: 4096,
            qos: QoS::AtLeastOnce,
        };
        let (sender, intake) = crossbeam_channel::bounded(1024);
        let (bell, _sleeper) = braid::shard::wake::Doorbell::new().unwrap();
        let (confirmations, status) = (Confirmations::new(1), Arc::new(SourceStatus::default()));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let log = Log::default();
        let run = braid::source::mqtt::run(
            settings,
            Intake::new(sender, bell),
            Arc::clone(&confirmations),
            Arc::clone(&status),
            shutdown_rx,
        );
        let thread = Some(io_thread(&log, run));
        Source { intake, confirmations, status, shutdown, thread, log }
    }

    fn connected(&self) -> bool {
        self.status.connected.load(Ordering::Relaxed)
    }

    fn wait_subscribed(&self) {
        until("the source is subscribed", || self.status.subscribed.load(Ordering::Relaxed));
    }

    /// Reads and confirms `n` deliveries; their payloads in order of arrival.
    fn take(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        (0..n)
            .map(|i| {
                let left = deadline.saturating_duration_since(Instant::now());
                let delivery = self.intake.recv_timeout(left).unwrap_or_else(|e| {
                    panic!("delivery {i} of {n}: {e}; {:?}\nlog:\n{}", self.status, self.log.text())
                });
                self.confirmations.confirm(0, delivery.seq);
                String::from_utf8(delivery.payload.to_vec()).unwrap()
            })
            .collect()
    }

    /// Shuts it down; it must end in time and without an error.
    fn stop(mut self) {
        self.shutdown.send(true).unwrap();
        let thread = self.thread.take().unwrap();
        until("the source ends after shutdown", || thread.is_finished());
        thread.join().expect("the source did not panic").expect("the source ends without an error");
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// A braid MQTT sink (spool + forwarding task on its own io thread).
struct Sink {
    uplink: Arc<Uplink>,
    shutdown: watch::Sender<bool>,
    thread: Option<JoinHandle<Result<(), UplinkError>>>,
    log: Log,
}

impl Sink {
    fn start(url: String, conn: MqttConn, spool: &std::path::Path) -> Sink {
        let def = SinkDef {
            name: "upstream".into(),
            kind: SinkKind::Mqtt,
            inputs: vec!["effect".into()],
            url: Some(url),
            topic: Some("results/{device}".into()),
            qos: 1,
            buffer: 1 << 20,
            overflow: Overflow::Block,
            path: None,
            conn,
            status_topic: Some("status/upstream".into()),
        };
        let uplink = Uplink::open(&def, spool).unwrap();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let log = Log::default();
        let thread =
            Some(io_thread(&log, braid::sink::mqtt::run(Arc::clone(&uplink), def, shutdown_rx, Duration::ZERO)));
        Sink { uplink, shutdown, thread, log }
    }

    fn push(&self, range: std::ops::Range<usize>) {
        let stop = AtomicBool::new(false);
        for i in range {
            self.uplink.push("results/dev", i.to_string().as_bytes(), &stop).unwrap();
        }
    }

    /// Shuts it down (no drain); it must end in time and without an error.
    fn stop(mut self) {
        self.shutdown.send(true).unwrap();
        let thread = self.thread.take().unwrap();
        until("the sink ends after shutdown", || thread.is_finished());
        thread.join().expect("the sink did not panic").expect("the sink ends without an error");
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

fn payloads(subscriber: &Subscriber) -> Vec<String> {
    subscriber.messages().into_iter().map(|(_, p)| String::from_utf8(p).unwrap()).collect()
}

/// 1. A source on `mqtts://` trusting the test CA receives, in order, what is published to the
///    broker over plain MQTT and over TLS.
#[test]
fn source_over_tls_receives_plain_and_tls_publishes() {
    let pki = Pki::make();
    let broker = SecureBroker::start(&pki, &Security::default());
    let tls = MqttConn { ca_file: Some(pki.file("ca.pem")), ..conn("braid-tls-source") };
    let source = Source::start(broker.tls_url(), tls.clone());
    source.wait_subscribed();

    publish_all(broker.broker.port(), &numbered(0..20), QoS::AtLeastOnce);
    let publisher = MqttConn { client_id: Some("tls-publisher".into()), ..tls };
    publish_with(braid::mqtt::options(&broker.tls_url(), &publisher, "unused").unwrap(), &numbered(20..40));

    assert_eq!(source.take(40), strings(0..40));
    assert!(source.log.text().contains("MQTT source connected"), "{}", source.log.text());
    source.stop();
}

/// 1''. Over TLS too, a publish over every limit (3 MiB for a `max_payload` of 4 KiB) comes
///    through the trimming relay (which then speaks TLS to the broker) cut to `max_payload + 1`
///    bytes, and the messages behind it follow in order.
#[test]
fn an_oversized_publish_reaches_a_tls_source_trimmed_and_does_not_block_it() {
    let pki = Pki::make();
    let broker = SecureBroker::start(&pki, &Security::default());
    let tls = MqttConn { ca_file: Some(pki.file("ca.pem")), ..conn("braid-tls-oversized") };
    let source = Source::start(broker.tls_url(), tls);
    source.wait_subscribed();

    let mut messages = vec![("devices/big/status".to_owned(), vec![b'x'; 3 << 20])];
    messages.extend(numbered(0..5));
    rt().block_on(async {
        let mut options = MqttOptions::new("big-publisher", "127.0.0.1", broker.broker.port());
        options.set_max_packet_size(4 << 20, 4 << 20);
        let (client, mut events) = AsyncClient::new(options, messages.len() + 1);
        for (topic, payload) in &messages {
            client.try_publish(topic.as_str(), QoS::AtLeastOnce, false, payload.clone()).unwrap();
        }
        let mut acked = 0;
        let all = async {
            while acked < messages.len() {
                if let Event::Incoming(Packet::PubAck(_)) = events.poll().await.unwrap() {
                    acked += 1;
                }
            }
        };
        tokio::time::timeout(WAIT, all).await.expect("every PUBACK within the wait");
    });

    let mut want = vec!["x".repeat(4097)];
    want.extend(strings(0..5));
    assert_eq!(source.take(6), want, "log:\n{}", source.log.text());
    assert_eq!(source.status.oversized_trimmed.load(Ordering::Relaxed), 1);
    assert_eq!(source.status.oversized_relayed.load(Ordering::Relaxed), 1);
    source.stop();
}

/// 1'. A source trusting another CA never connects: no panic, it keeps trying, logs why, and
///    stops cleanly when asked.
#[test]
fn source_with_a_wrong_ca_never_connects() {
    let pki = Pki::make();
    let broker = SecureBroker::start(&pki, &Security::default());
    let rogue = MqttConn { ca_file: Some(pki.file("rogue-ca.pem")), ..conn("braid-tls-rogue") };
    let source = Source::start(broker.tls_url(), rogue);

    assert!(never_within(REFUSED_FOR, || source.connected()), "connected to a broker it must not trust");
    assert!(!source.thread.as_ref().unwrap().is_finished(), "the source gave up (or panicked) instead of retrying");
    let log = source.log.text();
    assert!(log.contains("MQTT source cannot connect"), "no error logged:\n{log}");
    assert!(log.contains("UnknownIssuer"), "the error does not say the certificate is untrusted:\n{log}");
    assert!(broker.log_lines("unknown ca") >= 2, "mosquitto saw fewer than 2 attempts:\n{}", broker.broker.log());
    source.stop();
}

/// 2. A sink on `mqtts://` trusting the test CA delivers every pushed result, in order, and
///    empties its spool.
#[test]
fn sink_over_tls_delivers_in_order() {
    let pki = Pki::make();
    let broker = SecureBroker::start(&pki, &Security::default());
    let subscriber = Subscriber::connect(broker.broker.port(), "results/#", QoS::AtLeastOnce);
    let spool = tempfile::tempdir().unwrap();
    let tls = MqttConn { ca_file: Some(pki.file("ca.pem")), ..conn("braid-tls-sink") };
    let sink = Sink::start(broker.tls_url(), tls, spool.path());

    sink.push(0..300);
    assert!(
        subscriber.wait_for(300, WAIT),
        "only {} of 300 arrived; sink log:\n{}",
        subscriber.messages().len(),
        sink.log.text()
    );
    assert_eq!(payloads(&subscriber), strings(0..300));
    until("the spool is empty", || sink.uplink.stats().queued_rows == 0);
    let stats = sink.uplink.stats();
    assert!(stats.connected && stats.sent_total == 300, "{stats:?}");
    sink.stop();
}

/// 3. Mutual TLS (`require_certificate true`): a sink without a client certificate, or with one
///    from another CA, never connects and keeps its results; the same spool reopened with
///    `cert_file` + `key_file` delivers them all, in order.
#[test]
fn mutual_tls_needs_the_client_certificate() {
    let pki = Pki::make();
    let broker = SecureBroker::start(&pki, &Security { require_certificate: true, ..Security::default() });
    let subscriber = Subscriber::connect(broker.broker.port(), "results/#", QoS::AtLeastOnce);
    let spool = tempfile::tempdir().unwrap();
    let server_only = MqttConn { ca_file: Some(pki.file("ca.pem")), ..conn("braid-mtls-sink") };
    let rogue_cert = MqttConn {
        cert_file: Some(pki.file("rogue-client.pem")),
        key_file: Some(pki.file("rogue-client.key")),
        ..server_only.clone()
    };

    // What the broker's TLS alert says, as braid logs it.
    let refused = [
        ("no client certificate", server_only.clone(), "CertificateRequired"),
        ("another CA's certificate", rogue_cert, "UnknownCA"),
    ];
    for (run, (what, conn, alert)) in (1..).zip(refused) {
        // Each refused run pushes 50 more; what earlier runs could not send stays spooled.
        let sink = Sink::start(broker.tls_url(), conn, spool.path());
        sink.push(0..50);
        assert!(never_within(REFUSED_FOR, || sink.uplink.stats().connected), "connected with {what}");
        let stats = sink.uplink.stats();
        assert_eq!((stats.sent_total, stats.queued_rows), (0, 50 * run), "with {what}: {stats:?}");
        assert!(!sink.thread.as_ref().unwrap().is_finished(), "with {what} the sink gave up instead of retrying");
        let log = sink.log.text();
        let warned = log.lines().filter(|l| l.contains("WARN") && l.contains("Uplink cannot connect")).count();
        assert!(log.contains(alert), "with {what} the log does not say {alert}:\n{log}");
        assert_eq!(warned, 1, "with {what}: one rate-limited warning at the default level:\n{log}");
        sink.stop();
    }
    assert!(subscriber.messages().is_empty(), "results arrived without mutual TLS");

    let mutual =
        MqttConn { cert_file: Some(pki.file("client.pem")), key_file: Some(pki.file("client.key")), ..server_only };
    let sink = Sink::start(broker.tls_url(), mutual, spool.path());
    assert_eq!(sink.uplink.stats().queued_rows, 100, "both refused runs' results were kept");
    assert!(
        subscriber.wait_for(100, WAIT),
        "only {} of 100 arrived; sink log:\n{}",
        subscriber.messages().len(),
        sink.log.text()
    );
    let expected: Vec<String> = strings(0..50).into_iter().chain(strings(0..50)).collect();
    assert_eq!(payloads(&subscriber), expected);
    until("the spool is empty", || sink.uplink.stats().queued_rows == 0);
    sink.stop();
}

/// 4. `username` + `password_file` against `allow_anonymous false`: the right password (in a
///    file ending in a newline, which braid trims) connects and receives; a wrong one never
///    connects, and braid retries with backoff (a handful of attempts in 2.5 s, not thousands).
#[test]
fn username_and_password_file() {
    let pki = Pki::make();
    let secrets = tempfile::tempdir().unwrap();
    let passwd = password_file(secrets.path(), "gateway", "s3cret");
    let broker = SecureBroker::start(&pki, &Security { password_file: Some(passwd), ..Security::default() });
    let (right, wrong) = (secrets.path().join("right"), secrets.path().join("wrong"));
    std::fs::write(&right, "s3cret\n").unwrap();
    std::fs::write(&wrong, "s3cret-not\n").unwrap();
    let login = |id: &str, file: &std::path::Path| MqttConn {
        ca_file: Some(pki.file("ca.pem")),
        username: Some("gateway".into()),
        password_file: Some(file.display().to_string()),
        ..conn(id)
    };

    let source = Source::start(broker.tls_url(), login("braid-auth-right", &right));
    source.wait_subscribed();
    publish_all(broker.broker.port(), &numbered(0..10), QoS::AtLeastOnce);
    assert_eq!(source.take(10), strings(0..10));
    source.stop();

    let watched = Duration::from_millis(2500);
    let source = Source::start(broker.tls_url(), login("braid-auth-wrong", &wrong));
    assert!(never_within(watched, || source.connected()), "connected with a wrong password");
    // mosquitto names a refused client `<unknown>`; the right login before was never refused.
    let attempts = broker.log_lines("disconnected, not authorised");
    // Backoff from 100 ms, doubling, jittered into [cur/2, cur): at most ~6 attempts in 2.5 s.
    assert!((2..=10).contains(&attempts), "{attempts} refused attempts in {watched:?}:\n{}", broker.broker.log());
    let log = source.log.text();
    assert!(log.contains("MQTT source cannot connect") && log.contains("NotAuthorized"), "{log}");
    source.stop();
}
