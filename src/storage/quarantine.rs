//! Quarantine: where a damaged state file goes, so that braid starts from what is intact instead
//! of refusing to start (a crash loop under `Restart=on-failure`) or skipping damage silently.
//!
//! Recovery finds damage by crc (a segment log's walk, storage/log.rs "Recovery"; a spool's head
//! slots; a checkpoint file's frame) or by an unreadable block (EIO at `pread`, mapped_file.rs
//! point 7). The owner then:
//!
//! 1. logs one warning naming the file, the byte ranges and what was lost (records, or sequence
//!    numbers for a spool) — [`Lost`];
//! 2. puts the file into `STATE_DIR/quarantine/`, named `<UTC time>.<path under STATE_DIR with
//!    `/` as `.`>`, e.g. `20261202T051812Z.journal.0000000003.spool`:
//!    - **moved** when braid cannot use it at all (a damaged file header, segment header, head
//!      file or checkpoint file; an unreadable block);
//!    - **copied as found** when the intact records in it stay in use (damage in the middle of a
//!      segment: the records after it are kept; the copy is taken before recovery writes the end
//!      mark);
//! 3. counts the file and the records in [`quarantined_files`] and [`lost_records`] (metrics
//!    `braid_state_quarantined_files_total`, `braid_state_lost_records_total`; `/healthz` says
//!    `degraded` with the count once anything was quarantined since the start).
//!
//! `STATE_DIR` is the nearest directory above the file holding `braid.lock` (the service's lock,
//! service/mod.rs); a file outside any (a replay's or a test's) gets a `quarantine/` beside it.
//! Nothing in braid reads or deletes the quarantine: an operator inspects it, keeps it for a bug
//! report, and deletes it (README, "Damaged state files").

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Files quarantined by this process.
static FILES: AtomicU64 = AtomicU64::new(0);
/// Records lost to damage found by this process (a lower bound where a count is unknown).
static RECORDS: AtomicU64 = AtomicU64::new(0);

/// Files quarantined since the process started.
pub fn quarantined_files() -> u64 {
    FILES.load(Ordering::Relaxed)
}

/// Records lost to damage since the process started.
pub fn lost_records() -> u64 {
    RECORDS.load(Ordering::Relaxed)
}

/// Counts records lost to damage found without a file to quarantine (a gap between spool
/// segments, journal entries a fallen-back checkpoint needed).
pub fn note_lost(records: u64) {
    RECORDS.fetch_add(records, Ordering::Relaxed);
}

/// What a damaged file cost, for the log line and the counters.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Lost {
    /// Records lost (a lower bound when damage hides how many there were).
    pub records: u64,
    /// Human-readable detail: byte ranges, sequence numbers.
    pub detail: String,
}

/// Whether the file is taken out of use, or stays in use with its damage skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Move,
    Copy,
}

/// Logs `lost` for `path` (`what`: the kind of file, "journal segment"), puts the file into the
/// quarantine (`action`) and counts it; where it went, or `None` when that failed (logged: the
/// damage is still reported and counted, and a moved file that cannot be moved is deleted so the
/// next start does not find it again).
pub fn quarantine(path: &Path, what: &str, reason: &str, lost: &Lost, action: Action) -> Option<PathBuf> {
    FILES.fetch_add(1, Ordering::Relaxed);
    RECORDS.fetch_add(lost.records, Ordering::Relaxed);
    let (dir, name) = place_for(path);
    let placed = std::fs::create_dir_all(&dir).and_then(|()| {
        let target = free_name(&dir, &name);
        match action {
            Action::Move => std::fs::rename(path, &target),
            Action::Copy => std::fs::copy(path, &target).map(drop),
        }
        .map(|()| target)
    });
    let verb = if action == Action::Move { "moved" } else { "copied" };
    let (outcome, place) = match &placed {
        Ok(target) => (verb.to_owned(), target.display().to_string()),
        Err(error) => (format!("could not be {verb}"), error.to_string()),
    };
    tracing::warn!(
        path = %path.display(),
        what,
        reason,
        records_lost = lost.records,
        lost = %lost.detail,
        quarantine = %place,
        "Damaged state file {outcome} to quarantine; starting from what is intact"
    );
    if placed.is_err() && action == Action::Move && path.exists() {
        // Not to be found again at every start.
        let _ = std::fs::remove_file(path);
    }
    placed.ok()
}

/// The quarantine directory for `path` and the file's name there (module doc).
fn place_for(path: &Path) -> (PathBuf, String) {
    let state_dir = path.ancestors().skip(1).find(|dir| dir.join("braid.lock").is_file());
    let (dir, relative) = match state_dir {
        Some(state_dir) => (state_dir.join("quarantine"), path.strip_prefix(state_dir).unwrap_or(path)),
        None => {
            let parent = path.parent().unwrap_or(Path::new("."));
            (parent.join("quarantine"), path.strip_prefix(parent).unwrap_or(path))
        }
    };
    let flat: Vec<String> = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    (dir, format!("{}.{}", timestamp(), flat.join(".")))
}

/// `name`, or `name.N` for the first N free in `dir`.
fn free_name(dir: &Path, name: &str) -> PathBuf {
    let first = dir.join(name);
    if !first.exists() {
        return first;
    }
    (1u32..).map(|n| dir.join(format!("{name}.{n}"))).find(|p| !p.exists()).unwrap_or(first)
}

/// Now as `YYYYMMDDTHHMMSSZ` (UTC).
fn timestamp() -> String {
    let ms = crate::service::wall_clock() as i64;
    let text = crate::time::rfc3339::format_ms(ms);
    // "2026-12-02T05:18:12.345Z" → "20261202T051812Z"
    let compact: String = text[..19].chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    format!("{compact}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_goes_under_the_state_dir_with_time_and_path_in_its_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("braid.lock"), b"").unwrap();
        std::fs::create_dir_all(dir.path().join("sinks/up")).unwrap();
        let file = dir.path().join("sinks/up/0000000001.spool");
        std::fs::write(&file, b"damaged").unwrap();
        let lost = Lost { records: 3, detail: "seqs 4..7".into() };
        let copied = quarantine(&file, "sink buffer segment", "crc", &lost, Action::Copy).unwrap();
        assert!(file.exists(), "a copy leaves the file in use");
        let moved = quarantine(&file, "sink buffer segment", "crc", &lost, Action::Move).unwrap();
        assert!(!file.exists());
        for placed in [&copied, &moved] {
            assert_eq!(placed.parent().unwrap(), dir.path().join("quarantine"));
            let name = placed.file_name().unwrap().to_str().unwrap();
            assert!(name.contains(".sinks.up.0000000001.spool"), "{name}");
            assert_eq!(name.find('T'), Some(8), "{name}");
            assert_eq!(std::fs::read(placed).unwrap(), b"damaged");
        }
        assert_ne!(copied, moved, "a second file of the same name gets a suffix");
    }

    #[test]
    fn without_a_state_dir_the_quarantine_is_beside_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("head");
        std::fs::write(&file, b"x").unwrap();
        let placed = quarantine(&file, "spool head", "crc", &Lost::default(), Action::Move).unwrap();
        assert_eq!(placed.parent().unwrap(), dir.path().join("quarantine"));
    }
}
