//! braid's embedded MQTT broker: rumqttd 0.20 in this process, for gateways that have no broker
//! of their own (`[sources.X] kind = "embedded"`) and for `braid demo`.
//!
//! Design (docs/edge-io-research.md §2, README "Security"):
//! - **Two listeners.** Devices reach the broker only through the **gate** ([`gate`]) on
//!   `listen`: it authenticates every client against the users file ([`users`]), checks every
//!   PUBLISH and SUBSCRIBE against the ACL file ([`acl`]), and forwards what passes to rumqttd.
//!   rumqttd listens on a free loopback port and accepts one password only: a random secret made
//!   at [`start`] that never leaves this process ([`EmbeddedBroker::own_login`]). rumqttd 0.20 has
//!   a CONNECT hook but no per-topic check, hence the gate (gate.rs says why not braid's intake).
//! - **Same path as an external broker.** braid's MQTT source connects to rumqttd over TCP with
//!   rumqttc, exactly as it connects to mosquitto, with the secret as its password; rumqttd's
//!   in-process `link` API is not used, so there is one source implementation to test. No device
//!   can take its session: the gate puts [`gate::DEVICE_ID_PREFIX`] before every device's client
//!   id, and rumqttd's port refuses anyone without the secret.
//! - **MQTT 3.1.1, QoS 0 and 1.** rumqttd disconnects QoS 2 publishers. Persistent sessions
//!   (`clean_session = false`) keep their subscriptions and queued QoS 1 messages while the client
//!   is away, in memory only: a restart of braid loses them (the devices' own retries cover it).
//! - **Small memory.** rumqttd keeps a commit log per subscription filter of
//!   [`SEGMENT_COUNT`] segments of [`SEGMENT_SIZE`] bytes (at least one payload): about 4 MiB per
//!   filter instead of the 1 GB of rumqttd's sample config.
//! - **Threads are leaked.** rumqttd starts a router thread and one thread per listener and has
//!   no shutdown API, and the gate runs on a thread of its own, so an [`EmbeddedBroker`] runs until
//!   the process exits; dropping it does not stop it. Tests use a fresh port per broker and accept
//!   the leak. The users and ACL files are read again by [`EmbeddedBroker::reload`] (SIGHUP).
//! - **Readiness.** [`start`] binds `listen` itself and hands the socket to the gate, so a port
//!   held by another process (often a system mosquitto on 1883) gives [`BrokerError::AddrInUse`]
//!   instead of a broker that never comes up. It then waits, bounded by [`READY_TIMEOUT`], until
//!   rumqttd's port accepts a TCP connection.
//! - **Logs.** rumqttd logs routine events at ERROR (every probe or client that disconnects
//!   without a DISCONNECT packet: "Error while handling MQTT connect packet", "connection-stop").
//!   The service adds [`TRACING_DIRECTIVE`] (`rumqttd=off`) to its `EnvFilter` unless the user
//!   names `rumqttd` in `RUST_LOG`; what matters to the user (the port, TLS and access files) is
//!   checked here and reported as a [`BrokerError`], refusals by the gate are logged (rate
//!   limited) and counted ([`Refusals`]).
//! - **TLS** is the gate's, with the cargo feature `embedded-broker-tls`: rustls 0.23 with ring,
//!   the stack braid's MQTT clients use already (through rumqttc's tokio-rustls). Without the
//!   feature `tls: Some(..)` is [`BrokerError::TlsUnavailable`]. With a `ca_file` every device
//!   must present a certificate that chains to it (mutual TLS); the certificate is checked at the
//!   handshake and does not name the user (the users file does).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rumqttd::{Broker, Config, ConnectionSettings, MetricType, RouterConfig, ServerSettings};
use tokio::sync::watch;

pub mod acl;
pub mod gate;
pub mod users;

pub use gate::{Policy, Refusals};

