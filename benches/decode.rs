//! Decoding input lines (issue 13): the calling thread of a replay, and `braid run`'s feeder,
//! decode every line before anything else happens to it.
//!
//! The gateway's lines (benches/replay_rss/gen.py's shapes: a status and a command), decoded by
//! the stream's schema (benches/replay_rss/gateway.toml):
//! - `decode/line`: `decode_line`, the values a row is built from;
//! - `decode/arrival`: `arrival_of_line`, what replay's first pass reads of every line;
//! - `decode/ingest_ready`: `decode_line`, then the row's key, key hash and `_id` (`InputRows`):
//!   everything before the row is archived into its frame.
//!
//! Baseline in the same run, `decode/serde_value`: the line parsed into a `serde_json::Value`,
//! the plainest complete parse (nothing checked against the schema). Throughput is in lines.
//!
//! `cargo bench --bench decode`

#![allow(clippy::unwrap_used)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use braid::record::decode::{arrival_of_line, decode_line};
use braid::record::input::InputRows;

const LINES: usize = 4_096;

/// Gateway lines, a status and a command in turn, as gen.py writes them.
fn lines() -> Vec<(usize, String)> {
    (0..LINES)
        .map(|i| {
            let device = i % 1000;
            let ts = 1_700_000_000_000_i64 + i as i64 * 97;
            if i % 2 == 0 {
                let temp = 20.0 + (i % 700) as f64 / 10.0;
                let line = format!(
                    r#"{{"device":"dev-{device:05}","ts":{ts},"temp":{temp:.2},"state":"busy","seq":{}}}"#,
                    i / 2
                );
                (1, line)
            } else {
                let line = format!(
                    r#"{{"device":"dev-{device:05}","ts":{ts},"cmd":"update_fw","arg":"v={}","cmd_id":"c-{:016x}"}}"#,
                    i % 97,
                    (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                );
                (0, line)
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let config =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/replay_rss/gateway.toml")).unwrap();
    let plan = braid::config::parse("gateway.toml", &config).unwrap();
    let stream = |name: &str| plan.streams.iter().position(|s| s.name == name).unwrap();
    let (command, status) = (stream("command"), stream("status"));
    let lines: Vec<(usize, String)> =
        lines().into_iter().map(|(s, line)| (if s == 0 { command } else { status }, line)).collect();
    let timing: Vec<_> = plan.streams.iter().map(|s| s.schema.time_only()).collect();

    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(lines.len() as u64));
    group.bench_function("serde_value", |b| {
        b.iter(|| lines.iter().filter(|(_, line)| serde_json::from_str::<serde_json::Value>(line).is_ok()).count())
    });
    group.bench_function("line", |b| {
        b.iter(|| {
            lines
                .iter()
                .filter(|(s, line)| {
                    let def = &plan.streams[*s];
                    decode_line(&def.schema, line.as_bytes(), def.max_payload).outcome.is_ok()
                })
                .count()
        })
    });
    group.bench_function("arrival", |b| {
        b.iter(|| {
            lines
                .iter()
                .filter_map(|(s, line)| arrival_of_line(&timing[*s], line.as_bytes(), plan.streams[*s].max_payload))
                .count()
        })
    });
    let mut rows = InputRows::default();
    group.bench_function("ingest_ready", |b| {
        b.iter(|| {
            let mut ids = 0u64;
            for (s, line) in &lines {
                let def = &plan.streams[*s];
                let fields = decode_line(&def.schema, line.as_bytes(), def.max_payload).outcome.unwrap();
                let ts = fields.ts.unwrap();
                ids ^= rows.row(def, &fields.values, ts, line.as_bytes()).id;
            }
            ids
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
