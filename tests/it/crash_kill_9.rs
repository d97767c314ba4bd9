//! Crash test: mmap state survives `kill -9`.
//!
//! A child process (this test binary, re-run with an environment variable) fills an arena store:
//! inserts across several segments, marks rows matched, removes some. It says it is ready and
//! waits; the parent kills it with SIGKILL — no destructor, no flush, no msync — reopens the store
//! and requires exactly the rows, matched flags and removals of the same script replayed on the
//! in-memory store. Its own test binary, so no other test's locked files are inherited by the
//! child.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use braid::record::{Key, Row, Value};
use braid::state::arena::{ArenaConfig, ArenaStore};
use braid::state::{KeyedStore, MemoryStore};

const KEYS: usize = 5;
const CHILD_DIR: &str = "BRAID_KILL_9_DIR";

/// Keys 0..3 share one hash on purpose: a store must compare key values.
fn key(k: usize) -> (Key, u64) {
    match k {
        0 => (Key::Str("a".into()), 7),
        1 => (Key::Str("b".into()), 7),
        2 => (Key::Int(7), 7),
        3 => (Key::Str("dev-000003".into()), 9),
        _ => (Key::Broadcast, 0),
    }
}

fn row(k: usize, id: u64) -> Row {
    let (key, key_hash) = key(k);
    let values = vec![Value::Str("x".repeat(250).into()), Value::Int(id as i64), Value::Float(0.5)];
    Row { ts: 1_700_000_000_000 + id as i64, key, key_hash, id, values: values.into() }
}

fn small_segments() -> ArenaConfig {
    ArenaConfig { segment_bytes: 4096, spare_segments: 1, recoverable: true }
}

/// Inserts 60 rows (every 7th matched), marks every 3rd id matched by a scan, removes every 4th.
fn scripted(store: &mut dyn KeyedStore) {
    let mut handles = Vec::new();
    for id in 0..60u64 {
        let r = row(id as usize % KEYS, id);
        handles.push((r.key_hash, store.insert(r, id % 7 == 0)));
    }
    for k in 0..KEYS {
        let (key, hash) = key(k);
        store.scan(&key, hash, &mut |r| r.id() % 3 == 0);
    }
    for (i, (hash, handle)) in handles.into_iter().enumerate() {
        if i % 4 == 1 {
            store.remove(hash, handle).unwrap();
        }
    }
}

/// Every row per key, in order, with its matched flag (removing them all).
fn drain(store: &mut dyn KeyedStore) -> Vec<(Row, bool)> {
    let mut out = Vec::new();
    for k in 0..KEYS {
        let (key, hash) = key(k);
        let mut handles = Vec::new();
        store.scan_handles(&key, hash, &mut |h, _| {
            handles.push(h);
            false
        });
        for h in handles {
            let removed = store.remove(hash, h).unwrap();
            out.push((removed.row, removed.matched));
        }
    }
    out
}

#[test]
fn mmap_state_survives_kill_9() {
    if let Some(dir) = std::env::var_os(CHILD_DIR) {
        return child(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["crash_kill_9::mmap_state_survives_kill_9", "--exact", "--test-threads=1"])
        .env(CHILD_DIR, dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ready = dir.path().join("ready");
    for _ in 0..6000 {
        if ready.exists() {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the child exited before it was killed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(ready.exists(), "the child never got ready");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let mut arena = ArenaStore::open_with(&dir.path().join("arena"), small_segments()).unwrap();
    arena.set_compaction(false); // the files must give every row back as it was (arena module doc)
    assert_eq!(arena.recovery().damaged_records, 0);
    let mut model = MemoryStore::default();
    scripted(&mut model);
    assert_eq!(arena.rows(), model.rows());
    assert_eq!(drain(&mut arena), drain(&mut model), "rows, order and matched flags after kill -9");
}

/// The child: builds the state, says so, and waits to be killed.
fn child(dir: &Path) {
    let mut arena = ArenaStore::open_with(&dir.join("arena"), small_segments()).unwrap();
    arena.set_compaction(false); // the files must give every row back as it was (arena module doc)
    scripted(&mut arena);
    std::fs::write(dir.join("ready"), b"").unwrap();
    std::thread::sleep(Duration::from_secs(120));
}