/// The address of `kind = "embedded"` when the config sets no `listen`.
pub const DEFAULT_LISTEN: SocketAddr = crate::config::DEFAULT_EMBEDDED_LISTEN;
/// The `tracing_subscriber::EnvFilter` directive that keeps rumqttd's routine ERROR lines away
/// from the user (see the module doc).
pub const TRACING_DIRECTIVE: &str = "rumqttd=off";
/// How long [`start`] waits for the listener to accept connections.
pub const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// Commit-log segment size per subscription filter (raised to the max payload when that is larger).
pub const SEGMENT_SIZE: usize = 1 << 20;
/// Segments kept per subscription filter.
pub const SEGMENT_COUNT: usize = 4;
/// What the broker holds in memory per subscription filter for braid while braid does not take
/// input (a full disk, a full sink buffer): when a filter needs more, rumqttd drops its oldest
/// segment — at least [`SEGMENT_SIZE`] of messages braid has not read — and braid counts it
/// ([`Refusals::lost`], `braid_broker_lost_total`) and warns.
pub const HELD_PER_FILTER: usize = SEGMENT_SIZE * SEGMENT_COUNT;
/// How often rumqttd hands over its alerts (the segments it dropped unread).
const ALERTS_EVERY_S: u64 = 1;
/// The user name of braid's own clients on rumqttd's port (the secret is what counts).
pub const OWN_USER: &str = "braid";

const READY_POLL: Duration = Duration::from_millis(10);
/// Un-acked QoS 1 messages the broker sends one client before waiting for its PUBACKs.
const MAX_INFLIGHT: usize = 100;
const MAX_CONNECTIONS: usize = 1_000;
/// A client must send CONNECT within this time after its TCP connect.
const CONNECT_TIMEOUT_MS: u16 = 5_000;
/// Random bytes of the secret on rumqttd's port.
const SECRET_BYTES: usize = 32;

/// What the embedded broker listens on and who may use it.
#[derive(Clone, Debug)]
pub struct BrokerSettings {
    /// Port 0 picks a free port ([`EmbeddedBroker::addr`] tells which).
    pub listen: SocketAddr,
    /// The largest publish payload accepted, in bytes; a client sending more is disconnected.
    pub max_payload: usize,
    pub tls: Option<BrokerTls>,
    pub access: AccessFiles,
}

/// TLS on the embedded broker's listener (feature `embedded-broker-tls`), PEM files.
#[derive(Clone, Debug)]
pub struct BrokerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// A CA that every device's client certificate must chain to (mutual TLS).
    pub ca_file: Option<PathBuf>,
}

/// `users_file`, `acl_file` and `anonymous` of the source (CONTRACT.md "Extensions under way").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessFiles {
    pub users_file: Option<PathBuf>,
    pub acl_file: Option<PathBuf>,
    /// Clients without a user name are let in although there is a users file.
    pub anonymous: bool,
}

impl AccessFiles {
    /// Reads and checks both files.
    pub fn load(&self) -> Result<Policy, BrokerError> {
        let users = match &self.users_file {
            Some(path) => Some(users::Users::parse(&read_access_file(path)?).map_err(|e| line_error(path, e))?),
            None => None,
        };
        let acl = match &self.acl_file {
            Some(path) => Some(acl::Acl::parse(&read_access_file(path)?).map_err(|e| line_error(path, e))?),
            None => None,
        };
        Ok(Policy { users, acl, anonymous: self.anonymous })
    }
}

fn read_access_file(path: &Path) -> Result<String, BrokerError> {
    std::fs::read_to_string(path).map_err(|e| BrokerError::AccessFile {
        path: path.to_owned(),
        line: 0,
        reason: e.to_string(),
    })
}

fn line_error(path: &Path, error: users::LineError) -> BrokerError {
    BrokerError::AccessFile { path: path.to_owned(), line: error.line, reason: error.reason }
}

/// A running embedded broker. It runs until the process exits (rumqttd has no shutdown).
pub struct EmbeddedBroker {
    addr: SocketAddr,
    internal: SocketAddr,
    secret: Arc<str>,
    access: Mutex<AccessFiles>,
    policy: watch::Sender<Arc<Policy>>,
    refusals: Arc<Refusals>,
}

impl std::fmt::Debug for EmbeddedBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("EmbeddedBroker").field("addr", &self.addr).field("internal", &self.internal).finish()
    }
}

