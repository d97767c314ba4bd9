//! MQTT for integration tests: a private mosquitto per test, a subscriber that records what it
//! receives, and a publisher that returns once the broker acknowledged everything.
//!
//! Each [`Mosquitto`] listens on 127.0.0.1 on a free port (never 1883, where a system broker may
//! run) with persistence in its own temporary folder, so a test can restart it and find its
//! sessions again. mosquitto is required: CI installs it (`apt-get install -y mosquitto`), and a
//! missing binary fails the test with that hint instead of skipping it. Every wait is bounded by
//! [`WAIT`] and fails the test with what it was waiting for.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS};
use serde_json::Value;

/// The mosquitto binary (Debian's package puts it here).
pub const MOSQUITTO: &str = "/usr/sbin/mosquitto";
/// The bound on every wait of this harness.
pub const WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// A free TCP port on 127.0.0.1 (bound once and released; a race with another process is
/// possible but unlikely).
pub fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding 127.0.0.1:0");
    l.local_addr().expect("local address of a bound socket").port()
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
fn accepts(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// A mosquitto process of this test; killed when dropped.
pub struct Mosquitto {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// While stopped or killed: the port, held for the next start ([`PortHold`]).
    hold: Option<PortHold>,
}

/// Keeps a stopped broker's port from other tests: a listener that accepts each connection and
/// closes it at once, which a client sees as a broker that is down. With the port free instead,
/// another test's `free_port` could take it meanwhile (seen: a braid's `[ops] listen` answered
/// a source's CONNECT with `HTTP/1.1 400`, and the restarted mosquitto could not bind).
struct PortHold {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PortHold {
    /// `None` when the port cannot be bound (taken in the moment since the broker let it go).
    fn bind(port: u16) -> Option<PortHold> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok()?;
        listener.set_nonblocking(true).ok()?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((connection, _)) => drop(connection),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Some(PortHold { stop, thread: Some(thread) })
    }
}

impl Drop for PortHold {
    /// Closes the listener (its thread owns it) before returning, so the port can be bound again.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Mosquitto {
    /// Starts mosquitto on a free port with persistence in a new temporary folder; returns once
    /// it accepts connections.
    pub fn start() -> Mosquitto {
        Mosquitto::start_with_listener("")
    }

    /// Like [`Mosquitto::start`], plus `listener` (config lines opening a second listener and
    /// its settings) under `per_listener_settings true`: the first listener stays anonymous
    /// whatever the second one demands (`tls.rs` uses this). Returns once the first listener
    /// accepts; the caller waits for its own.
    pub fn start_with_listener(listener: &str) -> Mosquitto {
        assert!(
            Path::new(MOSQUITTO).exists(),
            "{MOSQUITTO} is missing: the MQTT tests need mosquitto (apt-get install -y mosquitto)"
        );
        let dir = tempfile::Builder::new().prefix("braid-mosquitto-").tempdir().expect("temporary folder");
        let port = free_port();
        let mut conf = config(port, dir.path());
        if !listener.is_empty() {
            // Must come before any listener; the base listener's `allow_anonymous` is then its own.
            conf = format!("per_listener_settings true\n{conf}{listener}");
        }
        std::fs::write(dir.path().join("mosquitto.conf"), conf).expect("writing mosquitto.conf");
        let mut m = Mosquitto { port, dir, child: None, hold: None };
        m.spawn();
        m
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// Its folder (config, persistence file, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// SIGTERM and wait: mosquitto saves its persistence file (sessions, queued messages) on the
    /// way out. Its port stays held until the next start ([`PortHold`]).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
            // SAFETY: kill(2) on our own child's pid; it has not been waited for, so the pid is
            // still ours.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            wait_exit(&mut child);
            self.hold = PortHold::bind(self.port);
        }
    }

    /// Stops it (SIGTERM) if it runs and starts it again on the same port with the same folder.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// SIGKILL and wait: no persistence saved beyond the last autosave (every second). Its port
    /// stays held until the next start ([`PortHold`]).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            self.hold = PortHold::bind(self.port);
        }
    }

    fn spawn(&mut self) {
        self.hold = None;
        let conf = self.dir.path().join("mosquitto.conf");
        let child = Command::new(MOSQUITTO)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {MOSQUITTO}: {e}"));
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let mut waited = Duration::ZERO;
        while !accepts(self.port) {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("mosquitto exited with {status} on port {}; log:\n{}", self.port, self.log());
            }
            assert!(
                waited < WAIT,
                "mosquitto did not accept on port {} within {WAIT:?}; log:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(POLL);
            waited += POLL;
        }
    }
}

