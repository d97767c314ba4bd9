//! One broker connection's settings: the endpoint from the URL, the client id, the credentials
//! and the TLS configuration, turned into `rumqttc::MqttOptions`.
//!
//! Decisions (research §1.6):
//! - **URLs are parsed here**, not by rumqttc's `parse_url`, which loads the system roots.
//! - **TLS is rustls with the ring provider passed explicitly** (`builder_with_provider`), so no
//!   process-default provider has to be installed and none is relied on. The trust anchors are
//!   only the CA file named in the config: an `mqtts://` URL without `ca_file` is refused, and the
//!   system roots are never loaded (a gateway trusts the one broker it was configured for).
//! - **The client id is stable across restarts**, because a persistent session is keyed by it: a
//!   new id every start would strand the un-acked messages of the old session at the broker. A
//!   source's id also has a random part that another client cannot guess
//!   (`braid-HOST-SECTION-RANDOM`, [`persistent_client_id`], kept in STATE_DIR): a client that
//!   connects with braid's id takes braid's session and its messages (MQTT-3.1.4-2), so a
//!   predictable one is an invitation. Sinks keep `braid-HOST-SECTION` (their status topic is
//!   derived from it).
//! - Errors name the file or key at fault; none of them is helped by retrying, they need the
//!   configuration or the files fixed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::{MqttOptions, TlsConfiguration, Transport};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::MqttConn;
use crate::storage::quarantine::{Action, Lost, quarantine};

/// Keep-alive when the config sets none.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(30);
const MQTT_PORT: u16 = 1883;
const MQTTS_PORT: u16 = 8883;

/// Why a connection could not be set up. None of these go away by retrying.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("bad broker URL {url:?}: {reason}")]
    Url { url: String, reason: &'static str },
    #[error("client id file {path:?}: {source}")]
    ClientIdFile { path: String, source: std::io::Error },
    #[error("cannot read password_file {path:?}: {source}")]
    PasswordFile { path: String, source: std::io::Error },
    #[error("password_file {path:?} is set but username is not")]
    PasswordWithoutUsername { path: String },
    #[error("{url:?} is mqtts:// but no ca_file names the CA to verify the broker with")]
    MissingCa { url: String },
    #[error("cert_file and key_file go together (mutual TLS); only {given} is set")]
    HalfClientAuth { given: &'static str },
    #[error("cannot read {key} {path:?}: {reason}")]
    Pem { key: &'static str, path: String, reason: String },
    #[error("TLS settings refused: {0}")]
    Tls(#[from] rustls::Error),
    #[error("keep_alive must be at least 1s, got {ms} ms")]
    KeepAlive { ms: i64 },
}

/// Where a broker listens, from `mqtt://HOST[:PORT]` (port 1883) or `mqtts://HOST[:PORT]` (8883).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

pub fn endpoint(url: &str) -> Result<Endpoint, ConnError> {
    let bad = |reason| ConnError::Url { url: url.to_owned(), reason };
    let (rest, tls) = match (url.strip_prefix("mqtt://"), url.strip_prefix("mqtts://")) {
        (Some(rest), _) => (rest, false),
        (_, Some(rest)) => (rest, true),
        _ => return Err(bad("expected mqtt://HOST[:PORT] or mqtts://HOST[:PORT]")),
    };
    let host_port = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) => (host, port.parse::<u16>().map_err(|_| bad("the port is not a number 0-65535"))?),
        None => (host_port, if tls { MQTTS_PORT } else { MQTT_PORT }),
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if host.contains(['/', '@', '?', '#', ' ']) {
        return Err(bad("a path, user info, query or space is not supported"));
    }
    Ok(Endpoint { host: host.to_owned(), port, tls })
}

/// rumqttc options for one connection: client id (`conn.client_id` or `default_client_id`), keep
/// alive (default 30 s), username and the password from `password_file`, and for `mqtts://` TLS
/// from `ca_file` (required) plus `cert_file`/`key_file` for mutual TLS.
///
/// Session, acks and packet limits are the caller's: a source and a sink set them differently.
pub fn options(url: &str, conn: &MqttConn, default_client_id: &str) -> Result<MqttOptions, ConnError> {
    let endpoint = endpoint(url)?;
    let client_id = conn.client_id.clone().unwrap_or_else(|| default_client_id.to_owned());
    let mut options = MqttOptions::new(client_id, endpoint.host, endpoint.port);
    options.set_keep_alive(keep_alive(conn.keep_alive_ms)?);
    if let Some(inflight) = conn.max_inflight.filter(|&n| n > 0) {
        options.set_inflight(inflight);
    }
    match (&conn.username, &conn.password_file) {
        (Some(username), Some(path)) => {
            options.set_credentials(username.clone(), read_password(path)?);
        }
        (Some(username), None) => {
            options.set_credentials(username.clone(), "");
        }
        (None, Some(path)) => return Err(ConnError::PasswordWithoutUsername { path: path.clone() }),
        (None, None) => {}
    }
    if endpoint.tls {
        let config = tls_config(url, conn)?;
        options.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(Arc::new(config))));
    }
    Ok(options)
}

