#![allow(clippy::unwrap_used)]
//! window_join and cogroup against a brute-force reference written in Rust.
//!
//! Each seeded workload has two input streams (`l` keyed by `k`, `r` keyed by `rk`; ≤ 60 rows
//! each, 1–3 keys, event times on a 50 ms grid with ±1 ms so rows land on window starts and on
//! `end − 1`), disorder within and beyond `max_out_of_orderness`, silent stretches that make a
//! stream (or both) idle, `idle_advance` on or off, a random window (tumbling, sliding — some
//! with gaps between windows —, session; offsets), allowed lateness, and two operators over the
//! same inputs and window: a `window_join` `j` (sometimes with a `where`) and a `cogroup` `g`
//! with a random join type and every aggregate function; and a `window_aggregate` `a` over `l`
//! alone (its own watermark, its own sessions; sometimes with a `where` on the row). The real
//! binary replays it, and every output must equal, as a multiset, what the reference computes:
//!
//! - ticks, stream watermarks, idleness and the operators' watermark by simulating CONTRACT.md
//!   rules 1–5 here, never from braid's late output;
//! - windows enumerated naively (every start in `(ts − size, ts]` tested against the slide),
//!   sessions recomputed from scratch at each row as the connected components of the live rows'
//!   `[ts, ts + gap)` intervals (touching ones connect), groups and aggregates built by scanning
//!   the rows of a window when it fires;
//! - every firing, immediate re-firing and merge as rules 7, 8 and 10 say, so each emitted row —
//!   `_version`, window bounds, `_supersedes` (translated to the window bounds of the ids it
//!   names) included — is predicted; `_id`s must be a function of (left row, right row, bounds
//!   unless session) for pairs and of (key, bounds) for groups, and distinct otherwise; the
//!   versions of each `_id` increase in emission order;
//! - late rows: `j.late` and `g.late` hold exactly the rows the simulation finds late.
//!
//! The shard-independence property runs some workloads with 1, 2 and 4 shards: the four outputs
//! must be identical multisets, `_id`s included.
//!
//! Knobs: `BRAID_REF_CASES` (default 240), `BRAID_REF_SEED` (first seed, default 0). A failing
//! workload is saved under `CARGO_TARGET_TMPDIR/reference_windows-SEED/`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use common::config_text::stream_section_ms;
use common::multiset::{canonical_by_value, is_id, multiset_by_value as multiset, multiset_diff};
use common::rng::Rng;
use common::run::{Files, Outputs, replay as run_replay, repro_dir, write_file, write_inputs};
use common::{BASE_TS as BASE, TICK, env_u64};

const GRID: i64 = 50;
const NEG_INF: i128 = i128::MIN / 4;
const POS_INF: i128 = i128::MAX / 4;
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

// ------------------------------------------------------------------------------ generation ---

#[derive(Clone, Copy, Debug, PartialEq)]
enum Win {
    Fixed { size: i64, slide: i64, offset: i64, tumbling: bool },
    Session { gap: i64 },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Join {
    Inner,
    Left,
    Right,
    Full,
}

impl Join {
    fn name(self) -> &'static str {
        match self {
            Join::Inner => "inner",
            Join::Left => "left",
            Join::Right => "right",
            Join::Full => "full",
        }
    }

    fn emits(self, nl: usize, nr: usize) -> bool {
        match self {
            Join::Inner => nl > 0 && nr > 0,
            Join::Left => nl > 0,
            Join::Right => nr > 0,
            Join::Full => nl > 0 || nr > 0,
        }
    }
}

/// A `where` condition and its meaning.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cond {
    VLe,
    FOrS,
    SumGt,
}

impl Cond {
    fn text(self) -> &'static str {
        match self {
            Cond::VLe => "left.v <= right.v",
            Cond::FOrS => "right.f > 0.5 or left.s == 'a'",
            Cond::SumGt => "left.v + right.v > 8",
        }
    }

    fn holds(self, l: &Row, r: &Row) -> bool {
        match self {
            Cond::VLe => l.v <= r.v,
            Cond::FOrS => r.f > 0.5 || l.s == "a",
            Cond::SumGt => l.v + r.v > 8,
        }
    }
}

/// The window aggregate's `where`, a condition on an `l` row.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RowCond {
    VGt,
    SNeOrF,
}

impl RowCond {
    fn text(self) -> &'static str {
        match self {
            RowCond::VGt => "v > 2",
            RowCond::SNeOrF => "s != 'b' and (f >= 0 or v % 2 == 0)",
        }
    }

    fn holds(self, r: &Row) -> bool {
        match self {
            RowCond::VGt => r.v > 2,
            RowCond::SNeOrF => r.s != "b" && (r.f >= 0.0 || r.v.rem_euclid(2) == 0),
        }
    }
}

#[derive(Clone, Debug)]
struct Row {
    /// 0 = `l`, 1 = `r`.
    side: usize,
    seq: i64,
    key: u8,
    ts: i64,
    v: i64,
    f: f64,
    s: &'static str,
    arrival: i64,
}

#[derive(Clone, Debug)]
struct Workload {
    seed: u64,
    win: Win,
    allowed_lateness: i64,
    join: Join,
    cond: Option<Cond>,
    idle_advance: bool,
    int_keys: bool,
    /// (max_out_of_orderness, idle_timeout) per stream.
    streams: [(i64, i64); 2],
    rows: Vec<Row>,
    /// Row indices of each file, in line order.
    files: [Vec<usize>; 2],
    /// The `--input` flag order (stream indices).
    flags: [usize; 2],
    /// The window aggregate's `where`.
    row_cond: Option<RowCond>,
}

const STREAMS: [&str; 2] = ["l", "r"];
const KEY_FIELDS: [&str; 2] = ["k", "rk"];