/// Waits until `broker`'s listener on `port` (another than its first) accepts TCP connections;
/// fails the test with the broker's log after [`WAIT`].
pub fn wait_accepting(port: u16, broker: &Mosquitto) {
    let mut waited = Duration::ZERO;
    while !accepts(port) {
        assert!(waited < WAIT, "mosquitto did not accept on port {port} within {WAIT:?}; log:\n{}", broker.log());
        std::thread::sleep(POLL);
        waited += POLL;
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

fn config(port: u16, dir: &Path) -> String {
    let dir = dir.display();
    format!(
        "listener {port} 127.0.0.1\n\
         allow_anonymous true\n\
         # As root, mosquitto would switch to user `mosquitto`, who cannot write this folder.\n\
         user root\n\
         persistence true\n\
         persistence_location {dir}/\n\
         autosave_interval 1\n\
         # Unlimited: a test's queued QoS 1 messages must not be dropped (the default is 1000).\n\
         max_queued_messages 0\n\
         log_dest file {dir}/mosquitto.log\n\
         log_type error\n\
         log_type warning\n\
         log_type notice\n"
    )
}

/// Waits for `child` to exit, at most [`WAIT`], then kills it.
fn wait_exit(child: &mut Child) {
    let mut waited = Duration::ZERO;
    while waited < WAIT {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(POLL);
        waited += POLL;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("mosquitto did not stop within {WAIT:?} of SIGTERM");
}

/// A client id no other client of this test run uses (mosquitto disconnects the older of two
/// clients with the same id).
fn unique_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime")
}

pub fn options(port: u16, client_id: &str, clean: bool) -> MqttOptions {
    let mut o = MqttOptions::new(client_id, "127.0.0.1", port);
    o.set_clean_session(clean).set_keep_alive(Duration::from_secs(5)).set_max_packet_size(1 << 20, 1 << 20);
    o
}

/// What a [`Subscriber`] received, in order.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A client on its own thread (own tokio runtime) that records every message of its filter. It
/// reconnects by itself (every 100 ms) while the broker is away, and acks what it receives.
pub struct Subscriber {
    received: Received,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Subscriber {
    /// A clean-session subscriber; returns once the broker acknowledged the subscription.
    pub fn connect(port: u16, filter: &str, qos: QoS) -> Subscriber {
        let id = unique_id("braid-test-sub");
        Subscriber::connect_with(port, filter, qos, &id, true)
    }

    /// A subscriber with a given client id; `clean = false` keeps its session (subscription and
    /// queued QoS 1 messages) at the broker across disconnects and broker restarts.
    pub fn connect_with(port: u16, filter: &str, qos: QoS, client_id: &str, clean: bool) -> Subscriber {
        Subscriber::connect_opts(options(port, client_id, clean), filter, qos)
    }

    /// A subscriber with these options (credentials, say); returns once a SubAck came, granted
    /// or not.
    pub fn connect_opts(opts: MqttOptions, filter: &str, qos: QoS) -> Subscriber {
        let port = opts.broker_address().1;
        let received = Received::default();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (filter, sink) = (filter.to_string(), received.clone());
        let thread = std::thread::Builder::new()
            .name("test-subscriber".into())
            .spawn(move || runtime().block_on(subscribe_loop(opts, filter, qos, sink, ready_tx, stop_rx)))
            .expect("subscriber thread");
        ready_rx.recv_timeout(WAIT).unwrap_or_else(|_| panic!("no SubAck from 127.0.0.1:{port} within {WAIT:?}"));
        Subscriber { received, stop: Some(stop_tx), thread: Some(thread) }
    }

    /// A snapshot of the (topic, payload) pairs received so far, in order.
    pub fn messages(&self) -> Vec<(String, Vec<u8>)> {
        self.received.lock().expect("subscriber lock").clone()
    }

    /// Waits until at least `n` messages arrived; false after `timeout`.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> bool {
        let mut waited = Duration::ZERO;
        loop {
            if self.received.lock().expect("subscriber lock").len() >= n {
                return true;
            }
            if waited >= timeout {
                return false;
            }
            std::thread::sleep(POLL);
            waited += POLL;
        }
    }

    /// The payloads parsed as JSON (a payload that is not JSON fails the test).
    pub fn json_rows(&self) -> Vec<Value> {
        self.messages()
            .iter()
            .map(|(topic, p)| {
                serde_json::from_slice(p)
                    .unwrap_or_else(|e| panic!("payload on {topic} is not JSON ({e}): {}", String::from_utf8_lossy(p)))
            })
            .collect()
    }

    /// Disconnects (sending DISCONNECT, so no will fires) and ends its thread.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn subscribe_loop(
    opts: MqttOptions,
    filter: String,
    qos: QoS,
    sink: Received,
    ready: std::sync::mpsc::Sender<()>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let (client, mut el) = AsyncClient::new(opts, 64);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            ev = el.poll() => match ev {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    sink.lock().expect("subscriber lock").push((p.topic.clone(), p.payload.to_vec()));
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = ready.send(());
                }
                // rumqttc does not resubscribe after a reconnect, and a clean session (or a
                // broker that lost ours) has no subscription: subscribe on every ConnAck (for a
                // kept session this only confirms it, queued messages stay queued).
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = client.try_subscribe(filter.clone(), qos);
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            },
        }
    }
    disconnect(&client, &mut el).await;
}

/// Sends DISCONNECT and waits (briefly) until it is written.
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

/// Publishes every message in order and returns once the broker has them: every PUBACK for
/// QoS 1, every publish written for QoS 0. Fails the test after [`WAIT`].
pub fn publish_all(port: u16, msgs: &[(String, Vec<u8>)], qos: QoS) {
    let id = unique_id("braid-test-pub");
    runtime().block_on(async {
        let (client, mut el) = AsyncClient::new(options(port, &id, true), msgs.len().max(1));
        for (topic, payload) in msgs {
            client.try_publish(topic.as_str(), qos, false, payload.clone()).expect("publish channel has room for all");
        }
        let mut done = 0;
        let confirm = async {
            while done < msgs.len() {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(_))) if qos != QoS::AtMostOnce => done += 1,
                    Ok(Event::Outgoing(Outgoing::Publish(_))) if qos == QoS::AtMostOnce => done += 1,
                    Ok(_) => {}
                    Err(e) => panic!("publishing to 127.0.0.1:{port}: {e}"),
                }
            }
        };
        let in_time = tokio::time::timeout(WAIT, confirm).await.is_ok();
        if !in_time {
            panic!("publish_all: only {done} of {} confirmed within {WAIT:?}", msgs.len());
        }
        disconnect(&client, &mut el).await;
    });
}
