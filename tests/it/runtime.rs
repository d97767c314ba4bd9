#![allow(clippy::unwrap_used)]
//! The shard runtime (`src/shard/`) against the oracle it must reproduce.
//!
//! `braid replay` runs on shard threads; `common::oracle` is replay's time semantics written
//! again from CONTRACT.md, single-threaded, stepping through every tick and simulating the same
//! shards, sharing no time-rule code with the runtime. For every generated workload
//! (`common::runtime_workload`) the runtime with 1, 2, 3 and 4 shards — skipping ticks or
//! stepping through every one, by turns — must write exactly the lines of the oracle with as
//! many shards (as multisets, `_id`s included) to every operator output, every
//! `OPERATOR.late` and `dead_letter`:
//!
//! - every operator kind alone, threshold and temporal joins also with a broadcast right side;
//! - chains of two or three operators re-keyed between them (`key = "g"`, then `key = "k"`), so
//!   results cross the shard-to-shard exchange, with every kind downstream and a union of two
//!   operators; a chain of 8 operators (the deepest allowed; 9 is a config error);
//! - order-sensitive operators (threshold's latest limit, reconcile's smallest (ts, arrival),
//!   temporal join's later arrival, cogroup's first/last) downstream of operators emitting tied
//!   results (equal `_ts`, one downstream key) on every shard in one tick;
//! - the order within one activation: an operator reading one upstream on both inputs (left
//!   copy first), a diamond (rows one hop away before rows two hops away), a custom `CoProcess`
//!   answering each broadcast row on every shard (ranked as the oracle ranks them) and setting
//!   processing-time timers;
//! - tiny rings (64 KiB feeder, collector and exchange rings; bursts several times an exchange
//!   ring), through `braid::shard::Runtime` in process, against the oracle fed alike.
//!
//! Coverage floors: the workloads must produce downstream results, rows that change shard when
//! re-keyed, and groups of tied upstream results from different shards at one downstream key.
//! Also: the monoio driver each shard reports (`--metrics`, `MONOIO_FORCE_LEGACY_DRIVER`), and
//! runtime problems ending in clear errors (too many shards, a chain too deep, frames too large
//! for a ring).
//!
//! Two bugs these tests found stay covered: `shard_count_changes_no_output` (tied results reached
//! a downstream key in a shard-count-dependent order) and
//! `a_result_too_large_for_the_exchange_ring_is_a_clear_error` (the runtime hung when shard 1
//! failed while shard 0 waited for it).
//!
//! Ring files go to `/dev/shm` when there is one (a replay's private state directory does too).
//! Knobs: `BRAID_RUNTIME_CASES` (a multiplier of the case counts, default 1; 0 runs one case
//! per test), `BRAID_RUNTIME_SEED` (first seed). A failing workload is saved under
//! `CARGO_TARGET_TMPDIR/runtime-…/` with its config and inputs.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use braid::operator::ExpiryReason;
use braid::plan::Plan;
use braid::record::id::key_hash;
use braid::record::input::InputRows;
use braid::record::{Key, Row};
use braid::replay::ReplayArgs;
use braid::shard::Emit;
use braid::shard::{Runtime, RuntimeError, RuntimeOptions};
use common::multiset::{count, multiset_diff};
use common::oracle::Oracle;
use common::rng::Rng;
use common::run::{Files, braid, output_files, repro_dir, run_with_timeout, write_file, write_inputs};
use common::runtime_workload::{Kind, Profile, Workload, gen_chain, gen_deep, gen_diamond, gen_self_join, gen_single};
use common::{BASE_TS, env_u64};

/// Shard counts every workload runs with.
const SHARDS: [usize; 4] = [1, 2, 3, 4];

/// Case counts scaled by `BRAID_RUNTIME_CASES` (at least one).
fn cases(default: u64) -> u64 {
    (default * env_u64("BRAID_RUNTIME_CASES", 1)).max(1)
}

fn first_seed() -> u64 {
    env_u64("BRAID_RUNTIME_SEED", 0)
}

// ------------------------------------------------------------------------- replay in process ---

/// A fresh folder for a runtime's ring files: in `/dev/shm` when there is one (creating rings
/// on a disk costs an msync each, a third of a small replay's time), else the temporary folder.
fn ring_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("braid-runtime-test-")
        .tempdir_in(braid::storage::mapped_file::scratch_base())
        .unwrap()
}

/// Sorted lines of every output, by name.
type Lines = BTreeMap<String, Vec<String>>;

struct Case<'w> {
    w: &'w Workload,
    dir: tempfile::TempDir,
    plan: Plan,
    inputs: Files,
    outputs: Vec<String>,
}

