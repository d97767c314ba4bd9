//! Sinks: where results leave braid. [`topic`] renders an MQTT sink's `{field}` topic template;
//! [`mqtt`] stores results and forwards them upstream.

pub mod mqtt;
pub mod topic;
