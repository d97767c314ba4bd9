//! Helpers shared by the integration tests (compiled once, as a module of the `it` test crate;
//! the modules beside it use what they need through `crate::common`, and the golden runner
//! `tests/golden.rs` includes `run.rs` and `multiset.rs` by path):
//!
//! - [`rng`]: the tests' one PRNG (splitmix64), so that seeded workloads are reproducible;
//! - [`run`]: the braid binary under test (`braid replay` with inputs, outputs and a timeout,
//!   reading its JSON-lines outputs back), input files in a temporary folder, and in-process
//!   replays (`braid::replay::run`) that skip ticks or step through every one;
//! - [`mqtt`]: a private mosquitto per test (start, SIGTERM stop, restart, kill), a recording
//!   subscriber and a publisher that waits for every PUBACK;
//! - [`tls`]: a test CA and certificates made with the openssl CLI, mosquitto password files,
//!   and a mosquitto with a second listener demanding TLS, client certificates or a password;
//! - [`multiset`]: outputs as multisets of canonical JSON texts, and readable differences;
//! - [`config_text`]: pieces of configuration text (stream sections, select items);
//! - [`join_workload`]: the interval-join workload generator, its brute-force reference and
//!   shrinker (`reference_join.rs`, `properties.rs`);
//! - [`notify`]: a stand-in for systemd's `NOTIFY_SOCKET` (readiness, watchdog pings);
//! - [`service`]: `braid run` as a child process with the gateway configuration, a seeded
//!   device workload, a reconnecting publisher, `/metrics` and results deduplicated by `_id`;
//! - [`runtime_workload`]: configurations of every operator kind, alone and chained through
//!   re-keying, over inputs full of ties (`runtime.rs`: the shard runtime against the oracle);
//! - [`oracle`]: replay's time semantics written again from CONTRACT.md, single-threaded,
//!   every tick, sharing no time-rule code with the runtime (`runtime.rs`'s reference).
//!
//! `dead_code` is allowed: the golden runner includes two of these files without using all of them.
#![allow(dead_code, clippy::unwrap_used)]

pub mod config_text;
pub mod join_workload;
pub mod mqtt;
pub mod multiset;
pub mod notify;
pub mod oracle;
pub mod rng;
pub mod run;
pub mod runtime_workload;
pub mod service;
pub mod tls;

/// 2026-01-01T00:00:00Z in ms: event times are realistic, and a multiple of every grid used.
pub const BASE_TS: i64 = 1_767_225_600_000;
/// Watermark ticks happen at multiples of this processing time (CONTRACT rule 3).
pub const TICK: i64 = 200;

/// An environment knob of a test (`BRAID_REF_CASES`, ...): its value, else `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