impl<'w> Case<'w> {
    fn new(w: &'w Workload) -> Case<'w> {
        Case::with(w, |_| {})
    }

    /// With the plan changed by `edit` (a custom connect function, say).
    fn with(w: &'w Workload, edit: impl FnOnce(&mut Plan)) -> Case<'w> {
        let dir = tempfile::tempdir().unwrap();
        let mut plan = braid::config::parse("gen.toml", &w.config)
            .unwrap_or_else(|e| panic!("generated config is invalid: {e}\n{}", w.dump()));
        edit(&mut plan);
        let inputs = write_inputs(dir.path(), w.inputs.iter().map(|(n, t)| (n.as_str(), t.as_str())));
        Case { w, dir, plan, inputs, outputs: w.outputs() }
    }

    /// One in-process replay with `shards` shards: the oracle (which steps through every tick),
    /// or the runtime.
    fn run(&self, shards: usize, reference: bool, every_tick: bool) -> Result<Lines, String> {
        let prefix = format!("{}-{shards}-{every_tick}", if reference { "ref" } else { "rt" });
        let names: Vec<&str> = self.outputs.iter().map(String::as_str).collect();
        let files = output_files(self.dir.path(), &prefix, &names);
        if reference {
            common::oracle::replay(&self.plan, shards, &self.inputs, &files);
        } else {
            let args = ReplayArgs {
                shards,
                every_tick,
                inputs: &self.inputs,
                outputs: &files,
                sort_run_bytes: braid::replay::input::SORT_RUN_BYTES,
            };
            let rings = ring_dir();
            let mut plan = self.plan.clone();
            plan.runtime.state_dir = Some(rings.path().to_owned());
            braid::replay::run(&plan, &args).map_err(|e| format!("replay ({prefix}): {e}"))?;
        }
        let mut lines = Lines::new();
        for (name, path) in files {
            let text = std::fs::read_to_string(&path).unwrap();
            let mut rows: Vec<String> = text.lines().map(str::to_owned).collect();
            rows.sort();
            lines.insert(name, rows);
        }
        Ok(lines)
    }

    /// Checks the runtime with every shard count against the oracle with as many
    /// (`every_tick(shards)`: whether the runtime steps through every tick). The oracle's
    /// outputs with one shard, and the shard counts whose oracle outputs differ from them.
    fn check(&self, every_tick: impl Fn(usize) -> bool) -> Result<(Lines, Vec<usize>), String> {
        let mut first = None;
        let mut dependent = Vec::new();
        for shards in SHARDS {
            let reference = self.run(shards, true, false)?;
            let every_tick = every_tick(shards);
            let got = self.run(shards, false, every_tick)?;
            let mut diff = String::new();
            for (name, want) in &reference {
                let have = &got[name];
                if have != want {
                    let d =
                        multiset_diff("oracle", &count(want.iter().cloned()), "runtime", &count(have.iter().cloned()));
                    diff += &format!("output {name}:\n{d}");
                }
            }
            if !diff.is_empty() {
                let saved = self.save();
                return Err(format!(
                    "{}: runtime with {shards} shards (every_tick {every_tick}) differs from the oracle \
                     with {shards} (saved in {})\n{diff}\n{}",
                    self.w.label,
                    saved.display(),
                    self.w.dump()
                ));
            }
            match &first {
                None => first = Some(reference),
                Some(one) if *one != reference => dependent.push(shards),
                Some(_) => {}
            }
        }
        Ok((first.unwrap(), dependent))
    }

    fn save(&self) -> PathBuf {
        let name: String =
            self.w.label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).take(60).collect();
        let dir = repro_dir(&format!("runtime-{name}"));
        write_file(&dir, "braid.toml", &self.w.config);
        for (stream, text) in &self.w.inputs {
            write_file(&dir, &format!("{stream}.jsonl"), text);
        }
        dir
    }
}

// ------------------------------------------------------------------------------- coverage ---

#[derive(Debug, Default)]
struct Coverage {
    cases: usize,
    results: usize,
    late: usize,
    dead_letters: usize,
    /// Results of operators reading another operator.
    downstream: usize,
    /// Cases with downstream results.
    cases_downstream: usize,
    /// Re-keyed results whose new key lives on another shard than their old one (2, 3 or 4
    /// shards, counted once).
    exchanged: usize,
    /// Groups of re-keyed results with one new key and one `_ts` coming from at least two
    /// shards (of 2, 3 or 4): ties a downstream operator must break as the oracle does.
    tie_groups: usize,
    cases_with_ties: usize,
    /// Workloads whose outputs (the oracle's, hence the runtime's) change with the
    /// shard count: see `shard_count_changes_no_output`.
    shard_dependent: Vec<String>,
}

fn json_key(v: &Value) -> Option<Key> {
    match v {
        Value::String(s) => Some(Key::Str(s.as_str().into())),
        Value::Number(n) => n.as_i64().map(Key::Int),
        _ => None,
    }
}

fn shard_of(key: &Key, shards: u64) -> u64 {
    key_hash(key) % shards
}

impl Coverage {
    fn add(&mut self, w: &Workload, out: &Lines) {
        self.cases += 1;
        for (name, _) in &w.ops {
            self.results += out[name].len();
            self.late += out[&format!("{name}.late")].len();
        }
        self.dead_letters += out["dead_letter"].len();
        let readers: BTreeSet<&String> = w.edges.iter().map(|(_, r)| r).collect();
        let downstream: usize = readers.iter().map(|r| out[*r].len()).sum();
        self.downstream += downstream;
        self.cases_downstream += usize::from(downstream > 0);
        let mut ties = 0;
        for r in &w.rekeyed {
            let mut groups: BTreeMap<(String, i64), Vec<Key>> = BTreeMap::new();
            for line in &out[&r.op] {
                let row: Value = serde_json::from_str(line).unwrap();
                let (Some(from), Some(to)) = (json_key(&row[&r.from]), json_key(&row[&r.to])) else { continue };
                if [2, 3, 4].iter().any(|&n| shard_of(&from, n) != shard_of(&to, n)) {
                    self.exchanged += 1;
                }
                groups.entry((row[&r.to].to_string(), row["_ts"].as_i64().unwrap())).or_default().push(from);
            }
            for from in groups.values().filter(|g| g.len() > 1) {
                let spread =
                    [2, 3, 4].iter().any(|&n| from.iter().map(|k| shard_of(k, n)).collect::<BTreeSet<_>>().len() > 1);
                ties += usize::from(spread);
            }
        }
        self.tie_groups += ties;
        self.cases_with_ties += usize::from(ties > 0);
    }
}

/// Checks every workload; the coverage of their reference outputs. Panics with the first
/// mismatch.
fn check_all(workloads: impl IntoIterator<Item = Workload>) -> Coverage {
    let mut coverage = Coverage::default();
    for (i, w) in workloads.into_iter().enumerate() {
        let case = Case::new(&w);
        // Every shard count skips ticks in some cases and steps through every one in others.
        let (out, dependent) = case.check(|shards| (i + shards) % 2 == 1).unwrap_or_else(|e| panic!("{e}"));
        coverage.add(&w, &out);
        if !dependent.is_empty() {
            coverage.shard_dependent.push(w.label.clone());
        }
    }
    // CONTRACT.md "Replay": the same output whatever the shard count.
    assert!(coverage.shard_dependent.is_empty(), "outputs change with the shard count: {:?}", coverage.shard_dependent);
    coverage
}

// ---------------------------------------------------------------------------- equivalence ---

#[test]
fn every_operator_kind_alone_matches_the_reference() {
    let n = cases(4);
    let mut per_kind = Vec::new();
    let mut broadcast = 0;
    let mut total = Coverage::default();
    for kind in Kind::ALL {
        let workloads: Vec<Workload> = (0..n).map(|i| gen_single(first_seed() + i, kind)).collect();
        broadcast += workloads.iter().filter(|w| w.config.contains("right = \"bc\"")).count();
        let c = check_all(workloads);
        per_kind.push((kind.name(), c.results, c.late));
        total.results += c.results;
        total.late += c.late;
        total.dead_letters += c.dead_letters;
    }
    eprintln!("single operators: (kind, results, late) {per_kind:?}; {broadcast} with a broadcast right side");
    if n >= 4 {
        for (kind, results, _) in &per_kind {
            assert!(*results > 0, "{kind}: the workloads should produce results");
        }
        assert!(total.late > 0 && total.dead_letters > 0, "late rows and dead letters should occur: {total:?}");
        assert!(broadcast > 0, "some workloads should read a broadcast stream");
    }
}

#[test]
fn chains_match_the_reference() {
    let n = cases(24);
    // Every downstream kind in turn; the upstream kind drawn.
    let workloads: Vec<Workload> = (0..n)
        .map(|i| gen_chain(first_seed() + i, Profile::DEFAULT, None, Some(Kind::ALL[i as usize % Kind::ALL.len()])))
        .collect();
    let three = workloads.iter().filter(|w| w.ops.iter().any(|(o, _)| o == "y")).count();
    let advancing = workloads.iter().filter(|w| w.config.contains("idle_advance = true")).count();
    let idle = workloads.iter().filter(|w| !w.config.contains("idle_timeout = \"0ms\"")).count();
    let twice = workloads.iter().filter(|w| w.label.contains("(u ⋈ u)")).count();
    let c = check_all(workloads);
    eprintln!(
        "chains: {three} of three operators, {twice} reading u twice, {advancing} advancing idle \
         operators, {idle} with every stream able to go idle; {c:?}"
    );
    if n >= 24 {
        assert!(c.cases_downstream * 4 >= c.cases * 3, "most chains should produce downstream results: {c:?}");
        assert!(c.exchanged > 100, "re-keyed results should cross shards: {c:?}");
        assert!(c.cases_with_ties * 3 >= c.cases, "tied upstream results should be common: {c:?}");
        assert!(three > 4 && twice > 0, "three-operator chains and self-joins should occur");
        assert!(advancing > 0 && advancing < c.cases && idle > 0, "idle_advance on and off, idle streams");
    }
}

#[test]
fn order_sensitive_operators_break_ties_of_upstream_results_as_the_oracle_does() {
    let n = cases(4);
    let ups = [Kind::Window, Kind::Cogroup, Kind::Interval, Kind::Temporal, Kind::Union];
    let downs = [Kind::Temporal, Kind::Threshold, Kind::Reconcile, Kind::Cogroup];
    let mut workloads = Vec::new();
    for i in 0..n {
        for (j, down) in downs.iter().enumerate() {
            let up = ups[(i as usize + j) % ups.len()];
            workloads.push(gen_chain(first_seed() + 1000 + i * 10 + j as u64, Profile::TIES, Some(up), Some(*down)));
        }
    }
    let c = check_all(workloads);
    eprintln!("ties: {c:?}");
    if n >= 4 {
        assert!(c.cases_with_ties * 2 >= c.cases, "most workloads should tie upstream results: {c:?}");
        assert!(c.tie_groups > 30 && c.downstream > 100, "{c:?}");
    }
}

/// An operator reading one upstream on both inputs gets each of its results twice at one
/// position of the order: left input first, as the oracle delivers them.
#[test]
fn a_self_join_takes_each_upstream_result_left_input_first() {
    let n = cases(4);
    // A union re-keys every row at once: many results per event, both copies of each pending
    // beside others, where a heap ordered by position alone may pop the right copy first.
    let ups = [Kind::Union, Kind::Window, Kind::Union, Kind::Cogroup, Kind::Interval];
    let downs = [Kind::Threshold, Kind::Reconcile, Kind::Temporal, Kind::Cogroup, Kind::Interval];
    let mut workloads = Vec::new();
    for i in 0..n {
        for (j, down) in downs.iter().enumerate() {
            let up = ups[(i as usize + j) % ups.len()];
            workloads.push(gen_self_join(first_seed() + 2000 + i * 10 + j as u64, Profile::TIES, up, *down));
        }
    }
    let c = check_all(workloads);
    eprintln!("self-joins: {c:?}");
    assert!(c.downstream > 0, "the self-joins should produce results: {c:?}");
}

/// An operator reading an upstream both directly and through another operator gets, for one
/// activation, every row one hop away before any row two hops away (breadth first).
#[test]
fn a_diamond_takes_rows_breadth_first() {
    let n = cases(4);
    let ups = [Kind::Window, Kind::Cogroup, Kind::Interval, Kind::Union];
    let lasts = [Kind::Threshold, Kind::Reconcile, Kind::Temporal, Kind::Cogroup];
    let mut workloads = Vec::new();
    for i in 0..n {
        for (j, last) in lasts.iter().enumerate() {
            let up = ups[(i as usize + j) % ups.len()];
            workloads.push(gen_diamond(first_seed() + 4000 + i * 10 + j as u64, Profile::TIES, up, *last));
        }
    }
    let c = check_all(workloads);
    eprintln!("diamonds: {c:?}");
    assert!(c.downstream > 0, "the diamonds should produce results: {c:?}");
}

/// A custom `CoProcess` that answers each broadcast row on every shard.
mod spread {
    use braid::operator::OperatorSpec;
    use braid::operator::ResultKind;
    use braid::operator::connect::{CoProcess, Context, Fired, Timer};
    use braid::record::id::key_hash;
    use braid::record::{Key, Row, Value};
    use braid::time::Time;