/// `braid-HOST-SECTION`: stable across restarts of the same gateway, distinct per section.
/// Characters other than ASCII letters, digits, `-`, `_` and `.` become `_` (some brokers limit
/// client ids to those).
pub fn default_client_id(section: &str) -> String {
    let id = format!("braid-{}-{section}", hostname());
    id.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' }).collect()
}

/// Random bytes in a source's client id (16 hex digits).
const CLIENT_ID_RANDOM_BYTES: usize = 8;

/// The client id of source `section`: read from `STATE_DIR/client-id.SECTION`, or made once as
/// `braid-HOST-SECTION-RANDOM` and written there (atomically: a crash leaves the old file or the
/// new one). The file stays when the host is renamed, so the session does too.
pub fn persistent_client_id(state_dir: &Path, section: &str) -> Result<String, ConnError> {
    let path = state_dir.join(client_id_file_name(section));
    let file_error = |source| ConnError::ClientIdFile { path: path.display().to_string(), source };
    let damaged = match std::fs::read(&path) {
        Ok(bytes) => match std::str::from_utf8(&bytes).map(str::trim) {
            Ok(text) if valid_client_id(text) => return Ok(text.to_owned()),
            _ => Some("not a client id"),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) if e.raw_os_error() == Some(libc::EIO) => Some("unreadable (EIO)"),
        Err(e) => return Err(file_error(e)),
    };
    if let Some(reason) = damaged {
        let lost = Lost { records: 0, detail: "the source's MQTT session: a new client id is made".into() };
        quarantine(&path, "source client id", reason, &lost, Action::Move);
    }
    let mut random = [0u8; CLIENT_ID_RANDOM_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random)
        .map_err(|_| file_error(std::io::Error::other("the OS gave no random bytes")))?;
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let id = format!("{}-{suffix}", default_client_id(section));
    write_atomically(&path, &id).map_err(file_error)?;
    Ok(id)
}

/// `client-id.SECTION`, the section name reduced to file-name-safe characters (plus a checksum of
/// the name when that changed it, so that two sections never share a file).
fn client_id_file_name(section: &str) -> String {
    let safe: String =
        section.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') { c } else { '_' }).collect();
    match safe == section {
        true => format!("client-id.{safe}"),
        false => format!("client-id.{safe}-{:08x}", crc32c::crc32c(section.as_bytes())),
    }
}

fn valid_client_id(id: &str) -> bool {
    !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    file.write_all(text.as_bytes())?;
    file.write_all(b"\n")?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}

