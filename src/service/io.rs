//! The io thread: one tokio current-thread runtime for what waits on the network or on the
//! system apart from braid's MQTT clients — embedded brokers' start, the `/metrics` server,
//! signals and systemd notifications. It does no join work. The MQTT sources and sinks (rumqttc
//! needs tokio; the shards run on monoio) run on the intake thread (sources.rs); this thread
//! starts them there.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::config::SourceKind;
use crate::ops::systemd::Notifier;
use crate::plan::Plan;
use crate::shard::wake::Doorbell;
use crate::sink::mqtt::Uplink;
use crate::source::mqtt::{SourceSettings, SourceStatus, subscription_filter};
use crate::source::{Confirmations, Delivery, Intake};
use crate::storage::write_faults;

use super::sources::SourceRuntime;
use super::view::LiveView;
use super::{Control, DRAIN, Request, ServiceError, embedded_listen};

/// How often the supervisor looks at readiness, the watchdog and the status line.
const SUPERVISE_EVERY: Duration = Duration::from_millis(100);
/// Seconds a shard may leave frames waiting without taking any before the watchdog stops (a busy
/// shard takes its ring in batches well within this).
const STALLED_ROUNDS: u64 = 5;
/// How often STATUS= is refreshed.
const STATUS_EVERY: Duration = Duration::from_secs(5);

pub struct IoThread {
    handle: tokio::runtime::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
    exit: watch::Sender<bool>,
    shared: Arc<Shared>,
}

/// What the io thread and the intake thread both see.
struct Shared {
    control: Arc<Control>,
    view: Arc<LiveView>,
    config_path: Option<PathBuf>,
    notifier: Notifier,
    /// A validated configuration that differs from the running one, waiting to be applied.
    reloaded: Mutex<Option<(String, Plan)>>,
    /// The text of the running configuration (an unchanged file is not reloaded).
    running_text: Mutex<Option<String>>,
    /// The text a reload replaced, until the new configuration has started.
    replaced_text: Mutex<Option<String>>,
    /// The sources of the running generation (readiness: all subscribed).
    sources: Mutex<Vec<Arc<SourceStatus>>>,
    /// READY=1 was sent for the running generation.
    ready: std::sync::atomic::AtomicBool,
    /// Embedded brokers by address: started once, kept across reloads (rumqttd cannot stop).
    #[cfg(feature = "embedded-broker")]
    brokers: Mutex<HashMap<SocketAddr, crate::broker::EmbeddedBroker>>,
}

/// How braid's own source reaches an embedded broker: rumqttd's loopback port, with the secret.
struct BrokerLink {
    addr: SocketAddr,
    login: (String, String),
    refusals: Arc<crate::source::mqtt::BrokerRefusals>,
}

#[cfg(feature = "embedded-broker")]
impl BrokerLink {
    fn of(broker: &crate::broker::EmbeddedBroker) -> BrokerLink {
        BrokerLink { addr: broker.local_addr(), login: broker.own_login(), refusals: broker.refusals() }
    }
}

/// Where a generation's sources run and what they feed: the intake thread's runtime, its
/// channel, its confirmations and its doorbell.
pub struct SourceFeed<'a> {
    pub runtime: &'a SourceRuntime,
    pub intake: crossbeam_channel::Sender<Delivery>,
    pub confirmations: Arc<Confirmations>,
    pub doorbell: Arc<Doorbell>,
}

/// The tasks of one generation.
pub struct GenerationTasks {
    stop_sources: watch::Sender<bool>,
    stop_sinks: watch::Sender<bool>,
    sources: Vec<tokio::task::JoinHandle<()>>,
    sinks: Vec<tokio::task::JoinHandle<()>>,
    status: Vec<Arc<SourceStatus>>,
    uplinks: Vec<Arc<Uplink>>,
}

impl IoThread {
    /// Starts the thread; returns once its signal handlers are installed (before that, SIGTERM
    /// would kill the process outright).
    pub fn start(
        control: Arc<Control>,
        view: Arc<LiveView>,
        config_path: Option<PathBuf>,
    ) -> Result<IoThread, ServiceError> {
        let running_text = config_path.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
        let shared = Arc::new(Shared {
            control,
            view,
            config_path,
            notifier: Notifier::from_env(),
            reloaded: Mutex::new(None),
            running_text: Mutex::new(running_text),
            replaced_text: Mutex::new(None),
            sources: Mutex::new(Vec::new()),
            ready: Default::default(),
            #[cfg(feature = "embedded-broker")]
            brokers: Mutex::new(HashMap::new()),
        });
        let (exit, exit_rx) = watch::channel(false);
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("braid-io".into())
            .spawn(move || io_main(for_thread, exit_rx, started_tx))
            .map_err(|e| ServiceError::Io(e.to_string()))?;
        let handle = started_rx
            .recv()
            .map_err(|_| ServiceError::Io("the io thread ended at start".into()))?
            .map_err(ServiceError::Io)?;
        Ok(IoThread { handle, thread: Some(thread), exit, shared })
    }