    /// Counts the left rows its instance took. Each broadcast right row makes every instance
    /// (one per shard) emit its count under the key `all`: one result per shard at one position
    /// of the single-threaded order (shard 0's first), told apart only by the shard in their
    /// tags' path. Each left row also sets a processing-time timer (some due between ticks,
    /// holding the output watermark at its ts) that emits the count as `left_only` of its key.
    #[derive(Default)]
    pub struct Spread {
        seen: i64,
    }

    fn result(kind: ResultKind, key: Key, ts: i64, seen: i64, id: u64) -> Row {
        let values = Box::new([key.to_value(), Value::Int(seen), Value::Str(kind.as_str().into())]);
        Row { ts, key_hash: key_hash(&key), key, id, values }
    }

    impl CoProcess for Spread {
        fn on_left(&mut self, row: Row, ctx: &mut Context<'_>) {
            self.seen += 1;
            let delay = [50, 200, 333, 1000][(self.seen % 4) as usize];
            let timer = Timer::processing(ctx.processing_time() + delay, row.ts as u64).holding(Time::ms(row.ts));
            ctx.timers.set(&row.key, row.key_hash, timer);
        }

        fn on_right(&mut self, row: Row, ctx: &mut Context<'_>) {
            let id = ctx.out.id(ResultKind::Match).u64(row.id).u64(self.seen as u64).finish();
            ctx.out
                .emit_row(ResultKind::Match, result(ResultKind::Match, Key::Str("all".into()), row.ts, self.seen, id));
        }

        fn on_timer(&mut self, fired: Fired, ctx: &mut Context<'_>) {
            // The processing time the timer sees is part of the result's `_id`: it must be the
            // oracle's.
            let now = ctx.processing_time() as u64;
            let id = ctx.out.id(ResultKind::LeftOnly).u64(fired.key_hash).u64(fired.timer.tag).u64(now).finish();
            let row = result(ResultKind::LeftOnly, fired.key, fired.timer.tag as i64, self.seen, id);
            ctx.out.emit_row(ResultKind::LeftOnly, row);
        }
    }