fn gen_workload(seed: u64) -> Workload {
    // The salt of `Rng::new`, without its first draw.
    let mut g = Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B);
    let win = match seed % 3 {
        0 => {
            let size = g.pick(&[100, 200, 300, 500]);
            Win::Fixed { size, slide: size, offset: g.pick(&[0, 0, 50, -100, 30]), tumbling: true }
        }
        1 => {
            let size = g.pick(&[200, 300, 400, 600]);
            let slide = if g.percent(15) { size + g.pick(&[50, 100]) } else { g.pick(&[100, 150, 200]).min(size) };
            Win::Fixed { size, slide, offset: g.pick(&[0, 0, 50, -20]), tumbling: false }
        }
        _ => Win::Session { gap: g.pick(&[50, 100, 150, 250]) },
    };
    // Sessions merge with fired sessions (re-firing, superseding) only within allowed lateness.
    let allowed_lateness = match win {
        Win::Session { .. } => g.pick(&[0, 100, 250, 600, 1000]),
        Win::Fixed { .. } => g.pick(&[0, 0, 0, 100, 250, 600]),
    };
    let join = g.pick(&[Join::Inner, Join::Left, Join::Right, Join::Full]);
    let cond = if g.percent(30) { Some(g.pick(&[Cond::VLe, Cond::FOrS, Cond::SumGt])) } else { None };
    let idle_advance = g.percent(50);
    let int_keys = g.percent(25);
    // Sessions extend past a fired session mostly with rows near the watermark: disorder.
    let disorder: &[i64] = if matches!(win, Win::Session { .. }) { &[0, 100, 250, 400] } else { &[0, 0, 100, 250] };
    let streams = [0, 1].map(|_| (g.pick(disorder), g.pick(&[0, 300, 500, 1000])));
    let keys = g.range(1, 3) as u8;
    let span = g.pick(&[1500, 3000, 5000]);
    let mut rows = Vec::new();
    for (side, &(ooo, _)) in streams.iter().enumerate() {
        let n = if g.percent(5) { 0 } else { g.range(1, 60) };
        // A silent stretch of nominal time in which this stream sends nothing.
        let silent = g.percent(35).then(|| {
            let from = g.range(0, span);
            (from, from + g.pick(&[700, 1200, 2000]))
        });
        for _ in 0..n {
            let mut nominal = g.range(0, span / GRID) * GRID;
            if let Some((from, to)) = silent
                && (from..to).contains(&nominal)
            {
                nominal = to + (nominal - from);
            }
            let jitter = match g.below(20) {
                0..=3 => -1,
                4 => 1,
                _ => 0,
            };
            let ts = BASE + nominal + jitter;
            let delay = match g.below(10) {
                0..=5 => g.range(0, ooo),
                6 | 7 => g.range(0, 60),
                _ => g.range(ooo, ooo + 900),
            };
            let arrival = ts + delay - if g.percent(5) { g.range(1, 80) } else { 0 };
            rows.push(Row {
                side,
                seq: 0,
                key: g.range(1, keys as i64) as u8,
                ts,
                v: g.range(-3, 12),
                f: g.range(-20, 20) as f64 * 0.25,
                s: g.pick(&["a", "b", "c", "bb", ""]),
                arrival,
            });
        }
    }
    for (i, r) in rows.iter_mut().enumerate() {
        r.seq = i as i64 + 1;
    }
    let mut files = [Vec::new(), Vec::new()];
    for (i, r) in rows.iter().enumerate() {
        files[r.side].push(i);
    }
    for file in &mut files {
        file.sort_by_key(|&i| rows[i].arrival);
        // Some neighbours swapped: the merge orders by arrival, ties by line number.
        for j in 1..file.len() {
            if g.percent(10) {
                file.swap(j - 1, j);
            }
        }
    }
    let flags = if g.percent(50) { [0, 1] } else { [1, 0] };
    // Drawn last, so the workloads of the other operators stay what they were.
    let row_cond = if g.percent(40) { Some(g.pick(&[RowCond::VGt, RowCond::SNeOrF])) } else { None };
    Workload { seed, win, allowed_lateness, join, cond, idle_advance, int_keys, streams, rows, files, flags, row_cond }
}

impl Workload {
    fn key_json(&self, key: u8) -> Value {
        if self.int_keys { json!(key) } else { json!(format!("d{key}")) }
    }

    fn window_toml(&self) -> String {
        match self.win {
            Win::Fixed { size, offset, tumbling: true, .. } => {
                format!("{{ kind = \"tumbling\", size = \"{size}ms\", offset = \"{offset}ms\" }}")
            }
            Win::Fixed { size, slide, offset, .. } => {
                format!("{{ kind = \"sliding\", size = \"{size}ms\", slide = \"{slide}ms\", offset = \"{offset}ms\" }}")
            }
            Win::Session { gap } => format!("{{ kind = \"session\", gap = \"{gap}ms\" }}"),
        }
    }

