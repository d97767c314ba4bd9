//! The gate: the embedded broker's only device-facing listener. It authenticates every client,
//! checks every PUBLISH and SUBSCRIBE against the ACL, and forwards what passes to rumqttd, which
//! listens on a loopback port that only accepts braid's per-process secret.
//!
//! Why a gate in front of rumqttd (README "Security"): rumqttd 0.20 offers a CONNECT hook
//! (`ConnectionSettings::external_auth`: client id, user name, password → bool) and nothing
//! per topic; its tenant prefixes need client certificates and a patched topic layout. braid's
//! own intake cannot stand in for it: MQTT 3.1.1 does not tell a subscriber who published a
//! message, so only the broker side of the device's connection knows whose row it is, and a
//! subscription to `#` never reaches braid at all.
//!
//! Per connection (one tokio task pair on the gate's thread):
//! 1. CONNECT within [`CONNECT_TIMEOUT`] (after the TLS handshake, when TLS is on). v4 only.
//! 2. **Authentication** ([`Policy::admit`]): a user name with the users file's password; no
//!    user name only when anonymous clients are allowed. A refusal is a CONNACK 4 (bad user name
//!    or password) or 5 (not authorised), counted, logged at most every 10 s.
//! 3. A will topic the client may not publish to is refused like a bad password (mosquitto too).
//! 4. The CONNECT goes on to rumqttd with the client id prefixed by [`DEVICE_ID_PREFIX`] (so no
//!    device can take the session of braid's own client, whatever id it picks) and the secret as
//!    password.
//! 5. Device → broker: every packet is parsed (rumqttc's v4 codec) and re-encoded. A PUBLISH the
//!    ACL refuses is dropped and counted; at QoS 1 the gate acknowledges it itself (as mosquitto
//!    does for MQTT 3.1.1, which has no negative PUBACK: a device that retried for ever would
//!    block its own queue), at QoS 2 the connection is closed (rumqttd does not take QoS 2).
//!    A SUBSCRIBE loses the filters the ACL refuses: none left → the gate answers SUBACK failure
//!    for all, else it forwards the rest and patches the broker's SUBACK (failure where a filter
//!    was cut). Anything oversized or malformed closes the connection.
//! 6. Broker → device: parsed and re-encoded too (to find the SUBACKs to patch).
//! 7. A reload ([`super::EmbeddedBroker::reload`]) is seen by every connection: its ACL grants
//!    are computed again, and a client whose password hash changed or went away (or an anonymous
//!    one no longer allowed) is disconnected.
//! 8. **The end.** After a device's DISCONNECT the gate forwards it, stops reading the device and
//!    leaves closing the inner connection to rumqttd (at most [`LINGER`]); only a device that
//!    vanished without DISCONNECT (or that the gate throws out) gets its inner connection closed
//!    by the gate, so that rumqttd sends its will.
//!
//! Why rumqttd must close first after a DISCONNECT: rumqttd 0.20 numbers connections by their
//! slot in a slab and gives a freed slot to the next CONNECT at once. A DISCONNECT makes its
//! router drop the session and free the slot; the connection's task ends when it notices. But
//! if that task sees the socket closed first, it reports "connection `n` is gone" to the router
//! (rumqttd's `src/server/broker.rs`, `remote`: `Event::Disconnect` with the slot number), and
//! when another client has taken slot `n` in between, the router disconnects *that* client:
//! the next device to connect through the gate lost its connection right after its CONNACK.
//! Left to close by itself, rumqttd's task ends on the router's side and reports nothing. The
//! same race remains, rarer, for a device that vanishes without DISCONNECT at the moment
//! rumqttd drops its session for a reason of its own (another client taking its client id, a
//! publish rumqttd refuses): only a patched rumqttd (a generation in the slot number) ends it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::BytesMut;
use rumqttc::mqttbytes::v4::{ConnAck, Connect, ConnectReturnCode, Login, Packet, PubAck, SubAck, Subscribe};
use rumqttc::mqttbytes::{Protocol, QoS};
use rumqttc::{SubscribeReasonCode, mqttbytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::acl::{Acl, Grants};
use super::users::{PasswordHash, Users};
use crate::ops::throttle::{self, Throttle};
pub use crate::source::mqtt::BrokerRefusals as Refusals;

/// A client must complete TLS and send CONNECT within this time.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// What the gate puts before a device's client id on its way to rumqttd. braid's own clients
/// connect to rumqttd directly, never with it, so no device can take their sessions.
pub const DEVICE_ID_PREFIX: &str = "device:";
/// How long rumqttd may take to close its side after the device closed or said DISCONNECT. It
/// closes within milliseconds; past this the gate closes it (a stuck rumqttd must not hold the
/// connection), which after a DISCONNECT risks the misdirected disconnect of step 8.
const LINGER: Duration = Duration::from_secs(5);
/// Read size per socket read.
const READ_CHUNK: usize = 64 * 1024;
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Who may connect and what they may do: the users file, the ACL file and `anonymous`.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// `None`: no users file; every client is anonymous (a user name is not checked and does not
    /// count for the ACL).
    pub users: Option<Users>,
    /// `None`: no ACL file; everything is allowed.
    pub acl: Option<Acl>,
    /// Clients without a user name are let in although there is a users file.
    pub anonymous: bool,
}

