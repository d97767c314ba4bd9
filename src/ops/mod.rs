//! Operating braid: metrics (Prometheus text), the `/metrics` and `/healthz` endpoint, and the
//! systemd notifications (readiness, status, watchdog), and where logs go.

pub mod http;
pub mod logs;
pub mod metrics;
pub mod systemd;
pub(crate) mod throttle;

pub use http::{OpsError, OpsView};