    /// Binds `[ops] listen` and serves `/metrics` and `/healthz` ("" turns it off).
    pub fn serve_ops(&self, listen: &str) -> Result<(), ServiceError> {
        let view: Arc<dyn crate::ops::http::OpsView> = Arc::clone(&self.shared.view) as _;
        let listener =
            self.handle.block_on(crate::ops::http::bind(listen)).map_err(|e| ServiceError::Io(e.to_string()))?;
        if let Some(listener) = listener {
            let shutdown = self.exit.subscribe();
            self.handle.spawn(crate::ops::http::serve(listener, view, shutdown));
        }
        Ok(())
    }

    /// Starts the embedded brokers and sinks of a generation, and its sources where `feed` says.
    pub fn start_generation(
        &self,
        plan: &Arc<Plan>,
        state_dir: &std::path::Path,
        uplinks: &[Arc<Uplink>],
        feed: SourceFeed<'_>,
    ) -> Result<GenerationTasks, ServiceError> {
        let SourceFeed { runtime: sources, intake, confirmations, doorbell } = feed;
        let (stop_sources, sources_rx) = watch::channel(false);
        let (stop_sinks, sinks_rx) = watch::channel(false);
        let mut tasks = GenerationTasks {
            stop_sources,
            stop_sinks,
            sources: Vec::new(),
            sinks: Vec::new(),
            status: Vec::new(),
            uplinks: uplinks.to_vec(),
        };
        for (index, def) in plan.sources.iter().enumerate() {
            let status = Arc::new(SourceStatus::default());
            let mut own_login = None;
            let url = match embedded_listen(plan, index) {
                Some(addr) => {
                    let link = self.ensure_broker(addr, plan, index)?;
                    own_login = Some(link.login);
                    let _ = status.broker.set(link.refusals);
                    format!("mqtt://{}", link.addr)
                }
                None if def.kind == SourceKind::Embedded => {
                    return Err(ServiceError::Source {
                        source_name: def.name.clone(),
                        error: "listen is not a socket address".into(),
                    });
                }
                None => def.url.clone().unwrap_or_default(),
            };
            let mut filters: Vec<String> =
                plan.source_streams(index).filter_map(|(_, s)| s.topic.as_deref().map(subscription_filter)).collect();
            filters.dedup();
            let client_id = crate::mqtt::persistent_client_id(state_dir, &def.name)
                .map_err(|e| ServiceError::Source { source_name: def.name.clone(), error: e.to_string() })?;
            let settings = SourceSettings {
                index,
                name: def.name.clone(),
                url,
                conn: def.conn.clone(),
                client_id,
                own_login,
                filters,
                max_payload: plan.source_max_payload(index),
                qos: rumqttc::QoS::AtLeastOnce,
            };
            tasks.status.push(Arc::clone(&status));
            let intake = Intake::new(intake.clone(), Arc::clone(&doorbell));
            let future =
                crate::source::mqtt::run(settings, intake, Arc::clone(&confirmations), status, sources_rx.clone());
            let name = def.name.clone();
            tasks.sources.push(sources.handle().spawn(async move {
                if let Err(error) = future.await {
                    tracing::error!(source = %name, %error, "source stopped");
                }
            }));
        }
        for uplink in uplinks {
            let name = uplink.name().to_owned();
            let Some(def) = plan.sinks.iter().find(|s| s.name == name).cloned() else { continue };
            let future = crate::sink::mqtt::run(Arc::clone(uplink), def, sinks_rx.clone(), DRAIN);
            tasks.sinks.push(sources.handle().spawn(async move {
                if let Err(error) = future.await {
                    tracing::error!(sink = %name, %error, "sink stopped");
                }
            }));
        }
        *lock(&self.shared.sources) = tasks.status.clone();
        self.shared.ready.store(false, Ordering::Release);
        Ok(tasks)
    }

