//! The MQTT source: one rumqttc v4 connection that subscribes to a source's stream topics and
//! hands every message to the feeder as a [`Delivery`], acknowledging it only once the feeder
//! confirmed it durable (docs/edge-io-research.md §1.2–1.5 is the recipe this follows).
//!
//! Design:
//! - **Persistent session** (`clean_session = false`, a client id stable across restarts): what
//!   braid has not acknowledged stays with the broker through disconnects, broker restarts (with
//!   broker persistence) and braid restarts. Subscriptions are (re)sent on the first ConnAck and
//!   on every ConnAck whose `session_present` is false (the broker forgot them).
//! - **Acks in receive order, after confirmation.** Every QoS 1 delivery handed to the feeder
//!   enters the [`AckQueue`] under its `seq`; the prefix with `seq ≤ confirmed` is acked, in that
//!   order (MQTT-4.6.0-2; rumqttd disconnects on out-of-order acks). The queue is keyed by `seq`,
//!   never by pkid, because the broker reuses pkids after a reconnect. On a disconnect the queue
//!   is cleared: the broker redelivers every un-acked message (the duplicates get the same row
//!   ids downstream). The acks of a round of confirmations are written to the connection between
//!   polls and flushed once (`write_acks`), not sent one request (and one system call) each
//!   through the client. They go out at the source's next round: the next read from the broker,
//!   a wake-up by the feeder once [`ACK_WAKE_AFTER`](super::ACK_WAKE_AFTER) wait, or the
//!   [`HANDOFF_RETRY`] timer, which runs while any delivery handed off is not acked.
//! - **Backpressure.** A full intake channel keeps deliveries in the local `waiting` queue, which
//!   is retried every [`HANDOFF_RETRY`] and after the feeder's wake-ups. Un-handed deliveries are not
//!   confirmed and so not acked, so the broker stops at its in-flight window (mosquitto: 20). The
//!   connection keeps polling (keep-alive). Only QoS 0 floods can grow `waiting` past the window:
//!   above [`WAITING_LIMIT`] entries polling pauses, so TCP pushes back on the broker.
//! - **Only `try_*` calls on the client**, from this one task: awaiting the request channel from
//!   the polling task can deadlock (rumqtt#1025).
//! - **Oversized packets** (research §1.5): the incoming limit is `max_payload` plus
//!   [`TOPIC_HEADROOM`], so a payload a little over `max_payload` still arrives and the feeder
//!   dead-letters it as `oversized`. A bigger one breaks the connection with
//!   `PayloadSizeLimitExceeded(n)`, and the broker would redeliver it forever, blocking the queue
//!   behind it. So the next connection goes through the trimming relay ([`super::relay`]),
//!   whatever `n`: it passes the packet on with its first `max_payload + 1` payload bytes, the
//!   feeder dead-letters it as `oversized` and it is acked in order like any other. The options
//!   are restored at that connection's ConnAck (a connection keeps the route it started with).
//!   Memory stays bounded by the incoming limit; only a transport the relay cannot speak leaves
//!   the packet stuck (logged and counted, `oversized_stuck`).
//! - **Reconnect backoff** is a timer arm of the `select!`, never a sleep inside an arm, so
//!   shutdown is seen at once during an outage (research §3).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::TrySendError;
use rumqttc::{
    AsyncClient, ConnAck, ConnectionError, Event, EventLoop, MqttOptions, Outgoing, Packet, PubAck, Publish, QoS,
    Request, StateError, SubAck, SubscribeFilter, SubscribeReasonCode,
};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Confirmations, Delivery, Intake};
use crate::config::MqttConn;
use crate::mqtt::{Backoff, ConnError};
use crate::ops::throttle::{self, Throttle};