/// Who a connection authenticated as.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    /// `None`: anonymous.
    user: Option<String>,
    /// The hash the user's password matched (a reload that changes it ends the connection).
    hash: Option<PasswordHash>,
}

impl Policy {
    /// Authenticates a CONNECT, or says which CONNACK code refuses it.
    fn admit(&self, login: Option<&Login>) -> Result<Identity, ConnectReturnCode> {
        let anonymous = Identity { user: None, hash: None };
        let Some(users) = &self.users else { return Ok(anonymous) };
        match login {
            Some(login) if !login.username.is_empty() => {
                if users.verify(&login.username, login.password.as_bytes()) {
                    let hash = users.hash_of(&login.username).cloned();
                    Ok(Identity { user: Some(login.username.clone()), hash })
                } else {
                    Err(ConnectReturnCode::BadUserNamePassword)
                }
            }
            _ if self.anonymous => Ok(anonymous),
            _ => Err(ConnectReturnCode::NotAuthorized),
        }
    }

    /// Whether `who` may stay connected under this (reloaded) policy.
    fn still_admits(&self, who: &Identity) -> bool {
        match (&self.users, &who.user) {
            (None, _) => true,
            (Some(_), None) => self.anonymous,
            (Some(users), Some(user)) => users.hash_of(user) == who.hash.as_ref(),
        }
    }

    fn grants(&self, who: &Identity, client_id: &str) -> Grants {
        match &self.acl {
            None => Grants::all(),
            Some(acl) => acl.grants(who.user.as_deref(), client_id),
        }
    }
}

/// What every connection of one gate shares.
pub struct Shared {
    /// Where rumqttd listens (loopback, secret only).
    pub internal: SocketAddr,
    pub secret: Arc<str>,
    pub policy: watch::Receiver<Arc<Policy>>,
    pub refusals: Arc<Refusals>,
    /// The largest packet a device may send (rumqttd's own limit).
    pub max_packet: usize,
    log: Mutex<Throttle>,
}

impl Shared {
    pub fn new(
        internal: SocketAddr,
        secret: Arc<str>,
        policy: watch::Receiver<Arc<Policy>>,
        refusals: Arc<Refusals>,
        max_packet: usize,
    ) -> Shared {
        Shared { internal, secret, policy, refusals, max_packet, log: Mutex::new(Throttle::new(LOG_EVERY)) }
    }

    /// A refusal: counted always, logged at most once per [`LOG_EVERY`] (a misconfigured device
    /// would otherwise fill the journal).
    fn refused(&self, counter: &AtomicU64, peer: SocketAddr, what: &str, detail: &str) {
        counter.fetch_add(1, Ordering::Relaxed);
        let admitted = self.log.lock().unwrap_or_else(PoisonError::into_inner).admit(throttle::now());
        if let Some(suppressed) = admitted {
            tracing::warn!(%peer, detail, suppressed, "Embedded broker refused {what}");
        }
    }
}

/// Why a connection ended early (logged at debug: devices come and go).
#[derive(Debug, thiserror::Error)]
enum End {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("MQTT: {0}")]
    Mqtt(mqttbytes::Error),
    #[error("closed")]
    Closed,
    #[error("no CONNECT in time")]
    Timeout,
    #[error("refused")]
    Refused,
    #[error("{0}")]
    Protocol(&'static str),
}

