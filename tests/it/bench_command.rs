//! `braid bench` with a tiny load: exit 0, the human table on stderr, and on stdout one
//! `key=value` line per figure (README.md "braid bench"). Figures are checked for their form and
//! their counts, never for timings.

use crate::common;

use std::collections::BTreeMap;

use common::run::braid;

fn bench(args: &[&str]) -> (BTreeMap<String, String>, String) {
    let out = braid().arg("bench").args(args).output().expect("braid runs");
    let stderr = String::from_utf8(out.stderr).expect("UTF-8 stderr");
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);
    let stdout = String::from_utf8(out.stdout).expect("UTF-8 stdout");
    let figures = stdout
        .lines()
        .map(|line| {
            let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("not key=value: {line:?}"));
            assert!(!k.is_empty() && !v.is_empty() && !k.contains(' '), "{line:?}");
            (k.to_owned(), v.to_owned())
        })
        .collect();
    (figures, stderr)
}

const FIGURES: [&str; 48] = [
    "config",
    "devices",
    "shards",
    "state_backend",
    "rate_per_device",
    "match_fanout_asked",
    "late_share",
    "rows",
    "event_seconds",
    "wall_seconds",
    "finish_seconds",
    "cpu_seconds",
    "rows_per_s",
    "rows_per_cpu_s",
    "results",
    "results_per_s",
    "results_at_ingest",
    "results_at_tick",
    "results_at_finish",
    "late_rows",
    "match_fanout",
    "latency_p50_us",
    "latency_p99_us",
    "latency_max_us",
    "shard_result_latency_p50_us",
    "shard_result_latency_p99_us",
    "shard_result_cpu_p50_us",
    "shard_result_cpu_p99_us",
    "peak_rss_kib",
    "rss_end_kib",
    "anon_rss_start_kib",
    "anon_rss_end_kib",
    "anon_rss_peak_kib",
    "anon_rss_at_peak_state_kib",
    "state_rows_peak",
    "state_bytes_peak",
    "state_rows_end",
    "state_bytes_end",
    "wakeups_per_row",
    "feeder_wakeups_per_row",
    "shard_wakeups_per_row",
    "feeder_sleeps_per_row",
    "shard_sleeps_per_row",
    "feeder_spins_won_per_row",
    "shard_spins_won_per_row",
    "shard_nudges",
    "context_switches_per_row",
    "voluntary_context_switches_per_row",
];

fn number(figures: &BTreeMap<String, String>, key: &str) -> f64 {
    figures[key].parse().unwrap_or_else(|_| panic!("{key}={} is not a number", figures[key]))
}

#[test]
fn bench_prints_every_figure_for_the_bundled_gateway_config() {
    let (figures, stderr) = bench(&["--devices", "50", "--rows", "5000", "--shards", "2"]);
    let keys: Vec<&str> = figures.keys().map(String::as_str).collect();
    let mut expected = FIGURES.to_vec();
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(figures["config"], "configs/gateway.toml (bundled)");
    assert_eq!(figures["rows"], "5000");
    assert_eq!(figures["devices"], "50");
    assert_eq!(figures["shards"], "2");
    assert_eq!(figures["late_rows"], "0");
    assert_eq!(figures["state_backend"], "arenas");
    for key in FIGURES.iter().skip(7) {
        if key.starts_with("shard_result") {
            // A bucket's bound, or above the last one; the CPU clock times a sample of the
            // stretches, of which a short run may have none.
            let value = &figures[*key];
            let bound = value.strip_prefix('>').unwrap_or(value).parse::<u64>().is_ok();
            assert!(bound || (key.starts_with("shard_result_cpu") && value == "na"), "{key}={value}");
        } else {
            number(&figures, key);
        }
    }
    let results = number(&figures, "results");
    let parts: f64 =
        ["results_at_ingest", "results_at_tick", "results_at_finish"].iter().map(|k| number(&figures, k)).sum();
    assert_eq!(results, parts);
    assert!(number(&figures, "results_at_ingest") > 0.0);
    assert!(number(&figures, "latency_p50_us") <= number(&figures, "latency_p99_us"));
    assert!(number(&figures, "state_bytes_peak") > 0.0);
    // The shards sleep while the next batch is generated, and the feeder's next publication wakes
    // them.
    assert!(number(&figures, "shard_sleeps_per_row") > 0.0);
    assert!(number(&figures, "shard_wakeups_per_row") > 0.0);
    assert!(number(&figures, "context_switches_per_row") >= number(&figures, "voluntary_context_switches_per_row"));
    for name in ["load", "input", "results", "latency", "in the shard", "state", "memory", "operator", "wake-ups"] {
        assert!(stderr.lines().any(|l| l.starts_with(name)), "no {name:?} row in the table:\n{stderr}");
    }
}

#[test]
fn bench_takes_a_config_and_a_late_share() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/union.toml");
    let (figures, _) = bench(&["--config", config, "--devices", "20", "--rows", "3000", "--late-share", "0.2"]);
    assert_eq!(figures["config"], config);
    assert_eq!(figures["rows"], "3000");
    assert!(number(&figures, "late_rows") > 0.0);
    assert_eq!(figures["match_fanout"], "na", "a union has no pairs");
}

#[test]
fn bench_refuses_bad_flags() {
    for args in [&["--devices", "0"][..], &["--late-share", "2"], &["--rows", "10", "--seconds", "1"]] {
        let out = braid().arg("bench").args(args).output().expect("braid runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}
