//! Prometheus text exposition of a run's figures (CONTRACT.md "Metrics" names).
//!
//! Rendered on demand from the runtime's figures, never in the row path (STYLE.md 7).

use std::fmt::Write;

use crate::operator::{ExpiryReason, ResultKind};
use crate::plan::{NodeRef, Plan};
use crate::shard::Figures;
use crate::shard::result_latency::{HeldResults, ResultLatency};

/// One metric family: its HELP and TYPE lines, then a sample per (labels, value); empty labels
/// write the bare name.
pub fn write_family(out: &mut String, name: &str, kind: &str, help: &str, samples: Vec<(String, String)>) {
    // Writing into a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = if labels.is_empty() {
            writeln!(out, "{name} {value}")
        } else {
            writeln!(out, "{name}{{{labels}}} {value}")
        };
    }
}

/// Per join input: its watermark's lag behind processing time and behind the other input.
fn watermark_lags(plan: &Plan, figures: &Figures) -> Vec<(String, String)> {
    let mut samples = Vec::new();
    for def in &plan.operators {
        if !def.spec.kind().is_join() || def.inputs.len() != 2 {
            continue;
        }
        let watermark = |node: NodeRef| match node {
            NodeRef::Stream(s) => figures.stream_watermarks[s],
            NodeRef::Operator(u) => figures.operator_watermarks[u],
        };
        for (input, &node) in def.inputs.iter().enumerate() {
            let mine = watermark(node);
            if !mine.is_finite() {
                continue;
            }
            let labels = |behind: &str| {
                format!("operator=\"{}\",input=\"{}\",behind=\"{behind}\"", def.name, plan.node_name(node))
            };
            let seconds = |ms: i128| format!("{:.3}", ms.max(0) as f64 / 1000.0);
            samples.push((labels("processing_time"), seconds(figures.now - mine.raw())));
            let other = watermark(def.inputs[1 - input]);
            if other.is_finite() {
                samples.push((labels("other_input"), seconds(other.raw() - mine.raw())));
            }
        }
    }
    samples
}