/// Accepts devices on `listener` for ever (the broker has no shutdown; see broker.rs).
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, tls: Option<Tls>) {
    let mut errors = Throttle::new(LOG_EVERY);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait a little instead of spinning.
                if let Some(suppressed) = errors.admit(throttle::now()) {
                    tracing::warn!(%error, suppressed, "Embedded broker cannot accept a connection");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let tls = tls.clone();
        tokio::spawn(async move {
            let ended = match tls {
                None => connection(stream, peer, &shared).await,
                Some(tls) => match tokio::time::timeout(CONNECT_TIMEOUT, tls.accept(stream)).await {
                    Ok(Ok(stream)) => connection(stream, peer, &shared).await,
                    Ok(Err(error)) => {
                        shared.refused(&shared.refusals.connections, peer, "a TLS handshake", &error.to_string());
                        Err(End::Refused)
                    }
                    Err(_) => Err(End::Timeout),
                },
            };
            if let Err(end) = ended {
                tracing::debug!(%peer, %end, "Embedded broker connection ended");
            }
        });
    }
}

/// TLS on the gate (feature `embedded-broker-tls`): rustls 0.23 with ring, the stack braid's
/// MQTT clients use.
#[cfg(feature = "embedded-broker-tls")]
pub type Tls = rumqttc::tokio_rustls::TlsAcceptor;
/// Without the feature there is no TLS to accept.
#[cfg(not(feature = "embedded-broker-tls"))]
#[derive(Clone)]
pub enum Tls {}

#[cfg(not(feature = "embedded-broker-tls"))]
impl Tls {
    async fn accept(&self, _stream: TcpStream) -> std::io::Result<TcpStream> {
        match *self {}
    }
}

async fn connection<S>(device: S, peer: SocketAddr, shared: &Shared) -> Result<(), End>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut device_rx, mut device_tx) = tokio::io::split(device);
    let mut inbox = BytesMut::with_capacity(4096);
    let first = tokio::time::timeout(CONNECT_TIMEOUT, read_packet(&mut device_rx, &mut inbox, shared.max_packet));
    let connect = match first.await.map_err(|_| End::Timeout)?? {
        Packet::Connect(connect) => connect,
        _ => return Err(End::Protocol("the first packet was not CONNECT")),
    };
    // This connection's view of the policy: a reload from now on is seen by `Upstream::run`.
    let mut policy_rx = shared.policy.clone();
    let policy = policy_rx.borrow_and_update().clone();
    let (who, grants) = match admit(&policy, &connect) {
        Ok(admitted) => admitted,
        Err((code, why)) => {
            let user = connect.login.as_ref().map_or("", |l| l.username.as_str());
            let detail = format!("{why} (user {user:?}, client id {:?})", connect.client_id);
            shared.refused(&shared.refusals.connections, peer, "a connection", &detail);
            let mut out = BytesMut::new();
            encode(&Packet::ConnAck(ConnAck::new(code, false)), &mut out)?;
            device_tx.write_all(&out).await?;
            let _ = device_tx.shutdown().await;
            return Err(End::Refused);
        }
    };
    let broker = TcpStream::connect(shared.internal).await?;
    let _ = broker.set_nodelay(true);
    let (broker_rx, mut broker_tx) = broker.into_split();
    let client_id = connect.client_id.clone();
    let mut out = BytesMut::new();
    encode(&Packet::Connect(inner_connect(connect, who.user.as_deref(), &shared.secret)), &mut out)?;
    broker_tx.write_all(&out).await?;

    let device_tx = tokio::sync::Mutex::new(device_tx);
    let cut = Mutex::new(HashMap::new());
    let mut upstream = Upstream { shared, peer, client_id, who, grants, inbox, device_tx: &device_tx, cut: &cut, out };
    let upstream = upstream.run(device_rx, broker_tx, policy_rx);
    let downstream = downstream(broker_rx, &device_tx, &cut);
    tokio::pin!(upstream, downstream);
    // Either side ending ends both, and rumqttd sees a device that vanished without DISCONNECT
    // exactly as it would without the gate (will sent). When the device side ended, rumqttd's
    // answers are read until it closes: after a DISCONNECT because rumqttd must close first (step
    // 8), else after the gate shut its half to rumqttd down (FIN after what was forwarded),
    // because closing a socket with unread data sends a RST, which can make rumqttd's kernel drop
    // what it had not read yet.
    tokio::select! {
        ended = &mut upstream => {
            let _ = tokio::time::timeout(LINGER, &mut downstream).await;
            ended
        }
        ended = &mut downstream => ended,
    }
}

