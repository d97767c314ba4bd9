//! `ttl` (issue 12 item 1): state bounded by processing time while a watermark is stalled.
//!
//! The workload: `command` brings a new device id every millisecond of arrival (and of event
//! time), `status` sent one row and then nothing, and never turns idle (`idle_timeout = "0ms"`):
//! the join's watermark stays at −1, so only `ttl` frees anything. Runs of growing length stand
//! for moments of one run (a prefix of the input is the run up to that processing time).
//!
//! - [`expiry_holds_state_to_the_ttl_window_whatever_the_shard_count`]: state rows at the end
//!   are the rows of the last `ttl` (a tick's worth of slack), every other row in
//!   `effect.expired`, the counts equal for 1 and 3 shards;
//! - [`ttl_plateau_figure`] (ignored; BENCHMARKS.md "State bounded by ttl"): the figure —
//!   rows held, rows expired and peak RSS for 25 k … 400 k new device ids, with and without
//!   `ttl`.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use crate::common::run::braid;

fn config(ttl: Option<&str>) -> String {
    let ttl = ttl.map_or(String::new(), |t| format!("ttl = \"{t}\"\n"));
    format!(
        "[streams.command]\nkey = \"device\"\ntime = {{ field = \"ts\", unit = \"ms\" }}\nidle_timeout = \"0ms\"\n\
         fields = {{ device = \"string\", ts = \"int\", cmd = \"string\" }}\n\n\
         [streams.status]\nkey = \"device\"\ntime = {{ field = \"ts\", unit = \"ms\" }}\nidle_timeout = \"0ms\"\n\
         fields = {{ device = \"string\", ts = \"int\", state = \"string\" }}\n\n\
         [operators.effect]\nkind = \"interval_join\"\nleft = \"command\"\nright = \"status\"\n\
         lower = \"0ms\"\nupper = \"1s\"\njoin = \"left\"\n{ttl}select = [\"left.cmd\", \"right.state\"]\n"
    )
}

/// `rows` commands of new devices, one per ms from 1 000; one status row at 0.
fn write_inputs(dir: &Path, rows: usize) {
    let mut command = String::with_capacity(rows * 64);
    for i in 0..rows {
        let t = 1_000 + i;
        command.push_str(&format!("{{\"device\":\"dev-{i}\",\"ts\":{t},\"cmd\":\"c\",\"arrival\":{t}}}\n"));
    }
    std::fs::write(dir.join("command.jsonl"), command).unwrap();
    std::fs::write(dir.join("status.jsonl"), "{\"device\":\"s\",\"ts\":0,\"state\":\"x\",\"arrival\":0}\n").unwrap();
}

/// What one replay showed. `held`: the rows still in the join's state when the input ended —
/// the end of input sends the watermark to +∞, which emits each of them as `left_only` (the
/// final metrics are taken after that, when the state is empty).
struct Ran {
    held: u64,
    expired: u64,
    rss_kib: u64,
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}")) as u64
}

/// Replays with `shards` under `/usr/bin/time` (peak RSS).
fn run(dir: &Path, ttl: Option<&str>, shards: u32, expired_out: bool) -> Ran {
    std::fs::write(dir.join("c.toml"), config(ttl)).unwrap();
    let metrics = dir.join("metrics");
    let mut cmd = Command::new("/usr/bin/time");
    cmd.args(["-f", "%M", "-o"]).arg(dir.join("rss"));
    cmd.arg(braid().get_program());
    cmd.args(["replay", "--shards", &shards.to_string(), "--config"]).arg(dir.join("c.toml"));
    cmd.arg("--input").arg(format!("command={}", dir.join("command.jsonl").display()));
    cmd.arg("--input").arg(format!("status={}", dir.join("status.jsonl").display()));
    if expired_out {
        cmd.arg("--output").arg(format!("effect.expired={}", dir.join("expired.jsonl").display()));
    }
    cmd.arg("--metrics").arg(&metrics);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&metrics).unwrap();
    let rss = std::fs::read_to_string(dir.join("rss")).unwrap();
    Ran {
        held: metric(&text, "braid_operator_results_total{operator=\"effect\",kind=\"left_only\"}"),
        expired: metric(&text, "braid_operator_expired_total{operator=\"effect\",reason=\"ttl\"}"),
        rss_kib: rss.trim().lines().last().and_then(|l| l.parse().ok()).unwrap_or(0),
    }
}

#[test]
fn expiry_holds_state_to_the_ttl_window_whatever_the_shard_count() {
    let dir = tempfile::tempdir().unwrap();
    let rows = 6_000;
    write_inputs(dir.path(), rows);
    let mut seen = Vec::new();
    for shards in [1, 3] {
        let ran = run(dir.path(), Some("2s"), shards, true);
        // Held at the end: the commands written after 4 800 (4 801 ..= 6 999).
        assert_eq!(ran.held, 2_199, "rows held at the end of input, {shards} shards");
        let lines = std::fs::read_to_string(dir.path().join("expired.jsonl")).unwrap();
        let mut expired: Vec<String> = lines.lines().map(str::to_owned).collect();
        expired.sort();
        assert_eq!(expired.len() as u64, ran.expired, "every expired row is in effect.expired");
        seen.push(expired);
    }
    assert_eq!(seen[0], seen[1], "effect.expired with 1 and 3 shards");
    // The last command arrives at 6 999; the last tick at 6 800 expired the rows written up to
    // 4 800 (commands 1 000 ..= 4 800) and the status row: 3 801 + 1.
    assert_eq!(seen[0].len(), 3_802, "rows expired");
    assert!(seen[0].iter().all(|l| l.ends_with("\"_reason\":\"ttl\"}")), "{:?}", &seen[0][..3]);
}

/// The figure for BENCHMARKS.md: `cargo test --release --test it -- ttl::ttl_plateau_figure
/// --ignored --nocapture`.
#[test]
#[ignore = "a figure for BENCHMARKS.md, not a check"]
fn ttl_plateau_figure() {
    println!(
        "| new device ids (1 000 per s of processing time) | ttl | rows held at the end | rows expired | peak RSS |"
    );
    println!("|---|---|---|---|---|");
    for rows in [25_000, 50_000, 100_000, 200_000, 400_000] {
        let dir = tempfile::tempdir().unwrap();
        write_inputs(dir.path(), rows);
        for ttl in [Some("10s"), None] {
            let ran = run(dir.path(), ttl, 1, false);
            println!(
                "| {rows} | {} | {} | {} | {:.1} MiB |",
                ttl.unwrap_or("none"),
                ran.held,
                ran.expired,
                ran.rss_kib as f64 / 1024.0
            );
        }
    }
}
