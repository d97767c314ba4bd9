//! The spool survives `kill -9` in the middle of appending: a child process appends (and
//! releases) in a loop and reports each call after it returned; the parent SIGKILLs it and
//! checks on reopen that every reported append is there, intact, and every reported release
//! stayed released.
#![allow(clippy::unwrap_used)] // test helpers: a panic is a failed test
#![allow(clippy::disallowed_methods)] // timing the test itself (deadlines), not engine time

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use braid::config::Overflow;
use braid::spool::{Spool, SpoolOptions};

const CHILD_DIR: &str = "BRAID_SPOOL_KILL_CHILD";

fn options() -> SpoolOptions {
    // Small segments: the child rolls over and recycles segments many times before it dies.
    SpoolOptions { max_bytes: 1 << 20, segment_bytes: 8 << 10, overflow: Overflow::Block, roll_after: None }
}

fn payload(seq: u64) -> Vec<u8> {
    let len = (seq * 53 % 500) as usize;
    (0..len).map(|j| (seq as usize * 7 + j) as u8).collect()
}

#[test]
fn spool_survives_kill_9_while_appending() {
    if let Some(dir) = std::env::var_os(CHILD_DIR) {
        return child(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["spool_kill_9::spool_survives_kill_9_while_appending", "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD_DIR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut appended, mut released) = (None::<u64>, None::<u64>);
    let note = |line: &str, appended: &mut Option<u64>, released: &mut Option<u64>| match line.split_once(' ') {
        Some(("a", n)) => *appended = (*appended).max(n.parse().ok()),
        Some(("r", n)) => *released = (*released).max(n.parse().ok()),
        _ => {}
    };
    while appended.is_none_or(|a| a < 20_000) {
        let line = lines.next().expect("the child stopped before it was killed").unwrap();
        note(&line, &mut appended, &mut released);
    }
    child.kill().unwrap(); // SIGKILL, in the middle of the loop
    child.wait().unwrap();
    // What the child reported before it died is still in the pipe. A last line cut short by the
    // kill is a prefix: a smaller number, so taking the maximum ignores it.
    for line in lines.map_while(Result::ok) {
        note(&line, &mut appended, &mut released);
    }
    let (appended, released) = (appended.unwrap(), released.unwrap());

    let spool = Spool::open(dir.path(), options()).unwrap();
    assert!(spool.first() > released, "release through {released} persisted (first {})", spool.first());
    assert!(spool.end() > appended, "append {appended} persisted (end {})", spool.end());
    for seq in spool.first()..spool.end() {
        assert_eq!(spool.get(seq), Some(payload(seq).as_slice()), "record {seq}");
    }
}

/// Appends forever, releasing all but the last 100 records every 10th append.
fn child(dir: &Path) {
    let mut spool = Spool::open(dir, options()).unwrap();
    let mut out = std::io::stdout().lock();
    loop {
        let seq = spool.end();
        assert_eq!(spool.append(&payload(seq)).unwrap(), seq);
        writeln!(out, "a {seq}").unwrap();
        if seq.is_multiple_of(10) && seq >= 100 {
            spool.release_through(seq - 100);
            writeln!(out, "r {}", seq - 100).unwrap();
        }
        out.flush().unwrap();
    }
}