/// Authenticates `connect` and resolves its ACL grants, or the CONNACK code and why.
fn admit(policy: &Policy, connect: &Connect) -> Result<(Identity, Grants), (ConnectReturnCode, &'static str)> {
    if connect.protocol != Protocol::V4 {
        return Err((ConnectReturnCode::RefusedProtocolVersion, "not MQTT 3.1.1"));
    }
    let who = policy.admit(connect.login.as_ref()).map_err(|code| match code {
        ConnectReturnCode::BadUserNamePassword => (code, "unknown user or wrong password"),
        _ => (code, "no user name (anonymous clients are not allowed)"),
    })?;
    let grants = policy.grants(&who, &connect.client_id);
    if let Some(will) = &connect.last_will
        && !grants.may_publish(&will.topic)
    {
        return Err((ConnectReturnCode::NotAuthorized, "the ACL does not allow its will topic"));
    }
    Ok((who, grants))
}

/// The CONNECT as rumqttd gets it: the device's id behind [`DEVICE_ID_PREFIX`] (an empty id
/// stays empty: rumqttd gives it one of its own), the secret as password.
fn inner_connect(mut connect: Connect, user: Option<&str>, secret: &str) -> Connect {
    if !connect.client_id.is_empty() {
        connect.client_id.insert_str(0, DEVICE_ID_PREFIX);
    }
    connect.login = Some(Login::new(user.unwrap_or_default(), secret));
    connect
}

/// Subscribe packet ids whose filters the gate cut, with which filters passed (in order).
type Cuts = Mutex<HashMap<u16, Vec<bool>>>;
type DeviceTx<S> = tokio::sync::Mutex<tokio::io::WriteHalf<S>>;

/// Device → broker.
struct Upstream<'a, S> {
    shared: &'a Shared,
    peer: SocketAddr,
    client_id: String,
    who: Identity,
    grants: Grants,
    inbox: BytesMut,
    device_tx: &'a DeviceTx<S>,
    cut: &'a Cuts,
    out: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Upstream<'_, S> {
    async fn run(
        &mut self,
        mut device_rx: tokio::io::ReadHalf<S>,
        mut broker_tx: tokio::net::tcp::OwnedWriteHalf,
        mut policy: watch::Receiver<Arc<Policy>>,
    ) -> Result<(), End> {
        loop {
            // Packets that came with the CONNECT (or in the last read) first.
            self.out.clear();
            let mut replies = BytesMut::new();
            let mut said_disconnect = false;
            while let Some(packet) = next_packet(&mut self.inbox, self.shared.max_packet)? {
                if matches!(packet, Packet::Disconnect) {
                    // Nothing may follow a DISCONNECT (MQTT 3.1.1 §3.14.4): the rest is dropped.
                    said_disconnect = true;
                    encode(&packet, &mut self.out)?;
                    break;
                }
                self.check(packet, &mut replies)?;
            }
            if !self.out.is_empty() {
                broker_tx.write_all(&self.out).await?;
            }
            if !replies.is_empty() {
                self.device_tx.lock().await.write_all(&replies).await?;
            }
            if said_disconnect {
                // The inner connection stays open until rumqttd closes it (module doc, step 8):
                // dropping `broker_tx` would shut it down, so it is forgotten instead, and the
                // socket closes with the read half, when `downstream` sees rumqttd's close.
                broker_tx.forget();
                return Ok(());
            }
            self.inbox.reserve(READ_CHUNK);
            tokio::select! {
                read = device_rx.read_buf(&mut self.inbox) => if read? == 0 {
                    let _ = broker_tx.shutdown().await;
                    return Err(End::Closed);
                },
                changed = policy.changed() => {
                    if changed.is_err() {
                        continue; // the broker's policy sender lives as long as the broker
                    }
                    let current = policy.borrow_and_update().clone();
                    if !current.still_admits(&self.who) {
                        self.shared.refused(&self.shared.refusals.connections, self.peer, "a connection", "credentials changed on reload");
                        return Err(End::Refused);
                    }
                    self.grants = current.grants(&self.who, &self.client_id);
                }
            }
        }
    }

    /// Forwards `packet` into `self.out`, or refuses it (an answer into `replies`).
    fn check(&mut self, packet: Packet, replies: &mut BytesMut) -> Result<(), End> {
        match packet {
            Packet::Publish(publish) if !self.grants.may_publish(&publish.topic) => {
                let detail = format!("topic {:?} (user {:?})", publish.topic, self.who.user.as_deref().unwrap_or(""));
                self.shared.refused(&self.shared.refusals.publishes, self.peer, "a publish", &detail);
                match publish.qos {
                    QoS::AtMostOnce => Ok(()),
                    QoS::AtLeastOnce => encode(&Packet::PubAck(PubAck::new(publish.pkid)), replies),
                    QoS::ExactlyOnce => Err(End::Protocol("a refused QoS 2 publish")),
                }
            }
            Packet::Subscribe(subscribe) => {
                let passed: Vec<bool> = subscribe.filters.iter().map(|f| self.grants.may_subscribe(&f.path)).collect();
                for (filter, _) in subscribe.filters.iter().zip(&passed).filter(|(_, ok)| !**ok) {
                    let detail =
                        format!("filter {:?} (user {:?})", filter.path, self.who.user.as_deref().unwrap_or(""));
                    self.shared.refused(&self.shared.refusals.subscriptions, self.peer, "a subscription", &detail);
                }
                if passed.iter().all(|ok| *ok) {
                    return encode(&Packet::Subscribe(subscribe), &mut self.out);
                }
                if !passed.iter().any(|ok| *ok) {
                    let codes = vec![SubscribeReasonCode::Failure; passed.len()];
                    return encode(&Packet::SubAck(SubAck::new(subscribe.pkid, codes)), replies);
                }
                let filters = subscribe.filters.into_iter().zip(&passed).filter(|(_, ok)| **ok).map(|(f, _)| f);
                let kept = Subscribe { pkid: subscribe.pkid, filters: filters.collect() };
                self.cut.lock().unwrap_or_else(PoisonError::into_inner).insert(kept.pkid, passed);
                encode(&Packet::Subscribe(kept), &mut self.out)
            }
            Packet::Connect(_) => Err(End::Protocol("a second CONNECT")),
            other => encode(&other, &mut self.out),
        }
    }
}

