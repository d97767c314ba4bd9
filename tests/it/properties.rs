//! Properties of `braid replay` with an interval join, over random workloads (proptest drives
//! the seed and size of a `tests/it/common` workload; each case runs the real binary a few times):
//!
//! - the output (full result objects, `_id`s included, as a multiset) does not depend on
//!   `--shards` (1, 2, 4);
//! - when nothing can be late, any permutation of arrivals that keeps every row within
//!   max_out_of_orderness gives the same output;
//! - no silent loss: every pair that satisfies the join condition, over all rows (late or not),
//!   is emitted as a match or has a row in `effect.late`; every emitted match satisfies it; a
//!   late row appears in no result;
//! - a chain (interval join → interval join): no result of the first operator is late in the
//!   second (CONTRACT rule 5), while its inputs keep flowing.
//!
//! A failing case is shrunk by `common::shrink` (removing input lines), not by proptest (whose
//! shrinking of a seed does not make a workload smaller), and printed as config + inputs.
//! `PROPTEST_CASES` overrides the number of cases (48 by default). Failures are not persisted
//! to a regressions file: print-out + seed is the record.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::join_workload::*;
use common::multiset::{multiset, multiset_diff};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;

const SHRINK_BUDGET: usize = 80;

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48);
    Config { cases, failure_persistence: None, max_shrink_iters: 0, ..Config::default() }
}

