//! Skipping ticks that cannot change anything must not change any output: every generated
//! workload is replayed twice — skipping, and stepping through every 200 ms tick — and the two
//! runs must write the same rows (as multisets) to every output, late outputs included. The
//! workloads are built to stress the skipping: long silent stretches (idle streams, idle
//! advancing), chains of joins (where a careless jump would change downstream lateness), late
//! rows. Both must also write what the oracle (`common::oracle`, every tick, no time-rule code
//! shared with the runtime) writes: a rule both modes get wrong alike shows there.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::BASE_TS;
use common::config_text::kv_stream;
use common::rng::Rng;
use common::run::{output_files, skip_and_step, write_inputs};

fn config(rng: &mut Rng) -> String {
    let idle_advance = rng.pick(&["true", "false"]);
    let idle_timeout = rng.pick(&["1s", "2s", "0ms"]);
    let mut text = format!("[runtime]\nidle_advance = {idle_advance}\n");
    for stream in ["a", "b", "c"] {
        text += &kv_stream(stream, "300ms", idle_timeout);
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
    // Half the inputs arrive on the 200 ms tick grid, so that `T − last arrival = idle_timeout`
    // holds exactly at some ticks (the idleness boundary, rule 4's `≥`).
    let grid = rng.one_in(2);
    let on_grid = |ms: i64| if grid { ms - ms.rem_euclid(200) } else { ms };
    let mut t: i64 = on_grid(BASE_TS + rng.below(1000) as i64);
    let mut rows = Vec::new();
    let row = |rng: &mut Rng, ts: i64, arrival: i64, v: usize| {
        (arrival, format!("{{\"k\":\"k{}\",\"ts\":{ts},\"v\":{v},\"arrival\":{arrival}}}", rng.below(3)))
    };
    for i in 0..rng.below(40) as usize + 5 {
        t += rng.pick(&[0, 100, 200, 500]);
        if rng.one_in(6) {
            // The device goes silent; often it then uploads what it buffered meanwhile, rows
            // whose lateness depends on exactly how far idle advancing moved the watermark.
            let gap = rng.pick(&[1_000, 1_900, 3_000, 20_000, 600_000]);
            if rng.one_in(2) {
                for j in 0..rng.below(4) {
                    let ts = t + rng.below(gap as u64) as i64;
                    rows.push(row(rng, ts, t + gap, 1000 * i + j as usize));
                }
            }
            t += gap;
        }
        let delay = if rng.one_in(12) { 1_500 + rng.below(3_000) as i64 } else { rng.below(301) as i64 };
        rows.push(row(rng, t, on_grid(t + delay), i));
    }
    rows.sort();
    rows.into_iter().map(|(_, line)| line + "\n").collect()
}

const OUTPUTS: [&str; 4] = ["u", "u.late", "x", "x.late"];

#[test]
fn skipping_ticks_changes_no_output() {
    let mut results_seen = 0;
    for seed in 0..40 {
        let mut rng = Rng(seed);
        let dir = tempfile::tempdir().unwrap();
        let text = config(&mut rng);
        let texts: Vec<(&str, String)> = ["a", "b", "c"].into_iter().map(|s| (s, input(&mut rng))).collect();
        let inputs = write_inputs(dir.path(), texts);
        let plan = braid::config::parse("gen.toml", &text).unwrap();
        let (skipping, stepping) = skip_and_step(&plan, dir.path(), 2, &inputs, &OUTPUTS);
        let files = output_files(dir.path(), "oracle", &OUTPUTS);
        common::oracle::replay(&plan, 2, &inputs, &files);
        for (i, (name, path)) in files.iter().enumerate() {
            assert_eq!(skipping[i], stepping[i], "seed {seed}: output {name} differs\nconfig:\n{text}");
            let mut oracle: Vec<String> = std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect();
            oracle.sort();
            assert_eq!(stepping[i], oracle, "seed {seed}: output {name} differs from the oracle's\nconfig:\n{text}");
        }
        results_seen += skipping[2].len();
    }
    assert!(results_seen > 100, "the workloads should produce chained results ({results_seen})");
}
