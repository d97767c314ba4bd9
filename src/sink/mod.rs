//! Sinks: where results leave braid. [`topic`] renders an MQTT sink's `{field}` topic template;
//! [`mqtt`] stores results and forwards them upstream.

pub mod mqtt;
pub mod topic;

/// How a sink's writer waits while it cannot go on (a full buffer, a full disk): in short rounds
/// until `stop` is set, each spent as `meanwhile` says.
#[derive(Clone, Copy)]
pub struct Patience<'a> {
    pub stop: &'a std::sync::atomic::AtomicBool,
    pub meanwhile: Meanwhile<'a>,
}

/// What a waiting writer does with each round of its wait.
#[derive(Clone, Copy)]
pub enum Meanwhile<'a> {
    /// Sleeps it (on the buffer's condition variable, where another thread frees the room).
    Sleep,
    /// Spends it running, for at most the given time, what goes on on the waiting thread: the
    /// service's MQTT sources and sinks (service/sources.rs). The sink that frees a full buffer
    /// runs only there, and the sources keep their connections alive through the wait.
    Run(&'a dyn Fn(std::time::Duration)),
}

impl<'a> Patience<'a> {
    /// Waits with nothing to do meanwhile.
    pub fn idle(stop: &'a std::sync::atomic::AtomicBool) -> Patience<'a> {
        Patience { stop, meanwhile: Meanwhile::Sleep }
    }
}

/// Runs `wait` (a test's wait that only `stop` ends) with a guard that sets `stop` after `within`
/// unless the wait ended first: a wait that should have stopped itself fails its test instead of
/// hanging it.
#[cfg(test)]
pub(crate) fn stopped_after<R>(
    stop: &std::sync::atomic::AtomicBool,
    within: std::time::Duration,
    wait: impl FnOnce() -> R,
) -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let step = std::time::Duration::from_millis(50);
            let mut waited = std::time::Duration::ZERO;
            while waited < within {
                if done.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(step);
                waited += step;
            }
            stop.store(true, Ordering::Relaxed);
        });
        let outcome = wait();
        done.store(true, Ordering::Relaxed);
        outcome
    })
}