/// The host name, from `/etc/hostname`, else the kernel's (what `gethostname` returns), else
/// `localhost`.
fn hostname() -> String {
    ["/etc/hostname", "/proc/sys/kernel/hostname"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|name| name.trim().to_owned())
        .find(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

fn keep_alive(ms: Option<i64>) -> Result<Duration, ConnError> {
    match ms {
        None => Ok(DEFAULT_KEEP_ALIVE),
        // rumqttc panics below one second; config validation refuses it too.
        Some(ms) if ms < 1000 => Err(ConnError::KeepAlive { ms }),
        Some(ms) => Ok(Duration::from_millis(ms as u64)),
    }
}

/// The file's content without its trailing newline (`echo secret > file`, systemd credentials).
fn read_password(path: &str) -> Result<String, ConnError> {
    let password =
        std::fs::read_to_string(path).map_err(|source| ConnError::PasswordFile { path: path.to_owned(), source })?;
    let trimmed = password.strip_suffix('\n').unwrap_or(&password);
    Ok(trimmed.strip_suffix('\r').unwrap_or(trimmed).to_owned())
}

fn tls_config(url: &str, conn: &MqttConn) -> Result<rustls::ClientConfig, ConnError> {
    let ca_file = conn.ca_file.as_deref().ok_or_else(|| ConnError::MissingCa { url: url.to_owned() })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates("ca_file", ca_file)? {
        roots.add(cert)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    match (&conn.cert_file, &conn.key_file) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert_file), Some(key_file)) => {
            let chain = certificates("cert_file", cert_file)?;
            let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| pem_error("key_file", key_file, e))?;
            Ok(builder.with_client_auth_cert(chain, key)?)
        }
        (Some(_), None) => Err(ConnError::HalfClientAuth { given: "cert_file" }),
        (None, Some(_)) => Err(ConnError::HalfClientAuth { given: "key_file" }),
    }
}

/// Every certificate in a PEM file; a file holding none is an error.
fn certificates(key: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, ConnError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(key, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(key, path, e))?;
    if certs.is_empty() {
        return Err(pem_error(key, path, rustls::pki_types::pem::Error::NoItemsFound));
    }
    Ok(certs)
}

