//! Where `braid run` keeps its scratch: the shards' rings and the operators' arenas.
//!
//! Neither is needed by a restart: the last checkpoint holds the operators' state and the
//! journal what came after it, and both are rebuilt at every start (a generation starts with
//! empty rings and arenas). Written to `STATE_DIR`, they would cost the gateway's flash a
//! stream of writeback for bytes that are thrown away — the rings alone cycle through every
//! message and result. So they go to memory-backed file systems, in this order:
//!
//! 1. `runtime.scratch_dir` (the operator's choice: used as given, an error when unusable);
//! 2. `$RUNTIME_DIRECTORY` (systemd's `RuntimeDirectory=`, a tmpfs under `/run` that systemd
//!    creates for the unit and removes when it stops; the first path when it lists several);
//! 3. `/dev/shm`;
//! 4. `STATE_DIR/run`, with a warning, when neither of the two above is usable.
//!
//! "Usable": the directory can be created there and the file system has room for the rings the
//! runtime preallocates plus [`HEADROOM`] for the arenas (statvfs; a container's `/dev/shm` is
//! often only 64 MiB).
//!
//! Each service gets a subdirectory of its own, `braid-run-HASH`, HASH being the xxh3 of its
//! state directory's path: two services on one machine never share one (their state directories
//! differ, and one state directory has one service: its lock), and a service that was killed
//! finds its leftovers at the next start under the same name. The subdirectory is emptied at
//! every start and removed at the stop ([`Scratch`]'s `Drop`). A service killed for good (its
//! state directory moved, a test's temporary one) leaves its directory behind: the next service
//! to start on the same file system removes every `braid-run-*` directory whose rings no process
//! holds ([`remove_abandoned`]).
//!
//! The price: pages of a memory-backed file system are RAM that the kernel cannot write back and
//! drop under pressure (without swap), where a file on disk could be. Rings are hot anyway (every
//! page is touched as they cycle); the arenas hold the operators' live state, bounded by the
//! operators' time rules. A gateway short of RAM with state larger than it can hold sets
//! `scratch_dir` to a directory on disk.

use std::path::{Path, PathBuf};

use crate::storage::mapped_file::free_bytes;

use super::ServiceError;

/// Room kept beyond the rings for the operators' arenas (their first segments are 1 MiB each).
pub const HEADROOM: u64 = 16 << 20;

/// Which rule chose the scratch directory (logged at start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chosen {
    Configured,
    RuntimeDirectory,
    DevShm,
    StateDir,
}

/// The service's scratch directory: emptied by [`Scratch::fresh`], removed on drop.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    pub chosen: Chosen,
}

impl Scratch {
    /// Chooses the scratch directory for the service on `state_dir` (see the module doc);
    /// `needed`: the bytes its rings preallocate.
    pub fn open(configured: Option<&Path>, state_dir: &Path, needed: u64) -> Result<Scratch, ServiceError> {
        let runtime_directory = std::env::var_os("RUNTIME_DIRECTORY");
        let runtime_directory = runtime_directory
            .as_ref()
            .and_then(|dirs| std::env::split_paths(dirs).next())
            .filter(|d| !d.as_os_str().is_empty());
        Scratch::choose(configured, runtime_directory.as_deref(), Path::new("/dev/shm"), state_dir, needed)
    }