impl EmbeddedBroker {
    /// The address devices connect to (the actual port when the settings asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where braid's own client connects, in plain MQTT over loopback, with [`Self::own_login`]:
    /// rumqttd's port, which nobody without the secret can use.
    pub fn local_addr(&self) -> SocketAddr {
        self.internal
    }

    /// The user name and password of braid's own clients on [`Self::local_addr`].
    pub fn own_login(&self) -> (String, String) {
        (OWN_USER.to_owned(), self.secret.to_string())
    }

    /// What the gate refused so far.
    pub fn refusals(&self) -> Arc<Refusals> {
        Arc::clone(&self.refusals)
    }

    /// Reads the users and ACL files again (`access`: a reloaded configuration may name other
    /// files; `None`: the same ones). On an error the running policy stays.
    pub fn reload(&self, access: Option<&AccessFiles>) -> Result<(), BrokerError> {
        let mut current = self.access.lock().unwrap_or_else(PoisonError::into_inner);
        let files = access.unwrap_or(&current).clone();
        let policy = files.load()?;
        *current = files;
        self.policy.send_replace(Arc::new(policy));
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error(
        "embedded broker: {addr} is already in use (is another MQTT broker, e.g. mosquitto, running? \
         use kind = \"mqtt\" to connect to it, or set another `listen`)"
    )]
    AddrInUse { addr: SocketAddr },
    #[error("embedded broker: cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("embedded broker: {addr} did not accept connections within {waited:?}")]
    NotReady { addr: SocketAddr, waited: Duration },
    #[error("embedded broker: cannot start its thread: {0}")]
    Spawn(io::Error),
    #[error("embedded broker: max payload must be at least 1 byte")]
    ZeroMaxPayload,
    #[error("embedded broker: TLS needs braid built with the cargo feature `embedded-broker-tls`")]
    TlsUnavailable,
    #[error("embedded broker: TLS file {path}: {reason}")]
    TlsFile { path: PathBuf, reason: String },
    #[error("embedded broker: {}{}: {reason}", path.display(), if *line > 0 { format!(":{line}") } else { String::new() })]
    AccessFile { path: PathBuf, line: usize, reason: String },
    #[error("embedded broker: no random secret: {0}")]
    Random(&'static str),
}

impl BrokerError {
    /// Whether starting again later may succeed without a configuration change (the port may be
    /// freed, the system may have threads again); the others need the configuration fixed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, BrokerError::AddrInUse { .. } | BrokerError::NotReady { .. } | BrokerError::Spawn(_))
    }
}

