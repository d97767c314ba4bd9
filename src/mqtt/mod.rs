//! What MQTT sources and MQTT sinks share: how to reach a broker ([`conn`]: URL, client id,
//! credentials, TLS), how long to wait before reconnecting ([`backoff`]), what of a broken
//! connection to forget ([`forget_stale_events`]) and how to flush packets written straight into
//! a connection between polls ([`flush`]), and how the thread that drives their runtime wakes
//! them between its drives ([`wake`]).
//!
//! Both sides drive one `rumqttc` v4 (MQTT 3.1.1) event loop each; docs/edge-io-research.md
//! explains why v4 and lists the rumqttc traps the callers work around.

pub mod backoff;
pub mod conn;
pub mod wake;

pub use backoff::Backoff;
pub use conn::{ConnError, Endpoint, default_client_id, endpoint, options, persistent_client_id};

/// Flushes what was written straight into the event loop's connection between polls (the
/// source's acks, the sink's publishes), within the connection timeout as rumqttc's own flushes.
/// Call only while no poll is pending (it owns the connection then).
pub async fn flush(eventloop: &mut rumqttc::EventLoop) -> Result<(), rumqttc::ConnectionError> {
    use rumqttc::{ConnectionError, StateError};
    let timeout = std::time::Duration::from_secs(eventloop.network_options.connection_timeout());
    let network = eventloop.network.as_mut().ok_or(StateError::ConnectionAborted)?;
    tokio::time::timeout(timeout, network.flush()).await.map_err(|_| ConnectionError::FlushTimeout)??;
    Ok(())
}

/// Forgets the events rumqttc read or made on a connection that broke and has not handed out
/// yet. It keeps them across the break and hands them out first after the next ConnAck: a
/// publish parsed in the same read as the packet that broke the link, an outgoing PUBACK. Their
/// packet ids belong to the old connection; matched to the new one they ack the wrong message or
/// wait for an ack that never comes. The broker sends every un-acked QoS 1 message again, so
/// only incoming QoS 0 publishes are kept: nobody would send those again.
pub fn forget_stale_events(eventloop: &mut rumqttc::EventLoop) {
    use rumqttc::{Event, Packet, QoS};
    eventloop
        .state
        .events
        .retain(|event| matches!(event, Event::Incoming(Packet::Publish(p)) if p.qos == QoS::AtMostOnce));
}

#[cfg(test)]
mod tests {
    use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, PubAck, Publish, QoS};

    #[test]
    fn only_incoming_qos0_publishes_outlive_a_broken_connection() {
        let (_client, mut eventloop) = AsyncClient::new(MqttOptions::new("stale", "127.0.0.1", 1883), 4);
        let publish = |qos| Event::Incoming(Packet::Publish(Publish::new("devices/d1/status", qos, "1")));
        eventloop.state.events.extend([
            publish(QoS::AtLeastOnce),
            publish(QoS::AtMostOnce),
            Event::Incoming(Packet::PubAck(PubAck::new(7))),
            Event::Outgoing(Outgoing::PubAck(3)),
        ]);
        super::forget_stale_events(&mut eventloop);
        assert_eq!(eventloop.state.events.into_iter().collect::<Vec<_>>(), [publish(QoS::AtMostOnce)]);
    }
}