    /// Operator `u` (a threshold in the config, so that its right side may be broadcast) runs
    /// [`Spread`].
    pub fn install(plan: &mut braid::plan::Plan) {
        let op = plan.operators.iter_mut().find(|o| o.name == "u").unwrap();
        let OperatorSpec::Connect(spec) = op.spec.clone() else { panic!("u is a connect operator") };
        op.spec = OperatorSpec::Connect(spec.with_function(|| Box::<Spread>::default()));
    }
}

/// A custom function's results for one broadcast row, one per shard, reach a downstream
/// threshold ranked by the key they came from (origin rank) as the oracle ranks them, and its
/// processing-time timers fire as in the oracle.
#[test]
fn results_of_a_broadcast_row_on_every_shard_arrive_ranked_as_in_the_oracle() {
    let stream = |name: &str, key: &str, k: &str| {
        format!(
            "[streams.{name}]\nkey = \"{key}\"\ntime = {{ field = \"ts\", unit = \"ms\" }}\nmax_out_of_orderness = \"100ms\"\n\
             fields = {{ {k} = \"string\", ts = \"int\", v = \"int\", seq = \"int\" }}\n"
        )
    };
    let config = stream("a", "k", "k")
        + &stream("bc", "*", "k")
        + &stream("c", "g", "g")
        + "[operators.u]\nkind = \"connect\"\nfunction = \"threshold\"\nleft = \"a\"\nright = \"bc\"\n\
           value = \"v\"\nlimit = \"v\"\nselect = [\"left.v\"]\n\
           [operators.x]\nkind = \"connect\"\nfunction = \"threshold\"\nleft = \"c\"\nright = \"u\"\n\
           value = \"v\"\nlimit = \"v\"\nselect = [\"left.seq\", \"right.v AS seen\", \"right._kind AS from\"]\n";
    for seed in 0..cases(3) {
        let mut rng = Rng::new(first_seed() + 3000 + seed);
        let (mut a, mut bc, mut c) = (String::new(), String::new(), String::new());
        let mut seq = 0;
        let mut line = |out: &mut String, field: &str, key: String, ts: i64, arrival: i64, v: i64| {
            seq += 1;
            *out += &format!("{{\"{field}\":\"{key}\",\"ts\":{ts},\"v\":{v},\"seq\":{seq},\"arrival\":{arrival}}}\n");
        };
        let mut t = BASE_TS;
        for i in 0..60 {
            t += rng.pick(&[0, 50, 100, 150]);
            let arrival = t + rng.pick(&[0, 0, 30, 120]);
            line(&mut a, "k", format!("k{}", rng.below(8)), t, arrival, 0);
            if i % 5 == 4 {
                line(&mut bc, "k", "any".into(), t, arrival + 10, 0);
                let g = if rng.one_in(3) { format!("k{}", rng.below(8)) } else { "all".into() };
                line(&mut c, "g", g, t + 20, arrival + 20, 1000);
            }
        }
        let w = Workload {
            label: format!("custom function seed {seed}: results of broadcast rows feeding a threshold"),
            config: config.clone(),
            inputs: vec![("a".into(), a), ("bc".into(), bc), ("c".into(), c)],
            ops: vec![("u".into(), Kind::Threshold), ("x".into(), Kind::Threshold)],
            edges: vec![("u".into(), "x".into())],
            rekeyed: Vec::new(),
        };
        let case = Case::with(&w, spread::install);
        let (out, _) =
            case.check(|shards| (seed as usize + shards).is_multiple_of(2)).unwrap_or_else(|e| panic!("{e}"));
        let from_broadcast = out["x"].iter().filter(|l| l.contains("\"from\":\"match\"")).count();
        let from_timers = out["x"].iter().filter(|l| l.contains("\"from\":\"left_only\"")).count();
        assert!(from_broadcast > 3 && from_timers > 0, "x should take limits of both kinds: {:?}", out["x"]);
    }
}

#[test]
fn a_chain_of_eight_operators_matches_the_reference_and_nine_is_a_config_error() {
    for seed in 0..cases(2) {
        let w = gen_deep(first_seed() + seed, 8);
        let c = check_all([w]);
        assert!(c.exchanged > 0, "the deep chain should re-key across shards: {c:?}");
    }
    let nine = gen_deep(first_seed(), 9);
    let errors = braid::config::parse("nine.toml", &nine.config).map(|_| ()).unwrap_err().to_string();
    assert!(errors.contains("makes a chain of more than 8 operators"), "{errors}");
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(dir.path(), "nine.toml", &nine.config);
    let mut validate = braid();
    validate.arg("validate").arg("--config").arg(&config);
    let (status, stderr) = run_with_timeout(&mut validate, Duration::from_secs(30)).unwrap();
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("makes a chain of more than 8 operators"), "{stderr}");
}

/// CONTRACT.md "Replay": a replay gives the same output whatever the shard count (DESIGN.md:
/// "results never depend on the shard count"). At a tick, `u`'s two results (keys k2, k1, equal
/// `_ts` 999) are re-keyed to one downstream key, where threshold's "latest limit" tells their
/// order apart. Emitted shard by shard, that order would depend on how k1 and k2 fall on shards;
/// what all instances emit at once is ranked by the key it came from instead (oracle and runtime).
#[test]
fn shard_count_changes_no_output() {
    let config = "\
[streams.a]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\nfields = { k = \"string\", g = \"string\", ts = \"int\", v = \"int\" }\n\
[streams.b]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\nfields = { k = \"string\", ts = \"int\" }\n\
[streams.c]\nkey = \"g\"\ntime = { field = \"ts\", unit = \"ms\" }\nfields = { g = \"string\", ts = \"int\", v = \"int\" }\n\
[operators.u]\nkind = \"window_join\"\nleft = \"a\"\nright = \"b\"\nwindow = { kind = \"tumbling\", size = \"1s\" }\n\
select = [\"left.g\", \"left.v\"]\nkey = \"g\"\n\
[operators.x]\nkind = \"connect\"\nfunction = \"threshold\"\nleft = \"c\"\nright = \"u\"\nvalue = \"v\"\nlimit = \"v\"\n\
select = [\"left.v\", \"right.k AS limit_from\", \"right.v AS limit\"]\n";
    let a = "{\"k\":\"k2\",\"g\":\"g\",\"ts\":100,\"v\":1}\n{\"k\":\"k1\",\"g\":\"g\",\"ts\":100,\"v\":2}\n\
             {\"k\":\"z\",\"g\":\"z\",\"ts\":2000,\"v\":0}\n";
    let b = "{\"k\":\"k2\",\"ts\":100}\n{\"k\":\"k1\",\"ts\":100}\n{\"k\":\"z\",\"ts\":2000}\n";
    let c = "{\"g\":\"g\",\"ts\":3000,\"v\":9}\n";
    let w = Workload {
        label: "tied window results feeding a threshold".into(),
        config: config.into(),
        inputs: vec![("a".into(), a.into()), ("b".into(), b.into()), ("c".into(), c.into())],
        ops: vec![("u".into(), Kind::Window), ("x".into(), Kind::Threshold)],
        edges: vec![("u".into(), "x".into())],
        rekeyed: Vec::new(),
    };
    let case = Case::new(&w);
    let one = case.run(1, true, false).unwrap();
    for shards in [2, 3] {
        for reference in [true, false] {
            let other = case.run(shards, reference, false).unwrap();
            assert_eq!(one["x"], other["x"], "x with 1 shard vs {shards} (oracle: {reference})");
        }
    }
}

// ------------------------------------------------------------- the runtime driven in process ---

/// Results and late rows as the oracle or a runtime emits them, as text (`Row`'s Debug: every
/// field, the id included).
#[derive(Default)]
struct Collected(Vec<String>);

impl Emit for Collected {
    fn result(&mut self, operator: usize, row: &Row, _after_barrier: bool) {
        self.0.push(format!("{operator} result {row:?}"));
    }

