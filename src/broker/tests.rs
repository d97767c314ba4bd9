//! The embedded broker against real rumqttc clients on 127.0.0.1 (fresh port per test), and the
//! small async client helpers these tests and the device simulator's tests share.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, Publish, QoS};

use super::*;

/// Every wait of these tests is bounded by this.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

pub(crate) fn settings() -> BrokerSettings {
    BrokerSettings {
        listen: (Ipv4Addr::LOCALHOST, 0).into(),
        max_payload: 64 * 1024,
        tls: None,
        access: AccessFiles::default(),
    }
}

pub(crate) fn options(addr: SocketAddr, id: &str, clean: bool) -> MqttOptions {
    let mut o = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    o.set_clean_session(clean).set_keep_alive(Duration::from_secs(5));
    o
}

/// Polls until the next event that `want` accepts (errors fail the test).
pub(crate) async fn poll_until<T>(el: &mut EventLoop, mut want: impl FnMut(&Event) -> Option<T>) -> T {
    let wait = async {
        loop {
            let ev = el.poll().await.unwrap();
            if let Some(t) = want(&ev) {
                return t;
            }
        }
    };
    tokio::time::timeout(WAIT, wait).await.expect("no awaited MQTT event in time")
}

/// Connects and subscribes `filter`, returning after the SubAck; the ConnAck's session_present.
pub(crate) async fn subscriber(opts: MqttOptions, filter: &str, qos: QoS) -> (AsyncClient, EventLoop, bool) {
    let (client, mut el) = AsyncClient::new(opts, 16);
    let present = poll_until(&mut el, |ev| match ev {
        Event::Incoming(Packet::ConnAck(c)) => Some(c.session_present),
        _ => None,
    })
    .await;
    client.subscribe(filter, qos).await.unwrap();
    poll_until(&mut el, |ev| matches!(ev, Event::Incoming(Packet::SubAck(_))).then_some(())).await;
    (client, el, present)
}

/// Publishes every message at QoS 1 and returns once every PUBACK arrived.
pub(crate) async fn publish_acked(opts: MqttOptions, msgs: &[(String, Vec<u8>)]) {
    let (client, mut el) = AsyncClient::new(opts, msgs.len().max(1));
    for (topic, payload) in msgs {
        client.try_publish(topic.as_str(), QoS::AtLeastOnce, false, payload.clone()).unwrap();
    }
    let mut acked = 0;
    while acked < msgs.len() {
        poll_until(&mut el, |ev| matches!(ev, Event::Incoming(Packet::PubAck(_))).then_some(())).await;
        acked += 1;
    }
    client.disconnect().await.unwrap();
    // Read until rumqttd closes: a close of ours reaching it after it dropped the session could
    // end whichever connection took the session's slot meanwhile (gate.rs, step 8).
    let _ = tokio::time::timeout(Duration::from_secs(2), async { while el.poll().await.is_ok() {} }).await;
}

/// Receives `n` publishes.
pub(crate) async fn receive(el: &mut EventLoop, n: usize) -> Vec<Publish> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        let p = poll_until(el, |ev| match ev {
            Event::Incoming(Packet::Publish(p)) => Some(p.clone()),
            _ => None,
        })
        .await;
        got.push(p);
    }
    got
}

fn messages(topic: &str, n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n).map(|i| (topic.to_string(), format!("{{\"n\":{i}}}").into_bytes())).collect()
}

fn payloads(got: &[Publish]) -> Vec<Vec<u8>> {
    got.iter().map(|p| p.payload.to_vec()).collect()
}

#[test]
fn qos1_publish_reaches_a_subscriber() {
    let broker = start(settings()).unwrap();
    let addr = broker.addr();
    assert_ne!(addr.port(), 0);
    runtime().block_on(async {
        let (_sub, mut el, _) = subscriber(options(addr, "sub", true), "devices/+/status", QoS::AtLeastOnce).await;
        let msgs = messages("devices/d1/status", 20);
        publish_acked(options(addr, "pub", true), &msgs).await;
        let got = receive(&mut el, msgs.len()).await;
        assert!(got.iter().all(|p| p.topic == "devices/d1/status" && p.qos == QoS::AtLeastOnce));
        assert_eq!(payloads(&got), msgs.into_iter().map(|m| m.1).collect::<Vec<_>>());
    });
}

