//! `/metrics` and `/healthz` over HTTP/1.1 (CONTRACT.md "Metrics", `[ops] listen`).
//!
//! Design: the server runs on the io thread's tokio current-thread runtime, next to the signal
//! handlers and systemd's watchdog, so it must never let a client hold that thread or its memory:
//!
//! - at most [`MAX_CONNECTIONS`] connections at once; further clients wait in the kernel's
//!   accept backlog until one ends (a Prometheus server needs one, a curl from a shell another);
//! - a request head must arrive within [`HEADER_READ_TIMEOUT`] of the connection going idle, so
//!   a silent or slow-loris client, and an idle keep-alive connection, is closed (hyper starts
//!   that timer whenever it waits for a request head);
//! - a connection lives at most [`CONNECTION_LIFETIME`], so a client that sends requests but
//!   never reads the answers is closed too;
//! - a request head may take at most [`MAX_BUF`] bytes; bodies are never read.
//!
//! What to show comes from an [`OpsView`], which the service implements; its methods run on the
//! io thread and must answer quickly (gather figures the threads have already published).
//!
//! Routes: `GET /metrics` → 200 Prometheus text (version 0.0.4); `GET /healthz` → 200 `ok`, or
//! 503 with one reason a line; another path → 404; another method on these paths → 405 with
//! `Allow: GET, HEAD` (HEAD answers like GET, without the body). `GET /journal` → 200 the
//! journal's messages as replay input lines (`braid explain --live`), to loopback clients only
//! (403 to others: it holds the payloads); 404 where there is no journal, 503 when the intake
//! thread does not hand a copy over within [`JOURNAL_WAIT`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::throttle::{Throttle, now};

/// Connections served at once; more wait in the accept backlog.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request head (counted from when hyper waits for one).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection is kept, whatever the client does.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// How long connections get to finish their answer once the server shuts down.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The bounds above, as one value so tests can shrink them.
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_connections: usize,
    header_read_timeout: Duration,
    connection_lifetime: Duration,
    shutdown_grace: Duration,
}

const LIMITS: Limits = Limits {
    max_connections: MAX_CONNECTIONS,
    header_read_timeout: HEADER_READ_TIMEOUT,
    connection_lifetime: CONNECTION_LIFETIME,
    shutdown_grace: SHUTDOWN_GRACE,
};
/// hyper's read buffer per connection: request heads are small, 16 KiB is plenty.
const MAX_BUF: usize = 16 * 1024;
/// After a failed accept (EMFILE, ENOBUFS...): wait before trying again instead of spinning.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// The content type of the Prometheus text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// What the server shows; the service implements it (it gathers live figures from its threads).
pub trait OpsView: Send + Sync + 'static {
    /// The Prometheus text exposition of every metric.
    fn metrics(&self) -> String;
    /// `Ok` when healthy; else the reasons, one per line of the 503 answer.
    fn health(&self) -> Result<(), Vec<String>>;
    /// Warnings ([`crate::ops::warnings`]): listed after `ok` (or the reasons), one a line;
    /// they never turn the answer to 503.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
    /// `GET /journal`: a blocking reader of the journal's messages as replay input lines
    /// ([`crate::service`]); the server runs it off the io thread. `None`: no journal to read.
    fn journal(&self) -> Option<JournalReader> {
        None
    }
}

/// Reads the journal as `{"stream":NAME,"line":LINE}` lines; `Err`: why it could not.
pub type JournalReader = Box<dyn FnOnce() -> Result<String, String> + Send>;

/// How long `GET /journal` waits for the intake thread's copy (it answers within a round of its
/// loop, but not while it replays the journal at start).
pub const JOURNAL_WAIT: Duration = Duration::from_secs(5);

/// The journal route: loopback clients only (it holds the payloads braid took).
pub const JOURNAL_PATH: &str = "/journal";
const NDJSON: &str = "application/x-ndjson";

