//! The interval join against a brute-force reference written in Rust.
//!
//! For each of many seeded workloads (two streams, ≤ 60 rows each, a few keys, all four join
//! types, negative and positive bounds, exclusive ends, out-of-order and late arrivals, idle
//! devices, whole streams going silent, dead-lettered lines) the real binary runs
//! `braid replay`, and its `effect` and `effect.late` outputs must equal, as multisets of
//! (kind, left seq, right seq) and (stream, seq), what `tests/it/common` computes by brute force:
//! lateness decided by simulating CONTRACT.md rules 1–8 itself, then nested loops over the
//! on-time rows. Each result object is checked on its own too (fields, key, nulls, `_ts`, `_id`).
//!
//! Environment knobs (for debugging; the defaults are what CI runs):
//! `BRAID_REF_CASES` (default 200), `BRAID_REF_SEED` (first seed, default 0),
//! `BRAID_REF_SHRINK` (calls of the shrinker on the first failure, default 300; 0 = off),
//! `BRAID_REF_DUMP_DIR` (the `dump_reference_workloads` test writes workloads and the
//! reference's expectations there, to cross-check the reference with another implementation).

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;

use common::env_u64;
use common::join_workload::*;

#[test]
fn interval_join_equals_brute_force_reference() {
    let cases = env_u64("BRAID_REF_CASES", 200);
    let first = env_u64("BRAID_REF_SEED", 0);
    let opts = GenOpts::everything(60);
    let mut failures: Vec<(u64, Option<u32>, String)> = vec![];
    let mut stats: Vec<CaseStats> = vec![];
    #[allow(clippy::disallowed_methods)] // timing the test itself, not engine time
    let t0 = std::time::Instant::now();
    for seed in first..first + cases {
        let w = gen_workload(seed, &opts);
        // vary the shard count too (its own property is in properties.rs)
        let shards = [None, Some(1), Some(2), Some(3)][(seed % 4) as usize];
        match check_reference(&w, shards) {
            Ok(s) => stats.push(s),
            Err(m) => failures.push((seed, shards, m)),
        }
    }
    eprintln!("{} workloads in {:?}, {} failed", cases, t0.elapsed(), failures.len());

    if let Some((seed, shards, msg)) = failures.first().cloned() {
        let w = gen_workload(seed, &opts);
        let budget = env_u64("BRAID_REF_SHRINK", 300) as usize;
        let (small, small_msg) = shrink(&w, msg, budget, |c| check_reference(c, shards).err());
        let dir = small.save_repro(&format!("reference-{seed}"));
        let seeds: Vec<String> = failures.iter().map(|(s, ..)| s.to_string()).collect();
        let firsts: Vec<String> =
            failures.iter().take(5).map(|(s, _, m)| format!("seed {s}: {}", first_lines(m, 4))).collect();
        panic!(
            "{} of {cases} workloads differ from the reference (seeds {}).\n\nFirst messages:\n{}\n\n\
             Seed {seed} shrunk to {} rows (saved in {}):\n{small_msg}\n\n{}",
            failures.len(),
            seeds.join(" "),
            firsts.join("\n"),
            small.n_rows(),
            dir.display(),
            small.dump()
        );
    }
    assert_coverage(&stats);
}

/// `where` on the pair: the same workloads with `(left.seq + right.seq) % M != 0` (M = 2 or 3)
/// on top of the bounds; the reference drops the failing pairs before deciding outer rows.
#[test]
fn interval_join_with_where_equals_brute_force_reference() {
    let cases = env_u64("BRAID_REF_CASES", 200) / 5;
    let opts = GenOpts::everything(60);
    let with_where = |seed: u64| {
        let mut w = gen_workload(seed, &opts);
        w.ops[0].where_mod = Some(2 + (seed % 2) as i64);
        w
    };
    let (mut filtered, mut outer) = (0, 0);
    for seed in 1000..1000 + cases {
        let w = with_where(seed);
        let e = expected(&w);
        let pairs_without = {
            let mut plain = w.clone();
            plain.ops[0].where_mod = None;
            expected(&plain).results.keys().filter(|t| t.0 == "match").count()
        };
        filtered += pairs_without - e.results.keys().filter(|t| t.0 == "match").count();
        outer += e.results.keys().filter(|t| t.0 != "match").count();
        if let Err(m) = check_reference(&w, None) {
            panic!("seed {seed}: braid differs from the reference\n{m}\n{}", w.dump());
        }
    }
    // The condition did filter pairs, and outer rows were emitted.
    assert!(filtered > 20 && outer > 20, "filtered pairs {filtered}, outer rows {outer}");
}

fn first_lines(s: &str, n: usize) -> String {
    s.lines().take(n).collect::<Vec<_>>().join("\n    ")
}

