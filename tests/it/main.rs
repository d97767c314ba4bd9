//! braid's integration tests, in one test crate so that the helpers of [`common`] (3.5 k lines)
//! compile once instead of once per test file. One module per subject; a test's full name is
//! `MODULE::TEST`, so a module runs alone with a filter:
//!
//! ```text
//! cargo test --test it runtime::            # one module
//! cargo test --test it -- runtime:: properties::
//! cargo test --test it -- config_errors::a_valid_config_exits_0 --exact
//! ```
//!
//! The golden cases have their own runner, one test per case folder (`tests/golden.rs`,
//! `cargo test --test golden CASE`).
//!
//! All modules share one process. None sets environment variables, installs signal handlers or
//! keeps process-wide state: keep it that way, or give such a test a crate of its own. The tests
//! that kill a child process (`crash_kill_9`, `spool_kill_9`, `mqtt_sink`) run this binary again
//! with their own full name (`MODULE::TEST --exact`) and a variable that makes the test be the
//! child.

mod common;

// The braid binary and its configuration errors.
mod bench_command;
mod config_errors;
mod examples;
mod explain;
mod explain_live;
mod sql;
mod systemd_unit;

// Logs and the bundled Grafana dashboard and Prometheus alerts.
mod grafana;
mod logs;

// Replay against brute-force references and properties.
mod composite_keys;
mod join_quality;
mod properties;
mod reference_connect;
mod reference_join;
mod reference_union_temporal_absence;
mod reference_windows;
mod replay_input;
mod replay_resume;
mod robustness;
mod runtime;
mod snapshots;
mod state_budget;
mod tick_skipping;
mod ttl;

// Crash safety of the mapped files.
mod crash_kill_9;
mod spool_kill_9;

// MQTT edge and the service.
mod backpressure;
mod damaged_state;
mod disk_full;
mod mqtt_harness;
mod mqtt_sink;
mod mqtt_source;
mod mqtt_tls;
mod poison;
mod scratch_dir;
mod security;
mod service_lifecycle;
mod service_mqtt;
mod service_restart;
mod status_command;
mod warnings;