/// Errors starting the ops endpoint.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// `[ops] listen` is not an address (config validation normally catches this first).
    #[error("[ops] listen = {listen:?}: expected \"host:port\" (e.g. \"127.0.0.1:9464\"), or \"\" to turn it off")]
    BadAddress { listen: String },
    /// The address cannot be bound. Retrying helps only when the port is in use by a process
    /// that is going away (the previous instance during a restart).
    #[error("cannot listen for /metrics and /healthz on {addr} ([ops] listen): {error}")]
    Bind { addr: SocketAddr, error: std::io::Error },
}

/// Binds `listen` ("127.0.0.1:9464"; "" = off → `Ok(None)`).
pub async fn bind(listen: &str) -> Result<Option<TcpListener>, OpsError> {
    let listen = listen.trim();
    if listen.is_empty() {
        return Ok(None);
    }
    let addr: SocketAddr = listen.parse().map_err(|_| OpsError::BadAddress { listen: listen.to_owned() })?;
    let listener = TcpListener::bind(addr).await.map_err(|error| OpsError::Bind { addr, error })?;
    Ok(Some(listener))
}

/// Serves until `shutdown` turns true (or its sender is dropped), then gives open connections
/// [`SHUTDOWN_GRACE`] to finish their answer and closes the rest.
pub async fn serve(listener: TcpListener, view: Arc<dyn OpsView>, shutdown: watch::Receiver<bool>) {
    serve_within(LIMITS, listener, view, shutdown).await;
}

async fn serve_within(
    limits: Limits,
    listener: TcpListener,
    view: Arc<dyn OpsView>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    let mut accept_warnings = Throttle::new(Duration::from_secs(60));
    loop {
        tokio::select! {
            () = shut_down(&mut shutdown) => break,
            Some(ended) = connections.join_next(), if !connections.is_empty() => {
                if let Err(error) = ended {
                    tracing::warn!(%error, "Ops connection task failed");
                }
            }
            accepted = listener.accept(), if connections.len() < limits.max_connections => match accepted {
                Ok((stream, _peer)) => {
                    connections.spawn(serve_connection(limits, stream, Arc::clone(&view), shutdown.clone()));
                }
                Err(error) => {
                    if let Some(held_back) = accept_warnings.admit(now()) {
                        tracing::warn!(%error, held_back, "Ops endpoint cannot accept a connection");
                    }
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            },
        }
    }
    drop(listener);
    // Every connection watches the same flag and is closing gracefully; wait for them, bounded.
    let drained =
        tokio::time::timeout(limits.shutdown_grace, async { while connections.join_next().await.is_some() {} });
    if drained.await.is_err() {
        connections.abort_all();
    }
}

/// Resolves once `shutdown` is true, or its sender is gone (nobody could stop us any more).
async fn shut_down(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// One connection: HTTP/1.1 with keep-alive, closed after [`CONNECTION_LIFETIME`] or at shutdown.
async fn serve_connection(
    limits: Limits,
    stream: TcpStream,
    view: Arc<dyn OpsView>,
    mut shutdown: watch::Receiver<bool>,
) {
    let loopback = stream.peer_addr().is_ok_and(|peer| peer.ip().is_loopback());
    let service = service_fn(move |request: Request<Incoming>| {
        let journal = (request.uri().path() == JOURNAL_PATH && request.method() == Method::GET)
            .then(|| journal_reader(view.as_ref(), loopback));
        let answered = answer(view.as_ref(), request.method(), request.uri().path());
        async move {
            match journal {
                Some(Ok(read)) => Ok::<_, Infallible>(journal_answer(read).await),
                Some(Err((status, why))) => Ok(response(status, TEXT, why.to_owned())),
                None => Ok(answered),
            }
        }
    });
    let mut builder = http1::Builder::new();
    // max_buf_size panics below hyper's minimum of 8 KiB; MAX_BUF is a constant above it.
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).max_buf_size(MAX_BUF);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => Some(ended),
        () = shut_down(&mut shutdown) => None,
        () = tokio::time::sleep(limits.connection_lifetime) => None,
    };
    let ended = match ended {
        Some(ended) => ended,
        None => {
            // Finish the request in progress, if any, then close.
            connection.as_mut().graceful_shutdown();
            match tokio::time::timeout(limits.shutdown_grace, connection).await {
                Ok(ended) => ended,
                Err(_) => return,
            }
        }
    };
    // Clients resetting or timing out are routine, and nothing the service can act on.
    if let Err(error) = ended {
        tracing::debug!(%error, "Ops connection ended with an error");
    }
}

