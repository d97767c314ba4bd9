//! `braid demo`: simulated devices publishing to an MQTT broker.

pub mod devices;