    fn config(&self) -> String {
        let key_type = if self.int_keys { "int" } else { "string" };
        let mut c = format!("[runtime]\nidle_advance = {}\n", self.idle_advance);
        for (i, name) in STREAMS.iter().enumerate() {
            let (ooo, idle) = self.streams[i];
            let key = KEY_FIELDS[i];
            let fields =
                [(key, key_type), ("ts", "int"), ("seq", "int"), ("v", "int"), ("f", "float"), ("s", "string")];
            c += &stream_section_ms(name, key, ooo, idle, &fields);
        }
        let (window, al) = (self.window_toml(), self.allowed_lateness);
        let _ = write!(
            c,
            "\n[operators.j]\nkind = \"window_join\"\nleft = \"l\"\nright = \"r\"\nwindow = {window}\n\
             allowed_lateness = \"{al}ms\"\n\
             select = [\"left.seq AS lseq\", \"right.seq AS rseq\", \"left.v\", \"right.s AS rs\", \"right.rk\"]\n\
             join = \"{}\"\n",
            self.window_join().name()
        );
        if let Some(cond) = self.cond {
            let _ = writeln!(c, "where = \"{}\"", cond.text());
        }
        let _ = write!(
            c,
            "\n[operators.g]\nkind = \"cogroup\"\nleft = \"l\"\nright = \"r\"\nwindow = {window}\n\
             allowed_lateness = \"{al}ms\"\njoin = \"{}\"\naggregate = [\"count(left) AS nl\", \"count(right) AS nr\",\n  \
             \"sum(left.v) AS sv\", \"sum(right.f) AS sf\", \"min(left.s) AS mins\", \"max(right.v) AS maxv\",\n  \
             \"min(right.f) AS minf\", \"max(left.ts) AS maxts\", \"first(left.seq) AS fl\", \"last(left.seq) AS ll\",\n  \
             \"first(right.seq) AS fr\", \"last(right.seq) AS lr\", \"count(right.s) AS nrs\",\n  \
             \"avg(left.v) AS av\", \"avg(right.f) AS af\"]\n",
            self.join.name()
        );
        let _ = write!(
            c,
            "\n[operators.a]\nkind = \"window_aggregate\"\ninput = \"l\"\nwindow = {window}\n\
             allowed_lateness = \"{al}ms\"\naggregate = [\"count(*) AS n\", \"sum(v) AS sv\", \"sum(f) AS sf\",\n  \
             \"min(s) AS mins\", \"max(v) AS maxv\", \"min(f) AS minf\", \"max(ts) AS maxts\", \"first(seq) AS fl\",\n  \
             \"last(seq) AS ll\", \"count(s) AS ns\", \"avg(v) AS av\", \"avg(f) AS af\"]\n"
        );
        if let Some(cond) = self.row_cond {
            let _ = writeln!(c, "where = \"{}\"", cond.text());
        }
        c
    }

    /// The window join's type: the cogroup's where there is no allowed lateness (an outer window
    /// join takes none), else inner.
    fn window_join(&self) -> Join {
        if self.allowed_lateness == 0 { self.join } else { Join::Inner }
    }

    fn line(&self, i: usize) -> String {
        let r = &self.rows[i];
        let mut obj = serde_json::Map::new();
        obj.insert(KEY_FIELDS[r.side].into(), self.key_json(r.key));
        obj.insert("ts".into(), json!(r.ts));
        obj.insert("seq".into(), json!(r.seq));
        obj.insert("v".into(), json!(r.v));
        obj.insert("f".into(), json!(r.f));
        obj.insert("s".into(), json!(r.s));
        obj.insert("arrival".into(), json!(r.arrival));
        Value::Object(obj).to_string()
    }

    /// Writes config.toml, l.jsonl and r.jsonl into `dir`: the config's path, and the inputs in
    /// the order of the `--input` flags.
    fn write_to(&self, dir: &Path) -> (PathBuf, Files) {
        let config = write_file(dir, "config.toml", self.config());
        let inputs = write_inputs(
            dir,
            self.flags.iter().map(|&side| {
                (STREAMS[side], self.files[side].iter().map(|&i| self.line(i) + "\n").collect::<String>())
            }),
        );
        (config, inputs)
    }

    fn dump(&self) -> String {
        let mut s = format!("seed {}\n--- config.toml\n{}", self.seed, self.config());
        for (side, name) in STREAMS.iter().enumerate() {
            let _ = writeln!(s, "--- {name}.jsonl");
            for &i in &self.files[side] {
                let _ = writeln!(s, "{}", self.line(i));
            }
        }
        s
    }
}

/// Workload `seed` written to `dir` for `join_quality.rs`: the config (window_join `j` and cogroup
/// `g` over `l` and `r`), the inputs, and the rows in each of the files of `l` and `r`.
pub(crate) fn write_workload(seed: u64, dir: &Path) -> (PathBuf, Files, [usize; 2]) {
    let w = gen_workload(seed);
    let (config, inputs) = w.write_to(dir);
    (config, inputs, [w.files[0].len(), w.files[1].len()])
}

// ------------------------------------------------------------------------------- replaying ---

const OUTPUTS: [&str; 6] = ["j", "j.late", "g", "g.late", "a", "a.late"];
/// The reference's operators by the watermark they follow: `j` and `g` read `l` and `r`, `a`
/// reads `l` alone.
const OPS_LR: [usize; 2] = [0, 1];
const OPS_L: [usize; 1] = [2];

/// Runs `braid replay`; the rows of each of [`OUTPUTS`], in file order.
fn replay(w: &Workload, shards: Option<u32>) -> Result<Outputs, String> {
    let dir = tempfile::tempdir().unwrap();
    let (config, inputs) = w.write_to(dir.path());
    run_replay(dir.path(), &config, shards, &inputs, &OUTPUTS, RUN_TIMEOUT)
}

// ---------------------------------------------------------------------- the reference itself ---

/// A window of the reference: its rows by index, in processing order.
#[derive(Clone, Debug)]
struct RWin {
    key: u8,
    start: i64,
    end: i64,
    rows: Vec<usize>,
    version: i64,
    done: bool,
    emitted: bool,
    /// cogroup sessions: bounds of the emitted results this one replaces.
    supersedes: BTreeSet<(i64, i64)>,
}

/// One operator's windows; `cogroup` (also the window aggregate) decides what merges do,
/// `cogroup` and `one_input` what firing emits.
struct RefOp {
    cogroup: bool,
    one_input: bool,
    wins: Vec<RWin>,
    emitted: Vec<Value>,
}