/// Broker → device: forwards every packet, with the SUBACKs of cut subscriptions patched.
async fn downstream<S: AsyncWrite + Unpin>(
    mut broker_rx: tokio::net::tcp::OwnedReadHalf,
    device_tx: &DeviceTx<S>,
    cut: &Cuts,
) -> Result<(), End> {
    // rumqttd only sends what a device may receive, up to its own limits; this bound is only
    // against a broken stream.
    const MAX_FROM_BROKER: usize = 256 << 20;
    let mut inbox = BytesMut::with_capacity(READ_CHUNK);
    let mut out = BytesMut::new();
    loop {
        inbox.reserve(READ_CHUNK);
        if broker_rx.read_buf(&mut inbox).await? == 0 {
            let _ = device_tx.lock().await.shutdown().await;
            return Err(End::Closed);
        }
        out.clear();
        while let Some(packet) = next_packet(&mut inbox, MAX_FROM_BROKER)? {
            let packet = match packet {
                Packet::SubAck(suback) => Packet::SubAck(patch(suback, cut)),
                other => other,
            };
            encode(&packet, &mut out)?;
        }
        if !out.is_empty() {
            device_tx.lock().await.write_all(&out).await?;
        }
    }
}

/// The broker's SUBACK for a cut subscription, with a failure for each filter the gate removed.
fn patch(suback: SubAck, cut: &Cuts) -> SubAck {
    let Some(passed) = cut.lock().unwrap_or_else(PoisonError::into_inner).remove(&suback.pkid) else {
        return suback;
    };
    let mut codes = suback.return_codes.into_iter();
    let return_codes =
        passed.iter().map(|ok| if *ok { codes.next() } else { None }.unwrap_or(SubscribeReasonCode::Failure)).collect();
    SubAck { pkid: suback.pkid, return_codes }
}

/// The next whole packet in `inbox`, if one is there.
fn next_packet(inbox: &mut BytesMut, max: usize) -> Result<Option<Packet>, End> {
    match Packet::read(inbox, max) {
        Ok(packet) => Ok(Some(packet)),
        Err(mqttbytes::Error::InsufficientBytes(_)) => Ok(None),
        Err(error) => Err(End::Mqtt(error)),
    }
}

