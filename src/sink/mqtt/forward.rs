//! The forwarding loop: spool → broker, release after PUBACK (the parent's doc has the rules).
//!
//! One `rumqttc` event loop polled from one task. Its `poll()` future stays pending across the
//! loop's rounds, so new results go out while it waits (it also drains rumqttc's request
//! channel); it is dropped only when it has returned, or when the loop ends (shutdown, the drain
//! deadline) — never in the middle of writing our publishes.
//!
//! While no poll is pending (the loop rests between reads of acknowledgements), a round's results
//! are written straight into the connection and flushed once ([`Forward::publish_parked`]):
//! through the request channel, rumqttc writes and flushes each publish on its own, a system
//! call and, on loopback, a pass through the broker's receive path per result (rumqtt#810).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, LastWill, MqttOptions, Outgoing, Packet, Publish, QoS, Request,
    StateError,
};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};

use super::{Uplink, UplinkError, split_record};
use crate::config::SinkDef;
use crate::mqtt::{self, Backoff};
use crate::ops::throttle::{self, Throttle};

/// Window when the sink's `max_inflight` is not set.
const DEFAULT_WINDOW: u16 = 100;
/// How long a shutdown waits for `offline` and DISCONNECT to be written and the broker to close.
const GOODBYE: Duration = Duration::from_secs(2);
/// The longest a shutdown without `drain` could wait: effectively forever.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// The sink's MQTT keep-alive when its config sets none (sources keep 30 s). rumqttc pings every
/// keep-alive and drops the connection when the previous ping went unanswered, so a silent uplink
/// (a dead mobile link, a broker host gone without a FIN) is noticed 5–10 s after it died, not
/// 30–60 s: until then results pile up in rumqttc's window instead of the buffer, and `/healthz`
/// still says connected. Two pings' worth of bytes every 5 s is nothing even on a metered link.
pub const SINK_KEEP_ALIVE: Duration = Duration::from_secs(5);
/// How long a connection attempt (TCP, TLS, CONNECT → CONNACK) may take before it counts as
/// failed and the backoff retries (rumqttc's default, set here so that it is visible).
pub const CONNECT_TIMEOUT_SECS: u64 = 5;
/// How long the broker's acknowledgements may wait in the socket while half the window or more is
/// in flight: their records leave the buffer that much later.
const ACKS_READ_AFTER: Duration = Duration::from_millis(2);
/// The same with less than half the window in flight: new results, published as they come, read
/// the acknowledgements that came before them; this reads the last ones of a burst.
const ACKS_READ_LATER: Duration = Duration::from_millis(20);
/// How often a sink with nothing in flight looks at its connection.
const IDLE_LOOK_AFTER: Duration = Duration::from_millis(100);
/// At most one "cannot connect" warning per this interval (the rest are counted): a refused
/// certificate or password must show at the default log level without flooding it.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Publishes the spool's records upstream until `shutdown` turns true (or its sender is gone);
/// then, while connected, keeps publishing until the spool is empty or `drain` elapsed, publishes a retained
/// `offline`, disconnects and returns. Connection errors are retried with backoff forever; only
/// settings that cannot work (a bad URL, unreadable TLS files) end it with an error.
pub async fn run(
    uplink: Arc<Uplink>,
    def: SinkDef,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
) -> Result<(), UplinkError> {
    let (options, status, window) = settings(&uplink, &def)?;
    let seed = u64::from(crc32c::crc32c(options.client_id().as_bytes()));
    let (client, mut events) = AsyncClient::new(options, usize::from(window) + 8);
    let mut network = events.network_options();
    network.set_connection_timeout(CONNECT_TIMEOUT_SECS);
    events.set_network_options(network);
    let qos = if def.qos == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce };
    let mut fwd = Forward::new(uplink, client, qos, window, status);
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30), seed);
    let (retry, deadline) = (sleep(Duration::ZERO), sleep(FOREVER));
    tokio::pin!(retry, deadline);
    let (mut waiting, mut draining) = (false, false);
    if *shutdown.borrow() {
        draining = true;
        deadline.as_mut().reset(Instant::now() + drain);
    }
    // One `poll()` stays pending across rounds (boxed so it can outlive a round): new results
    // are handed to rumqttc's request channel as soon as they are queued, which the pending
    // poll writes out, instead of waiting for the next network event — a PUBACK the broker may
    // delay by tens of ms (Nagle against a delayed ACK). It is dropped only to reconnect or stop.
    let mut parked = Some(events);
    let mut polling: Option<PendingPoll> = None;
    // While the loop rests (no poll pending, `resting`), `look` ends the rest
    // [`Forward::look_after`] after the last poll: acknowledgements are read then, or by a poll
    // for new results before that.
    let look = sleep(Duration::ZERO);
    tokio::pin!(look);
    let (mut look_due, mut resting) = (true, false);
    loop {
        // A stopping sink drains only over a live uplink: while it is down, waiting would only
        // delay the stop (the results stay spooled for the next start).
        if draining && (fwd.drained() || !fwd.uplink.connected.load(Ordering::Acquire)) {
            break;
        }
        let room = match parked.as_mut() {
            Some(events) if fwd.may_publish_parked(events) => match fwd.publish_parked(events).await {
                Ok(room) => room,
                Err(error) => {
                    // What a failed poll does inside rumqttc: the next poll reconnects.
                    events.clean();
                    crate::mqtt::forget_stale_events(events);
                    fwd.on_disconnect(&error);
                    retry.as_mut().reset(Instant::now() + backoff.next());
                    waiting = true;
                    continue;
                }
            },
            _ => fwd.feed_and_room(),
        };
        if polling.is_none() && !waiting {
            if look_due || draining || parked.as_ref().is_some_and(|events| fwd.must_poll(events)) {
                polling = parked.take().map(poll_owned);
                (look_due, resting) = (false, false);
            } else if !resting {
                look.as_mut().reset(Instant::now() + fwd.look_after());
                resting = true;
            }
        }
        let step = tokio::select! {
            (events, event) = next_event(&mut polling) => Step::Event(events, event),
            () = &mut look, if resting => Step::Look,
            () = &mut retry, if waiting => Step::Retry,
            () = fwd.uplink.data.notified(), if room => Step::Data,
            changed = shutdown.changed(), if !draining => Step::Shutdown(changed.is_err() || *shutdown.borrow()),
            () = &mut deadline, if draining => break,
        };
        match step {
            Step::Event(events, Ok(event)) => {
                (polling, parked) = (None, Some(events));
                if fwd.on_event(event) {
                    backoff.reset();
                }
            }
            Step::Event(mut events, Err(error)) => {
                // Every result in flight is sent again from the spool.
                crate::mqtt::forget_stale_events(&mut events);
                (polling, parked) = (None, Some(events));
                fwd.on_disconnect(&error);
                retry.as_mut().reset(Instant::now() + backoff.next());
                waiting = true;
            }
            Step::Retry => waiting = false,
            Step::Look => (look_due, resting) = (true, false),
            Step::Data => {}
            Step::Shutdown(stop) => {
                if stop {
                    draining = true;
                    deadline.as_mut().reset(Instant::now() + drain);
                }
            }
        }
    }
    fwd.goodbye(parked, polling).await;
    Ok(())
}