    /// Starts the embedded broker listening on `addr` unless it runs already (then it reads the
    /// access files this configuration names); returns how braid's own source reaches it.
    #[cfg(feature = "embedded-broker")]
    fn ensure_broker(&self, addr: SocketAddr, plan: &Plan, source: usize) -> Result<BrokerLink, ServiceError> {
        let def = &plan.sources[source];
        let source_error = |e: crate::broker::BrokerError| ServiceError::Source {
            source_name: def.name.clone(),
            error: e.to_string(),
        };
        let access = crate::broker::AccessFiles {
            users_file: def.access.users_file.as_ref().map(Into::into),
            acl_file: def.access.acl_file.as_ref().map(Into::into),
            anonymous: def.access.anonymous,
        };
        let mut brokers = lock(&self.shared.brokers);
        if let Some(broker) = brokers.get(&addr) {
            broker.reload(Some(&access)).map_err(source_error)?;
            return Ok(BrokerLink::of(broker));
        }
        let max_payload = plan.source_max_payload(source);
        let conn = &def.conn;
        // Devices connect with TLS when the source names the broker's certificate and key.
        let tls = match (&conn.cert_file, &conn.key_file) {
            (Some(cert), Some(key)) => Some(crate::broker::BrokerTls {
                cert_file: cert.into(),
                key_file: key.into(),
                ca_file: conn.ca_file.as_ref().map(Into::into),
            }),
            _ => None,
        };
        let settings = crate::broker::BrokerSettings {
            listen: addr,
            // Payloads just above the streams' limit still reach braid, to be dead-lettered.
            max_payload: usize::try_from(max_payload).unwrap_or(usize::MAX).saturating_mul(2).max(64 * 1024),
            tls,
            access,
        };
        let broker = crate::broker::start(settings).map_err(source_error)?;
        tracing::info!(source = %def.name, %addr, users_file = ?def.access.users_file, acl_file = ?def.access.acl_file, "embedded broker listening");
        let link = BrokerLink::of(&broker);
        brokers.insert(addr, broker);
        Ok(link)
    }

    #[cfg(not(feature = "embedded-broker"))]
    fn ensure_broker(&self, _addr: SocketAddr, plan: &Plan, source: usize) -> Result<BrokerLink, ServiceError> {
        Err(ServiceError::Source {
            source_name: plan.sources[source].name.clone(),
            error: "this build has no embedded broker (cargo feature `embedded-broker`)".into(),
        })
    }

    /// The validated configuration a SIGHUP found, if it differs from the running one.
    pub fn take_reloaded(&self) -> Option<Plan> {
        let (text, plan) = lock(&self.shared.reloaded).take()?;
        *lock(&self.shared.replaced_text) = lock(&self.shared.running_text).replace(text);
        Some(plan)
    }

    /// The reloaded configuration could not start and the previous one runs again: so does its
    /// text (a later SIGHUP with the same failing file tries it again).
    pub fn reload_failed(&self) {
        let previous = lock(&self.shared.replaced_text).take();
        *lock(&self.shared.running_text) = previous;
    }

