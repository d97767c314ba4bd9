//! Join-quality counters (issue 15 item 2): `braid_operator_matched_total` and
//! `braid_operator_unmatched_total` of `braid replay --metrics`, over the generated workloads of
//! the reference tests, with 1 and 3 shards.
//!
//! - For every join kind (interval join, window join, cogroup, temporal join) and every input,
//!   once the replay is done: matched + unmatched + late + expired = the rows of that input in
//!   the workload (each row counted once, whatever shard it fell on; a broadcast input's rows
//!   once; expired: `braid_operator_expired_rows_total`). With `ttl` or `evict_oldest` windows
//!   leave early: the rows they held count as expired, and the identity still holds.
//! - For the interval join, matched and unmatched per input also equal a brute-force count: an
//!   on-time row (lateness decided by the reference's own simulation of CONTRACT.md rules 1–8)
//!   is matched when some on-time row of the other input has its key and pairs with it.
//! - Union, connect and absence have no such metrics.
//!
//! Knob: `BRAID_QUALITY_CASES` (workloads per kind, default 24).

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::env_u64;
use common::join_workload::{GenOpts, gen_workload, simulate};
use common::run::{Files, RUN_TIMEOUT, replay_command, run_with_timeout};

/// (metric, operator, input) → value, from Prometheus text.
type Samples = BTreeMap<(String, String, String), u64>;

/// The per-input operator samples of a metrics text.
fn parse_metrics(text: &str) -> Samples {
    let mut samples = Samples::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, rest)) = line.split_once('{') else { continue };
        let Some((labels, value)) = rest.rsplit_once("} ") else { continue };
        let label = |key: &str| {
            labels.split(',').find_map(|kv| kv.strip_prefix(&format!("{key}=\""))?.strip_suffix('"').map(str::to_owned))
        };
        if let (Some(op), Some(input), Ok(v)) = (label("operator"), label("input"), value.parse()) {
            samples.insert((name.to_owned(), op, input), v);
        }
    }
    samples
}

/// Runs `braid replay --metrics` with no outputs; the per-input operator samples.
fn replay_metrics(dir: &Path, config: &Path, inputs: &Files, shards: u32) -> Result<Samples, String> {
    let metrics = dir.join(format!("metrics-{shards}.prom"));
    let mut cmd = replay_command(config, Some(shards), inputs, &[]);
    cmd.arg("--metrics").arg(&metrics);
    let (status, stderr) = run_with_timeout(&mut cmd, RUN_TIMEOUT)?;
    if !status.success() {
        return Err(format!("braid replay exited with {status} (shards {shards}); stderr:\n{stderr}"));
    }
    Ok(parse_metrics(&std::fs::read_to_string(&metrics).map_err(|e| e.to_string())?))
}

fn get(s: &Samples, metric: &str, op: &str, input: &str) -> Option<u64> {
    s.get(&(format!("braid_operator_{metric}_total"), op.to_owned(), input.to_owned())).copied()
}

/// matched + unmatched + late + expired = rows, for `op`'s input `input` with `rows` rows in the
/// workload (they must all have reached the operator, too). Returns (matched, unmatched, late,
/// expired).
fn check_identity(s: &Samples, op: &str, input: &str, rows: usize) -> Result<(u64, u64, u64, u64), String> {
    let need = |metric| get(s, metric, op, input).ok_or(format!("no braid_operator_{metric}_total for {op}/{input}"));
    let (matched, unmatched, late, rows_in) = (need("matched")?, need("unmatched")?, need("late")?, need("rows")?);
    let expired = need("expired_rows")?;
    if rows_in != rows as u64 || matched + unmatched + late + expired != rows as u64 {
        return Err(format!(
            "{op}/{input}: matched {matched} + unmatched {unmatched} + late {late} + expired {expired} should be \
             its {rows} rows (rows_total says {rows_in})"
        ));
    }
    Ok((matched, unmatched, late, expired))
}

/// Runs `check` on `cases` seeds with 1 and 3 shards; panics listing every failure.
fn for_cases(what: &str, check: impl Fn(u64, u32) -> Result<(), String>) {
    let cases = env_u64("BRAID_QUALITY_CASES", 24);
    let failures: Vec<String> = (0..cases)
        .flat_map(|seed| [1, 3].map(|shards| (seed, shards)))
        .filter_map(|(seed, shards)| check(seed, shards).err().map(|e| format!("seed {seed}, {shards} shards: {e}")))
        .collect();
    assert!(failures.is_empty(), "{what}: {} of {} runs failed:\n{}", failures.len(), 2 * cases, failures.join("\n"));
}

#[test]
fn interval_join_counts_equal_brute_force_and_add_up() {
    let opts = GenOpts::everything(60);
    // matched, unmatched and late rows over all runs: the workloads must have all three.
    let seen = std::cell::Cell::new([0u64; 3]);
    for_cases("interval join", |seed, shards| {
        let w = gen_workload(seed, &opts);
        let j = &w.ops[0];
        let (li, ri) = (w.stream_index(&j.left).unwrap(), w.stream_index(&j.right).unwrap());
        let sim = simulate(&w, 0);
        let on_time = |si: usize| -> Vec<&common::join_workload::Row> {
            let lines = w.streams[si].lines.iter().enumerate();
            lines.filter(|(ln, _)| !sim.late_lines.contains(&(si, *ln))).filter_map(|(_, l)| l.row()).collect()
        };
        let (ls, rs) = (on_time(li), on_time(ri));
        let left_matched = ls.iter().filter(|l| rs.iter().any(|r| l.key == r.key && j.cond(l.ts, r.ts))).count();
        let right_matched = rs.iter().filter(|r| ls.iter().any(|l| l.key == r.key && j.cond(l.ts, r.ts))).count();
        let want = [(li, left_matched, ls.len()), (ri, right_matched, rs.len())];

        let dir = tempfile::tempdir().unwrap();
        let (config, inputs) = w.write_to(dir.path());
        let s = replay_metrics(dir.path(), &config, &inputs, shards)?;
        for (si, matched, on_time) in want {
            let stream = &w.streams[si];
            let got = check_identity(&s, &j.name, &stream.name, stream.rows().count())?;
            let [m, u, l] = seen.get();
            seen.set([m + got.0, u + got.1, l + got.2]);
            let want = (matched as u64, (on_time - matched) as u64);
            if (got.0, got.1) != want {
                return Err(format!(
                    "{}/{}: (matched, unmatched) = {:?}, brute force {want:?}\n{}",
                    j.name,
                    stream.name,
                    (got.0, got.1),
                    w.dump()
                ));
            }
        }
        Ok(())
    });
    let seen = seen.get();
    assert!(seen.iter().all(|&n| n > 0), "matched, unmatched, late over all runs: {seen:?}");
}

