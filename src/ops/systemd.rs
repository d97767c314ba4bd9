//! Telling systemd how the service is doing (`Type=notify`, sd_notify(3)).
//!
//! Design: [`Notifier`] reads `NOTIFY_SOCKET` and the watchdog period once, at start, and then
//! sends each notification itself, as sd-notify's `notify` would (one datagram of `KEY=VALUE`
//! lines, formatted by sd-notify's `NotifyState`). Keeping the socket in the value rather than
//! re-reading the environment on every call lets tests point a notifier at their own socket
//! (environment variables are process-global, and setting them is `unsafe` in Rust 2024), and
//! lets it reach an abstract socket (`@name`), which sd-notify 0.5's `notify` cannot.
//!
//! Notifications are advisory: a failure is logged (at most once a minute, with how many were
//! held back) and never stops the service. Without `NOTIFY_SOCKET` (not run by systemd, or
//! `Type=simple`) every call does nothing.
//!
//! The watchdog: systemd sets `WATCHDOG_USEC` from `WatchdogSec=` and kills the service when
//! no `WATCHDOG=1` arrives for that long; sd_watchdog_enabled(3) advises pinging at half the
//! period, which [`Notifier::watchdog_period`] returns.

use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sd_notify::NotifyState;

use super::throttle::{Throttle, now};

/// Sends readiness, status and watchdog pings to systemd.
#[derive(Debug)]
pub struct Notifier {
    /// Where systemd listens; `None`: every call is a no-op.
    socket: Option<SocketAddr>,
    /// systemd's watchdog timeout (`WatchdogSec=`), when enabled.
    watchdog: Option<Duration>,
    warnings: Mutex<Throttle>,
}

impl Notifier {
    /// The notifier systemd asked for: `NOTIFY_SOCKET` and `WATCHDOG_USEC` (honouring
    /// `WATCHDOG_PID`) from the environment.
    pub fn from_env() -> Notifier {
        let socket = std::env::var_os("NOTIFY_SOCKET");
        Notifier::new(socket.as_deref(), sd_notify::watchdog_enabled())
    }

    /// A notifier sending to `socket` (a path, or `@name` for an abstract socket; `None` or
    /// empty: no-op), with systemd's watchdog timeout `watchdog` (`None` or zero: no watchdog).
    pub fn new(socket: Option<&OsStr>, watchdog: Option<Duration>) -> Notifier {
        let socket = socket.filter(|s| !s.is_empty()).and_then(|s| match socket_addr(s) {
            Ok(addr) => Some(addr),
            Err(error) => {
                tracing::warn!(socket = %s.display(), %error, "NOTIFY_SOCKET unusable; systemd will not hear from braid");
                None
            }
        });
        let watchdog = watchdog.filter(|period| !period.is_zero());
        Notifier { socket, watchdog, warnings: Mutex::new(Throttle::new(Duration::from_secs(60))) }
    }

    /// Whether notifications go anywhere (systemd started us with `Type=notify`).
    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// Start-up is done (`READY=1`): systemd starts dependent units and `systemctl start` returns.
    pub fn ready(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(&one_line(status))]);
    }

    /// A one-line status shown by `systemctl status`.
    pub fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(&one_line(status))]);
    }

    /// A reload (SIGHUP) began; send [`Notifier::ready`] when it is done. `MONOTONIC_USEC` is
    /// what `Type=notify-reload` (systemd ≥ 253) requires; older systemd ignores it.
    pub fn reloading(&self) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now]),
            Err(_) => self.send(&[NotifyState::Reloading]),
        }
    }

    /// Shutdown began (`STOPPING=1`), with what is happening (e.g. "draining").
    pub fn stopping(&self, status: &str) {
        self.send(&[NotifyState::Stopping, NotifyState::Status(&one_line(status))]);
    }

    /// Asks for `by` more time to start or stop than `TimeoutStartSec=`/`TimeoutStopSec=`
    /// allow, counted from now (e.g. while recovering large state after a crash).
    pub fn extend_timeout(&self, by: Duration) {
        let usec = u32::try_from(by.as_micros()).unwrap_or(u32::MAX);
        self.send(&[NotifyState::ExtendTimeoutUsec(usec)]);
    }

    /// A watchdog ping (`WATCHDOG=1`). Send it only when the service is making progress.
    pub fn watchdog(&self) {
        if self.watchdog.is_some() {
            self.send(&[NotifyState::Watchdog]);
        }
    }

    /// How often to call [`Notifier::watchdog`]: half of systemd's watchdog timeout, as
    /// sd_watchdog_enabled(3) advises. `None` when there is no watchdog or nothing to notify.
    pub fn watchdog_period(&self) -> Option<Duration> {
        self.watchdog.filter(|_| self.enabled()).map(|timeout| timeout / 2)
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        let Some(addr) = &self.socket else { return };
        if let Err(error) = send_to(addr, &message(states)) {
            let mut warnings = self.warnings.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(held_back) = warnings.admit(now()) {
                tracing::warn!(%error, held_back, "Cannot notify systemd");
            }
        }
    }
}