/// A `poll()` of the event loop kept pending across rounds of [`run`]; it owns the loop and
/// hands it back with the event.
type PendingPoll = std::pin::Pin<Box<dyn std::future::Future<Output = (EventLoop, PollResult)> + Send>>;
type PollResult = Result<Event, ConnectionError>;

fn poll_owned(mut events: EventLoop) -> PendingPoll {
    Box::pin(async move {
        let event = events.poll().await;
        (events, event)
    })
}

/// What woke a round of [`run`]. Short-lived, one per round: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Step {
    Event(EventLoop, PollResult),
    Retry,
    Look,
    Data,
    Shutdown(bool),
}

/// The pending poll's outcome; never, when there is none (reconnect backoff).
async fn next_event(polling: &mut Option<PendingPoll>) -> (EventLoop, PollResult) {
    match polling.as_mut() {
        Some(poll) => poll.await,
        None => std::future::pending().await,
    }
}

/// The connection options, the status topic and the window.
fn settings(uplink: &Uplink, def: &SinkDef) -> Result<(MqttOptions, String, u16), UplinkError> {
    let url = def.url.as_deref().ok_or_else(|| UplinkError::NoUrl { sink: def.name.clone() })?;
    let mut options = mqtt::options(url, &def.conn, &mqtt::default_client_id(&def.name))
        .map_err(|source| UplinkError::Conn { sink: def.name.clone(), source })?;
    let status = def.status_topic.clone().unwrap_or_else(|| default_status_topic(&options.client_id()));
    let window = def.conn.max_inflight.unwrap_or(DEFAULT_WINDOW).max(1);
    let max_record = uplink.lock().max_record();
    if def.conn.keep_alive_ms.is_none() {
        options.set_keep_alive(SINK_KEEP_ALIVE);
    }
    options
        .set_clean_session(true)
        .set_inflight(window)
        .set_last_will(LastWill::new(&status, "offline", QoS::AtLeastOnce, true))
        // Our publishes may be as large as a spool record; we receive only acks.
        .set_max_packet_size(10 * 1024, max_record + 65_546);
    Ok((options, status, window))
}