/// The journal's reader, or the refusal: a client off this machine (403), no journal (404).
fn journal_reader(view: &dyn OpsView, loopback: bool) -> Result<JournalReader, (StatusCode, &'static str)> {
    if !loopback {
        return Err((StatusCode::FORBIDDEN, "the journal is served to loopback clients only\n"));
    }
    view.journal().ok_or((StatusCode::NOT_FOUND, "no journal here\n"))
}

/// Runs the reader on tokio's blocking pool (it waits for the intake thread and converts every
/// payload): the io thread's other work goes on meanwhile.
async fn journal_answer(read: JournalReader) -> Response<Full<Bytes>> {
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(lines)) => response(StatusCode::OK, NDJSON, lines),
        Ok(Err(why)) => response(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
        Err(error) => response(StatusCode::INTERNAL_SERVER_ERROR, TEXT, format!("journal reader failed: {error}\n")),
    }
}

/// The answer to `method path`.
fn answer(view: &dyn OpsView, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let metrics = match path {
        "/metrics" => true,
        "/healthz" => false,
        // GET is answered by the journal's reader (serve_connection).
        JOURNAL_PATH => {
            let mut refused = response(StatusCode::METHOD_NOT_ALLOWED, TEXT, "method not allowed\n".to_owned());
            refused.headers_mut().insert(ALLOW, HeaderValue::from_static("GET"));
            return refused;
        }
        _ => return response(StatusCode::NOT_FOUND, TEXT, "not found\n".to_owned()),
    };
    if method != Method::GET && method != Method::HEAD {
        let mut refused = response(StatusCode::METHOD_NOT_ALLOWED, TEXT, "method not allowed\n".to_owned());
        refused.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return refused;
    }
    if metrics {
        return response(StatusCode::OK, METRICS_CONTENT_TYPE, view.metrics());
    }
    let (status, mut body) = match view.health() {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(reasons) => (StatusCode::SERVICE_UNAVAILABLE, reasons_text(&reasons)),
    };
    let warnings = view.warnings();
    if !warnings.is_empty() {
        body.push_str(&reasons_text(&warnings));
    }
    response(status, TEXT, body)
}

/// One reason a line: a line break inside a reason would read as two reasons.
fn reasons_text(reasons: &[String]) -> String {
    if reasons.is_empty() {
        return "unhealthy\n".to_owned();
    }
    let mut text = String::new();
    for reason in reasons {
        text.push_str(&reason.replace(['\r', '\n'], " "));
        text.push('\n');
    }
    text
}

