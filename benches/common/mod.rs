//! Pieces shared by the bench targets (each bench includes this module with `mod common;` and
//! uses what it needs; cargo does not take a subfolder of `benches/` for a bench of its own):
//!
//! - [`rng`]: the benches' fixed-seed PRNG (splitmix64), so every run generates the same rows;
//! - [`gateway`]: the gateway workload of CONTRACT.md (`command` ⋈ `status` on `device`): the
//!   per-device generator, the values and JSON lines of its rows, how rows are built (key hash
//!   and id, as `src/replay/mod.rs` `feed` builds them), and the config texts of its streams and
//!   of the gateway join;
//! - [`join`]: the gateway interval join alone (`[operators.effect]` as the config plans it), the
//!   rows of `benches/interval_join.rs`, and a driver that gives it a watermark at every 200 ms
//!   event-time tick and hands its output to a counting sink.
//!
//! The generator of `braid bench` (`src/bench/load.rs`) has a splitmix64 of its own: it lives in
//! the binary, which the benches cannot import.
//!
//! Not every bench uses every piece: unused ones are not dead code of the benches.
#![allow(dead_code, clippy::unwrap_used)]

pub mod gateway;
pub mod join;
pub mod rng;

/// Event times start here (an ordinary epoch-ms value).
pub const EPOCH_MS: i64 = 1_700_000_000_000;