/// `braid/<client id>/status`, with the characters a publish topic may not hold replaced.
fn default_status_topic(client_id: &str) -> String {
    let id: String = client_id.chars().map(|c| if matches!(c, '+' | '#' | '\0') { '_' } else { c }).collect();
    format!("braid/{id}/status")
}

/// A publish handed to rumqttc and not yet settled.
struct Flight {
    /// The spool record; `None` for a status publish.
    seq: Option<u64>,
    /// rumqttc wrote it (`Outgoing::Publish`), with this packet id (0 for QoS 0).
    written: bool,
    pkid: u16,
    acked: bool,
    /// A record with nothing to send (lost to damage, not ours): settled at once, not counted
    /// as sent.
    skipped: bool,
}

/// What became of a record offered to the connection.
enum Offer {
    /// Written into the connection's buffer under this packet id (QoS 1: released by its PUBACK).
    Written(u16),
    /// Handed to rumqttc, which writes it later and reports `Outgoing::Publish`.
    Queued,
    /// Not taken now: retried at the next round.
    Refused,
}

/// How a pass of [`Forward::fill`] ended.
struct Filled {
    /// A record settled as it was offered (nothing to send): its place may be free again.
    settled: bool,
    /// `offer` refused a record: no more this round.
    refused: bool,
}

/// Writes `packets` into the connection and flushes once ([`mqtt::flush`]). A connection gone
/// is an error: the flights of those packets count as written.
async fn write_all(events: &mut EventLoop, packets: &mut Vec<Packet>) -> Result<(), ConnectionError> {
    if packets.is_empty() {
        return Ok(());
    }
    let network = events.network.as_mut().ok_or(StateError::ConnectionAborted)?;
    for packet in packets.drain(..) {
        network.write(packet).await?;
    }
    mqtt::flush(events).await
}

struct Forward {
    uplink: Arc<Uplink>,
    client: AsyncClient,
    qos: QoS,
    window: usize,
    status: String,
    /// In the order handed to rumqttc, which writes requests in that order.
    inflight: VecDeque<Flight>,
    /// The next record to publish.
    cursor: u64,
    /// The packets of a [`publish_parked`](Self::publish_parked), kept for their allocation.
    outbox: Vec<Packet>,
    connected: bool,
    ever_connected: bool,
    /// When the last failed connection attempt was logged, and how many were not since.
    /// Failures to connect are logged at most every [`FAILURE_LOG_INTERVAL`].
    failure_log: Throttle,
}

impl Forward {
    fn new(uplink: Arc<Uplink>, client: AsyncClient, qos: QoS, window: u16, status: String) -> Forward {
        let window = usize::from(window);
        let inflight = VecDeque::with_capacity(window + 2);
        Forward {
            uplink,
            client,
            qos,
            window,
            status,
            inflight,
            cursor: 0,
            outbox: Vec::new(),
            connected: false,
            ever_connected: false,
            failure_log: Throttle::new(FAILURE_LOG_INTERVAL),
        }
    }