/// Reads until one whole packet is in `inbox`.
async fn read_packet<R: AsyncRead + Unpin>(rx: &mut R, inbox: &mut BytesMut, max: usize) -> Result<Packet, End> {
    loop {
        if let Some(packet) = next_packet(inbox, max)? {
            return Ok(packet);
        }
        inbox.reserve(READ_CHUNK.min(max));
        if rx.read_buf(inbox).await? == 0 {
            return Err(End::Closed);
        }
    }
}

fn encode(packet: &Packet, out: &mut BytesMut) -> Result<(), End> {
    packet.write(out, usize::MAX).map(drop).map_err(End::Mqtt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(user: &str, password: &str) -> Login {
        Login::new(user, password)
    }

    fn policy(anonymous: bool) -> Policy {
        // mosquitto_passwd -b FILE d1 p1 (mosquitto 2.0.11)
        let users = Users::parse(
            "d1:$7$101$fyeKBjcPx996djmY$pVBC4IQPlCWx7ZMATJpb4faqh94skDRo4lv+uA/pTjk5bkf4KciBXpN5k5ffH0Tf0CSOyBB7W7GBkuCWd7katg==",
        )
        .unwrap();
        Policy { users: Some(users), acl: None, anonymous }
    }

    #[test]
    fn admission_needs_the_password_or_allowed_anonymity() {
        let strict = policy(false);
        assert_eq!(strict.admit(Some(&login("d1", "p1"))).unwrap().user.as_deref(), Some("d1"));
        assert_eq!(strict.admit(Some(&login("d1", "p2"))), Err(ConnectReturnCode::BadUserNamePassword));
        assert_eq!(strict.admit(Some(&login("d2", "p1"))), Err(ConnectReturnCode::BadUserNamePassword));
        assert_eq!(strict.admit(None), Err(ConnectReturnCode::NotAuthorized));
        assert_eq!(strict.admit(Some(&login("", "p1"))), Err(ConnectReturnCode::NotAuthorized));
        assert_eq!(policy(true).admit(None).unwrap().user, None);
        // Without a users file a user name proves nothing: the client is anonymous.
        assert_eq!(Policy::default().admit(Some(&login("d1", "x"))).unwrap().user, None);
    }

    #[test]
    fn a_reload_keeps_only_unchanged_credentials() {
        let before = policy(true);
        let d1 = before.admit(Some(&login("d1", "p1"))).unwrap();
        let anonymous = before.admit(None).unwrap();
        assert!(before.still_admits(&d1) && before.still_admits(&anonymous));
        let other_hash = Users::parse(
            "d1:$6$P4Q13nrM4N46nMTN$LNbpu7fbpLneYIyH9Xhr7IX8VS7xZGKNUaWDgMHhj8gPEaDcxidjGvxWWcd6lMl6VU65wyyZVs7JtGHZhqCdSQ==",
        )
        .unwrap();
        let changed = Policy { users: Some(other_hash), anonymous: false, ..before };
        assert!(!changed.still_admits(&d1));
        assert!(!changed.still_admits(&anonymous));
    }

    #[test]
    fn device_ids_are_prefixed_and_the_password_is_the_secret() {
        let mut connect = Connect::new("braid-gw-devices");
        connect.login = Some(login("d1", "p1"));
        let inner = inner_connect(connect, Some("d1"), "s3cret");
        assert_eq!(inner.client_id, "device:braid-gw-devices");
        assert_eq!(inner.login, Some(login("d1", "s3cret")));
        let inner = inner_connect(Connect::new(""), None, "s3cret");
        assert_eq!(inner.client_id, "");
        assert_eq!(inner.login, Some(login("", "s3cret")));
    }

    #[test]
    fn a_cut_suback_gets_failures_where_filters_were_removed() {
        let cut = Cuts::default();
        cut.lock().unwrap().insert(7, vec![false, true, false, true]);
        let ok = SubscribeReasonCode::Success(QoS::AtLeastOnce);
        let patched = patch(SubAck::new(7, vec![ok, SubscribeReasonCode::Failure]), &cut);
        use SubscribeReasonCode::Failure;
        assert_eq!(patched.return_codes, vec![Failure, ok, Failure, Failure]);
        assert!(cut.lock().unwrap().is_empty());
        let untouched = patch(SubAck::new(8, vec![ok]), &cut);
        assert_eq!(untouched.return_codes, vec![ok]);
    }
}