/// Runs a property over (seed, max rows per stream); on a failure shrinks the workload by
/// removing input lines and fails with the smallest one found.
fn check_property(
    name: &str,
    rows: std::ops::RangeInclusive<usize>,
    make: impl Fn(u64, usize) -> Workload,
    fails: impl Fn(&Workload) -> Option<String> + Copy,
) {
    let mut runner = TestRunner::new(config());
    let result = runner.run(&(any::<u64>(), rows), |(seed, n)| {
        let w = make(seed, n);
        match fails(&w) {
            None => Ok(()),
            Some(msg) => {
                let (small, msg) = shrink(&w, msg, SHRINK_BUDGET, fails);
                let dir = small.save_repro(&format!("{name}-{seed}"));
                Err(TestCaseError::fail(format!(
                    "{name}: seed {seed}, max rows {n}; shrunk to {} rows (saved in {}):\n{msg}\n\n{}",
                    small.n_rows(),
                    dir.display(),
                    small.dump()
                )))
            }
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn shards_for(w: &Workload) -> Option<u32> {
    Some([1, 2, 4][(w.seed % 3) as usize])
}

// ---------------------------------------------------------------------------- shard count ---

fn shard_outputs_differ(w: &Workload) -> Option<String> {
    let names = ["effect", "effect.late", "dead_letter"];
    let one = match run_replay(w, Some(1), &names) {
        Ok(o) => o,
        Err(e) => return Some(e),
    };
    for n in [2, 4] {
        let other = match run_replay(w, Some(n), &names) {
            Ok(o) => o,
            Err(e) => return Some(e),
        };
        for name in names {
            let (a, b) = (multiset(one.get(name)), multiset(other.get(name)));
            if a != b {
                let d = multiset_diff("--shards 1", &a, &format!("--shards {n}"), &b);
                return Some(format!("output {name} differs between --shards 1 and --shards {n}:\n{d}"));
            }
        }
    }
    None
}

#[test]
fn output_does_not_depend_on_shard_count() {
    check_property("shards", 1..=40, |seed, n| gen_workload(seed, &GenOpts::everything(n)), shard_outputs_differ);
}

// ---------------------------------------------------------------------- arrival permutation ---

/// The seed of the permutation is derived from the workload's, so that shrinking keeps it.
fn permutation_changes_output(w: &Workload) -> Option<String> {
    let v = permute_arrivals(w, w.seed.rotate_left(17) ^ 0xA5A5);
    for x in [w, &v] {
        let sim = simulate(x, 0);
        assert!(sim.late.is_empty(), "generator bug: a never-late workload has late rows\n{}", x.dump());
    }
    let names = ["effect", "effect.late"];
    let (a, b) = match (run_replay(w, shards_for(w), &names), run_replay(&v, shards_for(w), &names)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return Some(e),
    };
    for (label, o) in [("original", &a), ("permuted", &b)] {
        if !o.get("effect.late").is_empty() {
            return Some(format!(
                "{label} arrivals: nothing is late (delays within max_out_of_orderness, no idleness), \
                 but effect.late has {:?}",
                o.get("effect.late")
            ));
        }
    }
    let (ma, mb) = (multiset(a.get("effect")), multiset(b.get("effect")));
    if ma != mb {
        return Some(format!(
            "permuting arrivals changed the output:\n{}\npermuted inputs:\n{}",
            multiset_diff("original", &ma, "permuted", &mb),
            v.dump()
        ));
    }
    None
}

#[test]
fn arrival_order_within_bound_does_not_change_output() {
    check_property(
        "permutation",
        2..=40,
        |seed, n| gen_workload(seed, &GenOpts::never_late(n)),
        permutation_changes_output,
    );
}

// ------------------------------------------------------------------------- no silent loss ---

fn silent_loss(w: &Workload) -> Option<String> {
    let j = &w.ops[0];
    let out = match run_replay(w, shards_for(w), &["effect", "effect.late"]) {
        Ok(o) => o,
        Err(e) => return Some(e),
    };
    let (lalias, ralias) = (j.alias_of(0, "seq").unwrap(), j.alias_of(1, "seq").unwrap());
    let mut matches: BTreeSet<(i64, i64)> = BTreeSet::new();
    let mut in_results: BTreeSet<i64> = BTreeSet::new();
    for v in out.get("effect") {
        let (l, r) = (v.get(lalias).and_then(Value::as_i64), v.get(ralias).and_then(Value::as_i64));
        in_results.extend(l.into_iter().chain(r));
        if v.get("_kind").and_then(Value::as_str) == Some("match") {
            match (l, r) {
                (Some(l), Some(r)) => {
                    matches.insert((l, r));
                }
                _ => return Some(format!("a match without both seqs: {v}")),
            }
        }
    }
    let late: BTreeSet<i64> = out.get("effect.late").iter().filter_map(|v| v.get("seq")?.as_i64()).collect();
    let by_seq = w.rows_by_seq();
    let mut problems = vec![];
    let (left, right) = (&w.streams[0], &w.streams[1]);
    for l in left.rows() {
        for r in right.rows() {
            let lost = l.key == r.key
                && j.cond(l.ts, r.ts)
                && !matches.contains(&(l.seq, r.seq))
                && !late.contains(&l.seq)
                && !late.contains(&r.seq);
            if lost {
                problems.push(format!(
                    "pair lost: command#{} ts {} arrival {} × status#{} ts {} arrival {} (key {:?}): \
                     not emitted, neither row in effect.late",
                    l.seq, l.ts, l.arrival, r.seq, r.ts, r.arrival, l.key
                ));
            }
        }
    }
    for &(l, r) in &matches {
        match (by_seq.get(&l), by_seq.get(&r)) {
            (Some(&(0, lr)), Some(&(1, rr))) => {
                if lr.key != rr.key || !j.cond(lr.ts, rr.ts) {
                    problems.push(format!("match ({l}, {r}) does not satisfy the join condition"));
                }
            }
            _ => problems.push(format!("match ({l}, {r}) names unknown rows")),
        }
    }
    // a redelivered row has copies: one may be late and another on time
    let mut copies: BTreeMap<i64, usize> = BTreeMap::new();
    for r in w.streams.iter().flat_map(Stream::rows) {
        *copies.entry(r.seq).or_insert(0) += 1;
    }
    for s in late.intersection(&in_results).filter(|s| copies.get(s) == Some(&1)) {
        problems.push(format!("row #{s} is in effect.late and in a result (rule 7: nowhere else)"));
    }
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for v in out.get("effect.late") {
        *counts.entry(v.get("seq").and_then(Value::as_i64).unwrap_or(-1)).or_insert(0) += 1;
    }
    for (s, n) in counts.iter().filter(|(s, n)| **n > copies.get(s).copied().unwrap_or(0)) {
        problems.push(format!("row #{s} is {n} times in effect.late"));
    }
    (!problems.is_empty()).then(|| format!("{} problem(s):\n  {}", problems.len(), problems.join("\n  ")))
}

#[test]
fn every_pair_is_emitted_or_has_a_late_row() {
    check_property("no-silent-loss", 1..=50, |seed, n| gen_workload(seed, &GenOpts::everything(n)), silent_loss);
}

// ---------------------------------------------------------------------------------- chains ---

static CHAIN_RESULTS: AtomicUsize = AtomicUsize::new(0);

fn chain_late(w: &Workload) -> Option<String> {
    let out = match run_replay(w, shards_for(w), &["effect", "audit", "audit.late"]) {
        Ok(o) => o,
        Err(e) => return Some(e),
    };
    let upstream_late: Vec<&Value> =
        out.get("audit.late").iter().filter(|v| v.get("_stream").and_then(Value::as_str) == Some("effect")).collect();
    if !upstream_late.is_empty() {
        return Some(format!(
            "{} result(s) of effect are late in audit (CONTRACT rule 5: effect's output watermark must \
             hold back to what it may still emit), e.g.:\n  {}",
            upstream_late.len(),
            upstream_late.iter().take(10).map(|v| v.to_string()).collect::<Vec<_>>().join("\n  ")
        ));
    }
    if !out.get("effect").is_empty() {
        CHAIN_RESULTS.fetch_add(1, Ordering::Relaxed);
    }
    None
}

#[test]
fn chained_join_gets_no_late_rows_from_upstream() {
    check_property("chain", 4..=40, gen_chain, chain_late);
    let n = CHAIN_RESULTS.load(Ordering::Relaxed);
    assert!(n * 2 >= config().cases as usize, "only {n} chain cases had upstream results");
}