#[test]
fn persistent_session_gets_what_was_queued_while_away() {
    let broker = start(settings()).unwrap();
    let addr = broker.addr();
    runtime().block_on(async {
        let (sub, mut el, _) = subscriber(options(addr, "keeper", false), "q/#", QoS::AtLeastOnce).await;
        sub.disconnect().await.unwrap();
        let _ = tokio::time::timeout(Duration::from_millis(200), el.poll()).await;
        drop(el);

        let msgs = messages("q/x", 10);
        publish_acked(options(addr, "pub", true), &msgs).await;

        // Back with the same id and no new subscription: the session kept both.
        let (_client, mut el) = AsyncClient::new(options(addr, "keeper", false), 16);
        let present = poll_until(&mut el, |ev| match ev {
            Event::Incoming(Packet::ConnAck(c)) => Some(c.session_present),
            _ => None,
        })
        .await;
        assert!(present, "the broker forgot the persistent session");
        let got = receive(&mut el, msgs.len()).await;
        assert_eq!(payloads(&got), msgs.into_iter().map(|m| m.1).collect::<Vec<_>>());
    });
}

#[test]
fn a_taken_port_is_a_clear_error() {
    let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = taken.local_addr().unwrap();
    let err = start(BrokerSettings { listen: addr, ..settings() }).unwrap_err();
    assert!(matches!(err, BrokerError::AddrInUse { addr: a } if a == addr), "{err:?}");
    assert!(err.to_string().contains("already in use"), "{err}");
    assert!(err.is_retryable());
}

#[test]
fn a_port_with_connections_in_time_wait_can_be_reused() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let client = std::net::TcpStream::connect(addr).unwrap();
    let (server_side, _) = listener.accept().unwrap();
    // The server side closes first, so its end of the connection stays in TIME_WAIT.
    drop(server_side);
    drop(client);
    drop(listener);
    let broker = start(BrokerSettings { listen: addr, ..settings() }).unwrap();
    assert_eq!(broker.addr(), addr);
}

#[test]
fn free_addr_prefers_the_given_port_and_falls_back_on_the_same_ip() {
    let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let busy = taken.local_addr().unwrap();
    let other = free_addr(busy).unwrap();
    assert_eq!(other.ip(), busy.ip());
    assert_ne!(other.port(), busy.port());
    drop(taken);
    assert_eq!(free_addr(busy).unwrap(), busy);
}

#[test]
fn zero_max_payload_is_refused() {
    let err = start(BrokerSettings { max_payload: 0, ..settings() }).unwrap_err();
    assert!(matches!(err, BrokerError::ZeroMaxPayload));
}

/// braid's own client on rumqttd's port, with the secret.
pub(crate) fn own(broker: &EmbeddedBroker, id: &str) -> MqttOptions {
    let mut o = options(broker.local_addr(), id, true);
    let (user, password) = broker.own_login();
    o.set_credentials(user, password);
    o
}

/// `opts` with a user name and password.
fn with_login(mut opts: MqttOptions, user: &str, password: &str) -> MqttOptions {
    opts.set_credentials(user, password);
    opts
}

/// Connects once: `None` on ConnAck success, else what went wrong (a refusing ConnAck code or
/// a connection error).
async fn connect_error(opts: MqttOptions) -> Option<String> {
    let (_client, mut el) = AsyncClient::new(opts, 4);
    let first = tokio::time::timeout(WAIT, el.poll()).await.expect("no answer to CONNECT in time");
    match first {
        Ok(Event::Incoming(Packet::ConnAck(ack))) if ack.code == rumqttc::ConnectReturnCode::Success => None,
        Ok(other) => Some(format!("{other:?}")),
        Err(error) => Some(error.to_string()),
    }
}

mod access;

#[cfg(not(feature = "embedded-broker-tls"))]
#[test]
fn tls_without_the_feature_is_a_clear_error() {
    let tls = BrokerTls { cert_file: "c.pem".into(), key_file: "k.pem".into(), ca_file: None };
    let err = start(BrokerSettings { tls: Some(tls), ..settings() }).unwrap_err();
    assert!(matches!(err, BrokerError::TlsUnavailable), "{err:?}");
    assert!(!err.is_retryable());
}

#[cfg(feature = "embedded-broker-tls")]
mod tls {
    use super::*;
    use crate::test_pki::Pki;

    /// The server certificate of a fresh test PKI, for the broker's TLS listener.
    fn server_tls(pki: &Pki) -> BrokerTls {
        BrokerTls { cert_file: pki.dir().join("server.pem"), key_file: pki.dir().join("server.key"), ca_file: None }
    }