#[derive(Default)]
struct Stats {
    late: usize,
    late_a: usize,
    refires: usize,
    supersedes: usize,
    /// Merges of a session that already superseded others (its list is carried on).
    carried: usize,
    merges: usize,
    one_sided: usize,
    at_end_minus_one: usize,
    at_start: usize,
    some_idle: bool,
    all_idle_advanced: bool,
    pairs: usize,
    groups: usize,
    /// Rows the window join emitted alone (`left_only`, `right_only`).
    alone: usize,
    /// Results of the window aggregate, and `l` rows its `where` dropped.
    aggregates: usize,
    filtered: usize,
}

struct Reference<'w> {
    w: &'w Workload,
    /// Processing position of each row (first/last break ts ties by it).
    order: Vec<usize>,
    ops: [RefOp; 3],
    /// Late rows of `j` and `g`, and of `a`.
    late: Vec<usize>,
    late_a: Vec<usize>,
    stats: Stats,
}

impl<'w> Reference<'w> {
    fn closed(&self, end: i64, wm: i128) -> bool {
        i128::from(end) - 1 + i128::from(self.w.allowed_lateness) <= wm
    }

    /// The windows holding `ts`, by testing every start in (ts − size, ts].
    fn windows_of(&self, ts: i64) -> Vec<(i64, i64)> {
        let Win::Fixed { size, slide, offset, .. } = self.w.win else { unreachable!() };
        (ts - size + 1..=ts).filter(|s| (s - offset).rem_euclid(slide) == 0).map(|s| (s, s + size)).collect()
    }

    fn late_at(&mut self, op: usize, i: usize) {
        match op {
            0 => self.late.push(i),
            2 => self.late_a.push(i),
            _ => {}
        }
    }

    fn on_row(&mut self, i: usize, wm: i128, ops: &[usize]) {
        let row = &self.w.rows[i];
        match self.w.win {
            Win::Fixed { .. } => {
                let all = self.windows_of(row.ts);
                for &(s, e) in &all {
                    self.stats.at_end_minus_one += usize::from(row.ts == e - 1);
                    self.stats.at_start += usize::from(row.ts == s);
                }
                let live: Vec<(i64, i64)> = all.into_iter().filter(|&(_, e)| !self.closed(e, wm)).collect();
                if live.is_empty() {
                    self.late_at(ops[0], i);
                    return;
                }
                for &op in ops {
                    for &(s, e) in &live {
                        let found = self.ops[op].wins.iter().position(|x| (x.key, x.start, x.end) == (row.key, s, e));
                        let at = found.unwrap_or_else(|| {
                            let wins = &mut self.ops[op].wins;
                            wins.push(RWin {
                                key: row.key,
                                start: s,
                                end: e,
                                rows: vec![],
                                version: 0,
                                done: false,
                                emitted: false,
                                supersedes: BTreeSet::new(),
                            });
                            wins.len() - 1
                        });
                        self.ops[op].wins[at].rows.push(i);
                        self.ops[op].wins[at].done = false;
                        if i128::from(e) - 1 <= wm {
                            self.fire(op, at);
                        }
                    }
                }
            }
            Win::Session { gap } => {
                for &op in ops {
                    // The live rows of this key plus the new one, as connected components of
                    // their [ts, ts + gap) intervals (touching intervals connect).
                    let mut rows: Vec<usize> = self.ops[op]
                        .wins
                        .iter()
                        .filter(|x| x.key == row.key)
                        .flat_map(|x| x.rows.iter().copied())
                        .collect();
                    rows.push(i);
                    rows.sort_by_key(|&r| self.w.rows[r].ts);
                    let mut component: Option<(i64, i64, Vec<usize>)> = None;
                    let mut current: (i64, i64, Vec<usize>) = (0, i64::MIN, vec![]);
                    for &r in &rows {
                        let ts = self.w.rows[r].ts;
                        if ts > current.1 {
                            if current.2.contains(&i) {
                                component = Some(current.clone());
                            }
                            current = (ts, ts + gap, vec![]);
                        }
                        current.1 = current.1.max(ts + gap);
                        current.2.push(r);
                    }
                    if current.2.contains(&i) {
                        component = Some(current);
                    }
                    let (start, end, members) = component.unwrap();
                    if self.closed(end, wm) {
                        self.late_at(op, i);
                        continue;
                    }
                    let cogroup = self.ops[op].cogroup;
                    let wins = &mut self.ops[op].wins;
                    let parts: Vec<usize> = (0..wins.len())
                        .filter(|&x| wins[x].key == row.key && wins[x].rows.iter().all(|r| members.contains(r)))
                        .collect();
                    let at = if parts.len() == 1 && (wins[parts[0]].start, wins[parts[0]].end) == (start, end) {
                        parts[0]
                    } else {
                        if !parts.is_empty() && op == 1 {
                            self.stats.merges += 1;
                        }
                        let mut merged = RWin {
                            key: row.key,
                            start,
                            end,
                            rows: vec![],
                            version: 0,
                            done: false,
                            emitted: false,
                            supersedes: BTreeSet::new(),
                        };
                        for &p in &parts {
                            let part = &wins[p];
                            merged.rows.extend(&part.rows);
                            if cogroup {
                                self.stats.carried += usize::from(!part.supersedes.is_empty());
                                merged.supersedes.extend(&part.supersedes);
                                if part.emitted {
                                    merged.supersedes.insert((part.start, part.end));
                                }
                            } else {
                                merged.version = merged.version.max(part.version);
                            }
                        }
                        let mut x = 0;
                        wins.retain(|_| {
                            x += 1;
                            !parts.contains(&(x - 1))
                        });
                        merged.rows.sort_by_key(|&r| self.order[r]);
                        wins.push(merged);
                        wins.len() - 1
                    };
                    wins[at].rows.push(i);
                    wins[at].done = false;
                    if i128::from(end) - 1 <= wm {
                        self.fire(op, at);
                    }
                }
            }
        }
    }

