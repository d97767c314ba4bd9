//! Test certificates made with the `openssl` CLI, shared by the unit tests (`crate::test_pki`)
//! and the integration tests (`tests/it/common/tls.rs` includes this file). [`Pki::make`] writes,
//! into a folder:
//! - `ca.pem`/`ca.key`: the test CA (EC P-256, `CA:TRUE`);
//! - `server.pem`/`server.key`: the broker's certificate, signed by the CA, SAN
//!   `IP:127.0.0.1,DNS:localhost`, `serverAuth`;
//! - `client.pem`/`client.key`: a client certificate signed by the CA (`clientAuth`), for mutual
//!   TLS;
//! - `rogue-ca.pem` and `rogue-client.pem`/`rogue-client.key`: another self-made CA and a client
//!   certificate it signed; the broker trusts neither, and a client trusting `rogue-ca.pem` must
//!   not trust the broker.
//!
//! `openssl` is required (CI installs it): a missing tool fails the test with a hint instead of
//! skipping it. Only std and tempfile are used, so both crates can compile this file.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};

pub const OPENSSL: &str = "openssl";

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