    fn choose(
        configured: Option<&Path>,
        runtime_directory: Option<&Path>,
        shm: &Path,
        state_dir: &Path,
        needed: u64,
    ) -> Result<Scratch, ServiceError> {
        let name = instance_name(state_dir);
        if let Some(base) = configured {
            let path = base.join(&name);
            usable(&path, needed).map_err(|error| ServiceError::StateDir { path: path.clone(), error })?;
            remove_abandoned(base, &name);
            return Ok(Scratch { path, chosen: Chosen::Configured });
        }
        let mut refused = Vec::new();
        for (base, chosen) in [(runtime_directory, Chosen::RuntimeDirectory), (Some(shm), Chosen::DevShm)] {
            let Some(base) = base else { continue };
            let path = base.join(&name);
            match usable(&path, needed) {
                Ok(()) => {
                    remove_abandoned(base, &name);
                    return Ok(Scratch { path, chosen });
                }
                Err(error) => refused.push(format!("{}: {error}", path.display())),
            }
        }
        let path = state_dir.join("run");
        std::fs::create_dir_all(&path).map_err(|error| ServiceError::StateDir { path: path.clone(), error })?;
        tracing::warn!(
            path = %path.display(),
            refused = %refused.join("; "),
            "No memory-backed directory for the rings and arenas: they go to the state directory, whose disk takes their writes (set runtime.scratch_dir)"
        );
        Ok(Scratch { path, chosen: Chosen::StateDir })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Empties the directory: a generation starts with new rings and arenas.
    pub fn fresh(&self) -> Result<(), ServiceError> {
        let error = |error| ServiceError::StateDir { path: self.path.clone(), error };
        match std::fs::remove_dir_all(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(error(e)),
            _ => {}
        }
        std::fs::create_dir_all(&self.path).map_err(error)
    }
}

impl Drop for Scratch {
    /// The service stopped: its rings and arenas go (in `/dev/shm` they would hold memory until
    /// the next reboot). Best effort: a failure leaves them for the next start to empty.
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The prefix of a service's scratch directory ([`instance_name`]).
const INSTANCE_PREFIX: &str = "braid-run-";

/// How long a service's directory must have been left before another service removes it: a
/// service killed and started again (systemd's `Restart=`) empties its own at once.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the scratch directories in `base` of services that no longer run, all but `ours`
/// (which [`Scratch::fresh`] empties). A running service holds a lock on each of its mapped
/// files (storage/mapped_file.rs, point 1) from the moment its first ring appears until it
/// stops; a directory whose first feed ring can be locked, and has not changed for
/// [`ABANDONED_AFTER`], has no service, whatever PID namespace it ran in. A directory without
/// that ring (a service between `fresh` and its rings, or from elsewhere) is left alone. Best
/// effort: errors leave the directory.
fn remove_abandoned(base: &Path, ours: &str) {
    remove_abandoned_after(base, ours, ABANDONED_AFTER);
}

fn remove_abandoned_after(base: &Path, ours: &str, after: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(INSTANCE_PREFIX) || name == ours {
            continue;
        }
        let ring = entry.path().join("shard-0.in.ring");
        let Ok(ring) = std::fs::OpenOptions::new().read(true).write(true).open(ring) else { continue };
        let left =
            ring.metadata().and_then(|m| m.modified()).is_ok_and(|at| at.elapsed().is_ok_and(|age| age >= after));
        // Locked by us: no process maps this ring. The lock lasts until the directory is gone.
        if left && ring.try_lock().is_ok() {
            tracing::info!(path = %entry.path().display(), "Removing the scratch directory of a service that no longer runs");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// `braid-run-HASH`: HASH is the xxh3 of the state directory's absolute path (as given when it
/// cannot be resolved).
fn instance_name(state_dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let path = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_owned());
    format!("{INSTANCE_PREFIX}{:016x}", xxhash_rust::xxh3::xxh3_64(path.as_os_str().as_bytes()))
}

/// Creates `path` and checks its file system has room for `needed` bytes plus [`HEADROOM`].
fn usable(path: &Path, needed: u64) -> std::io::Result<()> {
    std::fs::create_dir_all(path)?;
    let free = free_bytes(path)?;
    let want = needed.saturating_add(HEADROOM);
    if free < want {
        let _ = std::fs::remove_dir(path);
        return Err(std::io::Error::other(format!("{free} bytes free, {want} wanted (rings and headroom)")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choose(configured: Option<&Path>, runtime: Option<&Path>, shm: &Path, state: &Path) -> Scratch {
        Scratch::choose(configured, runtime, shm, state, 1 << 20).unwrap()
    }

    #[test]
    fn order_configured_then_runtime_directory_then_shm_then_state_dir() {
        let root = tempfile::tempdir().unwrap();
        let (conf, run, shm, state) =
            (root.path().join("conf"), root.path().join("run"), root.path().join("shm"), root.path().join("state"));
        std::fs::create_dir_all(&state).unwrap();
        let name = instance_name(&state);

        let s = choose(Some(&conf), Some(&run), &shm, &state);
        assert_eq!((s.chosen, s.path()), (Chosen::Configured, conf.join(&name).as_path()));
        drop(s);
        let s = choose(None, Some(&run), &shm, &state);
        assert_eq!((s.chosen, s.path()), (Chosen::RuntimeDirectory, run.join(&name).as_path()));
        drop(s);
        let s = choose(None, None, &shm, &state);
        assert_eq!((s.chosen, s.path()), (Chosen::DevShm, shm.join(&name).as_path()));
        drop(s);
        // Neither can be created (a file stands where the directory should be): the state dir.
        std::fs::write(root.path().join("file"), b"").unwrap();
        let blocked = root.path().join("file");
        let s = choose(None, Some(&blocked), &blocked, &state);
        assert_eq!((s.chosen, s.path()), (Chosen::StateDir, state.join("run").as_path()));
    }

    #[test]
    fn scratch_directories_of_services_gone_are_removed_those_of_running_ones_kept() {
        let root = tempfile::tempdir().unwrap();
        let dir = |name: &str, ring: bool| {
            let path = root.path().join(name);
            std::fs::create_dir_all(path.join("shard-0")).unwrap();
            if ring {
                std::fs::write(path.join("shard-0.in.ring"), b"ring").unwrap();
            }
            path
        };
        let (gone, running, starting, other) = (
            dir("braid-run-00000000000000aa", true),
            dir("braid-run-00000000000000bb", true),
            dir("braid-run-00000000000000cc", false),
            dir("braid-bench-1-x", true),
        );
        // The running service's lock: another open file description of its ring.
        let held = std::fs::OpenOptions::new().read(true).write(true).open(running.join("shard-0.in.ring")).unwrap();
        held.try_lock().unwrap();
        let state = root.path().join("state");
        let ours = dir(&instance_name(&state), true);
        let s = choose(None, None, root.path(), &state);
        assert_eq!(s.path(), ours);
        assert!(gone.exists(), "a directory left a moment ago was removed: its service may be restarting");
        remove_abandoned_after(root.path(), &instance_name(&state), std::time::Duration::ZERO);
        assert!(!gone.exists(), "the directory of a service gone was left");
        for kept in [&running, &starting, &other, &ours] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
    }

    #[test]
    fn a_file_system_without_room_for_the_rings_is_passed_over() {
        let root = tempfile::tempdir().unwrap();
        let state = root.path().join("state");
        let too_much = free_bytes(root.path()).unwrap();
        let s = Scratch::choose(None, Some(root.path()), root.path(), &state, too_much).unwrap();
        assert_eq!(s.chosen, Chosen::StateDir);
        assert!(!root.path().join(instance_name(&state)).exists(), "the refused directory is left behind");
        let configured = Scratch::choose(Some(root.path()), None, root.path(), &state, too_much);
        assert!(configured.is_err(), "a configured scratch_dir without room is an error, not a fallback");
    }

    #[test]
    fn one_directory_per_state_dir_emptied_by_fresh_removed_on_drop() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        assert_ne!(instance_name(&a), instance_name(&b), "two services would share their rings");
        assert_eq!(instance_name(&a), instance_name(&a), "a restart would not find its leftovers");

        let s = choose(None, Some(root.path()), root.path(), &a);
        std::fs::write(s.path().join("shard-0.in.ring"), b"x").unwrap();
        s.fresh().unwrap();
        assert_eq!(std::fs::read_dir(s.path()).unwrap().count(), 0, "fresh left a ring behind");
        let path = s.path().to_owned();
        drop(s);
        assert!(!path.exists(), "the scratch directory outlived the service");
    }
}