/// Incoming packet room beyond the payload: a topic of up to 65 535 bytes plus its 2-byte
/// length, the 2-byte packet id and some slack.
pub const TOPIC_HEADROOM: u64 = 65_546;
/// How often a full intake channel is retried and confirmed deliveries are acked at the latest
/// (besides after every read and every wake-up by the feeder).
pub const HANDOFF_RETRY: Duration = Duration::from_millis(2);
/// Waiting deliveries above which polling pauses (only QoS 0 floods get there).
pub const WAITING_LIMIT: usize = 1024;
/// The most deliveries taken from the socket before they are handed off (and the feeder woken).
const HANDOFF_BATCH: usize = 64;
/// rumqttc's request channel (acks and subscribes); a full one is retried at the next round.
const REQUEST_CAPACITY: usize = 256;
/// We never publish on a source connection; the limit only has to pass our subscribes.
const OUTGOING_LIMIT: usize = 64 << 10;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a clean disconnect at shutdown may take.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// At most one connection-error log line per this interval (the rest are counted).
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Live figures of one source, written by its task, read by metrics and `/healthz`.
#[derive(Debug, Default)]
pub struct SourceStatus {
    /// Between a ConnAck and the next connection error.
    pub connected: AtomicBool,
    /// The broker holds all filters for this connection: SubAck'ed since the last ConnAck, or
    /// kept in the resumed session (`session_present`).
    pub subscribed: AtomicBool,
    /// Messages received from the broker (redeliveries included).
    pub received: AtomicU64,
    /// Deliveries handed to the feeder.
    pub delivered: AtomicU64,
    /// PUBACKs queued to the broker.
    pub acked: AtomicU64,
    /// Connections lost (each is followed by a reconnect attempt).
    pub reconnects: AtomicU64,
    /// Deliveries waiting for room in the intake channel (backpressure).
    pub waiting: AtomicU64,
    /// Connections that broke on a packet over the incoming limit and were routed through the
    /// trimming relay.
    pub oversized_relayed: AtomicU64,
    /// Packets the relay trimmed (each then dead-lettered as `oversized`).
    pub oversized_trimmed: Arc<AtomicU64>,
    /// Packets over the limit the relay could not take (no relay for this transport): stuck at
    /// the broker, blocking this session.
    pub oversized_stuck: AtomicU64,
    /// Filters the broker refused (SubAck failure).
    pub subscriptions_refused: AtomicU64,
    /// An embedded source: what its broker's gate refused to devices (kept across reloads, like
    /// the broker).
    pub broker: std::sync::OnceLock<Arc<BrokerRefusals>>,
}

/// What the embedded broker's gate (`broker/gate.rs`) refused, for `/metrics`. No names: user
/// names and topics are the devices' business, and a label per device would grow without bound.
#[derive(Debug, Default)]
pub struct BrokerRefusals {
    /// CONNECTs refused: unknown user, wrong password, anonymous, will topic, protocol, TLS.
    pub connections: AtomicU64,
    /// PUBLISHes the ACL refused (dropped, never forwarded).
    pub publishes: AtomicU64,
    /// Subscription filters the ACL refused (SUBACK failure).
    pub subscriptions: AtomicU64,
    /// Times rumqttd let go of messages braid had not read yet: a subscription's in-memory log
    /// was full ([`crate::broker::HELD_PER_FILTER`]) while braid did not take input (a full disk,
    /// a full sink buffer), and its oldest segment went (README "Disk full").
    pub lost: AtomicU64,
}

