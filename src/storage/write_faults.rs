//! Write sites that cannot write now — a full disk (ENOSPC, EDQUOT) or another write error — for
//! the operator to see: `/healthz` (degraded, with the path), `/metrics`
//! (`braid_storage_write_failing`, `braid_storage_write_failures_total`) and the log (a warning
//! when a site starts failing, then at most every [`WARN_EVERY`] while it goes on, and a line when
//! it writes again).
//!
//! No site drops what it could not write: each holds it and tries again every [`RETRY_EVERY`]
//! (README "Disk full"): the journal holds the input (the broker keeps what is not acknowledged),
//! a sink's buffer holds the intake, the log of rows taken keeps its hashes in memory, a
//! checkpoint leaves the previous one and the journal in place, a file sink keeps its lines.
//!
//! One registry per process: the sites live on different threads (intake, shards, io), and a
//! report is a few words under a mutex, taken only when a write fails or succeeds again after
//! failing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How often a write that failed is tried again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// How often a site that keeps failing is warned about again.
pub const WARN_EVERY: Duration = Duration::from_secs(30);

/// One site that cannot write now.
#[derive(Clone, Debug)]
pub struct Failing {
    /// `journal`, `sink NAME`, `taken log`, `checkpoint`, `file sink NAME`.
    pub site: String,
    pub path: PathBuf,
    pub error: String,
    /// ENOSPC or EDQUOT (else another write error).
    pub disk_full: bool,
    /// What braid does meanwhile (`input held at the broker`).
    pub meanwhile: &'static str,
    pub since: Instant,
    /// Failed attempts since it started failing.
    pub attempts: u64,
}

impl Failing {
    /// `disk full: journal (/var/lib/braid/journal/0000000003.spool): No space left on device
    /// (os error 28) for 12 s; input held at the broker, retried every second` — one reason of
    /// `/healthz` and the STATUS= line.
    pub fn reason(&self) -> String {
        let what = if self.disk_full { "disk full" } else { "write error" };
        format!(
            "{what}: {} ({}): {} for {} s; {}, retried every second",
            self.site,
            self.path.display(),
            self.error,
            self.since.elapsed().as_secs(),
            self.meanwhile
        )
    }
}

struct Site {
    failing: Failing,
    warned: Instant,
    /// Attempts at the last warning.
    warned_attempts: u64,
}

#[derive(Default)]
struct Registry {
    failing: BTreeMap<String, Site>,
    /// Per site: failed writes over the process's life.
    failures: BTreeMap<String, u64>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { failing: BTreeMap::new(), failures: BTreeMap::new() });

/// How many sites are failing (kept with the registry, under its lock): lets [`recovered`], which
/// every successful batch calls, skip the lock while nothing fails.
static FAILING: AtomicUsize = AtomicUsize::new(0);

fn registry() -> MutexGuard<'static, Registry> {
    // Plain data: a panic while it was held leaves nothing half-done that matters.
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The storage layer's clock: retry timers, warning rates, a spool segment's age against the
/// kernel's writeback — wall time of the files, never processing time.
#[allow(clippy::disallowed_methods)] // file timing, not engine time
pub fn now() -> Instant {
    Instant::now()
}

/// Whether `error` says the file system is full (ENOSPC) or the quota is used up (EDQUOT).
pub fn is_disk_full(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// `site` could not write `path`: counted, shown, warned about (rate-limited).
pub fn failed(site: &str, path: &Path, error: &std::io::Error, meanwhile: &'static str) {
    failed_with(site, path, &error.to_string(), is_disk_full(error), meanwhile);
}

/// [`failed`] for an error that is not an `io::Error` (its text and whether it is a full disk).
pub fn failed_with(site: &str, path: &Path, error: &str, disk_full: bool, meanwhile: &'static str) {
    let mut registry = registry();
    *registry.failures.entry(site.to_owned()).or_default() += 1;
    let now = now();
    match registry.failing.get_mut(site) {
        Some(known) => {
            let failing = &mut known.failing;
            failing.attempts += 1;
            (failing.path, failing.error, failing.disk_full) = (path.to_owned(), error.to_owned(), disk_full);
            if now.duration_since(known.warned) >= WARN_EVERY {
                let attempts = failing.attempts - known.warned_attempts;
                let secs = failing.since.elapsed().as_secs();
                tracing::warn!(site, path = %path.display(), error, attempts, secs, "Still cannot write; {meanwhile}");
                (known.warned, known.warned_attempts) = (now, failing.attempts);
            }
        }
        None => {
            let what = if disk_full { "Disk full" } else { "Write error" };
            tracing::warn!(site, path = %path.display(), error, "{what}: {meanwhile}; retried every second");
            let failing = Failing {
                site: site.to_owned(),
                path: path.to_owned(),
                error: error.to_owned(),
                disk_full,
                meanwhile,
                since: now,
                attempts: 1,
            };
            registry.failing.insert(site.to_owned(), Site { failing, warned: now, warned_attempts: 1 });
            FAILING.store(registry.failing.len(), Ordering::Release);
        }
    }
}

/// `site` wrote again: no longer shown (logged once if it was failing).
pub fn recovered(site: &str) {
    if FAILING.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut registry = registry();
    if let Some(gone) = registry.failing.remove(site) {
        FAILING.store(registry.failing.len(), Ordering::Release);
        let failing = gone.failing;
        let secs = failing.since.elapsed().as_secs();
        tracing::warn!(site, path = %failing.path.display(), secs, attempts = failing.attempts, "Writes again; resumed");
    }
}

/// Whether `site` is failing now.
pub fn is_failing(site: &str) -> bool {
    registry().failing.contains_key(site)
}

/// The sites failing now, by name.
pub fn failing() -> Vec<Failing> {
    registry().failing.values().map(|s| s.failing.clone()).collect()
}

/// Failed writes per site over the process's life.
pub fn failures() -> Vec<(String, u64)> {
    registry().failures.iter().map(|(site, &n)| (site.clone(), n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_site_is_shown_counted_and_gone_once_it_writes() {
        let site = "test site write_faults";
        let enospc = std::io::Error::from_raw_os_error(libc::ENOSPC);
        failed(site, Path::new("/x/y"), &enospc, "held");
        failed(site, Path::new("/x/z"), &enospc, "held");
        let shown: Vec<Failing> = failing().into_iter().filter(|f| f.site == site).collect();
        assert_eq!(shown.len(), 1);
        assert!(shown[0].disk_full);
        assert_eq!((shown[0].attempts, shown[0].path.as_path()), (2, Path::new("/x/z")));
        assert!(
            shown[0].reason().starts_with("disk full: test site write_faults (/x/z): No space left"),
            "{}",
            shown[0].reason()
        );
        assert!(failures().contains(&(site.to_owned(), 2)));
        recovered(site);
        assert!(!is_failing(site));
        assert!(failures().contains(&(site.to_owned(), 2)), "the count stays");
        assert!(is_disk_full(&std::io::Error::from_raw_os_error(libc::EDQUOT)));
        assert!(!is_disk_full(&std::io::Error::from_raw_os_error(libc::EIO)));
    }
}
