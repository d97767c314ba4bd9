//! braid: a stream-join appliance for edge and IoT gateways.
//!
//! The modules follow the data path: [`config`] checks the TOML and yields a plan; [`record`]
//! turns payloads into positional rows; [`engine`] drives [`time`] (watermarks, idleness) and the
//! [`operator`]s, which keep their rows in [`state`]; [`replay`] feeds the engine from files;
//! [`ops`] renders its metrics.

pub mod config;
pub mod engine;
pub mod mapped_file;
pub mod operator;
pub mod ops;
pub mod record;
pub mod replay;
pub mod ring;
pub mod shard;
pub mod state;
pub mod time;
