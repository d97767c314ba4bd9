//! Operating braid: metrics (Prometheus text), the `/metrics` and `/healthz` endpoint, and the
//! systemd notifications (readiness, status, watchdog), where logs go; and `braid status`, which
//! reads that endpoint back ([`prom`] parses its text); malloc's tuning ([`malloc`]).

pub mod http;
pub mod logs;
pub mod malloc;
pub mod metrics;
pub mod prom;
pub mod status;
pub mod systemd;
pub(crate) mod throttle;
pub mod warnings;

pub use http::{OpsError, OpsView};