#[test]
fn window_join_and_cogroup_counts_add_up() {
    for_cases("window join and cogroup", |seed, shards| {
        let dir = tempfile::tempdir().unwrap();
        let (config, inputs, rows) = crate::reference_windows::write_workload(seed, dir.path());
        let s = replay_metrics(dir.path(), &config, &inputs, shards)?;
        for op in ["j", "g"] {
            for (input, rows) in ["l", "r"].into_iter().zip(rows) {
                check_identity(&s, op, input, rows)?;
            }
        }
        Ok(())
    });
}

#[test]
fn temporal_join_counts_add_up() {
    for_cases("temporal join", |seed, shards| {
        let dir = tempfile::tempdir().unwrap();
        let (config, inputs, streams) =
            crate::reference_union_temporal_absence::write_temporal_workload(seed, dir.path());
        let s = replay_metrics(dir.path(), &config, &inputs, shards)?;
        for (input, rows) in &streams {
            check_identity(&s, "op", input, *rows)?;
        }
        Ok(())
    });
}

/// The reference workloads of the window kinds with `ttl = "150ms"` on `j` and `g` (even seeds)
/// or a 4 KiB state budget with `evict_oldest` (odd seeds): windows leave early, the rows they
/// held count as expired, and the identity holds per input. Over all runs rows must have expired.
#[test]
fn window_kinds_count_the_rows_of_dropped_windows_as_expired() {
    let expired = std::cell::Cell::new(0u64);
    for_cases("window join and cogroup under ttl and evict_oldest", |seed, shards| {
        let dir = tempfile::tempdir().unwrap();
        let (config, inputs, rows) = crate::reference_windows::write_workload(seed, dir.path());
        let text = std::fs::read_to_string(&config).unwrap();
        let bounded = if seed % 2 == 0 {
            let ttl = |op: &str| format!("[operators.{op}]\nttl = \"150ms\"\n");
            text.replace("[operators.j]\n", &ttl("j")).replace("[operators.g]\n", &ttl("g"))
        } else {
            text.replacen("[runtime]\n", "[runtime]\nstate_budget = \"4KiB\"\non_state_full = \"evict_oldest\"\n", 1)
        };
        assert_ne!(bounded, text);
        std::fs::write(&config, bounded).unwrap();
        let s = replay_metrics(dir.path(), &config, &inputs, shards)?;
        for op in ["j", "g"] {
            for (input, rows) in ["l", "r"].into_iter().zip(rows) {
                expired.set(expired.get() + check_identity(&s, op, input, rows)?.3);
            }
        }
        Ok(())
    });
    assert!(expired.get() > 0, "no window expired or was evicted in any run");
}

/// The golden ttl cases, counted by hand (their READMEs): the interval join's rows leave as
/// themselves, the window join's inside its windows' would-be results; both add up.
#[test]
fn golden_ttl_cases_count_expired_rows_per_input() {
    let cases = [
        ("ttl_interval_join", "effect", [("command", (0, 1, 0, 5)), ("status", (0, 1, 0, 2))]),
        ("ttl_window_join", "w", [("l", (1, 1, 0, 2)), ("r", (1, 1, 0, 2))]),
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    for (case, op, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let inputs: Files = want
            .iter()
            .map(|(stream, _)| (stream.to_string(), root.join(case).join(format!("in/{stream}.jsonl"))))
            .collect();
        for shards in [1, 3] {
            let s = replay_metrics(dir.path(), &root.join(case).join("config.toml"), &inputs, shards).unwrap();
            for (stream, counts) in want {
                let lines = std::fs::read_to_string(&inputs.iter().find(|i| i.0 == stream).unwrap().1).unwrap();
                let got = check_identity(&s, op, stream, lines.lines().count()).unwrap();
                assert_eq!(got, counts, "{case} {op}/{stream}, {shards} shards: (matched, unmatched, late, expired)");
            }
        }
    }
}

/// Only join kinds have the counters: a union has none.
#[test]
fn only_join_kinds_have_quality_counters() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[streams.a]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\n\
                fields = { k = \"string\", ts = \"int\" }\n\
                [operators.u]\nkind = \"union\"\ninputs = [\"a\"]\n";
    let config = common::run::write_file(dir.path(), "u.toml", text);
    let inputs = common::run::write_inputs(dir.path(), [("a", "{\"k\":\"x\",\"ts\":1}\n")]);
    let s = replay_metrics(dir.path(), &config, &inputs, 1).unwrap();
    assert_eq!(get(&s, "rows", "u", "a"), Some(1));
    assert_eq!((get(&s, "matched", "u", "a"), get(&s, "unmatched", "u", "a")), (None, None));
    assert_eq!(get(&s, "expired_rows", "u", "a"), None);
}
