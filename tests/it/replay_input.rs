#![allow(clippy::unwrap_used)]
//! Replay's input merge in constant memory (issue 13, item 1): a file out of arrival order is
//! sorted externally, in runs spilled to disk, and replays exactly as the same lines written in
//! arrival order.

use std::path::{Path, PathBuf};

use braid::replay::ReplayArgs;
use braid::replay::input::SORT_RUN_BYTES;

const CONFIG: &str = r#"
[streams.status]
key = "device"
time = { field = "ts", unit = "ms" }
max_out_of_orderness = "500ms"
idle_timeout = "5s"
fields = { device = "string", ts = "int", seq = "int" }

[streams.command]
key = "device"
time = { field = "ts", unit = "ms" }
max_out_of_orderness = "500ms"
idle_timeout = "5s"
fields = { device = "string", ts = "int", cmd_id = "string" }

[operators.effect]
kind = "interval_join"
left = "command"
right = "status"
lower = "-3s"
upper = "5s"
join = "full"
select = ["left.cmd_id", "left.device", "right.seq", "right.ts AS status_ts"]
"#;

const OUTPUTS: [&str; 5] = ["effect", "effect.late", "dead_letter", "status", "command"];

/// A deterministic pseudo-random sequence.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// (arrival, line): lines with an explicit arrival up to 3 s away from their event time, so that
/// some are late; a few dead letters that carry an arrival too.
/// Arrivals are unique, so that no tie depends on where a line sits in its file.
fn lines(stream: &str, n: usize, rng: &mut Lcg) -> Vec<(i64, String)> {
    let mut taken = std::collections::HashSet::new();
    (0..n)
        .map(|i| {
            let ts = 1_700_000_000_000 + i as i64 * 37;
            let mut arrival = ts + rng.below(3_000) as i64;
            while !taken.insert(arrival) {
                arrival += 1;
            }
            let device = format!("d{}", rng.below(12));
            let line = match (stream, rng.below(40)) {
                (_, 0) => format!(r#"{{"device":"{device}","ts":{ts},"arrival":{arrival},"seq":"x","cmd_id":7}}"#),
                ("status", _) => format!(r#"{{"device":"{device}","ts":{ts},"seq":{i},"arrival":{arrival}}}"#),
                _ => format!(r#"{{"device":"{device}","ts":{ts},"cmd_id":"c{i}","arrival":{arrival}}}"#),
            };
            (arrival, line)
        })
        .collect()
}

fn write(path: &Path, lines: &[(i64, String)]) {
    std::fs::write(path, lines.iter().map(|(_, l)| format!("{l}\n")).collect::<String>()).unwrap();
}

/// Replays the two files with sorted runs of `run_bytes`: every output's lines, sorted.
fn replay(dir: &Path, label: &str, status: &Path, command: &Path, run_bytes: usize) -> Vec<Vec<String>> {
    let plan = braid::config::parse("c.toml", CONFIG).unwrap();
    let inputs: Vec<(String, PathBuf)> = vec![("status".into(), status.into()), ("command".into(), command.into())];
    let outputs: Vec<(String, PathBuf)> =
        OUTPUTS.iter().map(|n| (n.to_string(), dir.join(format!("{label}-{n}.jsonl")))).collect();
    let args =
        ReplayArgs { shards: 2, every_tick: false, inputs: &inputs, outputs: &outputs, sort_run_bytes: run_bytes };
    braid::replay::run(&plan, &args).unwrap();
    outputs
        .iter()
        .map(|(_, path)| {
            let mut lines: Vec<String> = std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect();
            lines.sort();
            lines
        })
        .collect()
}

#[test]
fn a_file_out_of_arrival_order_sorted_in_spilled_runs_replays_as_the_file_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Lcg(13);
    let status = lines("status", 3_000, &mut rng);
    let command = lines("command", 1_000, &mut rng);
    let in_order = |mut lines: Vec<(i64, String)>| {
        lines.sort_by_key(|(arrival, _)| *arrival);
        lines
    };
    let shuffled = |mut lines: Vec<(i64, String)>, rng: &mut Lcg| {
        for i in (1..lines.len()).rev() {
            lines.swap(i, rng.below(i as u64 + 1) as usize);
        }
        lines
    };
    let path = |name: &str| dir.path().join(name);
    let sorted_status = in_order(status.clone());
    let sorted_command = in_order(command.clone());
    write(&path("status-sorted.jsonl"), &sorted_status);
    write(&path("command-sorted.jsonl"), &sorted_command);
    let mut shuffled_status = shuffled(sorted_status, &mut rng);
    shuffled_status.sort_by_key(|(arrival, _)| *arrival % 7); // runs of rising arrivals, interleaved
    write(&path("status-shuffled.jsonl"), &shuffled_status);
    write(&path("command-shuffled.jsonl"), &shuffled(sorted_command, &mut rng));

    let expected =
        replay(dir.path(), "sorted", &path("status-sorted.jsonl"), &path("command-sorted.jsonl"), SORT_RUN_BYTES);
    // 256 bytes of text: about four lines per run, ~1 000 runs for the two files.
    let small = std::fs::metadata(path("status-shuffled.jsonl")).unwrap().len() / 256;
    assert!(small > 100, "{small} runs");
    for run_bytes in [256, 64 << 10, SORT_RUN_BYTES] {
        let got = replay(
            dir.path(),
            &format!("runs-{run_bytes}"),
            &path("status-shuffled.jsonl"),
            &path("command-shuffled.jsonl"),
            run_bytes,
        );
        assert_eq!(got, expected, "runs of {run_bytes} bytes");
    }
    let [effect, late, dead, status_out, command_out] = &expected[..] else { unreachable!() };
    assert!(
        effect.len() > 1_000 && !late.is_empty() && !dead.is_empty(),
        "{} {} {}",
        effect.len(),
        late.len(),
        dead.len()
    );
    assert_eq!(status_out.len() + command_out.len() + dead.len(), 4_000);
    // Results carry their ids: equal lines mean equal ids.
    assert!(effect.iter().all(|l| l.contains("\"_id\"")));
}

/// A file's lines: (arrival, line).
type FileLines = Vec<(i64, String)>;

/// `status` and `command` lines (as [`lines`] makes them, from `seed`), each file in arrival order.
fn in_arrival_order(seed: u64, status: usize, command: usize) -> (FileLines, FileLines) {
    let mut rng = Lcg(seed);
    let mut status = lines("status", status, &mut rng);
    let mut command = lines("command", command, &mut rng);
    status.sort_by_key(|(arrival, _)| *arrival);
    command.sort_by_key(|(arrival, _)| *arrival);
    (status, command)
}

/// Moves a file's first line (its lowest arrival) to its end: out of order only there.
fn first_line_last(lines: &mut FileLines) {
    let first = lines.remove(0);
    lines.push(first);
}

/// A plain replay takes its inputs' order on trust (no first pass) and starts again, sorting,
/// when one is not in order: a file whose first line was moved to its end shows it only there,
/// after every output has been written to. The outputs are then as if the replay had sorted
/// it at once: nothing of the first run is left in them, nothing is missing.
#[test]
fn a_file_out_of_order_only_at_its_end_replays_as_the_file_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (mut status, command) = in_arrival_order(29, 2_000, 700);
    let path = |name: &str| dir.path().join(name);
    write(&path("status-sorted.jsonl"), &status);
    write(&path("command.jsonl"), &command);
    let expected = replay(dir.path(), "sorted", &path("status-sorted.jsonl"), &path("command.jsonl"), SORT_RUN_BYTES);
    first_line_last(&mut status);
    write(&path("status-first-last.jsonl"), &status);
    let got =
        replay(dir.path(), "first-last", &path("status-first-last.jsonl"), &path("command.jsonl"), SORT_RUN_BYTES);
    assert_eq!(got, expected);
    assert!(expected[0].len() > 500, "{} results", expected[0].len());
}

/// What went into a pipe cannot be taken back: a replay with an output that is not a regular file
/// reads its inputs' order first and never starts again, so the pipe gets every line once, the
/// same lines a regular file gets.
#[test]
fn a_replay_into_a_pipe_sorts_first_and_writes_each_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut status, command) = in_arrival_order(31, 1_500, 500);
    first_line_last(&mut status);
    let (status_path, command_path) = (dir.path().join("status.jsonl"), dir.path().join("command.jsonl"));
    write(&status_path, &status);
    write(&command_path, &command);
    let plan = braid::config::parse("c.toml", CONFIG).unwrap();
    let inputs: Vec<(String, PathBuf)> = vec![("status".into(), status_path), ("command".into(), command_path)];
    let run = |effect: &Path| {
        let outputs: Vec<(String, PathBuf)> = vec![("effect".into(), effect.into())];
        let args = ReplayArgs {
            shards: 1,
            every_tick: false,
            inputs: &inputs,
            outputs: &outputs,
            sort_run_bytes: SORT_RUN_BYTES,
        };
        braid::replay::run(&plan, &args).unwrap();
    };
    let file = dir.path().join("effect.jsonl");
    run(&file);
    let fifo = dir.path().join("effect.fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // Everything the pipe gets, however many times it is opened, until the test's own last line.
    // The reader holds the pipe open for reading and writing: its open waits for no writer, and
    // the pipe never reads as ended between the replay's writes and the last line. (Reopened
    // after each end, a line could go to a copy of the read end that another test's child
    // process held between its fork and exec, and be lost with it: the test then hung.)
    const END: &str = "end of the test\n";
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut pipe = std::fs::OpenOptions::new().read(true).write(true).open(&fifo).unwrap();
            let (mut all, mut chunk) = (Vec::new(), [0u8; 4096]);
            while !all.ends_with(END.as_bytes()) {
                let read = pipe.read(&mut chunk).unwrap();
                all.extend_from_slice(&chunk[..read]);
            }
            String::from_utf8(all).unwrap().strip_suffix(END).unwrap().to_owned()
        })
    };
    run(&fifo);
    std::fs::write(&fifo, END).unwrap();
    let sorted = |text: &str| {
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        lines.iter().map(|l| format!("{l}\n")).collect::<String>()
    };
    let from_pipe = reader.join().unwrap();
    let from_file = std::fs::read_to_string(&file).unwrap();
    assert!(from_file.lines().count() > 300, "{} results", from_file.lines().count());
    assert_eq!(sorted(&from_pipe), sorted(&from_file));
}