impl SourceStatus {
    fn set(flag: &AtomicBool, value: bool) {
        flag.store(value, Ordering::Relaxed);
    }

    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

#[derive(Clone, Debug)]
pub struct SourceSettings {
    /// The source's index in `Plan::sources` (also [`Delivery::source`]).
    pub index: usize,
    /// The `[sources.NAME]` section name (logs).
    pub name: String,
    pub url: String,
    pub conn: MqttConn,
    /// The client id unless `conn.client_id` sets one: stable across restarts, with a random
    /// part (`mqtt::conn::persistent_client_id`).
    pub client_id: String,
    /// User name and password that replace `conn`'s: braid's own login on its embedded broker.
    pub own_login: Option<(String, String)>,
    /// MQTT filters to subscribe (see [`subscription_filter`]).
    pub filters: Vec<String>,
    /// The largest payload the feeder accepts; bigger ones still arrive and are dead-lettered.
    pub max_payload: u64,
    /// Subscription QoS (AtLeastOnce).
    pub qos: QoS,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The configuration or its files are wrong; retrying does not help.
    #[error("source `{source_name}`: {error}")]
    Conn { source_name: String, error: ConnError },
    #[error("source `{source_name}`: the client id is empty (a persistent session needs one)")]
    EmptyClientId { source_name: String },
    #[error("source `{source_name}`: {filter:?} is not a valid MQTT filter")]
    BadFilter { source_name: String, filter: String },
    /// The feeder is gone (the service is stopping or broken); nothing is lost, un-acked
    /// messages stay with the broker.
    #[error("source `{source_name}`: the feeder's intake channel is closed")]
    IntakeClosed { source_name: String },
}

/// The MQTT filter for a stream's topic: `+name` capture levels become `+`, everything else is
/// kept (route.rs has the grammar).
pub fn subscription_filter(topic: &str) -> String {
    topic.split('/').map(|level| if level.starts_with('+') { "+" } else { level }).collect::<Vec<_>>().join("/")
}

/// Runs the source until `shutdown` turns true (or its sender is dropped), then acks what is
/// confirmed and disconnects cleanly; un-acked messages stay with the broker.
pub async fn run(
    settings: SourceSettings,
    intake: Intake,
    confirmations: Arc<Confirmations>,
    status: Arc<SourceStatus>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), SourceError> {
    let options = source_options(&settings)?;
    let (client, mut eventloop) = AsyncClient::new(options, REQUEST_CAPACITY);
    let waker = confirmations.waker(settings.index);
    let mut source = Source::new(settings, client, intake, confirmations, status);
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX, u64::from(std::process::id()) ^ source.seed());
    let mut reconnect = Reconnect::default();
    let mut outcome = Ok(());
    while !*shutdown.borrow() {
        let retry = source.needs_retry();
        let paused = source.waiting.len() >= WAITING_LIMIT;
        let mut polled = tokio::select! {
            biased;
            changed = shutdown.changed() => if changed.is_err() { break } else { None },
            _ = &mut reconnect.timer, if reconnect.armed => { reconnect.armed = false; None }
            event = eventloop.poll(), if !reconnect.armed && !paused => Some(event),
            _ = waker.notified() => None,
            _ = tokio::time::sleep(HANDOFF_RETRY), if retry => None,
        };
        // The messages already read or waiting in the socket are taken as well, up to a batch,
        // and handed off together: one wake-up of the feeder (the event loop reads at most 10
        // packets a poll).
        while let Some(event) = polled.take() {
            match event {
                Ok(event) => source.on_event(event, &mut eventloop.mqtt_options, &mut backoff),
                Err(error) => {
                    crate::mqtt::forget_stale_events(&mut eventloop);
                    reconnect.after(source.on_error(&error, &mut eventloop.mqtt_options, &mut backoff));
                    break;
                }
            }
            if source.waiting.len() < HANDOFF_BATCH {
                polled = ready_event(&mut eventloop).await;
            }
        }
        if let Err(error) = source.hand_off() {
            outcome = Err(error);
            break;
        }
        if let Err(error) = source.send_requests(&mut eventloop).await {
            // What a failed poll does inside rumqttc: the next poll reconnects.
            eventloop.clean();
            crate::mqtt::forget_stale_events(&mut eventloop);
            reconnect.after(source.on_error(&error, &mut eventloop.mqtt_options, &mut backoff));
        }
    }
    source.disconnect(&mut eventloop).await;
    outcome
}

/// The reconnect backoff: a timer arm of the loop's `select!`, never a sleep inside an arm.
struct Reconnect {
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// A connection error set the timer; polling waits until it fires.
    armed: bool,
}

impl Default for Reconnect {
    fn default() -> Reconnect {
        Reconnect { timer: Box::pin(tokio::time::sleep(Duration::ZERO)), armed: false }
    }
}

impl Reconnect {
    /// The connection failed: poll again after `delay`.
    fn after(&mut self, delay: Duration) {
        self.timer.as_mut().reset(Instant::now() + delay);
        self.armed = true;
    }
}

/// The event loop's next event if it comes without waiting: one it has read already, or one in
/// the data the socket holds. A poll that would wait is dropped, which loses nothing: it is
/// waiting for the socket or the request channel, and the packets it has read are kept in its
/// state (the `select!` of [`run`] drops pending polls the same way).
async fn ready_event(eventloop: &mut EventLoop) -> Option<Result<Event, ConnectionError>> {
    tokio::select! {
        biased;
        event = eventloop.poll() => Some(event),
        () = std::future::ready(()) => None,
    }
}

fn source_options(settings: &SourceSettings) -> Result<MqttOptions, SourceError> {
    options_for(settings, &settings.url)
}

/// The source's options with the connection going to the trimming relay on `port` (plain TCP
/// on loopback; the relay speaks TLS to the broker when the source does).
fn source_options_via(settings: &SourceSettings, port: u16) -> Result<MqttOptions, SourceError> {
    options_for(settings, &format!("mqtt://127.0.0.1:{port}"))
}

