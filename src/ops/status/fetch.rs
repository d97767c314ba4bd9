//! One plain HTTP/1.1 GET over a std `TcpStream` (`Connection: close`), enough for braid's own
//! ops endpoint: a status line, headers, and a body with `Content-Length`, chunked, or up to the
//! close. Bounded: connect within [`CONNECT_TIMEOUT`], every read within [`READ_TIMEOUT`], at
//! most [`MAX_ANSWER`] bytes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const READ_TIMEOUT: Duration = Duration::from_secs(3);
/// A `/metrics` answer of a large plan is a few hundred KiB; more means something else answers.
pub const MAX_ANSWER: u64 = 16 * 1024 * 1024;

/// Why a GET failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Nothing answers at the address (refused, timed out, reset). Retrying helps once the
    /// service is up.
    #[error("cannot reach {addr}: {error}")]
    Unreachable { addr: SocketAddr, error: std::io::Error },
    /// Something answered, but not HTTP as braid's endpoint speaks it.
    #[error("{addr}{path}: not an HTTP answer braid understands: {what}")]
    BadAnswer { addr: SocketAddr, path: String, what: String },
}

/// `GET path` on `addr`: the status code and the body as text (invalid UTF-8 replaced).
pub fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), FetchError> {
    get_bounded(addr, path, MAX_ANSWER)
}

/// [`get`] taking up to `max_answer` bytes (`braid explain --live` reads a whole journal).
pub fn get_bounded(addr: SocketAddr, path: &str, max_answer: u64) -> Result<(u16, String), FetchError> {
    let unreachable = |error| FetchError::Unreachable { addr, error };
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(unreachable)?;
    stream.set_read_timeout(Some(READ_TIMEOUT)).map_err(unreachable)?;
    stream.set_write_timeout(Some(READ_TIMEOUT)).map_err(unreachable)?;
    // One write: `write!` on the unbuffered stream would send the request in pieces, and a server
    // that answers and closes after the first of them makes the next one fail (a broken pipe).
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: braid-status\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(unreachable)?;
    let mut raw = Vec::new();
    stream.take(max_answer).read_to_end(&mut raw).map_err(unreachable)?;
    parse_answer(&raw).map_err(|what| FetchError::BadAnswer { addr, path: path.to_owned(), what })
}

/// A whole HTTP/1.x answer → (status, body).
fn parse_answer(raw: &[u8]) -> Result<(u16, String), String> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no end of the header")?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| "header is not UTF-8")?;
    let body = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let status = match (parts.next(), parts.next()) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => code.parse::<u16>().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("status line {status_line:?}"))?;
    let header = |name: &str| {
        lines.clone().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(body)?
    } else if let Some(len) = header("content-length") {
        let len: usize = len.parse().map_err(|_| format!("Content-Length {len:?}"))?;
        body.get(..len).ok_or("body shorter than its Content-Length")?.to_vec()
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut s: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = s.windows(2).position(|w| w == b"\r\n").ok_or("chunk size without its line end")?;
        let size = std::str::from_utf8(&s[..eol]).unwrap_or_default();
        let size = size.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| format!("chunk size {size:?}"))?;
        s = &s[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(s.get(..size).ok_or("chunk shorter than its size")?);
        s = s.get(size + 2..).ok_or("chunk without its line end")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_chunked_and_to_the_close() {
        let fixed = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\nextra";
        assert_eq!(parse_answer(fixed).unwrap(), (200, "ok\n".to_owned()));
        let chunked = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nsour\r\n3;x=1\r\nce!\r\n0\r\n\r\n";
        assert_eq!(parse_answer(chunked).unwrap(), (503, "source!".to_owned()));
        let closed = b"HTTP/1.0 404 Not Found\r\n\r\nnothing here";
        assert_eq!(parse_answer(closed).unwrap(), (404, "nothing here".to_owned()));
    }

    #[test]
    fn not_http() {
        assert!(parse_answer(b"SSH-2.0-OpenSSH\r\n").unwrap_err().contains("no end of the header"));
        assert!(parse_answer(b"hello world\r\n\r\n").unwrap_err().contains("status line"));
        let short = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
        assert!(parse_answer(short).unwrap_err().contains("shorter"));
    }

    #[test]
    fn a_real_socket_and_a_closed_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let (mut buf, mut n) = ([0u8; 1024], 0);
            while !buf[..n].ends_with(b"\r\n\r\n") {
                let read = s.read(&mut buf[n..]).unwrap();
                assert!(read > 0, "the request ended early");
                n += read;
            }
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nm 1.5\n").unwrap();
            request
        });
        assert_eq!(get(addr, "/metrics").unwrap(), (200, "m 1.5\n".to_owned()));
        let request = server.join().unwrap();
        assert!(request.starts_with("GET /metrics HTTP/1.1\r\n"), "{request}");
        assert!(request.contains("\r\nConnection: close\r\n"), "{request}");
        // Nothing listens on the port any more.
        let e = get(addr, "/metrics").unwrap_err();
        assert!(matches!(e, FetchError::Unreachable { .. }), "{e}");
        assert!(e.to_string().starts_with(&format!("cannot reach {addr}: ")), "{e}");
    }
}