fn pem_error(key: &'static str, path: &str, error: rustls::pki_types::pem::Error) -> ConnError {
    let reason = match error {
        rustls::pki_types::pem::Error::Io(e) => e.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM section of the expected kind".to_owned(),
        other => format!("bad PEM: {other}"),
    };
    ConnError::Pem { key, path: Path::new(path).display().to_string(), reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint_of(url: &str) -> (String, u16, bool) {
        let e = endpoint(url).unwrap();
        (e.host, e.port, e.tls)
    }

    #[test]
    fn endpoints_with_and_without_ports() {
        assert_eq!(endpoint_of("mqtt://127.0.0.1:1884"), ("127.0.0.1".into(), 1884, false));
        assert_eq!(endpoint_of("mqtt://broker.local"), ("broker.local".into(), 1883, false));
        assert_eq!(endpoint_of("mqtts://cloud.example.com"), ("cloud.example.com".into(), 8883, true));
        assert_eq!(endpoint_of("mqtts://cloud.example.com:443/"), ("cloud.example.com".into(), 443, true));
    }

    #[test]
    fn bad_endpoints_say_why() {
        for (url, reason) in [
            ("tcp://h:1", "expected mqtt://"),
            ("mqtt://", "no host"),
            ("mqtt://:1883", "no host"),
            ("mqtt://h:99999", "port"),
            ("mqtt://h:x", "port"),
            ("mqtt://h/path", "path"),
            ("mqtt://user@h", "user info"),
        ] {
            let error = endpoint(url).unwrap_err().to_string();
            assert!(error.contains(reason) && error.contains(url), "{url}: {error}");
        }
    }

    #[test]
    fn client_id_keep_alive_and_defaults() {
        let conn = MqttConn::default();
        let defaults = options("mqtt://127.0.0.1:1", &conn, "braid-gw-devices").unwrap();
        assert_eq!(defaults.client_id(), "braid-gw-devices");
        assert_eq!(defaults.keep_alive(), DEFAULT_KEEP_ALIVE);
        assert_eq!(defaults.broker_address(), ("127.0.0.1".to_owned(), 1));

        let conn = MqttConn { client_id: Some("mine".into()), keep_alive_ms: Some(5000), ..MqttConn::default() };
        let set = options("mqtt://h", &conn, "unused").unwrap();
        assert_eq!(set.client_id(), "mine");
        assert_eq!(set.keep_alive(), Duration::from_secs(5));
    }

    #[test]
    fn a_keep_alive_below_a_second_is_an_error_not_a_panic() {
        let conn = MqttConn { keep_alive_ms: Some(999), ..MqttConn::default() };
        assert!(matches!(options("mqtt://h", &conn, "id"), Err(ConnError::KeepAlive { ms: 999 })));
    }

    #[test]
    fn password_file_trailing_newline_is_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        std::fs::write(&path, "s3cret \n").unwrap();
        let conn = MqttConn {
            username: Some("gw".into()),
            password_file: Some(path.display().to_string()),
            ..MqttConn::default()
        };
        let login = options("mqtt://h", &conn, "id").unwrap().credentials().unwrap();
        assert_eq!((login.username.as_str(), login.password.as_str()), ("gw", "s3cret "));
    }

    #[test]
    fn an_unreadable_password_file_is_named() {
        let conn = MqttConn {
            username: Some("gw".into()),
            password_file: Some("/nonexistent/braid-password".into()),
            ..MqttConn::default()
        };
        let error = options("mqtt://h", &conn, "id").unwrap_err().to_string();
        assert!(error.contains("password_file") && error.contains("/nonexistent/braid-password"), "{error}");
    }

    #[test]
    fn mqtts_without_ca_file_is_refused() {
        let error = options("mqtts://h", &MqttConn::default(), "id").unwrap_err();
        assert!(matches!(error, ConnError::MissingCa { .. }), "{error}");
    }

    #[test]
    fn unreadable_or_empty_tls_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        for (ca, key_name) in [("/nonexistent/ca.pem", "ca_file"), (empty.to_str().unwrap(), "ca_file")] {
            let conn = MqttConn { ca_file: Some(ca.into()), ..MqttConn::default() };
            let error = options("mqtts://h", &conn, "id").unwrap_err().to_string();
            assert!(error.contains(key_name) && error.contains(ca), "{error}");
        }
    }

    #[test]
    fn tls_from_a_real_ca_and_mutual_tls_files() {
        let pki = crate::test_pki::Pki::make();
        let file = |name: &str| pki.dir().join(name).display().to_string();
        let conn = MqttConn { ca_file: Some(file("ca.pem")), ..MqttConn::default() };
        let tls = options("mqtts://localhost", &conn, "id").unwrap();
        assert!(matches!(tls.transport(), Transport::Tls(TlsConfiguration::Rustls(_))));

        let mutual =
            MqttConn { cert_file: Some(file("client.pem")), key_file: Some(file("client.key")), ..conn.clone() };
        if let Err(error) = options("mqtts://localhost", &mutual, "id") {
            panic!("mutual TLS refused: {error}");
        }

        let key_missing =
            MqttConn { cert_file: Some(file("client.pem")), key_file: Some("/nonexistent/key.pem".into()), ..conn };
        let error = options("mqtts://localhost", &key_missing, "id").unwrap_err().to_string();
        assert!(error.contains("key_file") && error.contains("/nonexistent/key.pem"), "{error}");
    }

    #[test]
    fn a_source_client_id_is_made_once_with_a_random_part_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let id = persistent_client_id(dir.path(), "devices").unwrap();
        assert!(id.starts_with(&default_client_id("devices")) && id.len() == default_client_id("devices").len() + 17);
        assert_eq!(persistent_client_id(dir.path(), "devices").unwrap(), id, "stable across restarts");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("client-id.devices")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "readable by braid only");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(persistent_client_id(other.path(), "devices").unwrap(), id, "random per state dir");
        assert_ne!(persistent_client_id(dir.path(), "devices_in").unwrap(), id);
        assert_ne!(client_id_file_name("a/b"), client_id_file_name("a_b"));
        std::fs::write(dir.path().join("client-id.devices"), "\n").unwrap();
        assert_ne!(persistent_client_id(dir.path(), "devices").unwrap(), id, "a damaged file gets a new id");
    }

    #[test]
    fn default_client_ids_are_stable_and_plain() {
        let id = default_client_id("devices in/hall");
        assert_eq!(id, default_client_id("devices in/hall"));
        assert!(id.starts_with("braid-") && id.ends_with("-devices_in_hall"), "{id}");
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)), "{id}");
    }
}
