//! Skipping ticks that cannot change anything must not change any output: every generated
//! workload is replayed twice — skipping, and stepping through every 200 ms tick — and the two
//! runs must write the same rows (as multisets) to every output, late outputs included. The
//! workloads are built to stress the skipping: long silent stretches (idle streams, idle
//! advancing), chains of joins (where a careless jump would change downstream lateness), late
//! rows.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use braid::replay::{self, ReplayArgs};

/// splitmix64: a tiny deterministic generator, enough for workloads.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

fn config(rng: &mut Rng) -> String {
    let idle_advance = rng.pick(&["true", "false"]);
    let idle_timeout = rng.pick(&["1s", "2s", "0ms"]);
    let mut text = format!("[runtime]\nidle_advance = {idle_advance}\n");
    for stream in ["a", "b", "c"] {
        text += &format!(
            "[streams.{stream}]\nkey = \"k\"\ntime = {{ field = \"ts\", unit = \"ms\" }}\n\
             max_out_of_orderness = \"300ms\"\nidle_timeout = \"{idle_timeout}\"\n\
             fields = {{ k = \"string\", ts = \"int\", v = \"int\" }}\n"
        );
    }
    let lower = rng.pick(&[-2000, -500, 0, 300]);
    let upper = lower + rng.pick(&[0, 400, 1500]);
    let join = rng.pick(&["inner", "left", "right", "full"]);
    let join2 = rng.pick(&["inner", "left", "right", "full"]);
    text += &format!(
        "[operators.u]\nkind = \"interval_join\"\nleft = \"a\"\nright = \"b\"\nlower = \"{lower}ms\"\n\
         upper = \"{upper}ms\"\njoin = \"{join}\"\nselect = [\"left.v\", \"right.v AS w\"]\n\
         [operators.x]\nkind = \"interval_join\"\nleft = \"u\"\nright = \"c\"\nlower = \"-1s\"\n\
         upper = \"1s\"\njoin = \"{join2}\"\nselect = [\"left.v\", \"right.v AS cv\"]\n"
    );
    text
}

fn input(rng: &mut Rng) -> String {
    let mut t: i64 = 1_767_225_600_000 + rng.below(1000) as i64;
    let mut rows = Vec::new();
    let row = |rng: &mut Rng, ts: i64, arrival: i64, v: usize| {
        (arrival, format!("{{\"k\":\"k{}\",\"ts\":{ts},\"v\":{v},\"arrival\":{arrival}}}", rng.below(3)))
    };
    for i in 0..rng.below(40) as usize + 5 {
        t += rng.pick(&[0, 100, 200, 500]);
        if rng.below(6) == 0 {
            // The device goes silent; often it then uploads what it buffered meanwhile, rows
            // whose lateness depends on exactly how far idle advancing moved the watermark.
            let gap = rng.pick(&[1_000, 1_900, 3_000, 20_000, 600_000]);
            if rng.below(2) == 0 {
                for j in 0..rng.below(4) {
                    let ts = t + rng.below(gap as u64) as i64;
                    rows.push(row(rng, ts, t + gap, 1000 * i + j as usize));
                }
            }
            t += gap;
        }
        let delay = if rng.below(12) == 0 { 1_500 + rng.below(3_000) as i64 } else { rng.below(301) as i64 };
        rows.push(row(rng, t, t + delay, i));
    }
    rows.sort();
    rows.into_iter().map(|(_, line)| line + "\n").collect()
}

const OUTPUTS: [&str; 4] = ["u", "u.late", "x", "x.late"];

fn run(dir: &Path, text: &str, every_tick: bool) -> Vec<Vec<String>> {
    let plan = braid::config::parse("gen.toml", text).unwrap();
    let inputs: Vec<(String, PathBuf)> =
        ["a", "b", "c"].iter().map(|s| (s.to_string(), dir.join(format!("{s}.jsonl")))).collect();
    let tag = if every_tick { "step" } else { "skip" };
    let outputs: Vec<(String, PathBuf)> =
        OUTPUTS.iter().map(|o| (o.to_string(), dir.join(format!("{tag}-{o}.jsonl")))).collect();
    replay::run(&plan, &ReplayArgs { shards: 2, every_tick, inputs: &inputs, outputs: &outputs }).unwrap();
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
fn skipping_ticks_changes_no_output() {
    let mut results_seen = 0;
    for seed in 0..40 {
        let mut rng = Rng(seed);
        let dir = tempfile::tempdir().unwrap();
        let text = config(&mut rng);
        for stream in ["a", "b", "c"] {
            std::fs::write(dir.path().join(format!("{stream}.jsonl")), input(&mut rng)).unwrap();
        }
        let skipping = run(dir.path(), &text, false);
        let stepping = run(dir.path(), &text, true);
        for (i, name) in OUTPUTS.iter().enumerate() {
            assert_eq!(skipping[i], stepping[i], "seed {seed}: output {name} differs\nconfig:\n{text}");
        }
        results_seen += skipping[2].len();
    }
    assert!(results_seen > 100, "the workloads should produce chained results ({results_seen})");
}
