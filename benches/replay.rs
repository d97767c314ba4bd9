//! JSON replay end to end through the library: `config::parse` once, then `replay::run` (read
//! both files, decode, merge by arrival, engine with 200 ms ticks, interval join, JSON out).
//!
//! Workload (BENCHMARKS.md "replay"): the gateway config of CONTRACT.md (`command` ⋈ `status`
//! on `device`, [−3 s, +5 s], inner), 1 000 devices, a status every 4 s (±0.5 s) and a command
//! every 5 s on average per device, one device in ten without status; ≈ 200 k input lines in two
//! JSON-lines files, written once to a temporary directory. Lines carry no `arrival`, so each
//! line arrives at its event time; nothing is late and nothing is dead-lettered. One shard.
//! Outputs `effect`, `effect.late` and `dead_letter` go to files in the temporary directory.
//! The generator and the config are `benches/common/gateway.rs`'s.
//!
//! Baselines in the same run, over the same lines held in memory:
//! - `baseline_serde_json_value`: `serde_json::from_slice::<serde_json::Value>` of every line.
//! - `decode_only`: braid's own line decoder (`record::decode::decode_line`) against each
//!   stream's schema: JSON parse plus the typed field checks, no engine, no output.

#![allow(clippy::unwrap_used)]

mod common;

use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use braid::config;
use braid::plan::Plan;
use braid::record::decode::decode_line;
use braid::replay::{self, ReplayArgs};
use common::EPOCH_MS;
use common::gateway::{self, Event};
use common::rng::Rng;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const DEVICES: usize = 1_000;
/// ≈ 0.425 lines/s per device × 1 000 devices × 470 s ≈ 200 k lines.
const SECONDS: i64 = 470;
const SEED: u64 = 0x5eed_b4a1_d000_0002;

/// (command.jsonl, status.jsonl), each in event-time order.
fn generate() -> (String, String) {
    let mut rng = Rng(SEED);
    let mut commands: Vec<(i64, String)> = Vec::new();
    let mut statuses: Vec<(i64, String)> = Vec::new();
    gateway::gateway(&mut rng, DEVICES, EPOCH_MS + SECONDS * 1000, |device, event| match event {
        Event::Status(s) => statuses.push((s.ts, s.json(device))),
        Event::Command(c) => commands.push((c.ts, c.json(device))),
    });
    let join = |mut lines: Vec<(i64, String)>| {
        lines.sort_by_key(|(ts, _)| *ts);
        lines.into_iter().fold(String::new(), |mut text, (_, line)| {
            let _ = writeln!(text, "{line}");
            text
        })
    };
    (join(commands), join(statuses))
}

struct Setup {
    _dir: tempfile::TempDir,
    plan: Plan,
    inputs: Vec<(String, PathBuf)>,
    outputs: Vec<(String, PathBuf)>,
    /// (stream index, text) per input file.
    texts: Vec<(usize, String)>,
    lines: usize,
}

fn setup(dir: tempfile::TempDir) -> Setup {
    let plan = config::parse("gateway.toml", &gateway::config()).expect("the bench config is valid");
    let (command, status) = generate();
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("command.jsonl"), &command).expect("write command.jsonl");
    std::fs::write(path("status.jsonl"), &status).expect("write status.jsonl");
    let inputs = vec![("command".into(), path("command.jsonl")), ("status".into(), path("status.jsonl"))];
    let outputs = ["effect", "effect.late", "dead_letter"]
        .iter()
        .map(|name| (name.to_string(), path(&format!("{name}.jsonl"))))
        .collect();
    let lines = command.lines().count() + status.lines().count();
    let texts = vec![(plan.stream("command").unwrap(), command), (plan.stream("status").unwrap(), status)];
    Setup { _dir: dir, plan, inputs, outputs, texts, lines }
}

fn line_count(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

fn run(s: &Setup) -> usize {
    let args = ReplayArgs {
        shards: 1,
        every_tick: false,
        inputs: &s.inputs,
        outputs: &s.outputs,
        sort_run_bytes: replay::input::SORT_RUN_BYTES,
    };
    replay::run(&s.plan, &args).expect("replay runs").lines
}

fn bench_replay(c: &mut Criterion) {
    let s = setup(tempfile::tempdir().expect("a temporary directory"));
    assert_eq!(run(&s), s.lines);
    let counts: Vec<usize> = s.outputs.iter().map(|(_, p)| line_count(p)).collect();
    eprintln!(
        "replay workload: {} input lines ({} + {} bytes); effect {} rows, effect.late {}, dead_letter {}",
        s.lines,
        s.texts[0].1.len(),
        s.texts[1].1.len(),
        counts[0],
        counts[1],
        counts[2]
    );
    assert_eq!((counts[1], counts[2]), (0, 0), "nothing late, nothing dead-lettered");

    let mut group = c.benchmark_group("replay/gateway_1k_devices");
    group.throughput(Throughput::Elements(s.lines as u64));
    group.sample_size(10);
    group.bench_function("replay_run", |b| b.iter(|| black_box(run(&s))));
    group.bench_function("decode_only", |b| {
        b.iter(|| {
            let mut ok = 0usize;
            for (stream, text) in &s.texts {
                let def = &s.plan.streams[*stream];
                for line in text.as_bytes().split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                    ok += usize::from(decode_line(&def.schema, line, def.max_payload).outcome.is_ok());
                }
            }
            black_box(ok)
        })
    });
    group.bench_function("baseline_serde_json_value", |b| {
        b.iter(|| {
            let mut ok = 0usize;
            for (_, text) in &s.texts {
                for line in text.as_bytes().split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                    ok += usize::from(serde_json::from_slice::<serde_json::Value>(line).is_ok());
                }
            }
            black_box(ok)
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    targets = bench_replay
}
criterion_main!(benches);
