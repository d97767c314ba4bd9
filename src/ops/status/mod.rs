//! `braid status`: a live terminal view of a running service, read from its ops endpoint
//! (`/metrics` and `/healthz`, CONTRACT.md "Metrics") — nothing else, so it works against any
//! braid whose endpoint it can reach, and never disturbs the service beyond two GETs a second.
//!
//! Design: [`fetch`] does a plain HTTP/1.1 GET over a std `TcpStream` (no async runtime for a
//! once-a-second poll); [`crate::ops::prom`] parses the text; [`frame`] turns scrapes into
//! figures and figures into lines, both pure and unit-tested. This module only loops: scrape,
//! render, draw, sleep a second. On a terminal each frame clears the screen and redraws it (ANSI
//! `ESC[H ESC[2J`); elsewhere (a pipe, a file) frames are plain text separated by a blank line.
//!
//! Rates need two scrapes: `--once` scrapes, waits [`INTERVAL`], scrapes again and prints one
//! frame; the live view's first frame shows "–" for rates, the next ones the rates since the
//! frame before.

pub mod fetch;
pub mod frame;

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::prom::Scrape;
pub use fetch::FetchError;
pub use frame::{Frame, Health};

/// Time between scrapes.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// `[ops] listen`'s default (CONTRACT.md), used without `--ops` and `--config`.
pub const DEFAULT_OPS: &str = "127.0.0.1:9464";
/// Clear the screen and put the cursor home.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// Why `braid status` stopped (exit status 1).
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("--ops {addr:?}: expected \"host:port\" (e.g. \"127.0.0.1:9464\")")]
    BadAddress { addr: String },
    #[error("{file}: [ops] listen = \"\" turns the ops endpoint off; nothing to show (pass --ops ADDR)")]
    EndpointOff { file: String },
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("{addr}/metrics: {error}")]
    NotMetrics { addr: SocketAddr, error: super::prom::ParseError },
    #[error("{addr}/metrics answered {status}")]
    Status { addr: SocketAddr, status: u16 },
    #[error("writing the screen: {0}")]
    Write(#[from] std::io::Error),
}

/// The address to connect to for a listen address: a wildcard (`0.0.0.0`, `[::]`) means the
/// loopback of the same family.
pub fn connect_addr(listen: &str) -> Result<SocketAddr, StatusError> {
    let bad = || StatusError::BadAddress { addr: listen.to_owned() };
    let mut addr = listen.trim().to_socket_addrs().map_err(|_| bad())?.next().ok_or_else(bad)?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(addr)
}

/// The ops address: `--ops`, else the config's `[ops] listen` (`config_file` names it in
/// errors), else [`DEFAULT_OPS`].
pub fn resolve(ops: Option<&str>, config: Option<(&str, &str)>) -> Result<SocketAddr, StatusError> {
    match (ops, config) {
        (Some(ops), _) => connect_addr(ops),
        (None, Some((file, listen))) if listen.trim().is_empty() => {
            Err(StatusError::EndpointOff { file: file.to_owned() })
        }
        (None, Some((_, listen))) => connect_addr(listen),
        (None, None) => connect_addr(DEFAULT_OPS),
    }
}

/// Processing time in ms since the Unix epoch (the lag's reference).
#[allow(clippy::disallowed_methods)] // the CLI reads the clock (clippy.toml)
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[allow(clippy::disallowed_methods)] // the CLI reads the clock (clippy.toml)
fn instant() -> Instant {
    Instant::now()
}

/// One scrape of `/metrics` and `/healthz`, and when it was taken.
struct Taken {
    metrics: Scrape,
    health: Health,
    at: Instant,
    at_ms: i64,
}

fn scrape(addr: SocketAddr) -> Result<Taken, StatusError> {
    let at = instant();
    let (status, text) = fetch::get(addr, "/metrics")?;
    if status != 200 {
        return Err(StatusError::Status { addr, status });
    }
    let metrics = Scrape::parse(&text).map_err(|error| StatusError::NotMetrics { addr, error })?;
    let (status, body) = fetch::get(addr, "/healthz")?;
    Ok(Taken { metrics, health: Health::from_answer(status, &body), at, at_ms: now_ms() })
}

fn frame(addr: SocketAddr, prev: Option<&Taken>, cur: &Taken) -> Frame {
    let prev = prev.map(|p| (&p.metrics, cur.at.duration_since(p.at).as_secs_f64()));
    Frame::from_scrapes(&addr.to_string(), prev, &cur.metrics, cur.at_ms, cur.health.clone())
}

/// `braid status --once`: two scrapes [`INTERVAL`] apart, one frame to `out`.
pub fn once(addr: SocketAddr, out: &mut impl Write) -> Result<(), StatusError> {
    let first = scrape(addr)?;
    std::thread::sleep(INTERVAL);
    let second = scrape(addr)?;
    for line in frame(addr, Some(&first), &second).render() {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(())
}

/// `braid status`: a frame every [`INTERVAL`] until interrupted. The first scrape must succeed
/// (else the error, exit 1); a later failure is shown in place of the frame and retried, so
/// the view survives a restart of the service.
pub fn live(addr: SocketAddr, out: &mut impl Write, terminal: bool) -> Result<(), StatusError> {
    let mut started = instant();
    let first = scrape(addr)?;
    draw(out, terminal, &frame(addr, None, &first).render())?;
    let mut prev = Some(first);
    loop {
        std::thread::sleep(INTERVAL.saturating_sub(started.elapsed()));
        started = instant();
        let lines = match scrape(addr) {
            Ok(cur) => {
                let lines = frame(addr, prev.as_ref(), &cur).render();
                prev = Some(cur);
                lines
            }
            Err(e) => {
                prev = None;
                vec![format!("braid status  {addr}  unreachable"), String::new(), e.to_string()]
            }
        };
        draw(out, terminal, &lines)?;
    }
}

/// One frame: on a terminal over the previous one, elsewhere after a blank line.
fn draw(out: &mut impl Write, terminal: bool, lines: &[String]) -> Result<(), StatusError> {
    if terminal {
        write!(out, "{CLEAR}")?;
    } else {
        writeln!(out)?;
    }
    for line in lines {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_comes_from_ops_then_the_config_then_the_default() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(resolve(Some("127.0.0.1:1"), Some(("f", "127.0.0.1:2"))).unwrap(), at("127.0.0.1:1"));
        assert_eq!(resolve(None, Some(("f", "127.0.0.1:2"))).unwrap(), at("127.0.0.1:2"));
        assert_eq!(resolve(None, None).unwrap(), at("127.0.0.1:9464"));
        assert_eq!(resolve(None, Some(("f", "0.0.0.0:3"))).unwrap(), at("127.0.0.1:3"));
        assert_eq!(resolve(None, Some(("f", "[::]:4"))).unwrap(), at("[::1]:4"));
        let off = resolve(None, Some(("gw.toml", ""))).unwrap_err();
        assert!(off.to_string().starts_with("gw.toml: [ops] listen = \"\" turns the ops endpoint off"), "{off}");
        assert!(matches!(resolve(Some("nonsense"), None), Err(StatusError::BadAddress { .. })));
    }
}