fn options_for(settings: &SourceSettings, url: &str) -> Result<MqttOptions, SourceError> {
    let source_name = settings.name.clone();
    let mut options = crate::mqtt::options(url, &settings.conn, &settings.client_id)
        .map_err(|error| SourceError::Conn { source_name: source_name.clone(), error })?;
    if let Some((user, password)) = &settings.own_login {
        options.set_credentials(user.clone(), password.clone());
    }
    if options.client_id().is_empty() {
        // rumqttc panics on a persistent session without an id.
        return Err(SourceError::EmptyClientId { source_name });
    }
    if let Some(filter) = settings.filters.iter().find(|f| !rumqttc::valid_filter(f)) {
        return Err(SourceError::BadFilter { source_name, filter: filter.clone() });
    }
    options
        .set_clean_session(false)
        .set_manual_acks(true)
        .set_max_packet_size(incoming_limit(settings), OUTGOING_LIMIT);
    Ok(options)
}

/// The normal incoming packet limit: room for `max_payload` and the largest topic.
fn incoming_limit(settings: &SourceSettings) -> usize {
    usize::try_from(settings.max_payload.saturating_add(TOPIC_HEADROOM)).unwrap_or(usize::MAX)
}

/// A received message not yet in the intake channel.
struct Waiting {
    delivery: Delivery,
    /// The packet id to ack (QoS 1); `None` for QoS 0.
    pkid: Option<u16>,
}

/// The connection's state between polls: everything but the event loop itself, so the loop can
/// poll the event loop while this is borrowed by the arms' handlers.
struct Source {
    settings: SourceSettings,
    client: AsyncClient,
    intake: Intake,
    confirmations: Arc<Confirmations>,
    status: Arc<SourceStatus>,
    waiting: VecDeque<Waiting>,
    acks: AckQueue,
    next_seq: u64,
    connected: bool,
    /// A subscribe must be (re)sent on this connection and has not been queued yet.
    subscribe_due: bool,
    /// The broker confirmed all filters in the current session at least once.
    session_subscribed: bool,
    /// The next (or current) connection goes through the relay; restore the direct route at the
    /// next ConnAck.
    relayed: bool,
    /// The trimming relay, started at the first oversized packet.
    relay: Option<super::relay::Relay>,
    /// A reconnect through the relay went without backoff and no message arrived since.
    relay_retried: bool,
    error_log: Throttle,
}

impl Source {
    fn new(
        settings: SourceSettings,
        client: AsyncClient,
        intake: Intake,
        confirmations: Arc<Confirmations>,
        status: Arc<SourceStatus>,
    ) -> Source {
        Source {
            settings,
            client,
            intake,
            confirmations,
            status,
            waiting: VecDeque::new(),
            acks: AckQueue::default(),
            next_seq: 1,
            connected: false,
            subscribe_due: false,
            session_subscribed: false,
            relayed: false,
            relay: None,
            relay_retried: false,
            error_log: Throttle::new(ERROR_LOG_INTERVAL),
        }
    }

    fn seed(&self) -> u64 {
        self.settings.index as u64
    }

    /// A delivery waits for room in the intake, a delivery handed off waits for its ack (the
    /// feeder wakes the source only for several: `Confirmations`), or a subscribe could not be
    /// queued because rumqttc's request channel was full.
    fn needs_retry(&self) -> bool {
        !self.waiting.is_empty() || self.subscribe_due || (self.connected && !self.acks.pending.is_empty())
    }

    fn on_event(&mut self, event: Event, options: &mut MqttOptions, backoff: &mut Backoff) {
        match event {
            Event::Incoming(Packet::Publish(publish)) => self.on_publish(publish),
            Event::Incoming(Packet::ConnAck(connack)) => self.on_connack(connack, options, backoff),
            Event::Incoming(Packet::SubAck(suback)) => self.on_suback(&suback),
            Event::Outgoing(Outgoing::Disconnect) => self.connected = false,
            _ => {}
        }
    }

    fn on_publish(&mut self, publish: Publish) {
        SourceStatus::add(&self.status.received, 1);
        self.relay_retried = false;
        let pkid = (publish.qos != QoS::AtMostOnce).then_some(publish.pkid);
        let delivery = Delivery {
            source: self.settings.index,
            seq: 0, // numbered when handed off, so delivered seqs have no gaps
            topic: publish.topic,
            payload: publish.payload,
            arrival: wall_clock_ms(),
            redelivered: publish.dup,
        };
        self.waiting.push_back(Waiting { delivery, pkid });
    }

