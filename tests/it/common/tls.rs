//! TLS and credentials for the MQTT tests: certificates made with the `openssl` CLI
//! ([`Pki`], from `src/test_pki.rs`, shared with the unit tests), a password file made with
//! `mosquitto_passwd`, and a mosquitto with a second, secured listener.
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

#[path = "../../../src/test_pki.rs"]
mod pki;
pub use pki::Pki;

pub const MOSQUITTO_PASSWD: &str = "/usr/bin/mosquitto_passwd";

/// A mosquitto password file for one user, made with `mosquitto_passwd -b -c`.
pub fn password_file(dir: &Path, user: &str, password: &str) -> PathBuf {
    users_file(&dir.join("mosquitto.passwd"), &[(user, password)])
}

/// A new password file at `path` with these users, made with `mosquitto_passwd`.
pub fn users_file(path: &Path, users: &[(&str, &str)]) -> PathBuf {
    for (i, (user, password)) in users.iter().enumerate() {
        set_password(path, user, password, i == 0);
    }
    path.to_owned()
}

/// `mosquitto_passwd -b [-c] FILE USER PASSWORD`: adds the user or changes its password
/// (`create`: a new file).
pub fn set_password(path: &Path, user: &str, password: &str, create: bool) {
    let mut command = Command::new(MOSQUITTO_PASSWD);
    if create {
        command.arg("-c");
    }
    let out = command
        .arg("-b")
        .arg(path)
        .args([user, password])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {MOSQUITTO_PASSWD} ({e}): apt-get install -y mosquitto"));
    assert!(out.status.success(), "mosquitto_passwd failed:\n{}", String::from_utf8_lossy(&out.stderr));
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
