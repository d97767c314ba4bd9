//! The MQTT test harness itself (tests/it/common/mqtt.rs) against a real mosquitto: what other MQTT
//! tests rely on — delivery after the SubAck, and persistent sessions surviving a restart.

use crate::common;

use std::time::Duration;

use common::mqtt::{Mosquitto, Subscriber, publish_all};
use rumqttc::QoS;

fn messages(topic: &str, n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n).map(|i| (topic.to_string(), format!(r#"{{"n":{i}}}"#).into_bytes())).collect()
}

#[test]
fn publish_and_subscribe_through_mosquitto() {
    let broker = Mosquitto::start();
    assert_eq!(broker.url(), format!("mqtt://127.0.0.1:{}", broker.port()));
    let sub = Subscriber::connect(broker.port(), "devices/+/status", QoS::AtLeastOnce);
    let msgs = messages("devices/d1/status", 50);
    publish_all(broker.port(), &msgs, QoS::AtLeastOnce);
    publish_all(broker.port(), &messages("devices/d1/command", 5), QoS::AtLeastOnce);
    assert!(sub.wait_for(msgs.len(), Duration::from_secs(5)), "got {} of {}", sub.messages().len(), msgs.len());
    // The commands do not match the filter; give a stray one time to show up.
    assert!(!sub.wait_for(msgs.len() + 1, Duration::from_millis(200)));
    assert_eq!(sub.messages(), msgs);
    let ns: Vec<i64> = sub.json_rows().iter().map(|v| v["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, (0..50).collect::<Vec<_>>());
}

#[test]
fn restart_keeps_the_queued_messages_of_a_persistent_session() {
    let mut broker = Mosquitto::start();
    let port = broker.port();
    Subscriber::connect_with(port, "q/#", QoS::AtLeastOnce, "harness-keeper", false).close();
    let msgs = messages("q/x", 20);
    publish_all(port, &msgs, QoS::AtLeastOnce);
    broker.restart();
    assert_eq!(broker.port(), port);
    let sub = Subscriber::connect_with(port, "q/#", QoS::AtLeastOnce, "harness-keeper", false);
    assert!(sub.wait_for(msgs.len(), Duration::from_secs(5)), "got {:?}; log:\n{}", sub.messages(), broker.log());
    assert_eq!(sub.messages(), msgs);
    broker.kill();
}
