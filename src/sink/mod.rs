//! Sinks: where results leave braid. [`topic`] renders an MQTT sink's `{field}` topic template;
//! [`mqtt`] stores results and forwards them upstream.

pub mod mqtt;
pub mod topic;

/// How a sink's writer waits while it cannot go on (a full buffer, a full disk): until `stop` is
/// set, doing `meanwhile` between its short sleeps — the service runs its MQTT sources there, on
/// the waiting thread (service/sources.rs), so their connections live through the wait.
#[derive(Clone, Copy)]
pub struct Patience<'a> {
    pub stop: &'a std::sync::atomic::AtomicBool,
    pub meanwhile: &'a dyn Fn(),
}

impl<'a> Patience<'a> {
    /// Waits with nothing to do meanwhile.
    pub fn idle(stop: &'a std::sync::atomic::AtomicBool) -> Patience<'a> {
        Patience { stop, meanwhile: &|| {} }
    }
}
