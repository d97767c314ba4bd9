//! braid's embedded MQTT broker: rumqttd 0.20 in this process, for gateways that have no broker
//! of their own (`[sources.X] kind = "embedded"`) and for `braid demo`.
//!
//! Design (docs/edge-io-research.md §2):
//! - **Same path as an external broker.** braid's MQTT source connects to it over TCP with
//!   rumqttc, exactly as it connects to mosquitto; rumqttd's in-process `link` API is not used, so
//!   there is one source implementation to test.
//! - **MQTT 3.1.1, QoS 0 and 1.** rumqttd disconnects QoS 2 publishers. Persistent sessions
//!   (`clean_session = false`) keep their subscriptions and queued QoS 1 messages while the client
//!   is away, in memory only: a restart of braid loses them (the devices' own retries cover it).
//! - **Small memory.** rumqttd keeps a commit log per subscription filter of
//!   [`SEGMENT_COUNT`] segments of [`SEGMENT_SIZE`] bytes (at least one payload): about 4 MiB per
//!   filter instead of the 1 GB of rumqttd's sample config.
//! - **Threads are leaked.** rumqttd starts a router thread and one thread per listener and has
//!   no shutdown API, so an [`EmbeddedBroker`] runs until the process exits; dropping it does not
//!   stop it. Tests use a fresh port per broker and accept the leak.
//! - **Readiness.** [`start`] first binds the address itself, so a port held by another process
//!   (often a system mosquitto on 1883) gives [`BrokerError::AddrInUse`] instead of a broker that
//!   never comes up, or worse a readiness probe answered by the other broker. It then waits,
//!   bounded by [`READY_TIMEOUT`], until a TCP connect succeeds.
//! - **Logs.** rumqttd logs routine events at ERROR (every probe or client that disconnects
//!   without a DISCONNECT packet: "Error while handling MQTT connect packet", "connection-stop").
//!   The service adds [`TRACING_DIRECTIVE`] (`rumqttd=off`) to its `EnvFilter` unless the user
//!   names `rumqttd` in `RUST_LOG`; what matters to the user (the port, TLS files) is checked here
//!   and reported as a [`BrokerError`].
//! - **TLS** needs the cargo feature `embedded-broker-tls` (rumqttd's `use-rustls`: a second
//!   rustls stack, 0.22, with ring). Without it `tls: Some(..)` is [`BrokerError::TlsUnavailable`].
//!   rumqttd reads the certificate files again at every connection, so [`start`] reads them once
//!   first to report a bad file at start, not at the first device. Client certificates would need
//!   rumqttd's `verify-client-cert` feature, which then refuses every TLS setup without a CA and
//!   reads tenants from certificates; braid does not enable it, so a `ca_file` is
//!   [`BrokerError::ClientCertsUnsupported`] rather than silently ignored.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings};

/// The address of `kind = "embedded"` when the config sets no `listen`.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 1883);
/// The `tracing_subscriber::EnvFilter` directive that keeps rumqttd's routine ERROR lines away
/// from the user (see the module doc).
pub const TRACING_DIRECTIVE: &str = "rumqttd=off";
/// How long [`start`] waits for the listener to accept connections.
pub const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// Commit-log segment size per subscription filter (raised to the max payload when that is larger).
pub const SEGMENT_SIZE: usize = 1 << 20;
/// Segments kept per subscription filter.
pub const SEGMENT_COUNT: usize = 4;

const READY_POLL: Duration = Duration::from_millis(10);
/// Un-acked QoS 1 messages the broker sends one client before waiting for its PUBACKs.
const MAX_INFLIGHT: usize = 100;
const MAX_CONNECTIONS: usize = 1_000;
/// A client must send CONNECT within this time after its TCP connect.
const CONNECT_TIMEOUT_MS: u16 = 5_000;

/// What the embedded broker listens on.
#[derive(Clone, Debug)]
pub struct BrokerSettings {
    /// Port 0 picks a free port ([`EmbeddedBroker::addr`] tells which).
    pub listen: SocketAddr,
    /// The largest publish payload accepted, in bytes; a client sending more is disconnected.
    pub max_payload: usize,
    pub tls: Option<BrokerTls>,
}

/// TLS on the embedded broker's listener (feature `embedded-broker-tls`), PEM files.
#[derive(Clone, Debug)]
pub struct BrokerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// A CA that client certificates must chain to. Not supported yet: see the module doc.
    pub ca_file: Option<PathBuf>,
}

/// A running embedded broker. It runs until the process exits (rumqttd has no shutdown).
#[derive(Debug)]
pub struct EmbeddedBroker {
    addr: SocketAddr,
    local: SocketAddr,
}