    /// Hands records to rumqttc's request channel while connected and the window has room;
    /// whether the window still has room (then new data is worth waking up for).
    fn feed_and_room(&mut self) -> bool {
        let qos = self.qos;
        // rumqttc takes owned topic and payload: one copy per publish is its price.
        self.feed(|client, topic, payload| match client.try_publish(topic, qos, false, payload.to_vec()) {
            Ok(()) => Offer::Queued,
            Err(_) => Offer::Refused, // its channel is full: more after the next event
        })
    }

    /// Whether [`publish_parked`](Self::publish_parked) may write into the parked event loop's
    /// connection: at QoS 1, connected, and nothing of rumqttc's own to write or to report first
    /// (an event read, a request queued, a publish held back by a packet id collision). At QoS 0
    /// a record leaves the buffer once written, and through the channel that is once rumqttc's
    /// flush succeeded (a failed one reports no `Outgoing::Publish`): those keep the channel.
    fn may_publish_parked(&self, events: &EventLoop) -> bool {
        self.qos == QoS::AtLeastOnce
            && !self.must_poll(events)
            && events.state.collision.is_none()
            && events.network.is_some()
    }

    /// Writes the next records that fit the window into the parked event loop's connection and
    /// flushes them together; whether the window still has room. The event loop's state makes
    /// each packet (packet ids, in-flight bookkeeping, the keep-alive clock), as a poll would; the
    /// `Outgoing::Publish` events it queues are settled here instead of read back one per poll.
    async fn publish_parked(&mut self, events: &mut EventLoop) -> Result<bool, ConnectionError> {
        self.read_arrived_acks(events)?;
        let (qos, mut outbox, mut failed) = (self.qos, std::mem::take(&mut self.outbox), None);
        let state = &mut events.state;
        let room = self.feed(|_, topic, payload| {
            if state.collision.is_some() {
                return Offer::Refused; // rumqttc writes the held publish when its packet id is acked
            }
            let publish = Publish::new(topic, qos, payload.to_vec());
            match state.handle_outgoing_packet(Request::Publish(publish)) {
                Ok(Some(packet)) => {
                    let pkid = if let Packet::Publish(ref publish) = packet { publish.pkid } else { 0 };
                    outbox.push(packet);
                    Offer::Written(pkid)
                }
                Ok(None) => Offer::Queued, // the collision: written by a later poll, in order
                Err(error) => {
                    failed = Some(error);
                    Offer::Refused
                }
            }
        });
        state.events.retain(|event| !matches!(event, Event::Outgoing(Outgoing::Publish(_))));
        // A refused packet breaks the connection: nothing is written before the reconnect.
        let outcome = match failed {
            Some(error) => Err(error.into()),
            None => write_all(events, &mut outbox).await.map(|()| room),
        };
        outbox.clear();
        self.outbox = outbox;
        outcome
    }

    /// Reads the acknowledgements already in the socket, without waiting for more, and settles
    /// them: while results flow no poll is pending, so this is where their window frees up
    /// (read as they come, each would wake the thread). Giving up the read where it would wait
    /// loses nothing: with no collision held ([`may_publish_parked`](Self::may_publish_parked)),
    /// reading an acknowledgement writes nothing, and a frame not read whole stays buffered.
    fn read_arrived_acks(&mut self, events: &mut EventLoop) -> Result<(), StateError> {
        let mut cx = Context::from_waker(Waker::noop());
        while let Some(network) = events.network.as_mut() {
            match pin!(network.readb(&mut events.state)).poll(&mut cx) {
                Poll::Pending => break,
                Poll::Ready(read) => read?,
            }
            while let Some(event) = events.state.events.pop_front() {
                self.on_event(event);
            }
        }
        Ok(())
    }

    /// Offers the spool's next records to `offer` while connected and the window has room, and
    /// tracks each as a [`Flight`]; whether the window still has room.
    ///
    /// A record with nothing to send (lost to damage, not ours) settles as it is offered and
    /// frees its place at once, so the window is filled again until it is full of records in
    /// flight, the spool has no more, or `offer` refused one: a round that stopped with room and
    /// records left would wait for the next result or timer to send them.
    fn feed(&mut self, mut offer: impl FnMut(&AsyncClient, &str, &[u8]) -> Offer) -> bool {
        if !self.connected {
            return false;
        }
        loop {
            let filled = self.fill(&mut offer);
            if filled.settled {
                self.settle();
            }
            if !filled.settled || filled.refused {
                break;
            }
        }
        self.inflight.len() < self.window
    }