    fn on_watermark(&mut self, wm: i128, ops: &[usize]) {
        for &op in ops {
            for at in 0..self.ops[op].wins.len() {
                let x = &self.ops[op].wins[at];
                if !x.done && i128::from(x.end) - 1 <= wm {
                    self.fire(op, at);
                }
            }
            let al = i128::from(self.w.allowed_lateness);
            self.ops[op].wins.retain(|x| i128::from(x.end) - 1 + al > wm);
        }
    }

    fn fire(&mut self, op: usize, at: usize) {
        let w = self.w;
        let RefOp { cogroup, one_input, wins, emitted } = &mut self.ops[op];
        let win = &mut wins[at];
        win.version += 1;
        win.done = true;
        if win.version > 1 {
            self.stats.refires += 1;
        }
        let key = w.key_json(win.key);
        let meta = |obj: &mut serde_json::Map<String, Value>| {
            obj.insert("_window_start".into(), json!(win.start));
            obj.insert("_window_end".into(), json!(win.end));
            obj.insert("_version".into(), json!(win.version));
            obj.insert("_ts".into(), json!(win.end - 1));
        };
        let side = |s: usize| -> Vec<&Row> { win.rows.iter().map(|&r| &w.rows[r]).filter(|r| r.side == s).collect() };
        let (left, right) = (side(0), side(1));
        if !*cogroup {
            let result = |l: Option<&Row>, r: Option<&Row>, kind: &str| {
                let mut obj = serde_json::Map::new();
                obj.insert("k".into(), key.clone());
                obj.insert("rk".into(), key.clone());
                obj.insert("lseq".into(), json!(l.map(|l| l.seq)));
                obj.insert("rseq".into(), json!(r.map(|r| r.seq)));
                obj.insert("v".into(), json!(l.map(|l| l.v)));
                obj.insert("rs".into(), json!(r.map(|r| r.s)));
                obj.insert("_kind".into(), json!(kind));
                meta(&mut obj);
                Value::Object(obj)
            };
            let paired = |x: &Row, others: &[&Row], x_left: bool| {
                others.iter().any(|o| {
                    let (l, r) = if x_left { (x, *o) } else { (*o, x) };
                    w.cond.is_none_or(|c| c.holds(l, r))
                })
            };
            for l in &left {
                for r in &right {
                    if w.cond.is_some_and(|c| !c.holds(l, r)) {
                        continue;
                    }
                    self.stats.pairs += 1;
                    emitted.push(result(Some(l), Some(r), "match"));
                }
            }
            let join = w.window_join();
            if matches!(join, Join::Left | Join::Full) {
                for l in left.iter().filter(|l| !paired(l, &right, true)) {
                    self.stats.alone += 1;
                    emitted.push(result(Some(l), None, "left_only"));
                }
            }
            if matches!(join, Join::Right | Join::Full) {
                for r in right.iter().filter(|r| !paired(r, &left, false)) {
                    self.stats.alone += 1;
                    emitted.push(result(None, Some(r), "right_only"));
                }
            }
            return;
        }
        if *one_input {
            // Every row of a window aggregate's window is one it aggregates.
            let (n, order) = (left.len(), self.order.as_slice());
            let mut obj = serde_json::Map::new();
            obj.insert("k".into(), key);
            aggregates_of(&mut obj, &left, order);
            obj.insert("n".into(), json!(n));
            meta(&mut obj);
            if !win.supersedes.is_empty() {
                let bounds: Vec<Value> = win.supersedes.iter().map(|&(s, e)| json!([s, e])).collect();
                obj.insert("_supersedes".into(), Value::Array(bounds));
            }
            win.emitted = true;
            self.stats.aggregates += 1;
            emitted.push(Value::Object(obj));
            return;
        }
        if !w.join.emits(left.len(), right.len()) {
            return;
        }
        let by_order = |rows: &[&Row]| -> Vec<i64> {
            let mut sorted: Vec<&&Row> = rows.iter().collect();
            sorted.sort_by_key(|r| (r.ts, self.order[r.seq as usize - 1]));
            sorted.iter().map(|r| r.seq).collect()
        };
        let (lo, ro) = (by_order(&left), by_order(&right));
        let opt = |v: Option<Value>| v.unwrap_or(Value::Null);
        let mut obj = serde_json::Map::new();
        obj.insert("k".into(), key);
        obj.insert("nl".into(), json!(left.len()));
        obj.insert("nr".into(), json!(right.len()));
        obj.insert("sv".into(), opt((!left.is_empty()).then(|| json!(left.iter().map(|r| r.v).sum::<i64>()))));
        obj.insert("sf".into(), opt((!right.is_empty()).then(|| json!(right.iter().map(|r| r.f).sum::<f64>()))));
        // Through text and back, as braid's output is read: serde_json's float parsing may be one
        // ulp off the correctly rounded value (no `float_roundtrip`), for both sides alike.
        let mean = |sum: f64, n: usize| serde_json::from_str::<Value>(&json!(sum / n as f64).to_string()).unwrap();
        let av = (!left.is_empty()).then(|| mean(left.iter().map(|r| r.v).sum::<i64>() as f64, left.len()));
        obj.insert("av".into(), opt(av));
        let af = (!right.is_empty()).then(|| mean(right.iter().map(|r| r.f).sum::<f64>(), right.len()));
        obj.insert("af".into(), opt(af));
        obj.insert("mins".into(), opt(left.iter().map(|r| r.s).min().map(|s| json!(s))));
        obj.insert("maxv".into(), opt(right.iter().map(|r| r.v).max().map(|v| json!(v))));
        obj.insert("minf".into(), opt(right.iter().map(|r| r.f).min_by(f64::total_cmp).map(|v| json!(v))));
        obj.insert("maxts".into(), opt(left.iter().map(|r| r.ts).max().map(|v| json!(v))));
        obj.insert("fl".into(), opt(lo.first().map(|v| json!(v))));
        obj.insert("ll".into(), opt(lo.last().map(|v| json!(v))));
        obj.insert("fr".into(), opt(ro.first().map(|v| json!(v))));
        obj.insert("lr".into(), opt(ro.last().map(|v| json!(v))));
        obj.insert("nrs".into(), json!(right.len()));
        let kind = match (left.is_empty(), right.is_empty()) {
            (false, false) => "match",
            (false, true) => "left_only",
            _ => "right_only",
        };
        if kind != "match" {
            self.stats.one_sided += 1;
        }
        obj.insert("_kind".into(), json!(kind));
        meta(&mut obj);
        if !win.supersedes.is_empty() {
            self.stats.supersedes += 1;
            let bounds: Vec<Value> = win.supersedes.iter().map(|&(s, e)| json!([s, e])).collect();
            obj.insert("_supersedes".into(), Value::Array(bounds));
        }
        win.emitted = true;
        self.stats.groups += 1;
        emitted.push(Value::Object(obj));
    }
}