    fn late(&mut self, operator: usize, input: usize, row: &Row, _after_barrier: bool) {
        self.0.push(format!("{operator} late {input} {row:?}"));
    }

    fn expired(&mut self, operator: usize, reason: ExpiryReason, input: Option<usize>, row: &Row, _: bool) {
        self.0.push(format!("{operator} expired {reason:?} {input:?} {row:?}"));
    }

    fn too_large(&mut self, operator: usize, raw: &str) {
        self.0.push(format!("{operator} too_large {raw}"));
    }
}

/// The rows of `inputs` in processing order, decoded as replay decodes them: (stream, row,
/// arrival); the processing time of the first line. The inputs hold no bad line.
fn decoded_rows(plan: &Plan, inputs: &Files) -> (Vec<(usize, Row, i128)>, i128) {
    use braid::replay::input::{Content, Inputs, Order, SORT_RUN_BYTES};
    let files: Vec<(usize, &Path)> = inputs.iter().map(|(n, p)| (plan.stream(n).unwrap(), p.as_path())).collect();
    let spill = tempfile::tempdir().unwrap();
    let mut read = Inputs::open(&files, &plan.streams, spill.path(), SORT_RUN_BYTES, Order::Scan).unwrap();
    let start = read.peek_arrival().unwrap().map_or(0, i128::from);
    let mut ids = InputRows::default();
    let mut rows = Vec::new();
    while let Some(line) = read.next().unwrap() {
        let def = &plan.streams[line.stream];
        let Content::Row(fields) = &line.content else { panic!("a bad line: {line:?}") };
        let ts = fields.ts.unwrap_or(line.arrival);
        let values = fields.to_values(std::str::from_utf8(line.bytes).unwrap());
        braid::record::decode::check_time_window(ts, line.arrival, def.max_age, def.max_skew).unwrap();
        let row = braid::source::row_of(def, values, ts, &mut ids);
        rows.push((line.stream, row, i128::from(line.arrival)));
    }
    (rows, start)
}

/// The oracle's outputs for `rows`, sorted.
fn oracle_outputs(plan: &Plan, rows: &[(usize, Row, i128)], start: i128, shards: usize) -> Vec<String> {
    let mut out = Collected::default();
    let mut oracle = Oracle::new(plan, shards, start);
    for (stream, row, arrival) in rows {
        oracle.ingest(*stream, row.clone(), *arrival, &mut out);
    }
    oracle.finish(&mut out);
    out.0.sort();
    out.0
}

/// The runtime's outputs for `rows` (sorted) and the monoio driver of each shard.
fn runtime_outputs(
    plan: &Plan,
    rows: &[(usize, Row, i128)],
    start: i128,
    options: &RuntimeOptions<'_>,
) -> Result<(Vec<String>, Vec<&'static str>), RuntimeError> {
    let mut out = Collected::default();
    let figures = runtime_run(plan, rows, start, options, &mut out)?;
    out.0.sort();
    Ok((out.0, figures.drivers))
}

/// Runs `rows` through a runtime into `out`; its figures.
fn runtime_run(
    plan: &Plan,
    rows: &[(usize, Row, i128)],
    start: i128,
    options: &RuntimeOptions<'_>,
    out: &mut Collected,
) -> Result<braid::shard::Figures, RuntimeError> {
    let mut runtime = Runtime::start(plan, options, start)?;
    for (stream, row, arrival) in rows {
        runtime.advance_to(*arrival, out)?;
        runtime.ingest(*stream, row, *arrival, out)?;
    }
    runtime.finish(out)
}

/// Which driver monoio picks in this process: io_uring when its probe passes (it honours
/// `MONOIO_FORCE_LEGACY_DRIVER`) and a ring can be built, as `src/shard/driver.rs` decides.
fn expected_driver() -> &'static str {
    let uring = monoio::utils::detect_uring() && monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().build().is_ok();
    if uring { "io_uring" } else { "legacy" }
}

const PAD: usize = 200;

/// Streams `a`, `b` (keyed by `k`), `c`, `e` (by `g`), rows padded to make frames big, and
/// three chains re-keyed by `g`: a union of `a` and `b` feeding a threshold's limits, a tumbling
/// window join feeding a cogroup's first/last, and a session window join whose sessions all
/// close at the end — one burst of pairs per shard, several times the exchange ring — feeding a
/// temporal join whose versions tie.
const BACKPRESSURE_CONFIG: &str = "\
[runtime]\nidle_advance = false\n\
[streams.a]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\nidle_timeout = \"0ms\"\n\
fields = { k = \"string\", g = \"string\", ts = \"int\", v = \"int\", seq = \"int\", pad = \"string\" }\n\
[streams.b]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\nidle_timeout = \"0ms\"\n\
fields = { k = \"string\", g = \"string\", ts = \"int\", v = \"int\", seq = \"int\", pad = \"string\" }\n\
[streams.c]\nkey = \"g\"\ntime = { field = \"ts\", unit = \"ms\" }\nidle_timeout = \"0ms\"\n\
fields = { k = \"string\", g = \"string\", ts = \"int\", v = \"int\", seq = \"int\", pad = \"string\" }\n\
[streams.e]\nkey = \"g\"\ntime = { field = \"ts\", unit = \"ms\" }\nidle_timeout = \"0ms\"\n\
fields = { g = \"string\", ts = \"int\", seq = \"int\" }\n\
[operators.un]\nkind = \"union\"\ninputs = [\"a\", \"b\"]\nkey = \"g\"\n\
[operators.lim]\nkind = \"connect\"\nfunction = \"threshold\"\nleft = \"c\"\nright = \"un\"\nvalue = \"v\"\nlimit = \"v\"\n\
select = [\"left.seq\", \"right.seq AS rseq\", \"right.k AS rk\"]\n\
[operators.tw]\nkind = \"window_join\"\nleft = \"a\"\nright = \"b\"\nwindow = { kind = \"tumbling\", size = \"1s\" }\n\
select = [\"left.g\", \"left.seq\", \"left.pad\", \"right.seq AS rseq\"]\nkey = \"g\"\n\
[operators.fl]\nkind = \"cogroup\"\nleft = \"tw\"\nright = \"c\"\nwindow = { kind = \"tumbling\", size = \"1s\" }\njoin = \"left\"\n\
aggregate = [\"first(left.seq) AS f\", \"last(left.seq) AS l\", \"first(left.rseq) AS fr\", \"last(left.rseq) AS lr\", \"count(left) AS n\"]\n\
[operators.sw]\nkind = \"window_join\"\nleft = \"a\"\nright = \"b\"\nwindow = { kind = \"session\", gap = \"1h\" }\n\
select = [\"left.g\", \"left.seq\", \"left.pad\", \"right.seq AS rseq\"]\nkey = \"g\"\n\
[operators.ver]\nkind = \"temporal_join\"\nleft = \"e\"\nright = \"sw\"\njoin = \"left\"\n\
select = [\"left.seq\", \"right.seq AS vseq\", \"right.rseq AS vrseq\", \"right.k AS vk\"]\n";