    /// One pass of [`feed`](Self::feed): offers records until the window is full, the spool has
    /// no more or `offer` refused one.
    fn fill(&mut self, offer: &mut impl FnMut(&AsyncClient, &str, &[u8]) -> Offer) -> Filled {
        let mut filled = Filled { settled: false, refused: false };
        let spool = self.uplink.lock();
        self.cursor = self.cursor.max(spool.first());
        while self.inflight.len() < self.window && self.cursor < spool.end() {
            let seq = Some(self.cursor);
            let flight = match spool.get(self.cursor).and_then(split_record) {
                // A record lost to damage (the spool logged it) or not ours: nothing to send.
                None => Flight { seq, written: true, pkid: 0, acked: true, skipped: true },
                Some((topic, payload)) => match offer(&self.client, topic, payload) {
                    Offer::Refused => {
                        filled.refused = true;
                        break;
                    }
                    Offer::Queued => Flight { seq, written: false, pkid: 0, acked: false, skipped: false },
                    Offer::Written(pkid) => Flight { seq, written: true, pkid, acked: false, skipped: false },
                },
            };
            filled.settled |= flight.acked;
            self.inflight.push_back(flight);
            self.cursor += 1;
        }
        filled
    }

    /// Whether the event loop must be polled now: to connect, to write what was handed to it, or
    /// to hand over events it has read already. Otherwise acknowledgements wait in the socket
    /// until [`look_after`](Self::look_after), and are read together: read as they come, each
    /// one would wake the thread, and with a full window (an upstream broker slower than the
    /// results) each one freed one place, so results went out one per wake-up.
    fn must_poll(&self, events: &EventLoop) -> bool {
        !self.connected || !events.state.events.is_empty() || self.inflight.iter().any(|f| !f.written)
    }

    /// How long the event loop may rest: with half the window or more in flight, acknowledgements
    /// are read after [`ACKS_READ_AFTER`] (they make room for more results); with less, after
    /// [`ACKS_READ_LATER`] (the next round that publishes reads them before that); with nothing in
    /// flight it looks after [`IDLE_LOOK_AFTER`] (pings, a broker that closed the connection).
    fn look_after(&self) -> Duration {
        match self.inflight.len() {
            0 => IDLE_LOOK_AFTER,
            n if n * 2 >= self.window => ACKS_READ_AFTER,
            _ => ACKS_READ_LATER,
        }
    }

    /// Reacts to one event; whether it was a ConnAck.
    fn on_event(&mut self, event: Event) -> bool {
        match event {
            Event::Incoming(Packet::ConnAck(_)) => {
                self.on_connack();
                return true;
            }
            Event::Outgoing(Outgoing::Publish(pkid)) => {
                let qos0 = self.qos == QoS::AtMostOnce;
                if let Some(f) = self.inflight.iter_mut().find(|f| !f.written) {
                    (f.written, f.pkid) = (true, pkid);
                    f.acked = qos0 && f.seq.is_some();
                }
                self.settle();
            }
            Event::Incoming(Packet::PubAck(ack)) => {
                if let Some(f) = self.inflight.iter_mut().find(|f| f.written && !f.acked && f.pkid == ack.pkid) {
                    f.acked = true;
                }
                self.settle();
            }
            _ => {}
        }
        false
    }