/// Starts the broker and returns once it accepts connections (at most [`READY_TIMEOUT`]).
pub fn start(settings: BrokerSettings) -> Result<EmbeddedBroker, BrokerError> {
    if settings.max_payload == 0 {
        return Err(BrokerError::ZeroMaxPayload);
    }
    let tls = settings.tls.as_ref().map(tls_acceptor).transpose()?;
    let policy = settings.access.load()?;
    let devices = bind(settings.listen)?;
    let addr = devices.local_addr().map_err(|source| BrokerError::Bind { addr: settings.listen, source })?;
    let internal = claim(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let secret: Arc<str> = random_secret()?.into();
    let mut broker = Broker::new(rumqttd_config(internal, &secret, &settings));
    let refusals = Arc::new(Refusals::default());
    let alerts = broker.alerts().map_err(|e| BrokerError::Spawn(io::Error::other(e.to_string())))?;
    spawn_alert_counter(alerts, Arc::clone(&refusals))?;
    std::thread::Builder::new()
        .name("braid-broker".into())
        .spawn(move || {
            // start() blocks for ever, joining the listener threads; it returns only when the
            // listener could not even be configured, and then the readiness wait reports it.
            if let Err(e) = broker.start() {
                tracing::error!(error = %e, "Embedded broker stopped");
            }
        })
        .map_err(BrokerError::Spawn)?;
    let (policy_tx, policy_rx) = watch::channel(Arc::new(policy));
    let shared =
        gate::Shared::new(internal, Arc::clone(&secret), policy_rx, Arc::clone(&refusals), settings.max_payload);
    spawn_gate(devices, shared, tls)?;
    wait_ready(internal)?;
    Ok(EmbeddedBroker { addr, internal, secret, access: Mutex::new(settings.access), policy: policy_tx, refusals })
}

/// Counts rumqttd's cursor jumps — messages of a subscription dropped before braid read them,
/// because its in-memory log was full ([`HELD_PER_FILTER`]) — and warns (at most once every
/// 30 s). Runs, like the broker, until the process exits.
fn spawn_alert_counter(alerts: rumqttd::alerts::AlertsLink, counts: Arc<Refusals>) -> Result<(), BrokerError> {
    std::thread::Builder::new()
        .name("braid-broker-alerts".into())
        .spawn(move || {
            let mut warned: Option<std::time::Instant> = None;
            while let Ok(batch) = alerts.router_rx.recv() {
                let jumps = batch.iter().filter(|a| a.kind.name() == "cursor_jump").count();
                if jumps == 0 {
                    continue;
                }
                let total = counts.lost.fetch_add(jumps as u64, std::sync::atomic::Ordering::Relaxed) + jumps as u64;
                if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(30)) {
                    warned = Some(crate::storage::write_faults::now());
                    tracing::warn!(
                        times = total,
                        held_per_filter = HELD_PER_FILTER,
                        "Embedded broker dropped messages braid had not taken yet (its in-memory log per subscription is full while braid holds input)"
                    );
                }
            }
        })
        .map(drop)
        .map_err(BrokerError::Spawn)
}

/// The gate's thread: a current-thread tokio runtime accepting devices on `devices`.
fn spawn_gate(devices: TcpListener, shared: gate::Shared, tls: Option<gate::Tls>) -> Result<(), BrokerError> {
    let addr = devices.local_addr().map_err(|source| BrokerError::Bind { addr: DEFAULT_LISTEN, source })?;
    devices.set_nonblocking(true).map_err(|source| BrokerError::Bind { addr, source })?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(BrokerError::Spawn)?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(devices).map_err(|source| BrokerError::Bind { addr, source })?
    };
    std::thread::Builder::new()
        .name("braid-gate".into())
        .spawn(move || runtime.block_on(gate::serve(listener, Arc::new(shared), tls)))
        .map_err(BrokerError::Spawn)?;
    Ok(())
}

/// A secret nobody outside this process can guess: 32 random bytes from the OS, base64.
fn random_secret() -> Result<String, BrokerError> {
    use base64::Engine;
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; SECRET_BYTES];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| BrokerError::Random("the OS gave none"))?;
    Ok(base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes))
}

/// For `braid demo`: `preferred` if it can be bound now, else a free port on the same IP.
pub fn free_addr(preferred: SocketAddr) -> io::Result<SocketAddr> {
    match TcpListener::bind(preferred) {
        Ok(l) => l.local_addr(),
        Err(_) => TcpListener::bind(SocketAddr::new(preferred.ip(), 0))?.local_addr(),
    }
}

/// Binds the devices' address for the gate. std sets SO_REUSEADDR on Unix, so connections a
/// previous braid left in TIME_WAIT do not make a quick restart fail, while a port another
/// process listens on does.
fn bind(listen: SocketAddr) -> Result<TcpListener, BrokerError> {
    match TcpListener::bind(listen) {
        Ok(listener) => Ok(listener),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(BrokerError::AddrInUse { addr: listen }),
        Err(source) => Err(BrokerError::Bind { addr: listen, source }),
    }
}

/// Binds `listen` once to resolve port 0, then releases it for rumqttd. Another process could
/// take the port in between; the readiness wait then fails.
fn claim(listen: SocketAddr) -> Result<SocketAddr, BrokerError> {
    bind(listen)?.local_addr().map_err(|source| BrokerError::Bind { addr: listen, source })
}