    fn on_connack(&mut self, connack: ConnAck, options: &mut MqttOptions, backoff: &mut Backoff) {
        tracing::info!(source = %self.settings.name, session_present = connack.session_present, "MQTT source connected");
        self.connected = true;
        SourceStatus::set(&self.status.connected, true);
        backoff.reset();
        if self.relayed {
            // This connection keeps the relay it was opened through; the next one is direct.
            if let Ok(direct) = source_options(&self.settings) {
                *options = direct;
            }
            self.relayed = false;
        }
        if !connack.session_present {
            self.session_subscribed = false;
        }
        self.subscribe_due = !self.session_subscribed;
        SourceStatus::set(&self.status.subscribed, self.session_subscribed);
    }

    fn on_suback(&mut self, suback: &SubAck) {
        let mut all = suback.return_codes.len() == self.settings.filters.len();
        for (filter, code) in self.settings.filters.iter().zip(&suback.return_codes) {
            if *code == SubscribeReasonCode::Failure {
                all = false;
                SourceStatus::add(&self.status.subscriptions_refused, 1);
                tracing::error!(source = %self.settings.name, filter = %filter, "Broker refused the subscription");
            }
        }
        if all {
            tracing::info!(source = %self.settings.name, filters = self.settings.filters.len(), "MQTT source subscribed");
        }
        self.session_subscribed = all;
        SourceStatus::set(&self.status.subscribed, all);
    }

    /// The connection broke: forget what the broker will redeliver and pick the reconnect delay.
    fn on_error(&mut self, error: &ConnectionError, options: &mut MqttOptions, backoff: &mut Backoff) -> Duration {
        if self.connected {
            SourceStatus::add(&self.status.reconnects, 1);
        }
        // A flapping link would otherwise log at the backoff's pace (it resets at every ConnAck).
        if let Some(suppressed) = self.error_log.admit(throttle::now()) {
            let what = if self.connected { "MQTT source disconnected" } else { "MQTT source cannot connect" };
            tracing::warn!(source = %self.settings.name, %error, suppressed, "{what}");
        }
        self.connected = false;
        self.subscribe_due = false;
        SourceStatus::set(&self.status.connected, false);
        SourceStatus::set(&self.status.subscribed, false);
        self.acks.clear();
        // Un-acked QoS 1 messages come back from the broker; QoS 0 ones would not, so keep them.
        self.waiting.retain(|w| w.pkid.is_none());
        SourceStatus::set_count(&self.status.waiting, self.waiting.len());
        if let Some(size) = oversized_packet(error)
            && self.route_through_relay(size, options)
            && !std::mem::replace(&mut self.relay_retried, true)
        {
            // The packet is waiting first in line: fetch it now, not after a backoff (once: a
            // relayed connection that fails the same way before any message backs off).
            return Duration::ZERO;
        }
        backoff.next()
    }

    /// The next connection goes through the trimming relay (module doc); false when it cannot.
    fn route_through_relay(&mut self, size: usize, options: &mut MqttOptions) -> bool {
        let name = &self.settings.name;
        let keep = usize::try_from(self.settings.max_payload.saturating_add(1)).unwrap_or(usize::MAX);
        if self.relay.is_none() {
            let direct = source_options(&self.settings).ok();
            let started = direct.as_ref().and_then(super::relay::Upstream::of).map(|upstream| {
                super::relay::start(
                    upstream,
                    incoming_limit(&self.settings),
                    keep,
                    Arc::clone(&self.status.oversized_trimmed),
                )
            });
            match started {
                Some(Ok(relay)) => self.relay = Some(relay),
                Some(Err(error)) => {
                    tracing::error!(source = %name, %error, "Cannot start the relay for an oversized packet")
                }
                None => tracing::error!(source = %name, "No relay for this transport"),
            }
        }
        let relayed = self.relay.as_ref().and_then(|relay| source_options_via(&self.settings, relay.port).ok());
        let Some(relayed) = relayed else {
            SourceStatus::add(&self.status.oversized_stuck, 1);
            tracing::error!(
                source = %name, size,
                "An oversized packet is stuck at the broker and blocks this source; limit packet sizes at the broker (mosquitto: message_size_limit)"
            );
            return false;
        };
        SourceStatus::add(&self.status.oversized_relayed, 1);
        tracing::warn!(source = %name, size, limit = incoming_limit(&self.settings), "Oversized packet: reading it through the trimming relay; it becomes a dead letter");
        *options = relayed;
        self.relayed = true;
        true
    }

