//! A stand-in for systemd's notification socket, for tests of `braid run` under `Type=notify`.
//!
//! Bind a [`NotifyListener`], start braid with `NOTIFY_SOCKET` set to [`NotifyListener::path`]
//! (and `WATCHDOG_USEC` to test the watchdog), then wait for the notifications in order:
//!
//! ```ignore
//! let mut systemd = NotifyListener::bind();
//! let child = braid().args(["run", "--config", cfg]).env("NOTIFY_SOCKET", systemd.path())
//!     .env("WATCHDOG_USEC", "400000").spawn().unwrap();
//! systemd.wait_for(|m| m.contains("READY=1"), Duration::from_secs(10)).expect("never ready");
//! systemd.wait_for(|m| m == "WATCHDOG=1\n", Duration::from_secs(2)).expect("no watchdog ping");
//! ```
//!
//! Each message is one datagram as sent, e.g. `"READY=1\nSTATUS=running\n"`.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A bound `AF_UNIX` datagram socket in its own temporary folder, and what it received.
pub struct NotifyListener {
    _dir: tempfile::TempDir,
    path: PathBuf,
    socket: UnixDatagram,
    received: Vec<String>,
    /// Messages before this index were already returned or skipped by `wait_for`.
    cursor: usize,
}

impl NotifyListener {
    pub fn bind() -> NotifyListener {
        let dir = tempfile::tempdir().expect("temporary folder for the notify socket");
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifyListener { _dir: dir, path, socket, received: Vec::new(), cursor: 0 }
    }

    /// The value for `NOTIFY_SOCKET`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The first message after the one the previous `wait_for` returned that satisfies
    /// `predicate`, waiting up to `timeout` for it; `None` if none came. Successive calls thus
    /// check an order: READY, then RELOADING, then READY again, then STOPPING.
    pub fn wait_for(&mut self, predicate: impl Fn(&str) -> bool, timeout: Duration) -> Option<String> {
        let deadline = clock() + timeout;
        loop {
            if let Some(found) = self.received[self.cursor..].iter().position(|m| predicate(m)) {
                self.cursor += found + 1;
                return Some(self.received[self.cursor - 1].clone());
            }
            self.cursor = self.received.len();
            let left = deadline.checked_duration_since(clock()).filter(|d| !d.is_zero())?;
            self.receive(Some(left));
        }
    }

    /// Every message received so far (including those still queued in the socket), in order.
    pub fn messages(&mut self) -> &[String] {
        while self.receive(None) {}
        &self.received
    }

    /// Receives one datagram: waits up to `timeout`, or not at all when `None`. Whether one came.
    fn receive(&mut self, timeout: Option<Duration>) -> bool {
        self.socket.set_nonblocking(timeout.is_none()).expect("set the socket's blocking mode");
        self.socket.set_read_timeout(timeout).expect("set the socket's read timeout");
        let mut buf = vec![0u8; 64 * 1024];
        match self.socket.recv(&mut buf) {
            Ok(n) => {
                self.received.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                true
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => false,
            Err(e) => panic!("notify socket: {e}"),
        }
    }
}

/// Timing the test's own waits, not engine time.
#[allow(clippy::disallowed_methods)]
fn clock() -> Instant {
    Instant::now()
}