/// Inputs for [`BACKPRESSURE_CONFIG`]: `n` rows each of `a` and `b` over `keys` keys, `n / 2` of
/// `c`, and a few rows of `e` after every session's end.
fn backpressure_inputs(n: usize, keys: u64) -> Vec<(String, String)> {
    let mut rng = Rng::new(77);
    let pad = "p".repeat(PAD);
    // Two values of `g` on different shards of 2 and of 3: results re-keyed to each side.
    let on = |name: &String, shards: u64| shard_of(&Key::Str(name.as_str().into()), shards);
    let names: Vec<String> = (0..64).map(|i| format!("g{i}")).collect();
    let gs: Vec<&String> = names
        .iter()
        .flat_map(|x| names.iter().map(move |y| (x, y)))
        .find(|(x, y)| on(x, 2) != on(y, 2) && on(x, 3) != on(y, 3))
        .map(|(x, y)| vec![x, y])
        .unwrap();
    let mut seq = 0;
    let mut line = |rng: &mut Rng, i: usize| {
        seq += 1;
        let ts = BASE_TS + 100 * (i as i64 / 3);
        let k = rng.below(keys);
        let g = gs[rng.below(2) as usize];
        format!("{{\"k\":\"k{k}\",\"g\":\"{g}\",\"ts\":{ts},\"v\":{},\"seq\":{seq},\"pad\":\"{pad}\"}}\n", rng.below(6))
    };
    let a: String = (0..n).map(|i| line(&mut rng, i)).collect();
    let b: String = (0..n).map(|i| line(&mut rng, i)).collect();
    let c: String = (0..2 * n).map(|i| line(&mut rng, i / 2)).collect();
    let end = BASE_TS + 100 * (n as i64 / 3) + 3_600_000;
    let e: String = (0..6)
        .map(|i| format!("{{\"g\":\"{}\",\"ts\":{},\"seq\":{}}}\n", gs[i % 2], end + i as i64 * 1000, 100_000 + i))
        .collect();
    vec![("a".into(), a), ("b".into(), b), ("c".into(), c), ("e".into(), e)]
}

/// Feeder, collector and exchange rings of 64 KiB (frames of ~300 bytes: every ring wraps many
/// times, the feeder's is filled before the shards start when they are held) and end-of-input
/// bursts of results several times an exchange ring: the runtime waits, never drops, and writes
/// the oracle's output exactly.
#[test]
fn tiny_rings_and_bursts_change_nothing() {
    let n = 360;
    let keys = 6;
    let dir = tempfile::tempdir().unwrap();
    let plan = braid::config::parse("backpressure.toml", BACKPRESSURE_CONFIG).unwrap();
    let inputs = write_inputs(dir.path(), backpressure_inputs(n, keys));
    let (rows, start) = decoded_rows(&plan, &inputs);
    let sw = plan.operator("sw").unwrap();
    // The last case gives ring pages back as `braid run` does (chunks of 8 KiB, a page each
    // punched while bursts wrap the rings).
    for (shards, hold, every_tick, give_back) in
        [(2, false, false, false), (3, true, true, false), (2, false, false, true)]
    {
        let want = oracle_outputs(&plan, &rows, start, shards);
        let rings = ring_dir();
        let ring_bytes = if give_back { 128 << 10 } else { 64 << 10 };
        let options = RuntimeOptions {
            feed_ring_bytes: ring_bytes,
            exchange_ring_bytes: ring_bytes,
            hold,
            every_tick,
            give_back_ring_pages: give_back,
            ..RuntimeOptions::new(shards, rings.path())
        };
        let (got, drivers) = runtime_outputs(&plan, &rows, start, &options).unwrap();
        if got != want {
            let d = multiset_diff("oracle", &count(want.iter().cloned()), "runtime", &count(got.iter().cloned()));
            panic!("{shards} shards (hold {hold}, every_tick {every_tick}): the runtime differs from the oracle\n{d}");
        }
        assert_eq!(drivers, vec![expected_driver(); shards]);
        // The session burst: pairs per (old shard → new shard), each an exchange frame of at
        // least its pad, its tag and a frame header.
        let prefix = format!("{sw} result ");
        let mut crossing: BTreeMap<(u64, u64), usize> = BTreeMap::new();
        for line in got.iter().filter(|l| l.starts_with(&prefix)) {
            // The first string value starting with `prefix` (`k…`: the old key, `g…`: the new).
            let shard = |prefix: &str| {
                let marker = format!("Str(\"{prefix}");
                let rest = line.split(&marker).nth(1).unwrap().split('"').next().unwrap();
                shard_of(&Key::Str(format!("{prefix}{rest}").into()), shards as u64)
            };
            *crossing.entry((shard("k"), shard("g"))).or_default() += 1;
        }
        let largest = crossing.iter().filter(|((from, to), _)| from != to).map(|(_, n)| *n).max().unwrap_or(0);
        eprintln!(
            "{shards} shards: {} lines out, session pairs (from shard, to shard) → count {crossing:?}",
            got.len()
        );
        // Four rings of 64 KiB: two of the give-back case's.
        let frame = PAD + braid::shard::tag::TAG_BYTES + 16;
        assert!(
            largest * frame > 4 * (64 << 10),
            "the burst between two shards should be over the exchange ring ({largest} pairs)"
        );
        assert!(rows.len() * PAD > 4 * (64 << 10), "the input should be several feeder rings");
        let ties = want.iter().filter(|l| l.starts_with(&format!("{} result", plan.operator("ver").unwrap()))).count();
        assert!(ties > 0, "the temporal join should pick versions");
    }
}

// --------------------------------------------------------------------------------- driver ---

/// The `braid_shard_driver` lines of `--metrics`: driver label per shard.
fn drivers_in_metrics(text: &str) -> BTreeMap<usize, String> {
    let mut drivers = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("braid_shard_driver{")) {
        let (labels, value) = line.rsplit_once(' ').unwrap();
        assert_eq!(value, "1", "{line}");
        let label =
            |name: &str| labels.split(&format!("{name}=\"")).nth(1).unwrap().split('"').next().unwrap().to_owned();
        drivers.insert(label("shard").parse().unwrap(), label("driver"));
    }
    drivers
}