    /// Moves waiting deliveries into the intake channel, in order, numbering them, and wakes the
    /// feeder once for all of them.
    fn hand_off(&mut self) -> Result<(), SourceError> {
        let before = self.next_seq;
        let outcome = self.move_waiting();
        if self.next_seq != before {
            self.intake.ring();
        }
        SourceStatus::set_count(&self.status.waiting, self.waiting.len());
        outcome
    }

    fn move_waiting(&mut self) -> Result<(), SourceError> {
        while let Some(Waiting { mut delivery, pkid }) = self.waiting.pop_front() {
            delivery.seq = self.next_seq;
            match self.intake.try_send(delivery) {
                Ok(()) => {
                    if let Some(pkid) = pkid {
                        self.acks.push(self.next_seq, pkid);
                    }
                    self.next_seq += 1;
                    SourceStatus::add(&self.status.delivered, 1);
                }
                Err(TrySendError::Full(delivery)) => {
                    self.waiting.push_front(Waiting { delivery, pkid });
                    break;
                }
                Err(TrySendError::Disconnected(_)) => {
                    return Err(SourceError::IntakeClosed { source_name: self.settings.name.clone() });
                }
            }
        }
        Ok(())
    }

    /// Writes the confirmed acks and queues a due subscribe (without awaiting the request
    /// channel: research §1.2). An error is the connection's.
    async fn send_requests(&mut self, eventloop: &mut EventLoop) -> Result<(), ConnectionError> {
        if !self.connected {
            return Ok(());
        }
        let confirmed = self.confirmations.confirmed(self.settings.index);
        let acked = write_acks(&mut self.acks, confirmed, eventloop).await?;
        if acked > 0 {
            self.confirmations.acked(self.settings.index, confirmed);
        }
        SourceStatus::add(&self.status.acked, acked);
        if self.subscribe_due {
            self.subscribe();
        }
        Ok(())
    }

    fn subscribe(&mut self) {
        if self.settings.filters.is_empty() {
            self.subscribe_due = false;
            self.session_subscribed = true;
            SourceStatus::set(&self.status.subscribed, true);
            return;
        }
        let qos = self.settings.qos;
        let filters = self.settings.filters.iter().map(|f| SubscribeFilter::new(f.clone(), qos));
        // Fails only when the request channel is full (the filters were checked at start).
        if self.client.try_subscribe_many(filters).is_ok() {
            self.subscribe_due = false;
        }
    }

    /// Acks what is confirmed, sends DISCONNECT and reads until the broker closes the link
    /// (bounded by [`DISCONNECT_TIMEOUT`]).
    ///
    /// Reading to the end matters: closing a socket with unread incoming data (the broker keeps
    /// sending into its in-flight window) makes Linux send a RST, and the broker's kernel then
    /// discards whatever it had not read yet, the last PUBACKs included. Seen in tests: the last
    /// three acks before a shutdown were lost and their messages redelivered.
    async fn disconnect(&mut self, eventloop: &mut EventLoop) {
        if let Err(error) = self.send_requests(eventloop).await {
            tracing::warn!(source = %self.settings.name, %error, "MQTT source could not send its last acks");
            self.connected = false;
        }
        if !self.connected {
            return;
        }
        if self.client.try_disconnect().is_err() {
            tracing::warn!(source = %self.settings.name, "MQTT source could not queue DISCONNECT; dropping the connection");
            return;
        }
        // Publishes read here are not acked: the broker redelivers them to the next session.
        let closed = tokio::time::timeout(DISCONNECT_TIMEOUT, async { while eventloop.poll().await.is_ok() {} });
        if closed.await.is_err() {
            tracing::warn!(source = %self.settings.name, "MQTT source: the broker did not close the connection after DISCONNECT");
        }
        self.connected = false;
        SourceStatus::set(&self.status.connected, false);
        tracing::info!(source = %self.settings.name, "MQTT source disconnected at shutdown");
    }
}

impl SourceStatus {
    fn set_count(gauge: &AtomicU64, n: usize) {
        gauge.store(n as u64, Ordering::Relaxed);
    }
}