/// An output that cannot take its lines (a full disk) fails the replay with the write's error:
/// the lines are written by a writer thread (replay/file_writer.rs), and its error is not lost.
#[test]
fn an_output_on_a_full_disk_fails_the_replay_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Lcg(7);
    let (status, command) = (dir.path().join("status.jsonl"), dir.path().join("command.jsonl"));
    write(&status, &lines("status", 4000, &mut rng));
    write(&command, &lines("command", 400, &mut rng));
    let plan = braid::config::parse("c.toml", CONFIG).unwrap();
    let inputs: Vec<(String, PathBuf)> = vec![("status".into(), status), ("command".into(), command)];
    let outputs: Vec<(String, PathBuf)> =
        vec![("effect".into(), PathBuf::from("/dev/full")), ("dead_letter".into(), dir.path().join("dead.jsonl"))];
    let args =
        ReplayArgs { shards: 1, every_tick: false, inputs: &inputs, outputs: &outputs, sort_run_bytes: SORT_RUN_BYTES };
    match braid::replay::run(&plan, &args) {
        Err(braid::replay::ReplayError::Write(error)) => assert_eq!(error.raw_os_error(), Some(28), "{error}"),
        Err(other) => panic!("expected the full disk's error, got {other}"),
        Ok(_) => panic!("a replay onto a full disk succeeded"),
    }
}