/// rumqttd on `internal` only, accepting the secret as password and nothing else.
fn rumqttd_config(internal: SocketAddr, secret: &Arc<str>, settings: &BrokerSettings) -> Config {
    let mut connections = ConnectionSettings {
        connection_timeout_ms: CONNECT_TIMEOUT_MS,
        max_payload_size: settings.max_payload,
        max_inflight_count: MAX_INFLIGHT,
        auth: None,
        external_auth: None,
        dynamic_filters: true,
    };
    let secret = Arc::clone(secret);
    connections.set_auth_handler(move |_client_id, _user, password: String| {
        std::future::ready(users::same_bytes(password.as_bytes(), secret.as_bytes()))
    });
    let server = ServerSettings {
        name: "braid-broker-internal".into(),
        listen: internal,
        tls: None,
        next_connection_delay_ms: 1,
        connections,
    };
    let router = RouterConfig {
        max_connections: MAX_CONNECTIONS,
        max_outgoing_packet_count: 200,
        // A segment holds at least one message, so it must fit the largest payload.
        max_segment_size: SEGMENT_SIZE.max(settings.max_payload),
        max_segment_count: SEGMENT_COUNT,
        ..RouterConfig::default()
    };
    // Alerts (a subscription's unread messages dropped) every second, counted by braid; rumqttd's
    // timer needs both kinds set (it unwraps each), so meters go hourly to no one.
    let every =
        |secs: u64| serde_json::from_value::<rumqttd::MetricSettings>(serde_json::json!({ "push_interval": secs }));
    let metrics = match (every(ALERTS_EVERY_S), every(3600)) {
        (Ok(alerts), Ok(meters)) => Some(HashMap::from([(MetricType::Alerts, alerts), (MetricType::Meters, meters)])),
        _ => None,
    };
    // No v5, websocket, console, prometheus, bridge or cluster: only the v4 listener.
    Config { id: 0, router, v4: Some(HashMap::from([("1".to_string(), server)])), metrics, ..Config::default() }
}

#[cfg(not(feature = "embedded-broker-tls"))]
fn tls_acceptor(_tls: &BrokerTls) -> Result<gate::Tls, BrokerError> {
    Err(BrokerError::TlsUnavailable)
}

/// The gate's TLS: the certificate chain and key, and with a `ca_file` mandatory client
/// certificates chaining to it. Every file is read here, so a bad one is an error at start.
#[cfg(feature = "embedded-broker-tls")]
fn tls_acceptor(tls: &BrokerTls) -> Result<gate::Tls, BrokerError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let file_error = |path: &PathBuf, reason: String| BrokerError::TlsFile { path: path.clone(), reason };
    let certificates = |path: &PathBuf| -> Result<Vec<CertificateDer<'static>>, BrokerError> {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| file_error(path, e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| file_error(path, e.to_string()))?;
        if certs.is_empty() {
            return Err(file_error(path, "no PEM certificate in it".into()));
        }
        Ok(certs)
    };
    let chain = certificates(&tls.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key_file).map_err(|e| file_error(&tls.key_file, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| file_error(&tls.cert_file, e.to_string()))?;
    let builder = match &tls.ca_file {
        None => builder.with_no_client_auth(),
        Some(ca_file) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ca_file)? {
                roots.add(cert).map_err(|e| file_error(ca_file, e.to_string()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| file_error(ca_file, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain, key).map_err(|e| file_error(&tls.key_file, e.to_string()))?;
    Ok(rumqttc::tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Connects to `addr` until it answers, at most [`READY_TIMEOUT`] (counted in sleeps: braid
/// reads the clock only where it measures time).
fn wait_ready(addr: SocketAddr) -> Result<(), BrokerError> {
    let target = SocketAddr::new(connectable(addr.ip()), addr.port());
    let mut waited = Duration::ZERO;
    while waited < READY_TIMEOUT {
        if TcpStream::connect_timeout(&target, READY_POLL * 10).is_ok() {
            return Ok(());
        }
        std::thread::sleep(READY_POLL);
        waited += READY_POLL;
    }
    Err(BrokerError::NotReady { addr, waited })
}

/// A wildcard listen address is probed on the loopback of its family.
fn connectable(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => other,
    }
}

/// Test clients (also used by the demo's device simulator tests).
#[cfg(test)]
pub(crate) mod tests;
