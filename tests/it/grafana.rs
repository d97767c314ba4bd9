#![allow(clippy::unwrap_used)]
//! configs/grafana/: the dashboard is valid JSON and the alert rules valid YAML with the expected
//! groups, and every `braid_*` name their queries use is one braid exports: those of
//! `braid replay --metrics` on the bundled gateway sample (src/ops/metrics.rs), plus the
//! service's own families (sinks, sources, journal: written only by `braid run`, in
//! src/service/view.rs, and read from there).

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `braid_…` metric name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("braid_") {
        let tail = &rest[at..];
        let end =
            tail.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// The names braid exports: replay's metrics for the gateway config, and the service's families.
fn exported() -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.txt");
    let out = crate::logs::gateway_replay(dir.path()).arg("--metrics").arg(&metrics).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = fs::read_to_string(&metrics).unwrap();
    // Names of families with samples or at least a TYPE line; a histogram's series are its
    // name's `_bucket`, `_sum` and `_count`.
    let mut names = BTreeSet::new();
    for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let (name, kind) = family.split_once(' ').unwrap();
        if kind == "histogram" {
            names.extend(["_bucket", "_sum", "_count"].map(|series| format!("{name}{series}")));
        }
        names.insert(name.to_owned());
    }
    assert!(names.contains("braid_operator_matched_total"), "{text}");
    let view = fs::read_to_string(root().join("src/service/view.rs")).unwrap();
    names
        .extend(view.split('"').filter(|s| s.starts_with("braid_") && metric_names(s).contains(*s)).map(str::to_owned));
    assert!(names.contains("braid_sink_connected") && names.contains("braid_journal_bytes"), "{names:?}");
    names
}

/// (panel title, expr) of every query in the dashboard.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = fs::read_to_string(root().join("configs/grafana/braid-dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dashboard["uid"], "braid-overview");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap().to_owned();
        let targets = panel["targets"].as_array().unwrap_or_else(|| panic!("{title}: no targets"));
        assert!(!targets.is_empty(), "{title}: no targets");
        for target in targets {
            queries.push((title.clone(), target["expr"].as_str().unwrap().to_owned()));
        }
    }
    queries
}

#[test]
fn dashboard_queries_use_only_exported_metrics_and_cover_them() {
    let exported = exported();
    let mut used = BTreeSet::new();
    for (title, expr) in dashboard_queries() {
        assert_eq!(expr.matches('(').count(), expr.matches(')').count(), "{title}: {expr}");
        assert_eq!(expr.matches('{').count(), expr.matches('}').count(), "{title}: {expr}");
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "{title}: no braid metric in {expr}");
        for name in names {
            assert!(exported.contains(&name), "{title}: {name} is not exported by braid ({exported:?})");
            used.insert(name);
        }
    }
    // What issue 15 asks the dashboard to show.
    for name in [
        "braid_stream_rows_total",
        "braid_stream_dead_letter_total",
        "braid_stream_watermark_ms",
        "braid_operator_watermark_ms",
        "braid_operator_results_total",
        "braid_operator_late_total",
        "braid_operator_state_rows",
        "braid_operator_state_bytes",
        "braid_operator_matched_total",
        "braid_operator_unmatched_total",
        "braid_sink_queued_bytes",
        "braid_sink_sent_total",
        "braid_sink_connected",
        "braid_source_connected",
        "braid_journal_bytes",
        "braid_shard_ring_used_bytes",
        "braid_shard_result_latency_seconds_bucket",
        "braid_shard_result_cpu_seconds_bucket",
        "braid_operator_input_watermark_lag_seconds",
        "braid_warning_active",
    ] {
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
}

#[test]
fn alert_rules_parse_with_the_expected_groups_and_metrics() {
    let text = fs::read_to_string(root().join("configs/grafana/alerts.yml")).unwrap();
    let docs = YamlLoader::load_from_str(&text).unwrap();
    assert_eq!(docs.len(), 1);
    let exported = exported();
    let mut groups = Vec::new();
    let mut alerts = Vec::new();
    for group in docs[0]["groups"].as_vec().unwrap() {
        groups.push(group["name"].as_str().unwrap().to_owned());
        for rule in group["rules"].as_vec().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            let expr = rule["expr"].as_str().unwrap();
            let duration = rule["for"].as_str().unwrap_or_else(|| panic!("{name}: no `for`"));
            assert!(duration.ends_with('m'), "{name}: for {duration}");
            assert!(rule["labels"]["severity"].as_str().is_some(), "{name}: no severity");
            assert!(rule["annotations"]["summary"].as_str().is_some(), "{name}: no summary");
            assert_eq!(expr.matches('(').count(), expr.matches(')').count(), "{name}: {expr}");
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{name}: no braid metric");
            for metric in names {
                assert!(exported.contains(&metric), "{name}: {metric} is not exported by braid");
            }
            alerts.push((name.to_owned(), duration.to_owned()));
        }
    }
    assert_eq!(groups, ["braid-connectivity", "braid-data-quality", "braid-joins", "braid-warnings", "braid-sinks"]);
    let alerts: Vec<(&str, &str)> = alerts.iter().map(|(a, d)| (a.as_str(), d.as_str())).collect();
    assert_eq!(
        alerts,
        [
            ("BraidSourceDisconnected", "5m"),
            ("BraidSinkDisconnected", "5m"),
            ("BraidDeadLettersRising", "10m"),
            ("BraidLateRowsRising", "10m"),
            ("BraidJoinMatchesNothing", "5m"),
            ("BraidWarningNoMatch", "1m"),
            ("BraidWarningWatermarkSkew", "5m"),
            ("BraidWarningSilentStream", "1m"),
            ("BraidWarningStateStalled", "5m"),
            ("BraidWarningHotKey", "10m"),
            ("BraidSinkQueueGrowing", "10m"),
        ]
    );
    for warning in braid::ops::warnings::WARNINGS {
        assert!(
            text.contains(&format!("braid_warning_active{{warning=\"{warning}\"}}")),
            "no alert rule for {warning}"
        );
    }
    assert!(matches!(docs[0]["nonsense"], Yaml::BadValue));
}