    /// The service is done: STOPPING=1, the io thread ends.
    pub fn stopped(mut self) {
        self.shared.notifier.stopping("stopped");
        let _ = self.exit.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl GenerationTasks {
    pub fn status(&self) -> (Vec<Arc<SourceStatus>>, Vec<Arc<Uplink>>) {
        (self.status.clone(), self.uplinks.clone())
    }

    /// Stops the sources (they disconnect; what they did not hand over stays with the broker)
    /// and waits for them.
    pub fn stop_sources(&mut self, sources: &SourceRuntime) {
        let _ = self.stop_sources.send(true);
        for task in self.sources.drain(..) {
            let _ = sources.block_on(task);
        }
    }

    /// Stops the sinks: each drains its buffer while connected, for at most `drain`.
    pub fn stop_sinks(&mut self, sources: &SourceRuntime, drain: Duration) {
        let _ = self.stop_sinks.send(true);
        let deadline = Instant::now() + drain + Duration::from_secs(2);
        for task in self.sinks.drain(..) {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = sources.block_on(async { tokio::time::timeout(left, task).await });
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked while holding it; the data is plain.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn io_main(
    shared: Arc<Shared>,
    exit: watch::Receiver<bool>,
    started: std::sync::mpsc::Sender<Result<tokio::runtime::Handle, String>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = started.send(Err(format!("cannot build the tokio runtime: {e}")));
            return;
        }
    };
    let handle = runtime.handle().clone();
    runtime.block_on(async move {
        let signals = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()), signal(SignalKind::hangup()));
        let (Ok(term), Ok(int), Ok(hup)) = signals else {
            let _ = started.send(Err("cannot install signal handlers".into()));
            return;
        };
        let _ = started.send(Ok(handle));
        supervise(&shared, term, int, hup, exit).await;
    });
}

async fn supervise(
    shared: &Shared,
    mut term: tokio::signal::unix::Signal,
    mut int: tokio::signal::unix::Signal,
    mut hup: tokio::signal::unix::Signal,
    mut exit: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(SUPERVISE_EVERY);
    let mut watchdog = Watchdog::new(shared.notifier.watchdog_period());
    let mut status = StatusLine::default();
    loop {
        tokio::select! {
            _ = term.recv() => stop(shared, "SIGTERM"),
            _ = int.recv() => stop(shared, "SIGINT"),
            _ = hup.recv() => reload(shared),
            _ = exit.changed() => return,
            _ = tick.tick() => {
                announce_ready(shared);
                watchdog.check(shared);
                status.refresh(shared);
            }
        }
    }
}

fn stop(shared: &Shared, why: &str) {
    tracing::info!("{why}: stopping (intake first, then shards and sinks drain)");
    shared.notifier.stopping("draining");
    shared.control.ask(Request::Stop);
}

/// SIGHUP: re-read and validate the configuration; apply it only when it is valid and changed.
fn reload(shared: &Shared) {
    let Some(path) = &shared.config_path else {
        tracing::info!("SIGHUP: no configuration file to re-read");
        return;
    };
    shared.notifier.reloading();
    reload_broker_access(shared);
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => {
            tracing::error!(path = %path.display(), %error, "SIGHUP: cannot read the configuration; keeping the running one");
            shared.notifier.ready("running (reload failed: unreadable configuration)");
            return;
        }
    };
    if lock(&shared.running_text).as_deref() == Some(text.as_str()) {
        tracing::info!("SIGHUP: configuration unchanged");
        shared.notifier.ready("running (configuration unchanged)");
        return;
    }
    match crate::config::parse(&path.display().to_string(), &text) {
        Ok(plan) => {
            tracing::info!("SIGHUP: configuration valid; applying it");
            *lock(&shared.reloaded) = Some((text, plan));
            shared.ready.store(false, Ordering::Release);
            shared.control.ask(Request::Reload);
        }
        Err(errors) => {
            tracing::error!("SIGHUP: {}", errors.to_string().trim_end());
            tracing::error!(count = errors.errors.len(), "SIGHUP: configuration invalid; keeping the running one");
            shared.notifier.ready("running (reload refused: invalid configuration)");
        }
    }
}

/// SIGHUP: the embedded brokers read their users and ACL files again (also when the configuration
/// is unchanged: rotating a device's password touches only the users file). A file that cannot be
/// read or parsed leaves the running policy in place.
fn reload_broker_access(shared: &Shared) {
    #[cfg(feature = "embedded-broker")]
    for (addr, broker) in lock(&shared.brokers).iter() {
        match broker.reload(None) {
            Ok(()) => tracing::info!(%addr, "SIGHUP: embedded broker's users and ACL files read again"),
            Err(error) => tracing::error!(%addr, %error, "SIGHUP: keeping the embedded broker's running users and ACL"),
        }
    }
    #[cfg(not(feature = "embedded-broker"))]
    let _ = shared;
}

/// READY=1 once every source of the running generation has its subscriptions. Not while a
/// reload or a stop is pending: the generation still running is the old one (its sources stay
/// subscribed until they disconnect), and READY=1 after RELOADING=1 tells systemd the new
/// configuration is in effect.
fn announce_ready(shared: &Shared) {
    if shared.ready.load(Ordering::Acquire) || !shared.view.is_running() || shared.control.request() != Request::Run {
        return;
    }
    let all = lock(&shared.sources).iter().all(|s| s.subscribed.load(Ordering::Acquire));
    if all {
        shared.ready.store(true, Ordering::Release);
        tracing::info!("ready: subscribed");
        shared.notifier.ready("running");
    }
}