    /// A new connection (clean session): resend from the first unreleased record, say `online`.
    fn on_connack(&mut self) {
        if self.ever_connected {
            self.uplink.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        (self.connected, self.ever_connected) = (true, true);
        self.uplink.connected.store(true, Ordering::Relaxed);
        self.inflight.clear();
        self.cursor = self.uplink.lock().first();
        tracing::info!(sink = %self.uplink.name, from = self.cursor, "Uplink connected");
        if self.client.try_publish(&self.status, QoS::AtLeastOnce, true, "online").is_ok() {
            self.inflight.push_back(Flight { seq: None, written: false, pkid: 0, acked: false, skipped: false });
        }
    }

    fn on_disconnect(&mut self, error: &ConnectionError) {
        if self.connected {
            tracing::warn!(sink = %self.uplink.name, %error, "Uplink disconnected; resending from the oldest unacknowledged result after reconnecting");
        } else if let Some(suppressed) = self.failure_log.admit(throttle::now()) {
            tracing::warn!(sink = %self.uplink.name, %error, suppressed, "Uplink cannot connect; results stay spooled, retrying with backoff");
        } else {
            tracing::debug!(sink = %self.uplink.name, %error, "Uplink connection failed");
        }
        self.connected = false;
        self.uplink.connected.store(false, Ordering::Relaxed);
        self.inflight.clear();
    }

    /// Pops the settled prefix of the window and releases its records.
    fn settle(&mut self) {
        let (mut last, mut count) = (None, 0);
        while self.inflight.front().is_some_and(|f| f.acked) {
            if let Some(Flight { seq: Some(seq), skipped, .. }) = self.inflight.pop_front() {
                (last, count) = (Some(seq), count + u64::from(!skipped));
            }
        }
        if let Some(seq) = last {
            self.uplink.release_through(seq, count);
        }
    }

    fn drained(&self) -> bool {
        let spool = self.uplink.lock();
        spool.first() == spool.end()
    }

    /// Publishes `offline` and disconnects, then reads until the broker closes the connection,
    /// all within [`GOODBYE`]. `parked`: the event loop, or `polling`: a poll that owns it (the
    /// requests queued here wake it).
    ///
    /// The broker closes, not the sink: the embedded broker (rumqttd 0.20) numbers connections by
    /// a slot it reuses at once, and a close that reaches it after it dropped the session on the
    /// DISCONNECT ends whichever connection took the slot meanwhile (src/broker/gate.rs, step 8).
    /// Reading to the end also spares the broker a reset that would discard what it had not read.
    async fn goodbye(&mut self, parked: Option<EventLoop>, polling: Option<PendingPoll>) {
        if self.connected {
            let said = self.client.try_publish(&self.status, QoS::AtLeastOnce, true, "offline").is_ok();
            if said && self.client.try_disconnect().is_ok() {
                let closed = timeout(GOODBYE, async {
                    let mut events = match (parked, polling) {
                        (Some(events), _) => events,
                        (None, Some(poll)) => match poll.await {
                            (_, Err(_)) => return,
                            (events, Ok(_)) => events,
                        },
                        (None, None) => return,
                    };
                    while events.poll().await.is_ok() {}
                });
                if closed.await.is_err() {
                    tracing::warn!(sink = %self.uplink.name, "MQTT sink: the broker did not close the connection after DISCONNECT");
                }
            }
        }
        self.connected = false;
        self.uplink.connected.store(false, Ordering::Relaxed);
        tracing::info!(sink = %self.uplink.name, "Uplink stopped");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::config::MqttConn;

    fn sink(keep_alive_ms: Option<i64>) -> (tempfile::TempDir, Arc<Uplink>, SinkDef) {
        let def = SinkDef {
            topic: Some("up/{device}".into()),
            conn: MqttConn { keep_alive_ms, ..MqttConn::default() },
            ..super::super::tests::blocking_sink("up", 1 << 20)
        };
        let dir = tempfile::tempdir().unwrap();
        let uplink = Uplink::open(&def, dir.path()).unwrap();
        (dir, uplink, def)
    }

    /// A round of results goes out in one write while no poll is pending: the subscriber of a
    /// real broker gets them all, in spool order, with the sink's event loop not polled since
    /// (through rumqttc's request channel nothing would leave before the next poll), and the
    /// next rounds read their acknowledgements and release them.
    #[test]
    fn results_are_written_into_a_parked_connection_and_released_on_their_acks_without_a_poll() {
        use crate::broker::tests::{WAIT, options, poll_until, runtime, settings as broker_settings, subscriber};
        let broker = crate::broker::start(broker_settings()).unwrap();
        let addr = broker.addr();
        let (_dir, uplink, mut def) = sink(None);
        def.url = Some(format!("mqtt://{addr}"));
        let stop = AtomicBool::new(false);
        runtime().block_on(async {
            let (_watch, mut watched, _) = subscriber(options(addr, "watch", true), "up/#", QoS::AtLeastOnce).await;
            let (sink_options, status, window) = settings(&uplink, &def).unwrap();
            let (client, mut events) = AsyncClient::new(sink_options, usize::from(window) + 8);
            let mut fwd = Forward::new(Arc::clone(&uplink), client, QoS::AtLeastOnce, window, status);
            // Connect; the poll writes `online` (queued through the channel at the ConnAck).
            fwd.on_event(events.poll().await.unwrap());
            while fwd.must_poll(&events) {
                fwd.on_event(events.poll().await.unwrap());
            }
            let topics: Vec<String> = (0..40).map(|i| format!("up/d{i:02}")).collect();
            for topic in &topics {
                uplink.queue(topic, b"{}", crate::sink::Patience::idle(&stop)).unwrap();
            }
            assert!(fwd.may_publish_parked(&events));
            assert!(fwd.publish_parked(&mut events).await.unwrap(), "the window has room for more");
            assert!(fwd.inflight.iter().all(|f| f.written) && !fwd.must_poll(&events));
            let mut seen = Vec::new();
            while seen.len() < topics.len() {
                seen.push(
                    poll_until(&mut watched, |event| match event {
                        Event::Incoming(Packet::Publish(p)) => Some(p.topic.clone()),
                        _ => None,
                    })
                    .await,
                );
            }
            assert_eq!(seen, topics);
            // Their PUBACKs, read by the next rounds that publish (none polls), release them.
            tokio::time::timeout(WAIT, async {
                while !fwd.drained() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    fwd.publish_parked(&mut events).await.unwrap();
                }
            })
            .await
            .expect("the broker acknowledged every result");
            assert_eq!(uplink.lock().first(), topics.len() as u64);
        });
    }

    /// Records with nothing to send settle as they are offered: a run of them as long as the
    /// window must not end a round with room and the records after it unsent (nothing would
    /// wake the loop for those until the next result or timer).
    #[test]
    fn a_window_full_of_records_lost_to_damage_is_passed_over_in_the_same_round() {
        let (_dir, uplink, mut def) = sink(None);
        def.url = Some("mqtt://127.0.0.1:1".into()); // never connected: the records stay in the channel
        let stop = AtomicBool::new(false);
        let window = 4;
        for _ in 0..window * 2 + 1 {
            uplink.lock().append(&[0xff]).unwrap(); // too short for a topic length: not ours
        }
        for i in 0..3 {
            uplink.queue(&format!("up/d{i}"), b"{}", crate::sink::Patience::idle(&stop)).unwrap();
        }
        let (sink_options, status, _) = settings(&uplink, &def).unwrap();
        let (client, _events) = AsyncClient::new(sink_options, usize::from(window) + 8);
        let mut fwd = Forward::new(Arc::clone(&uplink), client, QoS::AtLeastOnce, window, status);
        fwd.connected = true;
        assert!(fwd.feed_and_room(), "3 records in flight leave room in a window of 4");
        assert_eq!(fwd.cursor, u64::from(window) * 2 + 4, "every record offered");
        assert_eq!(fwd.inflight.len(), 3);
        assert_eq!(uplink.lock().first(), u64::from(window) * 2 + 1, "the unsendable ones released");
        assert_eq!(uplink.stats().sent_total, 0, "and not counted as sent");
    }

    #[test]
    fn a_sink_pings_every_5_s_unless_its_config_says_otherwise() {
        let (_dir, uplink, def) = sink(None);
        assert_eq!(settings(&uplink, &def).unwrap().0.keep_alive(), SINK_KEEP_ALIVE);
        assert_eq!(SINK_KEEP_ALIVE, Duration::from_secs(5), "README says 5 s");
        let (_dir, uplink, def) = sink(Some(20_000));
        assert_eq!(settings(&uplink, &def).unwrap().0.keep_alive(), Duration::from_secs(20));
    }
}