/// `braid replay --metrics` reports the driver every shard ran on: `legacy` for all when
/// `MONOIO_FORCE_LEGACY_DRIVER=1` (always run, so the fallback path is exercised), else what
/// monoio's probe decides in this process (`io_uring` on a kernel that allows it) — and one
/// driver for all shards whatever the environment.
#[test]
fn every_shard_reports_its_monoio_driver() {
    let w = gen_chain(first_seed() + 7, Profile::DEFAULT, Some(Kind::Window), Some(Kind::Temporal));
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(dir.path(), "braid.toml", &w.config);
    let inputs = write_inputs(dir.path(), w.inputs.iter().map(|(n, t)| (n.as_str(), t.as_str())));
    let forced = std::env::var("MONOIO_FORCE_LEGACY_DRIVER")
        .is_ok_and(|v| ["1", "true", "yes"].contains(&v.to_ascii_lowercase().as_str()));
    let mut outputs_seen = Vec::new();
    for (run, env) in [("inherited", None), ("forced", Some("1")), ("unset", Some(""))] {
        let metrics = dir.path().join(format!("metrics-{run}.txt"));
        let names: Vec<&str> = ["u", "x", "x.late"].to_vec();
        let outputs = output_files(dir.path(), run, &names);
        let mut cmd = common::run::replay_command(&config, Some(3), &inputs, &outputs);
        cmd.arg("--metrics").arg(&metrics);
        match env {
            Some("") => {
                cmd.env_remove("MONOIO_FORCE_LEGACY_DRIVER");
            }
            Some(v) => {
                cmd.env("MONOIO_FORCE_LEGACY_DRIVER", v);
            }
            None => {}
        }
        let (status, stderr) = run_with_timeout(&mut cmd, common::run::RUN_TIMEOUT).unwrap();
        assert!(status.success(), "{run}: {stderr}");
        let drivers = drivers_in_metrics(&std::fs::read_to_string(&metrics).unwrap());
        assert_eq!(drivers.keys().copied().collect::<Vec<_>>(), [0, 1, 2], "{run}: one line per shard");
        let distinct: BTreeSet<&String> = drivers.values().collect();
        assert_eq!(distinct.len(), 1, "{run}: every shard runs the same driver: {drivers:?}");
        let driver = drivers[&0].as_str();
        match run {
            "forced" => assert_eq!(driver, "legacy", "MONOIO_FORCE_LEGACY_DRIVER=1"),
            "inherited" => assert_eq!(driver, expected_driver(), "monoio's probe in this process"),
            _ if !forced => assert_eq!(driver, expected_driver(), "monoio's probe in this process"),
            _ => {}
        }
        eprintln!("{run}: {driver}");
        let mut out: Vec<Vec<String>> = outputs
            .iter()
            .map(|(_, p)| std::fs::read_to_string(p).unwrap().lines().map(str::to_owned).collect())
            .collect();
        out.iter_mut().for_each(|lines| lines.sort());
        outputs_seen.push(out);
    }
    assert!(outputs_seen.windows(2).all(|w| w[0] == w[1]), "the driver changes no output");
}

// --------------------------------------------------------------------------------- errors ---

/// Runs `f` on a thread; its result, or Err after `timeout` (the thread is left behind).
fn within<T: Send + 'static>(timeout: Duration, f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (send, recv) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(f());
    });
    recv.recv_timeout(timeout).map_err(|_| format!("no answer within {timeout:?}: the runtime hangs"))
}

#[test]
fn too_many_shards_is_a_clear_error() {
    let w = gen_single(first_seed(), Kind::Union);
    let plan = braid::config::parse("gen.toml", &w.config).unwrap();
    let dir = ring_dir();
    match Runtime::start(&plan, &RuntimeOptions::new(257, dir.path()), 0) {
        Err(e @ RuntimeError::TooManyShards(257)) => assert_eq!(e.to_string(), "257 shards: at most 256 are supported"),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("257 shards started"),
    }
    // Through the binary: the flag, and the config.
    let tmp = tempfile::tempdir().unwrap();
    let config = write_file(tmp.path(), "braid.toml", &w.config);
    let mut cmd = common::run::replay_command(&config, None, &[], &[]);
    cmd.arg("--shards").arg("257");
    let (status, stderr) = run_with_timeout(&mut cmd, Duration::from_secs(30)).unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("257") && stderr.contains("1..=256"), "{stderr}");
    let config = write_file(tmp.path(), "big.toml", w.config.replace("[runtime]\n", "[runtime]\nshards = 300\n"));
    let mut cmd = braid();
    cmd.arg("validate").arg("--config").arg(&config);
    let (status, stderr) = run_with_timeout(&mut cmd, Duration::from_secs(30)).unwrap();
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("runtime.shards") && stderr.contains("from 1 to 256"), "{stderr}");
}

/// A row larger than the rings carry is refused by `ingest` before anything is sent (no hang, no
/// panic, not counted, no watermark moved): the caller dead-letters it and the run goes on.
#[test]
fn a_row_too_large_for_the_rings_is_refused_and_the_run_goes_on() {
    let plan = braid::config::parse("backpressure.toml", BACKPRESSURE_CONFIG).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let row = |seq: usize, pad: usize| {
        format!(
            "{{\"k\":\"k1\",\"g\":\"g1\",\"ts\":{BASE_TS},\"v\":1,\"seq\":{seq},\"pad\":\"{}\"}}\n",
            "x".repeat(pad)
        )
    };
    let inputs = write_inputs(dir.path(), [("a", row(1, 3000) + &row(2, 0))]);
    let (rows, start) = decoded_rows(&plan, &inputs);
    let outcome = within(Duration::from_secs(20), move || {
        let rings = ring_dir();
        let options = RuntimeOptions { feed_ring_bytes: 4096, ..RuntimeOptions::new(2, rings.path()) };
        let mut out = Collected::default();
        let mut runtime = Runtime::start(&plan, &options, start).unwrap();
        let mut refused = Vec::new();
        for (stream, row, arrival) in &rows {
            runtime.advance_to(*arrival, &mut out).unwrap();
            if let Err(e) = runtime.ingest(*stream, row, *arrival, &mut out) {
                refused.push(e.to_string());
            }
        }
        let figures = runtime.finish(&mut out).unwrap();
        (refused, figures.streams[rows[0].0].rows)
    })
    .unwrap();
    let (refused, rows_counted) = outcome;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].starts_with("a row of ") && refused[0].contains("larger than the shard rings carry"),
        "{refused:?}"
    );
    assert_eq!(rows_counted, 1, "only the row that went in is counted (the caller counts the dead letter)");
}