/// The window aggregate's aggregates over `rows` (never empty), as `a` names them.
fn aggregates_of(obj: &mut serde_json::Map<String, Value>, rows: &[&Row], order: &[usize]) {
    let mut sorted: Vec<&&Row> = rows.iter().collect();
    sorted.sort_by_key(|r| (r.ts, order[r.seq as usize - 1]));
    let mean = |sum: f64| serde_json::from_str::<Value>(&json!(sum / rows.len() as f64).to_string()).unwrap();
    obj.insert("sv".into(), json!(rows.iter().map(|r| r.v).sum::<i64>()));
    obj.insert("sf".into(), json!(rows.iter().map(|r| r.f).sum::<f64>()));
    obj.insert("mins".into(), json!(rows.iter().map(|r| r.s).min()));
    obj.insert("maxv".into(), json!(rows.iter().map(|r| r.v).max()));
    obj.insert("minf".into(), json!(rows.iter().map(|r| r.f).min_by(f64::total_cmp)));
    obj.insert("maxts".into(), json!(rows.iter().map(|r| r.ts).max()));
    obj.insert("fl".into(), json!(sorted.first().map(|r| r.seq)));
    obj.insert("ll".into(), json!(sorted.last().map(|r| r.seq)));
    obj.insert("ns".into(), json!(rows.len()));
    obj.insert("av".into(), mean(rows.iter().map(|r| r.v).sum::<i64>() as f64));
    obj.insert("af".into(), mean(rows.iter().map(|r| r.f).sum::<f64>()));
}

/// An operator's watermark (rule 5) over some of the streams.
struct Clock {
    wm: i128,
    /// Since when (tick, watermark then) every input has been idle.
    all_idle_since: Option<(i64, i128)>,
}

impl Clock {
    /// Tick `t` over the streams' (watermark, idle) pairs; whether the watermark moved, and
    /// whether idle_advance moved it.
    fn tick(&mut self, t: i64, inputs: &[(i128, bool)], idle_advance: bool) -> (bool, bool) {
        let before = self.wm;
        match inputs.iter().filter(|s| !s.1).map(|s| s.0).min() {
            Some(m) => {
                self.all_idle_since = None;
                self.wm = self.wm.max(m);
            }
            None if idle_advance => {
                let (t0, base) = *self.all_idle_since.get_or_insert((t, self.wm));
                if base > NEG_INF {
                    self.wm = self.wm.max(base + i128::from(t - t0));
                    return (self.wm > before, self.wm > before);
                }
            }
            None => {}
        }
        (self.wm > before, false)
    }
}

/// Simulates CONTRACT.md rules 1–5 and the window rules over the merged input.
fn reference(w: &Workload) -> Reference<'_> {
    let mut lines: Vec<(i64, usize, usize, usize)> = vec![];
    for (flag, &side) in w.flags.iter().enumerate() {
        for (n, &i) in w.files[side].iter().enumerate() {
            lines.push((w.rows[i].arrival, flag, n, i));
        }
    }
    lines.sort();
    let mut order = vec![0; w.rows.len()];
    for (pos, &(.., i)) in lines.iter().enumerate() {
        order[i] = pos;
    }
    let op = |cogroup, one_input| RefOp { cogroup, one_input, wins: vec![], emitted: vec![] };
    let ops = [op(false, false), op(true, false), op(true, true)];
    let mut r = Reference { w, order, ops, late: vec![], late_a: vec![], stats: Stats::default() };
    let Some(&(start, ..)) = lines.first() else { return r };
    // Per stream: (max ts, watermark, idle, last arrival, rows since the last tick).
    let mut st: Vec<(Option<i64>, i128, bool, i64, bool)> = vec![(None, NEG_INF, false, start, false); 2];
    let mut clock = Clock { wm: NEG_INF, all_idle_since: None };
    let mut clock_a = Clock { wm: NEG_INF, all_idle_since: None };
    let mut now = start;
    for &(a, .., i) in &lines {
        let mut t = (now.div_euclid(TICK) + 1) * TICK;
        while t <= a {
            for (s, state) in st.iter_mut().enumerate() {
                let (ooo, idle_timeout) = w.streams[s];
                if state.4 {
                    state.2 = false;
                    state.4 = false;
                } else if idle_timeout > 0 && t - state.3 >= idle_timeout {
                    state.2 = true;
                }
                if let Some(m) = state.0 {
                    state.1 = i128::from(m) - i128::from(ooo) - 1;
                }
            }
            r.stats.some_idle |= st.iter().any(|s| s.2);
            let inputs: Vec<(i128, bool)> = st.iter().map(|s| (s.1, s.2)).collect();
            let (moved, advanced) = clock.tick(t, &inputs, w.idle_advance);
            r.stats.all_idle_advanced |= advanced;
            if moved {
                r.on_watermark(clock.wm, &OPS_LR);
            }
            if clock_a.tick(t, &inputs[..1], w.idle_advance).0 {
                r.on_watermark(clock_a.wm, &OPS_L);
            }
            t += TICK;
        }
        now = now.max(a);
        let row = &w.rows[i];
        let s = &mut st[row.side];
        s.4 = true;
        s.3 = a;
        s.0 = Some(s.0.map_or(row.ts, |m| m.max(row.ts)));
        r.on_row(i, clock.wm, &OPS_LR);
        if row.side == 0 {
            match w.row_cond {
                Some(cond) if !cond.holds(row) => r.stats.filtered += 1,
                _ => r.on_row(i, clock_a.wm, &OPS_L),
            }
        }
    }
    r.on_watermark(POS_INF, &OPS_LR);
    r.on_watermark(POS_INF, &OPS_L);
    r.stats.late = r.late.len();
    r.stats.late_a = r.late_a.len();
    r
}