/// The generator must actually reach the corners the test is about; this fails when a change
/// to the generator (or seeds) stops exercising one of them.
fn assert_coverage(stats: &[CaseStats]) {
    if stats.len() < 100 {
        return; // a short debugging run (BRAID_REF_CASES)
    }
    let count = |f: &dyn Fn(&CaseStats) -> bool| stats.iter().filter(|s| f(s)).count();
    let mut by_join: BTreeMap<&str, usize> = BTreeMap::new();
    for s in stats {
        *by_join.entry(s.join.unwrap().name()).or_insert(0) += 1;
    }
    let sum = |f: &dyn Fn(&CaseStats) -> usize| stats.iter().map(f).sum::<usize>();
    let figures = [
        ("workloads with late rows", count(&|s| s.late > 0)),
        ("rows exactly on the watermark (on time)", sum(&|s| s.on_watermark)),
        ("rows 1 ms below the watermark (late)", sum(&|s| s.just_late)),
        ("matches exactly on a bound", sum(&|s| s.on_bound)),
        ("same-key pairs 1 ms outside a bound", sum(&|s| s.off_by_one)),
        ("workloads with an idle input", count(&|s| s.some_idle)),
        ("workloads with all inputs idle", count(&|s| s.all_idle)),
        ("workloads where idle_advance moved the watermark", count(&|s| s.idle_advanced)),
        ("workloads where an idle stream came back", count(&|s| s.reactivated)),
        ("workloads with lower < 0", count(&|s| s.negative_lower)),
        ("workloads with lower > 0", count(&|s| s.positive_lower)),
        ("workloads with upper < 0", count(&|s| s.negative_upper)),
        ("workloads with an exclusive bound", count(&|s| s.exclusive)),
        ("workloads with int keys", count(&|s| s.int_keys)),
        ("workloads with dead letters", count(&|s| s.dead_letters > 0)),
        ("workloads with an empty stream", count(&|s| s.empty_stream)),
        ("workloads with a redelivered row", count(&|s| s.redelivered)),
        ("workloads with a row from the future", count(&|s| s.from_future)),
        ("workloads with a pause above 30 s", count(&|s| s.long_pause)),
        ("matches", sum(&|s| s.matches)),
        ("outer results", sum(&|s| s.outer)),
    ];
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for r in stats.iter().flat_map(|s| s.dead_reasons.iter()) {
        *reasons.entry(r.clone()).or_insert(0) += 1;
    }
    eprintln!("coverage over {} workloads: joins {by_join:?}", stats.len());
    eprintln!("  dead-letter reasons (workloads): {reasons:?}");
    assert!(reasons.len() >= 6, "the generator no longer makes every kind of dead letter: {reasons:?}");
    for (what, n) in figures {
        eprintln!("  {what}: {n}");
    }
    for j in JoinType::ALL {
        assert!(by_join.get(j.name()).copied().unwrap_or(0) >= 10, "too few {} joins: {by_join:?}", j.name());
    }
    for (what, n) in figures {
        assert!(n >= 3, "the generator no longer covers: {what} ({n})");
    }
}

/// Not a check: writes workloads and this reference's expectations to `BRAID_REF_DUMP_DIR`
/// (one folder per seed: braid.toml, inputs, expected.json, args.txt), so that the reference can
/// be compared with another implementation of CONTRACT.md. Fails without the variable.
/// `BRAID_REF_DUMP_KIND=chain` writes the chain workloads of properties.rs instead (no
/// expectations), `never_late` the never-late workloads and their permuted twins (`seed-N-perm`).
/// Run it with `BRAID_REF_DUMP_DIR=DIR cargo test --test it reference_join::dump -- --ignored`.
#[test]
#[ignore = "not a check: writes workloads to BRAID_REF_DUMP_DIR"]
fn dump_reference_workloads() {
    let dir = std::env::var("BRAID_REF_DUMP_DIR").expect("BRAID_REF_DUMP_DIR: the folder to write the workloads to");
    let kind = std::env::var("BRAID_REF_DUMP_KIND").unwrap_or_default();
    let cases = env_u64("BRAID_REF_CASES", 200);
    let first = env_u64("BRAID_REF_SEED", 0);
    let write = |w: &Workload, name: String| {
        let d = std::path::Path::new(&dir).join(name);
        std::fs::create_dir_all(&d).unwrap();
        let (_, inputs) = w.write_to(&d);
        let args: Vec<String> = inputs.iter().map(|(n, p)| format!("--input {n}={}", p.display())).collect();
        std::fs::write(d.join("args.txt"), args.join(" ")).unwrap();
        d
    };
    for seed in first..first + cases {
        match kind.as_str() {
            "chain" => {
                write(&gen_chain(seed, 40), format!("seed-{seed}"));
            }
            "never_late" => {
                let w = gen_workload(seed, &GenOpts::never_late(40));
                write(&w, format!("seed-{seed}"));
                write(&permute_arrivals(&w, seed ^ 0xA5A5), format!("seed-{seed}-perm"));
            }
            _ => {
                let w = gen_workload(seed, &GenOpts::everything(60));
                let d = write(&w, format!("seed-{seed}"));
                let e = expected(&w);
                let results: Vec<serde_json::Value> =
                    e.results.iter().flat_map(|((k, l, r), &n)| vec![serde_json::json!([k, l, r]); n]).collect();
                let late: Vec<serde_json::Value> =
                    e.late.iter().flat_map(|((s, q), &n)| vec![serde_json::json!([s, q]); n]).collect();
                let j = &w.ops[0];
                let aliases = serde_json::json!({ "lseq": j.alias_of(0, "seq"), "rseq": j.alias_of(1, "seq") });
                let doc = serde_json::json!({"results": results, "late": late, "aliases": aliases, "notes": w.notes});
                std::fs::write(d.join("expected.json"), doc.to_string()).unwrap();
            }
        }
    }
}