    /// A device's options for the broker's TLS listener, through braid's own TLS settings
    /// (`mqtt::options`): the test CA, and `client`'s certificate and key for mutual TLS.
    fn tls_options(addr: SocketAddr, id: &str, pki: &Pki, client: Option<&str>) -> MqttOptions {
        let file = |name: String| Some(pki.dir().join(name).display().to_string());
        let conn = crate::config::MqttConn {
            ca_file: file("ca.pem".into()),
            cert_file: client.and_then(|c| file(format!("{c}.pem"))),
            key_file: client.and_then(|c| file(format!("{c}.key"))),
            keep_alive_ms: Some(5_000),
            ..Default::default()
        };
        crate::mqtt::options(&format!("mqtts://{addr}"), &conn, id).unwrap()
    }

    #[test]
    fn qos1_over_tls() {
        let pki = Pki::make();
        let broker = start(BrokerSettings { tls: Some(server_tls(&pki)), ..settings() }).unwrap();
        let addr = broker.addr();
        runtime().block_on(async {
            let (_sub, mut el, _) = subscriber(tls_options(addr, "sub", &pki, None), "t/#", QoS::AtLeastOnce).await;
            let msgs = messages("t/1", 5);
            publish_acked(tls_options(addr, "pub", &pki, None), &msgs).await;
            let got = receive(&mut el, msgs.len()).await;
            assert_eq!(payloads(&got), msgs.into_iter().map(|m| m.1).collect::<Vec<_>>());
        });
    }

    #[test]
    fn with_tls_braid_reaches_its_broker_in_plain_mqtt_on_a_loopback_listener() {
        let pki = Pki::make();
        let broker = start(BrokerSettings { tls: Some(server_tls(&pki)), ..settings() }).unwrap();
        let (devices, local) = (broker.addr(), broker.local_addr());
        assert_ne!(devices, local);
        assert!(local.ip().is_loopback());
        runtime().block_on(async {
            // braid's side subscribes without TLS; a device publishes with TLS.
            let (_sub, mut el, _) = subscriber(own(&broker, "braid"), "t/#", QoS::AtLeastOnce).await;
            let msgs = messages("t/2", 5);
            publish_acked(tls_options(devices, "device", &pki, None), &msgs).await;
            let got = receive(&mut el, msgs.len()).await;
            assert_eq!(payloads(&got), msgs.into_iter().map(|m| m.1).collect::<Vec<_>>());
        });
    }

    #[test]
    fn bad_tls_files_are_clear_errors() {
        let pki = Pki::make();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("empty.pem"), "").unwrap();
        let tls = BrokerTls {
            cert_file: dir.path().join("empty.pem"),
            key_file: dir.path().join("missing.key"),
            ca_file: None,
        };
        let err = start(BrokerSettings { tls: Some(tls), ..settings() }).unwrap_err();
        assert!(matches!(&err, BrokerError::TlsFile { path, .. } if path.ends_with("empty.pem")), "{err:?}");
        let missing_ca = BrokerTls { ca_file: Some(dir.path().join("ca.pem")), ..server_tls(&pki) };
        let err = start(BrokerSettings { tls: Some(missing_ca), ..settings() }).unwrap_err();
        assert!(matches!(&err, BrokerError::TlsFile { path, .. } if path.ends_with("ca.pem")), "{err:?}");
    }

    #[test]
    fn with_a_ca_file_a_client_certificate_is_required() {
        let pki = Pki::make();
        let tls = BrokerTls { ca_file: Some(pki.dir().join("ca.pem")), ..server_tls(&pki) };
        let broker = start(BrokerSettings { tls: Some(tls), ..settings() }).unwrap();
        let addr = broker.addr();
        runtime().block_on(async {
            let (_sub, mut el, _) = subscriber(own(&broker, "braid"), "t/#", QoS::AtLeastOnce).await;
            let msgs = messages("t/3", 3);
            publish_acked(tls_options(addr, "device", &pki, Some("client")), &msgs).await;
            assert_eq!(payloads(&receive(&mut el, 3).await), msgs.into_iter().map(|m| m.1).collect::<Vec<_>>());
            for (name, opts) in [
                ("no certificate", tls_options(addr, "nocert", &pki, None)),
                ("a certificate of another CA", tls_options(addr, "rogue", &pki, Some("rogue-client"))),
            ] {
                let error = connect_error(opts).await;
                assert!(error.is_some(), "{name}: connected");
            }
        });
        // The broker counts a refusal on its own task, after the client has seen the handshake
        // fail: wait for the count rather than read it at once.
        let refused = || broker.refusals().connections.load(Ordering::Relaxed);
        for _ in 0..500 {
            if refused() >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(refused(), 2);
    }
}