// ---------------------------------------------------------------------------------- checks ---

/// Compares one replay with the reference; Err describes every difference.
fn check(w: &Workload, shards: Option<u32>) -> Result<Stats, String> {
    let out = replay(w, shards)?;
    let r = reference(w);
    let mut errs = String::new();

    // Late rows: exactly the simulation's, each with its declared fields, `_stream` and `_ts`.
    let late_rows = |late: &[usize]| -> Vec<Value> {
        late.iter()
            .map(|&i| {
                let row = &w.rows[i];
                let mut v: Value = serde_json::from_str(&w.line(i)).unwrap();
                let obj = v.as_object_mut().unwrap();
                obj.remove("arrival");
                obj.insert("_stream".into(), json!(STREAMS[row.side]));
                obj.insert("_ts".into(), json!(row.ts));
                v
            })
            .collect()
    };
    for (name, late) in [("j.late", &r.late), ("g.late", &r.late), ("a.late", &r.late_a)] {
        let expected = late_rows(late);
        errs += &multiset_diff(&format!("{name} expected"), &multiset(&expected), "braid", &multiset(out.get(name)));
    }

    // Results: every emission predicted; `_id` checked for structure, `_supersedes` translated.
    for (op, name) in [(0, "j"), (1, "g"), (2, "a")] {
        let rows = out.get(name);
        let mut by_id: BTreeMap<String, Value> = BTreeMap::new();
        let mut last_version: BTreeMap<String, i64> = BTreeMap::new();
        let mut actual = vec![];
        for row in rows {
            let Some(id) = row.get("_id").and_then(Value::as_str).map(str::to_owned) else {
                errs += &format!("  {name}: no _id: {row}\n");
                continue;
            };
            if !is_id(&id) {
                errs += &format!("  {name}: bad _id {id}\n");
            }
            let identity = match (op, w.win) {
                (0, Win::Session { .. }) => json!([row["lseq"], row["rseq"]]),
                (0, _) => json!([row["lseq"], row["rseq"], row["_window_start"], row["_window_end"]]),
                _ => json!([row["k"], row["_window_start"], row["_window_end"]]),
            };
            if let Some(seen) = by_id.insert(id.clone(), identity.clone())
                && seen != identity
            {
                errs += &format!("  {name}: _id {id} names both {seen} and {identity}\n");
            }
            let version = row["_version"].as_i64().unwrap_or(0);
            if let Some(&before) = last_version.get(&id)
                && version <= before
            {
                errs += &format!("  {name}: _id {id}: _version {version} after {before}\n");
            }
            last_version.insert(id, version);
            actual.push(row.clone());
        }
        let identities: BTreeSet<String> = by_id.values().map(canonical_by_value).collect();
        if identities.len() != by_id.len() {
            errs += &format!("  {name}: two _ids name one result\n");
        }
        for row in &mut actual {
            let obj = row.as_object_mut().unwrap();
            obj.remove("_id");
            if let Some(Value::Array(ids)) = obj.get("_supersedes") {
                let mut bounds = vec![];
                for id in ids {
                    match id.as_str().and_then(|id| by_id.get(id)) {
                        Some(identity) if identity[0] == obj["k"] => bounds.push(json!([identity[1], identity[2]])),
                        _ => errs += &format!("  {name}: _supersedes names {id}, no earlier result of this key\n"),
                    }
                }
                bounds.sort_by_key(|b| (b[0].as_i64(), b[1].as_i64()));
                obj.insert("_supersedes".into(), Value::Array(bounds));
            }
        }
        errs += &multiset_diff(&format!("{name} expected"), &multiset(&r.ops[op].emitted), "braid", &multiset(&actual));
    }
    if errs.is_empty() { Ok(r.stats) } else { Err(errs) }
}

fn save(w: &Workload) -> PathBuf {
    let dir = repro_dir(&format!("reference_windows-{}", w.seed));
    w.write_to(&dir);
    dir
}

