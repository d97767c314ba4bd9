//! braid: a stream-join appliance for edge and IoT gateways.
//!
//! The modules follow the data path: [`config`] checks the TOML and yields a [`plan`] (the graph,
//! what it derives once, the runtime limits); [`record`] turns payloads into positional rows;
//! [`shard`] runs the [`operator`]s on pinned threads fed through [`ring`]s of rkyv frames — its
//! feeder asks [`time`]'s tick planner which ticks run, each operator runs in an operator host
//! that keeps its watermark, and operators keep their rows in [`state`], on [`storage`]'s one
//! segment log over mapped files; [`replay`], [`service`] (`braid run`) and the bench all drive
//! that one runtime; [`ops`] renders its metrics. [`source`] routes MQTT topics to streams and [`sink`] renders
//! publish topics. [`broker`] (feature `embedded-broker`) is braid's own MQTT broker and
//! [`demo`] simulates devices publishing to one.

#[cfg(feature = "embedded-broker")]
pub mod broker;
pub mod checkpoint;
pub mod config;
pub mod demo;
pub mod explain;
pub mod mqtt;
pub mod operator;
pub mod ops;
pub mod plan;
pub mod record;
pub mod replay;
pub mod ring;
pub mod service;
pub mod shard;
pub mod sink;
pub mod source;
pub mod spool;
pub mod sql;
pub mod state;
pub mod storage;
#[cfg(test)]
mod test_pki;
pub mod time;
