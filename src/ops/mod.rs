//! Operating braid: metrics (Prometheus text).

pub mod metrics;
