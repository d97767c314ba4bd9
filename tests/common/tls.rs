//! TLS and credentials for the MQTT tests: certificates made with the `openssl` CLI, a password
//! file made with `mosquitto_passwd`, and a mosquitto with a second, secured listener.
//!
//! [`Pki::make`] writes, into a folder:
//! - `ca.pem`/`ca.key`: the test CA (EC P-256, `CA:TRUE`);
//! - `server.pem`/`server.key`: the broker's certificate, signed by the CA, SAN
//!   `IP:127.0.0.1,DNS:localhost`, `serverAuth`;
//! - `client.pem`/`client.key`: a client certificate signed by the CA (`clientAuth`), for mutual
//!   TLS;
//! - `rogue-ca.pem` and `rogue-client.pem`/`rogue-client.key`: another self-made CA and a client
//!   certificate it signed; the broker trusts neither, and a client trusting `rogue-ca.pem` must
//!   not trust the broker.
//!
//! `openssl` and `mosquitto_passwd` are required (CI installs openssl and mosquitto): a missing
//! tool fails the test with a hint instead of skipping it.
//!
//! [`SecureBroker`] is a [`Mosquitto`] with `per_listener_settings true`: its first listener
//! stays plain and anonymous (the harness's publisher and subscriber use it, so they never
//! depend on the code under test), and a second listener on [`SecureBroker::tls_port`] carries
//! the TLS and credential settings under test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::mqtt::{Mosquitto, free_port};

pub const OPENSSL: &str = "openssl";
pub const MOSQUITTO_PASSWD: &str = "/usr/bin/mosquitto_passwd";

/// The certificates of one test, in a folder that lives as long as this value.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub fn make() -> Pki {
        let dir = tempfile::Builder::new().prefix("braid-pki-").tempdir().expect("temporary folder");
        let d = dir.path();
        ca(d, "ca", "/CN=braid test CA");
        leaf(
            d,
            "ca",
            "server",
            "/CN=localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
        );
        leaf(d, "ca", "client", "/CN=braid-gateway", "extendedKeyUsage=clientAuth");
        ca(d, "rogue-ca", "/CN=rogue CA");
        leaf(d, "rogue-ca", "rogue-client", "/CN=braid-gateway", "extendedKeyUsage=clientAuth");
        Pki { dir }
    }

    /// `NAME.pem` or `NAME.key` in the folder, as the string a config holds.
    pub fn file(&self, name: &str) -> String {
        let path = self.dir.path().join(name);
        assert!(path.exists(), "{} was not made", path.display());
        path.display().to_string()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// `openssl ARGS` in `dir`; fails the test with openssl's own words.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new(OPENSSL)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {OPENSSL} ({e}): the TLS tests need the openssl CLI"));
    assert!(out.status.success(), "openssl {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// A self-signed CA `NAME.pem` with its key `NAME.key`.
fn ca(dir: &Path, name: &str, subject: &str) {
    let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            subject,
            "-keyout",
            &key,
            "-out",
            &pem,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// `NAME.pem`/`NAME.key` signed by the CA `ISSUER`, with the extensions `ext` (one per line;
/// any extension makes `x509 -req` write the v3 certificate webpki requires).
fn leaf(dir: &Path, issuer: &str, name: &str, subject: &str, ext: &str) {
    let (key, csr, pem, ext_file) =
        (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
    std::fs::write(dir.join(&ext_file), format!("basicConstraints=CA:FALSE\n{ext}\n")).expect("writing the extensions");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            subject,
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
    );
    let (ca_pem, ca_key) = (format!("{issuer}.pem"), format!("{issuer}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext_file,
            "-out",
            &pem,
        ],
    );
}

/// A mosquitto password file for one user, made with `mosquitto_passwd -b -c`.
pub fn password_file(dir: &Path, user: &str, password: &str) -> PathBuf {
    let path = dir.join("mosquitto.passwd");
    let out = Command::new(MOSQUITTO_PASSWD)
        .arg("-b")
        .arg("-c")
        .arg(&path)
        .args([user, password])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {MOSQUITTO_PASSWD} ({e}): apt-get install -y mosquitto"));
    assert!(out.status.success(), "mosquitto_passwd failed:\n{}", String::from_utf8_lossy(&out.stderr));
    path
}

/// What the secured listener demands.
#[derive(Default)]
pub struct Security {
    /// Clients must present a certificate signed by the test CA (`require_certificate true`).
    pub require_certificate: bool,
    /// A mosquitto password file; with it, `allow_anonymous false` on the secured listener.
    pub password_file: Option<PathBuf>,
}

/// A mosquitto with a plain anonymous listener ([`Mosquitto::port`]) and a TLS listener
/// ([`SecureBroker::tls_port`]) using the server certificate of `pki`.
pub struct SecureBroker {
    pub broker: Mosquitto,
    tls_port: u16,
}

impl SecureBroker {
    pub fn start(pki: &Pki, security: &Security) -> SecureBroker {
        let tls_port = free_port();
        let mut listener = format!(
            "listener {tls_port} 127.0.0.1\n\
             cafile {}\n\
             certfile {}\n\
             keyfile {}\n\
             require_certificate {}\n",
            pki.file("ca.pem"),
            pki.file("server.pem"),
            pki.file("server.key"),
            security.require_certificate,
        );
        match &security.password_file {
            Some(path) => listener.push_str(&format!("allow_anonymous false\npassword_file {}\n", path.display())),
            None => listener.push_str("allow_anonymous true\n"),
        }
        let broker = Mosquitto::start_with_listener(&listener);
        super::mqtt::wait_accepting(tls_port, &broker);
        SecureBroker { broker, tls_port }
    }

    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// `mqtts://127.0.0.1:TLS_PORT` (the server certificate names IP 127.0.0.1).
    pub fn tls_url(&self) -> String {
        format!("mqtts://127.0.0.1:{}", self.tls_port)
    }

    /// Lines of mosquitto's log containing `needle`.
    pub fn log_lines(&self, needle: &str) -> usize {
        self.broker.log().lines().filter(|l| l.contains(needle)).count()
    }
}
