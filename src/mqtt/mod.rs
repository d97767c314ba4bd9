//! What MQTT sources and MQTT sinks share: how to reach a broker ([`conn`]: URL, client id,
//! credentials, TLS) and how long to wait before reconnecting ([`backoff`]).
//!
//! Both sides drive one `rumqttc` v4 (MQTT 3.1.1) event loop each; docs/edge-io-research.md
//! explains why v4 and lists the rumqttc traps the callers work around.

pub mod backoff;
pub mod conn;

pub use backoff::Backoff;
pub use conn::{ConnError, Endpoint, default_client_id, endpoint, options, persistent_client_id};
