//! The journal's syncs under `durability = "power"`, on a thread of their own.
//!
//! The intake thread also collects the shards' results and runs the sinks. When it made each
//! `msync` itself, results waited behind the disk: publish → result p99 was about 1 ms longer than
//! with `durability = "process"` (BENCHMARKS.md, 26th session). Now it hands the syncs of a batch's
//! journal entries to this thread and goes on with results. It takes no more input, appends nothing
//! to the journal and releases nothing from it until the sync reports. Only then are the batch's
//! deliveries confirmed to their sources (service/intake.rs). While a sync runs, the next
//! deliveries gather in the intake channel, so a slow disk syncs larger batches.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::shard::wake::Doorbell;
use crate::storage::PendingSync;

/// A thread that runs one batch of syncs at a time and rings the intake's doorbell when done.
pub struct Syncer {
    jobs: Option<Sender<Vec<PendingSync>>>,
    reports: Receiver<std::io::Result<()>>,
    thread: Option<JoinHandle<()>>,
    under_way: bool,
}

impl Syncer {
    /// Starts the thread; `bell` wakes the intake when a sync has run.
    pub fn start(bell: Arc<Doorbell>) -> std::io::Result<Syncer> {
        let (jobs, todo) = crossbeam_channel::bounded::<Vec<PendingSync>>(1);
        let (report, reports) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new().name("braid-sync".into()).spawn(move || {
            for syncs in todo {
                let ran = syncs.iter().try_for_each(|sync| sync.run().map_err(std::io::Error::other));
                if report.send(ran).is_err() {
                    return;
                }
                bell.ring();
            }
        })?;
        Ok(Syncer { jobs: Some(jobs), reports, thread: Some(thread), under_way: false })
    }

    /// A batch of syncs was handed over and has not been collected yet.
    pub fn under_way(&self) -> bool {
        self.under_way
    }

    /// Hands `syncs` over (none may be under way).
    pub fn hand_over(&mut self, syncs: Vec<PendingSync>) -> std::io::Result<()> {
        let Some(jobs) = &self.jobs else { return Err(gone()) };
        jobs.send(syncs).map_err(|_| gone())?;
        self.under_way = true;
        Ok(())
    }

    /// How the syncs under way went, once they have run; `None` while they run or when none are
    /// under way.
    pub fn report(&mut self) -> Option<std::io::Result<()>> {
        if !self.under_way {
            return None;
        }
        let ran = match self.reports.try_recv() {
            Ok(ran) => ran,
            Err(crossbeam_channel::TryRecvError::Empty) => return None,
            Err(crossbeam_channel::TryRecvError::Disconnected) => Err(gone()),
        };
        self.under_way = false;
        Some(ran)
    }

    /// [`report`](Self::report), waiting for the syncs under way to run.
    pub fn wait(&mut self) -> Option<std::io::Result<()>> {
        if !self.under_way {
            return None;
        }
        self.under_way = false;
        Some(self.reports.recv().unwrap_or_else(|_| Err(gone())))
    }

    /// A report waits to be collected (the intake's sleep looks: the bell may have rung before
    /// it slept).
    pub fn has_report(&self) -> bool {
        !self.reports.is_empty()
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        // The thread ends once the channel is closed and the batch it runs, if any, has run.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn gone() -> std::io::Error {
    std::io::Error::other("the journal's sync thread is gone")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MappedFile;

    #[test]
    fn a_handed_over_sync_runs_and_reports_even_once_its_file_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let (bell, _sleeper) = Doorbell::new().unwrap();
        let mut syncer = Syncer::start(Arc::clone(&bell)).unwrap();
        assert!(!syncer.under_way() && syncer.report().is_none() && syncer.wait().is_none());
        let file = MappedFile::create(&dir.path().join("f"), *b"braidtst", 1, 8192).unwrap();
        syncer.hand_over(vec![file.sync_later(0, 4096), file.sync_later(4096, 10)]).unwrap();
        assert!(syncer.under_way());
        // The file may go meanwhile: the sync holds its mapping.
        drop(file);
        assert!(syncer.wait().unwrap().is_ok());
        assert!(!syncer.under_way() && !syncer.has_report());
        syncer.hand_over(Vec::new()).unwrap();
        let ran = (0..10_000).find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(1));
            syncer.report()
        });
        assert!(ran.expect("a report within about 10 s").is_ok());
    }
}
