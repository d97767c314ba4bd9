//! Sinks: where results leave braid. [`topic`] renders an MQTT sink's `{field}` topic template.

pub mod topic;