/// The datagram: one `KEY=VALUE` line per state (sd_notify(3)).
fn message(states: &[NotifyState<'_>]) -> String {
    states.iter().map(|state| format!("{state}\n")).collect()
}

/// Never waits: a notify socket whose queue is full (systemd busy, or a reader that stopped
/// reading) loses this notification, logged, rather than stall the io thread that sends it —
/// and with it the sinks, the sources and `/healthz` that run there.
fn send_to(addr: &SocketAddr, message: &str) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    socket.set_nonblocking(true)?;
    let sent = socket.send_to_addr(message.as_bytes(), addr)?;
    if sent != message.len() {
        return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "notification truncated"));
    }
    Ok(())
}

/// `NOTIFY_SOCKET` as an address: a path, or `@name` for Linux's abstract namespace.
fn socket_addr(socket: &OsStr) -> std::io::Result<SocketAddr> {
    match socket.as_bytes().strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(socket),
    }
}

/// A status on one line: a line break would start another `KEY=VALUE` assignment (a status
/// text could otherwise say `READY=1`).
fn one_line(status: &str) -> String {
    status.replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;

    /// A real datagram socket standing in for systemd.
    fn listener() -> (tempfile::TempDir, std::path::PathBuf, UnixDatagram) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (dir, path, socket)
    }

    fn receive(socket: &UnixDatagram) -> String {
        let mut buf = [0u8; 4096];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn sends_each_notification_as_one_datagram() {
        let (_dir, path, socket) = listener();
        let notifier = Notifier::new(Some(path.as_os_str()), Some(Duration::from_secs(20)));
        assert!(notifier.enabled());
        assert_eq!(notifier.watchdog_period(), Some(Duration::from_secs(10)));

        notifier.ready("running");
        assert_eq!(receive(&socket), "READY=1\nSTATUS=running\n");
        notifier.status("2 shards, 1 sink\nREADY=1");
        assert_eq!(receive(&socket), "STATUS=2 shards, 1 sink READY=1\n");
        notifier.watchdog();
        assert_eq!(receive(&socket), "WATCHDOG=1\n");
        notifier.reloading();
        let reloading = receive(&socket);
        assert!(reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="), "{reloading}");
        notifier.extend_timeout(Duration::from_secs(30));
        assert_eq!(receive(&socket), "EXTEND_TIMEOUT_USEC=30000000\n");
        notifier.stopping("draining");
        assert_eq!(receive(&socket), "STOPPING=1\nSTATUS=draining\n");
    }

    #[test]
    fn reaches_an_abstract_socket() {
        let name = format!("braid-test-notify-{}", std::process::id());
        let socket = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let notifier = Notifier::new(Some(OsStr::new(&format!("@{name}"))), None);
        notifier.ready("up");
        assert_eq!(receive(&socket), "READY=1\nSTATUS=up\n");
    }

    #[test]
    fn without_a_socket_every_call_is_a_no_op() {
        for notifier in [Notifier::new(None, Some(Duration::from_secs(10))), Notifier::new(Some(OsStr::new("")), None)]
        {
            assert!(!notifier.enabled());
            assert_eq!(notifier.watchdog_period(), None);
            notifier.ready("running");
            notifier.watchdog();
            notifier.stopping("draining");
        }
    }

    #[test]
    fn no_watchdog_pings_without_a_watchdog() {
        let (_dir, path, socket) = listener();
        let notifier = Notifier::new(Some(path.as_os_str()), Some(Duration::ZERO));
        assert_eq!(notifier.watchdog_period(), None, "a zero period would make tokio's interval panic");
        notifier.watchdog();
        notifier.status("after");
        assert_eq!(receive(&socket), "STATUS=after\n");
    }

    #[test]
    fn a_notify_socket_nobody_reads_never_blocks_the_sender() {
        let (_dir, path, _socket) = listener();
        let notifier = Notifier::new(Some(path.as_os_str()), Some(Duration::from_secs(2)));
        // Far more than a datagram socket queues (net.unix.max_dgram_qlen, 10 by default): a
        // blocking send would wait here forever.
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for n in 0..200 {
                notifier.status(&format!("line {n}"));
                notifier.watchdog();
            }
            done_tx.send(()).unwrap();
        });
        assert!(done_rx.recv_timeout(Duration::from_secs(10)).is_ok(), "notifications block on a full socket");
    }

    #[test]
    fn failures_are_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("nobody-listens.sock");
        let notifier = Notifier::new(Some(gone.as_os_str()), Some(Duration::from_secs(10)));
        for _ in 0..3 {
            notifier.ready("running");
            notifier.watchdog();
        }
        let too_long = "x".repeat(200);
        assert!(!Notifier::new(Some(OsStr::new(&too_long)), None).enabled());
    }
}
