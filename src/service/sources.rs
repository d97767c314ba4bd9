//! Where the MQTT sources and sinks run: on the intake thread, in a tokio current-thread runtime
//! of its own that the intake drives whenever it would wait anyway.
//!
//! A device's message used to cross two threads before it reached a ring: the io thread woke for
//! the socket, handed the message over and rang the intake, which woke in turn — two sleeps and
//! two wake-ups for every batch the broker sent (BENCHMARKS.md "One thread for a source's
//! messages"). Now the intake's sleep *is* the sources' wait: it sleeps in [`SourceRuntime`]'s
//! `block_on` on its doorbell's socket, so the broker's next packet wakes the intake itself, the
//! source task reads it and hands the deliveries over in the same wake-up. Each round of the
//! intake also [`pump`](SourceRuntime::pump)s the runtime once without waiting, so a busy intake
//! still acknowledges (the confirmations it made wake the source tasks) and reads on. Those
//! wake-ups, made by the intake between two drives, wait for the next drive's start
//! (mqtt/wake.rs): tokio would otherwise write its eventfd for each.
//!
//! The MQTT sinks' forwarding loops (sink/mqtt/forward.rs) run here too: the intake collects a
//! result and the same thread publishes it at its next pump or sleep, where on the io thread each
//! batch of results cost that thread a wake-up and a result waited for it (BENCHMARKS.md
//! "Latency timed to the µs").
//!
//! The intake runs them only between its own steps, and a step never waits on a source, so
//! nothing here can deadlock: a source whose hand-off channel is full retries on a timer of this
//! runtime, which the next pump or sleep runs. A wait of the intake that lasts (a full sink
//! buffer, `overflow = "block"`; a full disk) spends its rounds running this runtime
//! ([`run_for`](SourceRuntime::run_for)): the sink that frees the room runs then, and the sources
//! keep their connections alive (pings) through backpressure. `/metrics` and signals stay on the
//! io thread (io.rs).

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use crate::mqtt::wake::{self, Drive};
use crate::shard::wake::SleepDriver;

/// The sources' runtime; one per service, kept across reloads. Driven only by the thread that
/// made it (tokio's current-thread runtime runs its tasks inside `block_on`); never from inside
/// one of its tasks (a nested `block_on` panics): the intake drives it only from its own steps.
#[derive(Clone)]
pub struct SourceRuntime {
    runtime: Arc<tokio::runtime::Runtime>,
}

impl SourceRuntime {
    pub fn new() -> std::io::Result<SourceRuntime> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        // Only this thread drives it: its wake-ups of the tasks wait for its next drive.
        wake::drives();
        Ok(SourceRuntime { runtime: Arc::new(runtime) })
    }

    /// Where source tasks are spawned (from any thread; they run when this one drives them).
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    /// Runs what is ready without waiting: tasks woken since the last drive, then one look at
    /// the sockets (the tasks that look wakes run at the next pump or sleep).
    pub fn pump(&self) {
        self.block_on(tokio::task::yield_now());
    }

    /// Drives the runtime for `how_long`: what a sink's wait does with its rounds (the sinks
    /// that free its room run here).
    pub fn run_for(&self, how_long: Duration) {
        // Made inside: a sleep needs the runtime's timer when it is created.
        self.block_on(async { tokio::time::sleep(how_long).await });
    }

    /// Drives the runtime until `future` is done (stopping the sources, draining the sinks): every
    /// drive goes through here, and first gives the wake-ups that waited for it (mqtt/wake.rs).
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(async {
            let _drive = Drive::begins();
            future.await
        })
    }

    /// The intake's way to sleep: on its doorbell's socket, with the sources running meanwhile.
    pub fn sleeper(&self, socket: UnixStream) -> std::io::Result<Box<dyn SleepDriver>> {
        let _in_runtime = self.runtime.enter();
        let bell = tokio::net::UnixStream::from_std(socket)?;
        Ok(Box::new(SleepWithSources { sources: self.clone(), bell }))
    }
}

struct SleepWithSources {
    sources: SourceRuntime,
    bell: tokio::net::UnixStream,
}

impl SleepDriver for SleepWithSources {
    fn sleep(&mut self, timeout: Duration) -> bool {
        let SleepWithSources { sources, bell } = self;
        sources.block_on(async {
            let mut bytes = [0u8; 64];
            // Any number of bytes is one wake-up; none (Ok(0), the waker end gone) or a failed
            // socket ends the wait too. Read as a stream, not `readable` then `try_read`: a read
            // shorter than the buffer tells tokio the socket is drained, so the next sleep waits
            // at once instead of first reading nothing (a system call per sleep).
            let rung = tokio::io::AsyncReadExt::read(bell, &mut bytes);
            tokio::time::timeout(timeout, rung).await.is_ok()
        })
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // the tests time their own sleeps
mod tests {
    use std::io::Write;
    use std::time::{Duration, Instant};

    use super::SourceRuntime;

    #[test]
    fn a_sleep_runs_the_sources_and_ends_when_rung() {
        let sources = SourceRuntime::new().unwrap();
        let (mut waker, sleeper) = std::os::unix::net::UnixStream::pair().unwrap();
        sleeper.set_nonblocking(true).unwrap();
        let mut sleep = sources.sleeper(sleeper).unwrap();
        // A task spawned from elsewhere runs while the owner sleeps, and its ring ends the sleep.
        let (tx, rx) = std::sync::mpsc::channel();
        let mut ring = waker.try_clone().unwrap();
        sources.handle().spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.send("ran").unwrap();
            ring.write_all(&[1]).unwrap();
        });
        let since = Instant::now();
        assert!(sleep.sleep(Duration::from_secs(5)), "rung by the task");
        assert!(since.elapsed() < Duration::from_secs(4));
        assert_eq!(rx.try_recv(), Ok("ran"));
        // Unrung: the sleep ends at its timeout and says so.
        assert!(!sleep.sleep(Duration::from_millis(30)));
        // Bytes written meanwhile wake the next sleep at once.
        waker.write_all(&[1, 1]).unwrap();
        let since = Instant::now();
        assert!(sleep.sleep(Duration::from_secs(5)));
        assert!(since.elapsed() < Duration::from_secs(4));
    }

    #[test]
    fn a_pump_runs_the_tasks_that_are_ready_without_waiting() {
        let sources = SourceRuntime::new().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        sources.handle().spawn(async move { tx.send(1).unwrap() });
        sources.pump();
        assert_eq!(rx.try_recv(), Ok(1));
    }

    /// A sink's wait for room spends its rounds here: the tasks (the sink that frees the room)
    /// run all through it, timers included, and it lasts what it was given.
    #[test]
    fn run_for_runs_the_tasks_for_that_long() {
        let sources = SourceRuntime::new().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        sources.handle().spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            tx.send("ran").unwrap();
        });
        let since = Instant::now();
        sources.run_for(Duration::from_millis(40));
        assert!(since.elapsed() >= Duration::from_millis(40));
        assert_eq!(rx.try_recv(), Ok("ran"));
    }
}