/// The remaining length of a packet over the incoming limit, if that is what broke the link.
fn oversized_packet(error: &ConnectionError) -> Option<usize> {
    match error {
        ConnectionError::MqttState(StateError::Deserialization(rumqttc::Error::PayloadSizeLimitExceeded(n))) => {
            Some(*n)
        }
        _ => None,
    }
}

/// Processing time of an arrival, ms since the Unix epoch.
// The source is runtime I/O, where reading the clock belongs (STYLE.md 4).
#[allow(clippy::disallowed_methods)]
fn wall_clock_ms() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i128)
}

/// QoS 1 deliveries handed to the feeder and not yet acked, in receive order.
#[derive(Debug, Default)]
struct AckQueue {
    pending: VecDeque<(u64, u16)>,
}

impl AckQueue {
    fn push(&mut self, seq: u64, pkid: u16) {
        self.pending.push_back((seq, pkid));
    }

    /// Takes the confirmed prefix, oldest first (seqs only grow along the queue).
    fn take_confirmed(&mut self, confirmed: u64) -> impl Iterator<Item = u16> + Send + '_ {
        let prefix = self.pending.partition_point(|&(seq, _)| seq <= confirmed);
        self.pending.drain(..prefix).map(|(_, pkid)| pkid)
    }

    /// The connection broke: these pkids mean nothing on the next one.
    fn clear(&mut self) {
        self.pending.clear();
    }
}

/// Writes PUBACKs for the confirmed prefix of `acks`, in order, to the connection and flushes
/// once; returns how many. Without a connection it leaves them queued.
///
/// Acks sent through the client would each be a request that rumqttc's event loop writes and
/// flushes on its own: a system call per message, and on loopback the broker's receive path too
/// (rumqtt#810, open). Written here, a round of confirmations costs one. The event loop's state
/// still makes each packet (its keep-alive clock sees the traffic); the `Outgoing::PubAck` events
/// it queues for the poller are dropped, as nothing reads them. Call between polls, never while
/// a poll is pending (it owns the connection then).
async fn write_acks(acks: &mut AckQueue, confirmed: u64, eventloop: &mut EventLoop) -> Result<u64, ConnectionError> {
    let Some(network) = eventloop.network.as_mut() else {
        return Ok(0);
    };
    let mut written = 0;
    for pkid in acks.take_confirmed(confirmed) {
        if let Some(packet) = eventloop.state.handle_outgoing_packet(Request::PubAck(PubAck::new(pkid)))? {
            network.write(packet).await?;
        }
        written += 1;
    }
    if written > 0 {
        eventloop.state.events.retain(|event| !matches!(event, Event::Outgoing(Outgoing::PubAck(_))));
        crate::mqtt::flush(eventloop).await?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_levels_become_plus() {
        assert_eq!(subscription_filter("devices/+device/status"), "devices/+/status");
        assert_eq!(subscription_filter("+site/+/x/#"), "+/+/x/#");
        assert_eq!(subscription_filter("a//b"), "a//b");
        assert_eq!(subscription_filter("plain"), "plain");
    }

    #[test]
    fn takes_only_the_confirmed_prefix_in_order() {
        let mut queue = AckQueue::default();
        for (seq, pkid) in [(1, 7), (2, 8), (4, 9)] {
            queue.push(seq, pkid);
        }
        assert_eq!(queue.take_confirmed(0).count(), 0);
        assert_eq!(queue.take_confirmed(3).collect::<Vec<_>>(), [7, 8]);
        assert_eq!(queue.pending.front(), Some(&(4, 9)));
        queue.clear();
        assert_eq!(queue.take_confirmed(u64::MAX).count(), 0);
    }

    #[test]
    fn bad_settings_are_errors_not_panics() {
        let settings = SourceSettings {
            index: 0,
            name: "devices".into(),
            url: "mqtt://127.0.0.1:1".into(),
            conn: MqttConn::default(),
            client_id: "braid-test".into(),
            own_login: None,
            filters: vec!["a/#/b".into()],
            max_payload: 1024,
            qos: QoS::AtLeastOnce,
        };
        assert!(matches!(source_options(&settings), Err(SourceError::BadFilter { .. })));
        let settings = SourceSettings { url: "http://x".into(), ..settings };
        assert!(matches!(source_options(&settings), Err(SourceError::Conn { .. })));
    }
}