fn response(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Figures are live: a proxy or browser must not answer from a cache.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    //! A real server on 127.0.0.1 (its own thread and current-thread runtime, as in the
    //! service) and a plain std `TcpStream` as the client.

    use std::io::{Read, Write};
    use std::sync::Mutex;
    use std::thread::JoinHandle;

    use super::*;

    struct TestView {
        health: Mutex<Result<(), Vec<String>>>,
        /// What the journal's reader gives; `None`: no journal.
        journal: Option<Result<String, String>>,
    }

    impl OpsView for TestView {
        fn metrics(&self) -> String {
            "# TYPE braid_up gauge\nbraid_up 1\n".to_owned()
        }
        fn health(&self) -> Result<(), Vec<String>> {
            self.health.lock().unwrap().clone()
        }
        fn journal(&self) -> Option<JournalReader> {
            let read = self.journal.clone()?;
            Some(Box::new(move || read))
        }
    }

    struct Server {
        addr: SocketAddr,
        stop: watch::Sender<bool>,
        thread: JoinHandle<()>,
    }

    impl Server {
        fn start(limits: Limits, health: Result<(), Vec<String>>) -> Server {
            Server::start_view(limits, TestView { health: Mutex::new(health), journal: None })
        }

        fn start_view(limits: Limits, view: TestView) -> Server {
            let view: Arc<dyn OpsView> = Arc::new(view);
            let (stop, shutdown) = watch::channel(false);
            let (addr_tx, addr_rx) = std::sync::mpsc::channel();
            let thread = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                runtime.block_on(async move {
                    let listener = bind("127.0.0.1:0").await.unwrap().unwrap();
                    addr_tx.send(listener.local_addr().unwrap()).unwrap();
                    serve_within(limits, listener, view, shutdown).await;
                });
            });
            let addr = addr_rx.recv_timeout(Duration::from_secs(5)).unwrap();
            Server { addr, stop, thread }
        }

        /// Stops the server and waits for `serve` to return; how long that took.
        fn stop(self) -> Duration {
            let start = now();
            self.stop.send(true).unwrap();
            self.thread.join().unwrap();
            start.elapsed()
        }
    }

    struct Answer {
        status: u16,
        head: String,
        body: String,
    }

    /// Sends `method path` with `Connection: close` and reads the whole answer.
    fn request(addr: SocketAddr, method: &str, path: &str) -> Answer {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(stream, "{method} {path} HTTP/1.1\r\nHost: braid\r\nConnection: close\r\n\r\n").unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        Answer { status, head: head.to_ascii_lowercase(), body: body.to_owned() }
    }

    #[test]
    fn the_journal_is_read_off_the_io_thread_or_refused() {
        let none = Server::start(LIMITS, Ok(()));
        assert_eq!(request(none.addr, "GET", "/journal").status, 404);
        let post = request(none.addr, "POST", "/journal");
        assert_eq!(post.status, 405);
        assert!(post.head.contains("allow: get\r\n") || post.head.ends_with("allow: get"), "{}", post.head);
        none.stop();

        let lines = "{\"stream\":\"status\",\"line\":{\"ts\":1,\"arrival\":2}}\n".to_owned();
        let view = TestView { health: Mutex::new(Ok(())), journal: Some(Ok(lines.clone())) };
        let held = Server::start_view(LIMITS, view);
        let journal = request(held.addr, "GET", "/journal");
        assert_eq!((journal.status, journal.body.as_str()), (200, lines.as_str()));
        assert!(journal.head.contains("content-type: application/x-ndjson"), "{}", journal.head);
        held.stop();

        let view = TestView { health: Mutex::new(Ok(())), journal: Some(Err("intake busy".into())) };
        let busy = Server::start_view(LIMITS, view);
        let journal = request(busy.addr, "GET", "/journal");
        assert_eq!((journal.status, journal.body.as_str()), (503, "intake busy\n"));
        busy.stop();
    }

    #[test]
    fn answers_metrics_health_and_refusals() {
        let server = Server::start(LIMITS, Ok(()));
        let metrics = request(server.addr, "GET", "/metrics");
        assert_eq!(metrics.status, 200);
        assert!(metrics.head.contains("content-type: text/plain; version=0.0.4"), "{}", metrics.head);
        assert_eq!(metrics.body, "# TYPE braid_up gauge\nbraid_up 1\n");
        assert_eq!(request(server.addr, "GET", "/metrics?name[]=braid_up").status, 200);

        let health = request(server.addr, "GET", "/healthz");
        assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));

        let head = request(server.addr, "HEAD", "/metrics");
        assert_eq!((head.status, head.body.as_str()), (200, ""));

        let missing = request(server.addr, "GET", "/");
        assert_eq!(missing.status, 404);
        assert_eq!(request(server.addr, "POST", "/nowhere").status, 404);

        let post = request(server.addr, "POST", "/metrics");
        assert_eq!(post.status, 405);
        assert!(post.head.contains("allow: get, head"), "{}", post.head);
        assert_eq!(request(server.addr, "DELETE", "/healthz").status, 405);
        server.stop();
    }

    #[test]
    fn unhealthy_answers_503_with_one_reason_a_line() {
        let reasons = vec!["sink `cloud` disconnected for 30s".to_owned(), "shard 1\nstalled".to_owned()];
        let server = Server::start(LIMITS, Err(reasons));
        let health = request(server.addr, "GET", "/healthz");
        assert_eq!(health.status, 503);
        assert_eq!(health.body, "sink `cloud` disconnected for 30s\nshard 1 stalled\n");
        server.stop();

        let server = Server::start(LIMITS, Err(Vec::new()));
        let health = request(server.addr, "GET", "/healthz");
        assert_eq!((health.status, health.body.as_str()), (503, "unhealthy\n"));
        server.stop();
    }

    #[test]
    fn keep_alive_serves_several_requests_on_one_connection() {
        let server = Server::start(LIMITS, Ok(()));
        let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(stream, "GET /healthz HTTP/1.1\r\nHost: b\r\n\r\nGET /healthz HTTP/1.1\r\nHost: b\r\n\r\n").unwrap();
        let mut raw = Vec::new();
        let mut buf = [0u8; 1024];
        while raw.windows(3).filter(|w| w == b"ok\n").count() < 2 {
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&raw));
            raw.extend_from_slice(&buf[..n]);
        }
        server.stop();
    }

    #[test]
    fn slow_clients_cannot_hold_the_server() {
        let limits = Limits {
            max_connections: 2,
            header_read_timeout: Duration::from_millis(300),
            connection_lifetime: Duration::from_secs(5),
            shutdown_grace: Duration::from_millis(500),
        };
        let server = Server::start(limits, Ok(()));
        // Two clients take every slot: one silent, one stuck half-way through a request head.
        let mut silent = std::net::TcpStream::connect(server.addr).unwrap();
        let mut slow = std::net::TcpStream::connect(server.addr).unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHost:").unwrap();
        // A third is answered once the header timeout has closed them.
        let start = now();
        assert_eq!(request(server.addr, "GET", "/healthz").status, 200);
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(3), "{waited:?}");
        for stream in [&mut silent, &mut slow] {
            stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut rest = Vec::new();
            // Closed by the server: EOF (possibly after an error answer) or a reset, not our timeout.
            if let Err(error) = stream.read_to_end(&mut rest) {
                assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
            }
        }
        server.stop();
    }

    #[test]
    fn shutdown_ends_serve_with_connections_open() {
        let limits = Limits { shutdown_grace: Duration::from_millis(500), ..LIMITS };
        let server = Server::start(limits, Ok(()));
        let mut idle = std::net::TcpStream::connect(server.addr).unwrap();
        assert_eq!(request(server.addr, "GET", "/healthz").status, 200);
        let addr = server.addr;
        let took = server.stop();
        assert!(took < Duration::from_secs(3), "{took:?}");
        idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        let _ = idle.read_to_end(&mut rest);
        assert!(std::net::TcpStream::connect(addr).is_err(), "still listening after shutdown");
    }

    #[test]
    fn bind_reads_the_listen_setting() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            assert!(bind("").await.unwrap().is_none());
            assert!(bind("  ").await.unwrap().is_none());
            let error = bind("localhost").await.unwrap_err();
            assert!(matches!(error, OpsError::BadAddress { .. }), "{error}");
            let taken = bind("127.0.0.1:0").await.unwrap().unwrap();
            let addr = taken.local_addr().unwrap();
            let error = bind(&addr.to_string()).await.unwrap_err();
            let message = error.to_string();
            assert!(message.contains(&addr.to_string()) && message.contains("[ops] listen"), "{message}");
        });
    }
}