/// The metrics of a run of `plan`, in Prometheus text format.
pub fn render(plan: &Plan, figures: &Figures) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, String)>| {
        write_family(&mut out, name, kind, help, samples);
    };
    let streams = || plan.streams.iter().enumerate();
    let operators = || plan.operators.iter().enumerate();
    family(
        "braid_stream_rows_total",
        "counter",
        "Rows received for the stream (decoded or not).",
        streams().map(|(i, s)| (format!("stream=\"{}\"", s.name), figures.streams[i].rows.to_string())).collect(),
    );
    family(
        "braid_stream_dead_letter_total",
        "counter",
        "Rows sent to dead_letter.",
        streams()
            .flat_map(|(i, s)| {
                figures.streams[i]
                    .dead_letters
                    .iter()
                    .map(move |(reason, n)| (format!("stream=\"{}\",reason=\"{reason}\"", s.name), n.to_string()))
            })
            // An operator's output is a stream too: its results too large for the rings.
            .chain(operators().filter_map(|(i, o)| {
                let n = figures.operator_too_large.get(i).copied().filter(|&n| n > 0)?;
                Some((format!("stream=\"{}\",reason=\"too_large\"", o.name), n.to_string()))
            }))
            .collect(),
    );
    family(
        "braid_stream_watermark_ms",
        "gauge",
        "The stream's current watermark.",
        streams()
            .map(|(i, s)| {
                (format!("stream=\"{}\"", s.name), figures.stream_watermarks[i].as_i64_saturating().to_string())
            })
            .collect(),
    );
    family(
        "braid_stream_idle",
        "gauge",
        "1 while the stream is idle.",
        streams()
            .map(|(i, s)| (format!("stream=\"{}\"", s.name), u8::from(figures.stream_idle[i]).to_string()))
            .collect(),
    );
    // Per operator and input; `joins_only`: of the join kinds alone (the join-quality counters:
    // union, connect and absence have no partners to find).
    let per_input = |values: fn(&crate::operator::host::OperatorCounters) -> &Vec<u64>, joins_only: bool| {
        operators()
            .filter(|(_, o)| !joins_only || o.spec.kind().is_join())
            .flat_map(|(i, o)| {
                values(&figures.operator_counters[i]).iter().zip(&o.inputs).map(move |(n, input)| {
                    (format!("operator=\"{}\",input=\"{}\"", o.name, plan.node_name(*input)), n.to_string())
                })
            })
            .collect::<Vec<_>>()
    };
    // Per operator and a label of fixed values (`label`="name" for each of `names`), the counts
    // in `names`' order.
    let per_label = |label: &str, names: &[&str], counts: fn(&crate::operator::host::OperatorCounters) -> &[u64]| {
        operators()
            .flat_map(|(i, o)| {
                names
                    .iter()
                    .zip(counts(&figures.operator_counters[i]))
                    .map(move |(name, n)| (format!("operator=\"{}\",{label}=\"{name}\"", o.name), n.to_string()))
            })
            .collect::<Vec<_>>()
    };
    family(
        "braid_operator_rows_total",
        "counter",
        "Rows that reached the operator from that input.",
        per_input(|c| &c.rows_in, false),
    );
    family(
        "braid_operator_results_total",
        "counter",
        "Results emitted.",
        per_label("kind", &ResultKind::ALL.map(ResultKind::as_str), |c| &c.results),
    );
    family(
        "braid_operator_late_total",
        "counter",
        "Rows routed to the late side output.",
        per_input(|c| &c.late, false),
    );
    family(
        "braid_operator_expired_total",
        "counter",
        "Lines routed to the expired side output (rows, and would-be results of open windows and absence keys), by reason.",
        per_label("reason", &ExpiryReason::ALL.map(ExpiryReason::as_str), |c| &c.expired),
    );
    family(
        "braid_operator_matched_total",
        "counter",
        "Rows of a join input that left the join having found at least one partner.",
        per_input(|c| &c.matched, true),
    );
    family(
        "braid_operator_unmatched_total",
        "counter",
        "Rows of a join input that left the join having found no partner by their last chance.",
        per_input(|c| &c.unmatched, true),
    );
    family(
        "braid_operator_expired_rows_total",
        "counter",
        "Rows of a join input that left the join's state by ttl or the state budget (as themselves, or held by an expired window), neither matched nor unmatched.",
        per_input(|c| &c.expired_rows, true),
    );
    family(
        "braid_operator_state_rows",
        "gauge",
        "Live state rows.",
        operators()
            .map(|(i, o)| (format!("operator=\"{}\"", o.name), figures.operator_state[i].0.to_string()))
            .collect(),
    );
    family(
        "braid_operator_state_bytes",
        "gauge",
        "Live state bytes.",
        operators()
            .map(|(i, o)| (format!("operator=\"{}\"", o.name), figures.operator_state[i].1.to_string()))
            .collect(),
    );
    family(
        "braid_operator_watermark_ms",
        "gauge",
        "The operator's current watermark.",
        operators()
            .map(|(i, o)| {
                (format!("operator=\"{}\"", o.name), figures.operator_watermarks[i].as_i64_saturating().to_string())
            })
            .collect(),
    );
    family(
        "braid_operator_input_watermark_lag_seconds",
        "gauge",
        "How far a join input's watermark is behind processing time, or behind the join's other input (0 when ahead); no sample before the input's first watermark.",
        watermark_lags(plan, figures),
    );
    family(
        "braid_shard_driver",
        "gauge",
        "1 for the monoio driver each shard runs on (io_uring, or legacy when io_uring is unavailable).",
        figures
            .drivers
            .iter()
            .enumerate()
            .map(|(shard, driver)| (format!("shard=\"{shard}\",driver=\"{driver}\""), "1".to_owned()))
            .collect(),
    );
    family(
        "braid_shard_ring_used_bytes",
        "gauge",
        "Bytes of frames waiting in the shard's feed ring.",
        figures
            .shard_ring_used_bytes
            .iter()
            .enumerate()
            .map(|(shard, used)| (format!("shard=\"{shard}\""), used.to_string()))
            .collect(),
    );
    if let Some(budget) = plan.runtime.state_budget {
        let per_shard = |value: &dyn Fn(u64, bool) -> String| {
            figures
                .shard_state
                .iter()
                .enumerate()
                .map(|(shard, &(bytes, full))| (format!("shard=\"{shard}\""), value(bytes, full)))
                .collect()
        };
        family(
            "braid_state_budget_bytes",
            "gauge",
            "runtime.state_budget: the bytes of state each shard may hold.",
            per_shard(&|_, _| budget.to_string()),
        );
        family(
            "braid_shard_state_bytes",
            "gauge",
            "Bytes of operator state the shard holds, as the budget counts them (arena segments mapped, indexes, per-key state).",
            per_shard(&|bytes, _| bytes.to_string()),
        );
        family(
            "braid_state_budget_full",
            "gauge",
            "1 while the shard is at its state budget and the intake waits (backpressure; evict_oldest with nothing evictable).",
            per_shard(&|_, full| u8::from(full).to_string()),
        );
    }
    write_results_held(&mut out, &figures.shard_results_held);
    out
}

/// How long the shards held their results, histograms over all shards: each result counted
/// with the stretch of the shard's work that made and committed it; a row's results by wall time
/// and by the shard thread's CPU time, those made as time advanced by wall time
/// (shard/result_latency.rs).
fn write_results_held(out: &mut String, held: &HeldResults) {
    write_histogram(
        out,
        "braid_shard_result_latency_seconds",
        "How long a shard held each result of a row after reading the row that made it (wall time, an upper bound).",
        &held.wall,
    );
    write_histogram(
        out,
        "braid_shard_result_cpu_seconds",
        "The shard thread's CPU time over the same stretch as braid_shard_result_latency_seconds (its own work, without preemptions), for one stretch in 16.",
        &held.cpu,
    );
    write_histogram(
        out,
        "braid_shard_time_result_latency_seconds",
        "How long a shard held each result made as time advanced (a tick's watermark and timers, processing time, the end) after reading the frame that advanced it (wall time, an upper bound).",
        &held.of_time,
    );
}

/// A histogram family: its HELP and TYPE lines ([`write_family`]), then its `le` buckets, sum
/// and count.
fn write_histogram(out: &mut String, name: &str, help: &str, latency: &ResultLatency) {
    write_family(out, name, "histogram", help, Vec::new());
    // Writing into a String cannot fail.
    for (bound, count) in latency.cumulative() {
        let le = bound.map_or_else(|| "+Inf".to_owned(), |us| format!("{}", us as f64 / 1e6));
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {count}");
    }
    let _ = writeln!(out, "{name}_sum {:.9}\n{name}_count {}", latency.sum().as_secs_f64(), latency.count());
}