#[test]
fn windows_equal_brute_force_reference() {
    let cases = env_u64("BRAID_REF_CASES", 240);
    let first = env_u64("BRAID_REF_SEED", 0);
    let mut failures = vec![];
    let mut stats = vec![];
    for seed in first..first + cases {
        let w = gen_workload(seed);
        let shards = [None, Some(1), Some(2), Some(3)][(seed / 3 % 4) as usize];
        match check(&w, shards) {
            Ok(s) => stats.push((w, s)),
            Err(e) => failures.push((w, shards, e)),
        }
    }
    if let Some((w, shards, e)) = failures.first() {
        let seeds: Vec<String> = failures.iter().map(|(w, ..)| w.seed.to_string()).collect();
        let dir = save(w);
        panic!(
            "{} of {cases} workloads differ from the reference (seeds {}).\nSeed {} (shards {shards:?}, saved in {}):\n{e}\n{}",
            failures.len(),
            seeds.join(" "),
            w.seed,
            dir.display(),
            w.dump()
        );
    }
    if cases < 200 {
        return;
    }
    // The generator must reach the corners this test is about.
    let count = |f: &dyn Fn(&Workload, &Stats) -> bool| stats.iter().filter(|(w, s)| f(w, s)).count();
    let sum = |f: &dyn Fn(&Stats) -> usize| stats.iter().map(|(_, s)| f(s)).sum::<usize>();
    let figures = [
        ("tumbling workloads", count(&|w, _| matches!(w.win, Win::Fixed { tumbling: true, .. }))),
        ("sliding workloads", count(&|w, _| matches!(w.win, Win::Fixed { tumbling: false, .. }))),
        ("sliding workloads with gaps", count(&|w, _| matches!(w.win, Win::Fixed { size, slide, .. } if slide > size))),
        ("session workloads", count(&|w, _| matches!(w.win, Win::Session { .. }))),
        ("inner cogroups", count(&|w, _| w.join == Join::Inner)),
        ("left cogroups", count(&|w, _| w.join == Join::Left)),
        ("right cogroups", count(&|w, _| w.join == Join::Right)),
        ("full cogroups", count(&|w, _| w.join == Join::Full)),
        ("workloads with `where`", count(&|w, _| w.cond.is_some())),
        ("workloads with late rows", count(&|_, s| s.late > 0)),
        ("workloads with allowed lateness re-firing", count(&|w, s| w.allowed_lateness > 0 && s.refires > 0)),
        ("workloads with an idle input", count(&|_, s| s.some_idle)),
        ("workloads where idle_advance moved the watermark", count(&|_, s| s.all_idle_advanced)),
        ("workloads with an empty stream", count(&|w, _| w.files.iter().any(Vec::is_empty))),
        ("session merges", sum(&|s| s.merges)),
        ("results with _supersedes", sum(&|s| s.supersedes)),
        ("merges carrying a _supersedes list on", sum(&|s| s.carried)),
        ("one-sided groups", sum(&|s| s.one_sided)),
        ("rows at a window's end − 1", sum(&|s| s.at_end_minus_one)),
        ("rows at a window's start", sum(&|s| s.at_start)),
        ("pairs", sum(&|s| s.pairs)),
        ("outer window joins", count(&|w, _| w.window_join() != Join::Inner)),
        ("rows a window join emitted alone", sum(&|s| s.alone)),
        ("groups", sum(&|s| s.groups)),
        ("window aggregates with `where`", count(&|w, _| w.row_cond.is_some())),
        ("window aggregate results", sum(&|s| s.aggregates)),
        ("rows a window aggregate's `where` dropped", sum(&|s| s.filtered)),
        ("window aggregates with late rows", count(&|_, s| s.late_a > 0)),
    ];
    eprintln!("coverage over {} workloads:", stats.len());
    for (what, n) in figures {
        eprintln!("  {what}: {n}");
    }
    for (what, n) in figures {
        assert!(n >= 3, "the generator no longer covers: {what} ({n})");
    }
}

#[test]
fn results_do_not_depend_on_the_shard_count() {
    let cases = env_u64("BRAID_REF_CASES", 240) / 6;
    let first = env_u64("BRAID_REF_SEED", 0);
    for seed in first..first + cases {
        let w = gen_workload(seed * 7 + 1);
        let runs: Vec<Outputs> = [1, 2, 4].iter().map(|&n| replay(&w, Some(n)).unwrap()).collect();
        for name in OUTPUTS {
            let one = multiset(runs[0].get(name));
            for (run, shards) in runs[1..].iter().zip([2, 4]) {
                let d = multiset_diff(
                    &format!("{name}, 1 shard"),
                    &one,
                    &format!("{shards} shards"),
                    &multiset(run.get(name)),
                );
                assert!(d.is_empty(), "seed {}: 1 shard vs {shards}:\n{d}\n{}", w.seed, w.dump());
            }
        }
    }
}

/// Not a check: with `BRAID_REF_DUMP_DIR` set, writes the workloads (config.toml, l.jsonl,
/// r.jsonl, args: the `--input` flags in order) one folder per seed, to compare the reference's
/// subject with another implementation of CONTRACT.md. Run it with
/// `BRAID_REF_DUMP_DIR=DIR cargo test --test it reference_windows::dump -- --ignored`.
#[test]
#[ignore = "not a check: writes workloads to BRAID_REF_DUMP_DIR"]
fn dump_workloads() {
    let dir = std::env::var("BRAID_REF_DUMP_DIR").expect("BRAID_REF_DUMP_DIR: the folder to write the workloads to");
    let cases = env_u64("BRAID_REF_CASES", 240);
    let first = env_u64("BRAID_REF_SEED", 0);
    for seed in first..first + cases {
        let w = gen_workload(seed);
        let d = Path::new(&dir).join(format!("seed-{seed}"));
        std::fs::create_dir_all(&d).unwrap();
        w.write_to(&d);
        let flags: Vec<String> = w.flags.iter().map(|&s| format!("--input {0}={0}.jsonl", STREAMS[s])).collect();
        std::fs::write(d.join("args"), flags.join("\n") + "\n").unwrap();
    }
}