/// WATCHDOG=1 every half WatchdogSec, only while the intake loop moves and every shard takes the
/// frames waiting for it: a shard that stopped (its ring not drained for [`STALLED_ROUNDS`]
/// seconds) or an intake stuck behind it stops the pings, and systemd restarts braid.
///
/// Backpressure is no hang: while the intake waits for room in a full sink buffer
/// (`overflow = "block"`, the uplink down or slow), its loop stands still on purpose. Then the
/// pings go on as long as that wait itself moves (its rounds, counted by the waiting thread every
/// 50 ms): the thread is alive and where it should be. A restart would not bring the uplink back,
/// only replay the journal into the same full buffer, again and again. The same for a file sink
/// waiting for its full disk (its attempts, one a second, move) and for a sink's buffer whose
/// disk is full (a wait for room like the other). A journal that cannot write does not hold the
/// loop at all (service/intake.rs).
struct Watchdog {
    period: Option<Duration>,
    last_ping: Instant,
    last_heartbeat: u64,
    last_wait_rounds: u64,
    /// Attempts of the file sinks waiting for a full disk at the last ping.
    last_retries: u64,
}

impl Watchdog {
    fn new(period: Option<Duration>) -> Watchdog {
        Watchdog {
            period,
            last_ping: Instant::now(),
            last_heartbeat: u64::MAX,
            last_wait_rounds: u64::MAX,
            last_retries: 0,
        }
    }

    fn check(&mut self, shared: &Shared) {
        let Some(period) = self.period else { return };
        // The notifier's period is already half of WatchdogSec.
        if self.last_ping.elapsed() < period {
            return;
        }
        let heartbeat = shared.control.heartbeat.load(Ordering::Relaxed);
        let shards_move = shared.control.stalled_rounds.load(Ordering::Relaxed) < STALLED_ROUNDS;
        let blocked = shared.view.backpressure();
        let wait_rounds = blocked.iter().map(|(_, b)| b.rounds).fold(0, u64::wrapping_add);
        let waiting_alive = !blocked.is_empty() && wait_rounds != self.last_wait_rounds;
        // A file sink whose disk is full holds the intake too, trying again every second.
        let file_sinks_retrying: u64 = write_faults::failing()
            .iter()
            .filter(|f| f.site.starts_with("file sink "))
            .map(|f| f.attempts)
            .fold(0, u64::wrapping_add);
        let retrying_alive = file_sinks_retrying != 0 && file_sinks_retrying != self.last_retries;
        if (heartbeat != self.last_heartbeat && shards_move) || waiting_alive || retrying_alive {
            self.last_heartbeat = heartbeat;
            self.last_wait_rounds = wait_rounds;
            self.last_retries = file_sinks_retrying;
            self.last_ping = Instant::now();
            shared.notifier.watchdog();
        }
    }
}

/// STATUS= every few seconds: rates since the last one; at once when backpressure or a failing
/// write site (a full disk) begins or ends, which the line then opens with (`degraded:
/// backpressure: sink up full (...) · in 0/s`, `degraded: disk full: journal (...) · ...`).
#[derive(Default)]
struct StatusLine {
    last: Option<(Instant, super::view::Totals)>,
    /// The sinks the intake waited on and the write sites failing at the last line.
    blocked: Vec<String>,
}

impl StatusLine {
    fn refresh(&mut self, shared: &Shared) {
        let now = Instant::now();
        let blocked = shared.view.backpressure();
        let failing = write_faults::failing();
        let state_full = shared.view.state_budget();
        let mut names: Vec<String> = blocked.iter().map(|(name, _)| name.clone()).collect();
        names.extend(failing.iter().map(|f| f.site.clone()));
        names.extend(state_full.iter().map(|_| "state budget".to_owned()));
        let changed = names != self.blocked;
        if !changed && self.last.as_ref().is_some_and(|(at, _)| now.duration_since(*at) < STATUS_EVERY) {
            return;
        }
        self.blocked = names;
        let totals = shared.view.totals();
        let rates = self.last.as_ref().map(|(at, before)| totals.status_line(before, now.duration_since(*at)));
        let mut degraded: Vec<String> =
            blocked.iter().map(|(name, b)| super::view::backpressure_reason(name, b)).collect();
        degraded.extend(failing.iter().map(write_faults::Failing::reason));
        degraded.extend(state_full);
        let line = match (degraded.is_empty(), rates) {
            (true, Some(rates)) => Some(rates),
            (true, None) => None,
            (false, Some(rates)) => Some(format!("degraded: {} · {rates}", degraded.join(" · "))),
            (false, None) => Some(format!("degraded: {}", degraded.join(" · "))),
        };
        if let Some(line) = line {
            shared.notifier.status(&line);
        }
        self.last = Some((now, totals));
    }
}