impl EmbeddedBroker {
    /// The address it listens on (the actual port when the settings asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where braid's own client connects, in plain MQTT over loopback: the devices' listener
    /// itself without TLS (on 127.0.0.1 when it listens on every address), or with TLS a second,
    /// plain listener on a free loopback port — braid's source then needs neither the broker's
    /// certificate nor its host name.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
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
    #[error("embedded broker: client certificates (ca_file) are not supported; use an external broker for mTLS")]
    ClientCertsUnsupported,
    #[error("embedded broker: TLS file {path}: {reason}")]
    TlsFile { path: PathBuf, reason: String },
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
    if let Some(tls) = &settings.tls {
        check_tls(tls)?;
    }
    let addr = claim(settings.listen)?;
    let local = match &settings.tls {
        Some(_) => claim(SocketAddr::from(([127, 0, 0, 1], 0)))?,
        None if addr.ip().is_unspecified() => SocketAddr::from(([127, 0, 0, 1], addr.port())),
        None => addr,
    };
    let mut broker = Broker::new(rumqttd_config(addr, local, &settings));
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
    wait_ready(local)?;
    Ok(EmbeddedBroker { addr, local })
}

/// For `braid demo`: `preferred` if it can be bound now, else a free port on the same IP.
pub fn free_addr(preferred: SocketAddr) -> io::Result<SocketAddr> {
    match TcpListener::bind(preferred) {
        Ok(l) => l.local_addr(),
        Err(_) => TcpListener::bind(SocketAddr::new(preferred.ip(), 0))?.local_addr(),
    }
}

/// Binds `listen` once to prove it is free (and to resolve port 0), then releases it for rumqttd.
/// Another process could take the port in between; the readiness wait then fails. std sets
/// SO_REUSEADDR on Unix like rumqttd's tokio listener, so connections a previous braid left in
/// TIME_WAIT do not make a quick restart fail, while a port another process listens on does.
fn claim(listen: SocketAddr) -> Result<SocketAddr, BrokerError> {
    match TcpListener::bind(listen) {
        Ok(l) => l.local_addr().map_err(|source| BrokerError::Bind { addr: listen, source }),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(BrokerError::AddrInUse { addr: listen }),
        Err(source) => Err(BrokerError::Bind { addr: listen, source }),
    }
}

fn rumqttd_config(addr: SocketAddr, local: SocketAddr, settings: &BrokerSettings) -> Config {
    let connections = ConnectionSettings {
        connection_timeout_ms: CONNECT_TIMEOUT_MS,
        max_payload_size: settings.max_payload,
        max_inflight_count: MAX_INFLIGHT,
        auth: None,
        external_auth: None,
        dynamic_filters: true,
    };
    let server = ServerSettings {
        name: "braid-broker-v4".into(),
        listen: addr,
        tls: settings.tls.as_ref().map(rumqttd_tls),
        next_connection_delay_ms: 1,
        connections: connections.clone(),
    };
    let mut servers = HashMap::from([("1".to_string(), server)]);
    if settings.tls.is_some() {
        let plain = ServerSettings {
            name: "braid-broker-local".into(),
            listen: local,
            tls: None,
            next_connection_delay_ms: 1,
            connections,
        };
        servers.insert("2".to_string(), plain);
    }
    let router = RouterConfig {
        max_connections: MAX_CONNECTIONS,
        max_outgoing_packet_count: 200,
        // A segment holds at least one message, so it must fit the largest payload.
        max_segment_size: SEGMENT_SIZE.max(settings.max_payload),
        max_segment_count: SEGMENT_COUNT,
        ..RouterConfig::default()
    };
    // No v5, websocket, console, prometheus, bridge or cluster: only the v4 listener.
    Config { id: 0, router, v4: Some(servers), ..Config::default() }
}

fn rumqttd_tls(tls: &BrokerTls) -> rumqttd::TlsConfig {
    rumqttd::TlsConfig::Rustls {
        capath: None,
        certpath: tls.cert_file.to_string_lossy().into_owned(),
        keypath: tls.key_file.to_string_lossy().into_owned(),
    }
}

#[cfg(not(feature = "embedded-broker-tls"))]
fn check_tls(_tls: &BrokerTls) -> Result<(), BrokerError> {
    Err(BrokerError::TlsUnavailable)
}

/// Reads the PEM files as rumqttd will, so that a bad file is an error at start.
#[cfg(feature = "embedded-broker-tls")]
fn check_tls(tls: &BrokerTls) -> Result<(), BrokerError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    if tls.ca_file.is_some() {
        return Err(BrokerError::ClientCertsUnsupported);
    }
    let file_error = |path: &PathBuf, reason: String| BrokerError::TlsFile { path: path.clone(), reason };
    let certs = CertificateDer::pem_file_iter(&tls.cert_file)
        .map_err(|e| file_error(&tls.cert_file, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(&tls.cert_file, e.to_string()))?;
    if certs.is_empty() {
        return Err(file_error(&tls.cert_file, "no PEM certificate in it".into()));
    }
    PrivateKeyDer::from_pem_file(&tls.key_file).map_err(|e| file_error(&tls.key_file, e.to_string()))?;
    Ok(())
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