/// A shard does not hold a round's first results until it has worked through everything its ring
/// holds: it commits them every 64 rows (shard/result_latency.rs), so 1 000 matching commands
/// read in one round leave in about 16 commits, each counted with its results.
#[test]
fn a_shard_commits_its_results_every_64_rows_of_a_long_round() {
    let plan = braid::config::parse("gateway.toml", include_str!("../../configs/gateway.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let devices = 0..1000;
    let status: String = devices
        .clone()
        .map(|d| format!("{{\"device\":\"dev-{d}\",\"ts\":{BASE_TS},\"temp\":1.5,\"state\":\"on\",\"seq\":{d}}}\n"))
        .collect();
    let command: String = devices
        .map(|d| {
            format!("{{\"device\":\"dev-{d}\",\"ts\":{BASE_TS},\"cmd\":\"start\",\"arg\":\"1\",\"cmd_id\":\"c{d}\"}}\n")
        })
        .collect();
    let inputs = write_inputs(dir.path(), [("status", status), ("command", command)]);
    let (rows, start) = decoded_rows(&plan, &inputs);
    let figures = within(Duration::from_secs(30), move || {
        let rings = ring_dir();
        // Held: every row is in the ring before the shard reads any, in one round.
        let options = RuntimeOptions { hold: true, ..RuntimeOptions::new(1, rings.path()) };
        let mut out = Collected::default();
        let mut runtime = Runtime::start(&plan, &options, start).unwrap();
        for (stream, row, arrival) in &rows {
            runtime.advance_to(*arrival, &mut out).unwrap();
            runtime.ingest(*stream, row, *arrival, &mut out).unwrap();
        }
        runtime.finish(&mut out).unwrap()
    })
    .unwrap();
    let held = figures.shard_results_held;
    assert_eq!(held.wall.count(), 1000, "every match counted once: {held:?}");
    assert!((15..=20).contains(&held.commits), "1 000 results in {} commits", held.commits);
}

/// Streams `a` and `b` (key `k`, a big `pad`) joined into results re-keyed by `g` and read by an
/// absence operator: a pair of 300 KiB rows makes a result larger than the rings carry.
const OVERSIZED_CONFIG: &str = "\
[streams.a]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\nmax_payload = \"400KiB\"\n\
fields = { k = \"string\", g = \"string\", ts = \"int\", pad = \"string\" }\n\
[streams.b]\nkey = \"k\"\ntime = { field = \"ts\", unit = \"ms\" }\nmax_payload = \"400KiB\"\n\
fields = { k = \"string\", g = \"string\", ts = \"int\", pad = \"string\" }\n\
[operators.pair]\nkind = \"interval_join\"\nleft = \"a\"\nright = \"b\"\nlower = \"-1s\"\nupper = \"1s\"\n\
select = [\"left.g\", \"left.pad\", \"right.pad AS pad_b\"]\nkey = \"g\"\n\
[operators.gone]\nkind = \"absence\"\ninput = \"pair\"\ntimeout = \"1s\"\n";

/// A result too large for the rings goes to `dead_letter` from its shard (counted per operator,
/// handed to `Emit::too_large`), reaches neither the sinks nor the operator reading it, and the
/// run goes on: the next pair of the same keys joins and reaches `gone`.
#[test]
fn a_result_too_large_for_the_rings_is_a_dead_letter_and_the_run_goes_on() {
    let plan = braid::config::parse("oversized.toml", OVERSIZED_CONFIG).unwrap();
    let row = |k: &str, ts: i64, pad: usize| {
        format!("{{\"k\":\"{k}\",\"g\":\"g1\",\"ts\":{ts},\"pad\":\"{}\"}}\n", "x".repeat(pad))
    };
    let dir = tempfile::tempdir().unwrap();
    let a = row("k1", BASE_TS, 300 << 10) + &row("k1", BASE_TS + 5000, 10);
    let b = row("k1", BASE_TS + 1, 300 << 10) + &row("k1", BASE_TS + 5001, 10);
    let inputs = write_inputs(dir.path(), [("a", a), ("b", b)]);
    let (rows, start) = decoded_rows(&plan, &inputs);
    let outcome = within(Duration::from_secs(20), move || {
        let rings = ring_dir();
        let mut out = Collected::default();
        let figures = runtime_run(&plan, &rows, start, &RuntimeOptions::new(2, rings.path()), &mut out);
        (figures.map(|f| f.operator_too_large).map_err(|e| e.to_string()), out.0)
    })
    .unwrap();
    let (too_large, emitted) = outcome;
    assert_eq!(too_large, Ok(vec![1, 0]), "{emitted:?}");
    let dead: Vec<&String> = emitted.iter().filter(|e| e.starts_with("0 too_large")).collect();
    assert_eq!(dead.len(), 1, "{emitted:?}");
    assert!(dead[0].contains("\"pad\":\"xxxx"), "the stand-in carries the result's first KiB: {}", dead[0]);
    let results = |op: &str| emitted.iter().filter(|e| e.starts_with(&format!("{op} result"))).count();
    // Had the big result reached `gone` (same key, 5 s earlier), it would add an absent and a present.
    assert_eq!((results("0"), results("1")), (1, 1), "the small pair, and `gone`s absent at the end: {emitted:?}");
}

/// A runtime dropped before `finish` (its caller hit an error) stops, wakes and joins its shards:
/// the drop returns, with shards asleep, busy or still held, and leaves no thread waiting for
/// input that will never come.
#[test]
fn a_runtime_dropped_before_the_end_stops_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    let plan = braid::config::parse("backpressure.toml", BACKPRESSURE_CONFIG).unwrap();
    let inputs = write_inputs(dir.path(), backpressure_inputs(120, 6));
    let (rows, start) = decoded_rows(&plan, &inputs);
    for (hold, fed) in [(false, 0), (false, rows.len() / 2), (true, rows.len() / 2)] {
        let (plan, rows) = (plan.clone(), rows.clone());
        let rings = ring_dir();
        let path = rings.path().to_owned();
        let dropped = within(Duration::from_secs(20), move || {
            let mut out = Collected::default();
            let options = RuntimeOptions { hold, ..RuntimeOptions::new(3, &path) };
            let mut runtime = Runtime::start(&plan, &options, start).unwrap();
            for (stream, row, arrival) in rows.iter().take(fed) {
                runtime.advance_to(*arrival, &mut out).unwrap();
                runtime.ingest(*stream, row, *arrival, &mut out).unwrap();
            }
            drop(runtime);
        });
        assert!(dropped.is_ok(), "hold {hold}, {fed} rows fed: the drop did not return: {dropped:?}");
    }
}

#[test]
fn a_shard_that_takes_no_frames_is_reported_stalled_and_one_that_does_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let plan = braid::config::parse("backpressure.toml", BACKPRESSURE_CONFIG).unwrap();
    let inputs = write_inputs(dir.path(), backpressure_inputs(40, 6));
    let (rows, start) = decoded_rows(&plan, &inputs);
    for hold in [true, false] {
        let rings = ring_dir();
        let mut out = Collected::default();
        // Rings that hold every row: a full ring starts held shards.
        let options = RuntimeOptions { hold, feed_ring_bytes: 8 << 20, ..RuntimeOptions::new(2, rings.path()) };
        let mut runtime = Runtime::start(&plan, &options, start).unwrap();
        for (stream, row, arrival) in &rows {
            runtime.advance_to(*arrival, &mut out).unwrap();
            runtime.ingest(*stream, row, *arrival, &mut out).unwrap();
        }
        runtime.flush(&mut out).unwrap();
        if hold {
            // Held shards take nothing: both rings keep their frames, call after call.
            assert_eq!(runtime.stalled_shards(), 2);
            assert_eq!(runtime.stalled_shards(), 2);
        } else {
            // At most ~10 s of 10 ms waits.
            let mut waits = 0;
            while runtime.stalled_shards() > 0 {
                waits += 1;
                assert!(waits < 1000, "running shards never drained their rings");
                runtime.wait(&mut out, Duration::from_millis(10), || false).unwrap();
            }
        }
        runtime.finish(&mut out).unwrap();
    }
}
