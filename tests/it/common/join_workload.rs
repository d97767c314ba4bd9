//! The interval-join workloads of `reference_join.rs` and `properties.rs`:
//!
//! - a seeded workload generator: two input streams (`command` left, `status` right, key
//!   `device`, string or int), event times on a coarse grid so rows land exactly on join bounds
//!   and on watermarks, explicit `"arrival"`s with disorder inside `max_out_of_orderness`, a share
//!   of late rows, idle devices, whole streams going silent for longer than `idle_timeout`,
//!   dead-lettered lines, and a random `interval_join` config;
//! - a runner for the real binary (`braid replay`, see `run.rs`) on a workload;
//! - a brute-force reference of the interval join that decides lateness itself by simulating
//!   CONTRACT.md "Exact replay semantics" rules 1–8 (never from braid's late output), and a
//!   checker that compares braid's outputs with it;
//! - a greedy shrinker that removes input lines while a failure persists, and a repro dump.
//!
//! Nothing here needs Python: the executable model in the shared folder was only used to
//! cross-check this reference while it was written.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::config_text::{select_item, stream_section};
use super::multiset::is_id_value;
use super::rng::Rng;
use super::run::{Files, Outputs, RUN_TIMEOUT, replay, repro_dir, write_file, write_inputs};
use super::{BASE_TS, TICK};

/// −∞ for watermarks; i128 so that "−∞ + processing time" stays far below every ts.
const NEG_INF: i128 = -(1i128 << 100);

// ---------------------------------------------------------------------------------- the model ---

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum JoinType {
    Inner,
    Left,
    Right,
    Full,
}

impl JoinType {
    pub const ALL: [JoinType; 4] = [JoinType::Inner, JoinType::Left, JoinType::Right, JoinType::Full];

    pub fn name(self) -> &'static str {
        match self {
            JoinType::Inner => "inner",
            JoinType::Left => "left",
            JoinType::Right => "right",
            JoinType::Full => "full",
        }
    }

    pub fn keeps_left(self) -> bool {
        matches!(self, JoinType::Left | JoinType::Full)
    }

    pub fn keeps_right(self) -> bool {
        matches!(self, JoinType::Right | JoinType::Full)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    Str(String),
    Int(i64),
}

impl Key {
    pub fn to_json(&self) -> Value {
        match self {
            Key::Str(s) => json!(s),
            Key::Int(i) => json!(i),
        }
    }
}

/// One generated row. `seq` is unique over the whole workload and identifies the row in outputs.
#[derive(Clone, Debug)]
pub struct Row {
    pub seq: i64,
    pub key: Key,
    pub ts: i64,
    pub arrival: i64,
    /// false: the line carries no `"arrival"` (then arrival == ts, CONTRACT rule 1).
    pub write_arrival: bool,
    /// The value of the stream's payload field (`cmd`, `temp`, ...).
    pub extra: Value,
}

/// One line of an input file.
#[derive(Clone, Debug)]
pub enum Line {
    Row(Row),
    /// A line that goes to `dead_letter` with `reason`. `arrival`: the arrival CONTRACT rule 1
    /// gives it when it can be read from the line (its `"arrival"`, else its event time); None:
    /// it inherits the arrival of the nearest earlier line of its file (else the nearest later).
    Bad {
        arrival: Option<i64>,
        text: String,
        reason: String,
    },
}

impl Line {
    /// The arrival readable from the line itself (None: inherited, see `Stream::arrivals`).
    pub fn own_arrival(&self) -> Option<i64> {
        match self {
            Line::Row(r) => Some(r.arrival),
            Line::Bad { arrival, .. } => *arrival,
        }
    }

    pub fn row(&self) -> Option<&Row> {
        match self {
            Line::Row(r) => Some(r),
            Line::Bad { .. } => None,
        }
    }

    pub fn row_mut(&mut self) -> Option<&mut Row> {
        match self {
            Line::Row(r) => Some(r),
            Line::Bad { .. } => None,
        }
    }
}

/// An input stream: its config and its file.
#[derive(Clone, Debug)]
pub struct Stream {
    pub name: String,
    /// Effective max_out_of_orderness (ms) and its text in the config (None: omitted, default 0).
    pub ooo: i64,
    pub ooo_text: Option<String>,
    /// Effective idle_timeout (ms, 0 = never idle) and its text (None: omitted, default 30 s).
    pub idle: i64,
    pub idle_text: Option<String>,
    /// The payload field: name and type ("string" or "float").
    pub extra_field: String,
    pub extra_type: String,
    pub lines: Vec<Line>,
}

impl Stream {
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        self.lines.iter().filter_map(Line::row)
    }

    /// Declared fields in declaration order: (name, type).
    pub fn fields(&self, int_keys: bool) -> Vec<(String, String)> {
        vec![
            ("device".into(), if int_keys { "int" } else { "string" }.into()),
            ("ts".into(), "int".into()),
            ("seq".into(), "int".into()),
            (self.extra_field.clone(), self.extra_type.clone()),
        ]
    }

    /// The row's declared fields as JSON (no arrival).
    pub fn row_fields(&self, r: &Row) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("device".into(), r.key.to_json());
        m.insert("ts".into(), json!(r.ts));
        m.insert("seq".into(), json!(r.seq));
        m.insert(self.extra_field.clone(), r.extra.clone());
        m
    }

    /// The arrival of every line (CONTRACT rule 1): its own, else the nearest earlier line's of
    /// this file, else the nearest later line's, else 0.
    pub fn arrivals(&self) -> Vec<i64> {
        let own: Vec<Option<i64>> = self.lines.iter().map(Line::own_arrival).collect();
        let mut out = vec![None; own.len()];
        let mut prev = None;
        for (i, a) in own.iter().enumerate() {
            prev = a.or(prev);
            out[i] = prev;
        }
        let mut next = None;
        for i in (0..own.len()).rev() {
            next = own[i].or(next);
            if out[i].is_none() {
                out[i] = next;
            }
        }
        out.into_iter().map(|a| a.unwrap_or(0)).collect()
    }

    pub fn file_text(&self) -> String {
        let mut s = String::new();
        for l in &self.lines {
            match l {
                Line::Row(r) => {
                    let mut m = self.row_fields(r);
                    if r.write_arrival {
                        m.insert("arrival".into(), json!(r.arrival));
                    }
                    s.push_str(&Value::Object(m).to_string());
                }
                Line::Bad { text, .. } => s.push_str(text),
            }
            s.push('\n');
        }
        s
    }
}

/// One selected field: "SIDE.FIELD AS ALIAS" (side 0 = left, 1 = right).
#[derive(Clone, Debug)]
pub struct Sel {
    pub side: usize,
    pub field: String,
    pub alias: String,
}

impl Sel {
    pub fn new(side: usize, field: &str, alias: Option<&str>) -> Sel {
        Sel { side, field: field.into(), alias: alias.unwrap_or(field).into() }
    }

    pub fn text(&self) -> String {
        select_item(self.side, &self.field, &self.alias)
    }
}

/// An `interval_join` operator.
#[derive(Clone, Debug)]
pub struct Join {
    pub name: String,
    /// Names of its inputs (input streams or operators).
    pub left: String,
    pub right: String,
    pub lower: i64,
    pub upper: i64,
    pub lower_text: String,
    pub upper_text: String,
    /// None: the key is omitted (default false).
    pub lower_excl: Option<bool>,
    pub upper_excl: Option<bool>,
    /// None: omitted (default inner).
    pub join: Option<JoinType>,
    pub select: Vec<Sel>,
    /// `where = "(left.seq + right.seq) % M != 0"` with this M; None: no `where`.
    pub where_mod: Option<i64>,
}

impl Join {
    pub fn join_type(&self) -> JoinType {
        self.join.unwrap_or(JoinType::Inner)
    }

    /// lower′: the bound after the exclusive flag.
    pub fn lo(&self) -> i64 {
        self.lower + i64::from(self.lower_excl == Some(true))
    }

    /// upper′: the bound after the exclusive flag.
    pub fn hi(&self) -> i64 {
        self.upper - i64::from(self.upper_excl == Some(true))
    }

    pub fn cond(&self, lts: i64, rts: i64) -> bool {
        lts + self.lo() <= rts && rts <= lts + self.hi()
    }

    /// Whether the pair passes `where` (Python's `%`: the seqs are positive here anyway).
    pub fn passes_where(&self, l: &Row, r: &Row) -> bool {
        self.where_mod.is_none_or(|m| (l.seq + r.seq).rem_euclid(m) != 0)
    }

    /// The alias under which a side's field is selected, if it is.
    pub fn alias_of(&self, side: usize, field: &str) -> Option<&str> {
        self.select.iter().find(|s| s.side == side && s.field == field).map(|s| s.alias.as_str())
    }
}

/// A whole replay: config, inputs, operators.
#[derive(Clone, Debug)]
pub struct Workload {
    pub seed: u64,
    /// Event times are BASE_TS + a multiple of this.
    pub grid: i64,
    pub idle_advance: Option<bool>,
    pub int_keys: bool,
    pub streams: Vec<Stream>,
    /// Operators, upstream first. Operator 0 reads streams 0 (left) and 1 (right).
    pub ops: Vec<Join>,
    /// The order of the `--input` flags: indices into `streams`.
    pub flag_order: Vec<usize>,
    /// Short description of what the generator chose (for messages).
    pub notes: Vec<String>,
}

impl Workload {
    pub fn idle_advance(&self) -> bool {
        self.idle_advance.unwrap_or(true)
    }

    pub fn stream_index(&self, name: &str) -> Option<usize> {
        self.streams.iter().position(|s| s.name == name)
    }

    /// seq → (stream index, row)
    pub fn rows_by_seq(&self) -> BTreeMap<i64, (usize, &Row)> {
        let mut m = BTreeMap::new();
        for (i, s) in self.streams.iter().enumerate() {
            for r in s.rows() {
                m.insert(r.seq, (i, r));
            }
        }
        m
    }

    pub fn n_rows(&self) -> usize {
        self.streams.iter().map(|s| s.rows().count()).sum()
    }

    pub fn n_bad(&self) -> usize {
        self.streams.iter().map(|s| s.lines.len() - s.rows().count()).sum()
    }

    pub fn config_text(&self) -> String {
        let mut s = String::new();
        if let Some(b) = self.idle_advance {
            writeln!(s, "[runtime]\nidle_advance = {b}\n").unwrap();
        }
        for st in &self.streams {
            let fields = st.fields(self.int_keys);
            let fields: Vec<(&str, &str)> = fields.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
            s += &stream_section(&st.name, "device", st.ooo_text.as_deref(), st.idle_text.as_deref(), &fields);
            // The rows "from the future" jump up to 5 min ahead; the default (30 s) would make
            // them dead letters instead of the watermark jumps they are meant to be.
            s += "max_skew = \"10m\"\n";
        }
        for op in &self.ops {
            writeln!(s, "\n[operators.{}]", op.name).unwrap();
            writeln!(s, "kind = \"interval_join\"").unwrap();
            writeln!(s, "left = \"{}\"\nright = \"{}\"", op.left, op.right).unwrap();
            writeln!(s, "lower = \"{}\"\nupper = \"{}\"", op.lower_text, op.upper_text).unwrap();
            if let Some(b) = op.lower_excl {
                writeln!(s, "lower_exclusive = {b}").unwrap();
            }
            if let Some(b) = op.upper_excl {
                writeln!(s, "upper_exclusive = {b}").unwrap();
            }
            if let Some(j) = op.join {
                writeln!(s, "join = \"{}\"", j.name()).unwrap();
            }
            if let Some(m) = op.where_mod {
                writeln!(s, "where = \"(left.seq + right.seq) % {m} != 0\"").unwrap();
            }
            let sel: Vec<String> = op.select.iter().map(|x| format!("\"{}\"", x.text())).collect();
            writeln!(s, "select = [{}]", sel.join(", ")).unwrap();
        }
        s
    }

    /// Config, inputs and the command line, as text (for failure messages).
    pub fn dump(&self) -> String {
        let mut s = format!("--- workload seed {} ({}) ---\n", self.seed, self.notes.join("; "));
        s += "--- braid.toml ---\n";
        s += &self.config_text();
        for &i in &self.flag_order {
            let st = &self.streams[i];
            s += &format!("--- {}.jsonl ---\n{}", st.name, st.file_text());
        }
        let inputs: Vec<String> =
            self.flag_order.iter().map(|&i| format!("--input {0}={0}.jsonl", self.streams[i].name)).collect();
        s += &format!("--- braid replay --config braid.toml {} --output NAME=FILE ...\n", inputs.join(" "));
        s
    }

    /// Writes config and inputs to `dir`; returns the config path and (stream, path) in flag order.
    pub fn write_to(&self, dir: &Path) -> (PathBuf, Files) {
        let cfg = write_file(dir, "braid.toml", self.config_text());
        let inputs =
            write_inputs(dir, self.flag_order.iter().map(|&i| (&self.streams[i].name, self.streams[i].file_text())));
        (cfg, inputs)
    }

    /// Saves config + inputs under the cargo target tmp dir for a human to replay; returns the dir.
    pub fn save_repro(&self, label: &str) -> PathBuf {
        let dir = repro_dir(&format!("braid-repro-{label}"));
        self.write_to(&dir);
        std::fs::write(dir.join("workload.txt"), self.dump()).unwrap();
        dir
    }

    /// Every file that has lines has one with an arrival of its own (else rule 1 gives arrival 0
    /// and the replay would span from 1970: the generator never does that, the shrinker must not).
    pub fn is_sane(&self) -> bool {
        self.streams.iter().all(|s| s.lines.is_empty() || s.lines.iter().any(|l| l.own_arrival().is_some()))
    }

    /// The same workload without line `li` of stream `si` (for shrinking).
    pub fn without_line(&self, si: usize, li: usize) -> Workload {
        let mut w = self.clone();
        w.streams[si].lines.remove(li);
        w
    }
}

// ---------------------------------------------------------------------------- the generator ---

/// What a generated workload may contain.
#[derive(Clone, Debug)]
pub struct GenOpts {
    /// Rows per stream: 0..=max_rows.
    pub max_rows: usize,
    /// A share of rows with a delay above max_out_of_orderness.
    pub late: bool,
    /// idle_timeout settings that bite, idle devices, streams going silent.
    pub idle: bool,
    /// A few rows that arrive before their event time (clock skew).
    pub negative_delays: bool,
    /// A few lines that go to dead_letter (sometimes the very first line of the replay).
    pub dead_letters: bool,
    /// Both streams get the same max_out_of_orderness, at least this much.
    pub same_ooo_min: Option<i64>,
}

impl GenOpts {
    /// Everything on: the reference test.
    pub fn everything(max_rows: usize) -> GenOpts {
        GenOpts { max_rows, late: true, idle: true, negative_delays: true, dead_letters: true, same_ooo_min: None }
    }

    /// Nothing can be late: delays within one shared max_out_of_orderness, no idleness.
    pub fn never_late(max_rows: usize) -> GenOpts {
        GenOpts {
            max_rows,
            late: false,
            idle: false,
            negative_delays: false,
            dead_letters: false,
            same_ooo_min: Some(200),
        }
    }
}

/// Values ≡ −1 (mod grid) put watermarks on the grid (rows exactly on the watermark), ≡ −2 one
/// ms above it (rows late by exactly 1 ms).
const OOO_CHOICES: [i64; 13] = [0, 98, 99, 100, 199, 200, 248, 249, 250, 499, 500, 999, 1000];
const STRING_KEYS: [&str; 6] = ["d0", "d1", "gw-ü2", "d3", "sensor-17", "x"];
const INT_KEYS: [i64; 6] = [0, 7, -3, 1 << 40, 42, i64::MAX];

fn dur_text(rng: &mut Rng, ms: i64) -> String {
    if ms != 0 && ms % 1000 == 0 && rng.chance(0.5) { format!("{}s", ms / 1000) } else { format!("{ms}ms") }
}

/// Event-time layout shared by the streams of one workload.
#[derive(Clone, Debug)]
struct Layout {
    grid: i64,
    span: i64,
    keys: Vec<Key>,
    /// Key 0 is an idle device: only rows with ts < this.
    idle_key_until: Option<i64>,
    /// Delays are rounded down to multiples of this.
    delay_gran: i64,
    late_share: f64,
    neg_share: f64,
    /// Share of rows whose ts is moved 1 ms off the grid.
    jitter: f64,
    /// Every row with ts ≥ at gets ts + len: a pause of the whole input (longer than the
    /// default idle_timeout of 30 s when set).
    pause: Option<(i64, i64)>,
}

/// A silent stretch of event time [from, to) for one stream.
type Silence = Option<(i64, i64)>;

fn gen_rows(rng: &mut Rng, lay: &Layout, n: usize, ooo: i64, silence: Silence, seq: &mut i64) -> Vec<Row> {
    let mut rows = Vec::with_capacity(n);
    let slots = lay.span / lay.grid;
    for _ in 0..n {
        // event time: on the grid, outside the silent stretch (give up after a few tries)
        let mut ts = None;
        for _ in 0..20 {
            let t = BASE_TS + lay.grid * rng.range(0, slots);
            if !matches!(silence, Some((a, b)) if a <= t && t < b) {
                ts = Some(t);
                break;
            }
        }
        let Some(mut ts) = ts else { continue };
        let mut key = rng.pick(&lay.keys);
        if let Some(until) = lay.idle_key_until
            && key == lay.keys[0]
            && ts >= until
            && lay.keys.len() > 1
        {
            key = lay.keys[1 + rng.below(lay.keys.len() as u64 - 1) as usize].clone();
        }
        if let Some((at, len)) = lay.pause
            && ts >= at
        {
            ts += len;
        }
        if rng.chance(lay.jitter) {
            ts += rng.pick(&[-1, 1]);
        }
        let delay = if rng.chance(lay.late_share) {
            let d = ooo + rng.range(1, 3000);
            d + (lay.delay_gran - d % lay.delay_gran) % lay.delay_gran
        } else if rng.chance(lay.neg_share) {
            -rng.range(1, 400)
        } else {
            let d = rng.range(0, ooo);
            d - d % lay.delay_gran
        };
        let write_arrival = delay != 0 || rng.chance(0.5);
        *seq += 1;
        rows.push(Row { seq: *seq, key, ts, arrival: ts + delay, write_arrival, extra: Value::Null });
    }
    rows
}

fn silence_for(rng: &mut Rng, lay: &Layout, idle: i64) -> Silence {
    let len = idle.max(400) + rng.range(1, 12) * TICK;
    match rng.below(3) {
        0 => Some((BASE_TS, BASE_TS + len)),             // starts late
        1 => Some((BASE_TS + lay.span - len, i64::MAX)), // stops early
        _ => {
            let a = BASE_TS + lay.grid * rng.range(0, lay.span / lay.grid / 2);
            Some((a, a + len)) // a gap
        }
    }
}

/// Puts the lines of a file in an order: by arrival, by ts, or shuffled (ties in arrival are
/// broken by line number, CONTRACT rule 1).
fn order_lines(rng: &mut Rng, lines: &mut [Line]) {
    match rng.below(3) {
        0 => lines.sort_by_key(|l| l.own_arrival().unwrap_or(0)),
        1 => lines.sort_by_key(|l| l.row().map_or(0, |r| r.ts)),
        _ => rng.shuffle(lines),
    }
}

/// A line that goes to dead_letter, arriving at `a` when its kind lets it have an arrival of its
/// own: an explicit `"arrival"`, or (bad `"arrival"`, or no `"arrival"`) its event time `a`.
fn bad_line(rng: &mut Rng, st: &Stream, key: &Key, grid: i64, a: i64) -> Line {
    let mut m = serde_json::Map::new();
    m.insert("device".into(), key.to_json());
    m.insert("ts".into(), json!(a - a.rem_euclid(grid)));
    m.insert("seq".into(), json!(0));
    m.insert(st.extra_field.clone(), if st.extra_type == "float" { json!(1.5) } else { json!("x") });
    m.insert("arrival".into(), json!(a));
    let (arrival, reason) = match rng.below(7) {
        0 => {
            m.insert("seq".into(), json!("not-an-int"));
            (Some(a), "wrong_type:seq")
        }
        1 => {
            m.insert("seq".into(), json!(1.5));
            m.insert("ts".into(), json!(a));
            m.remove("arrival");
            (Some(a), "wrong_type:seq")
        }
        2 => {
            m.insert("ts".into(), json!(a));
            m.insert("arrival".into(), json!("soon"));
            (Some(a), "bad_arrival")
        }
        3 => {
            m.insert("ts".into(), json!(a + 11 * 60_000)); // beyond max_skew (10 min)
            (Some(a), "time_out_of_range")
        }
        4 => {
            m.remove("seq");
            (Some(a), "missing_field:seq")
        }
        5 => {
            let text = Value::Object(m).to_string();
            return Line::Bad {
                arrival: None,
                text: text[..text.len() / 2].to_string(),
                reason: "invalid_json".into(),
            };
        }
        _ => return Line::Bad { arrival: None, text: "[1,2,3]".into(), reason: "not_an_object".into() },
    };
    Line::Bad { arrival, text: Value::Object(m).to_string(), reason: reason.into() }
}

fn new_stream(rng: &mut Rng, name: &str, extra_field: &str, extra_type: &str, ooo: i64, idle: i64) -> Stream {
    let ooo_text = if ooo == 0 && rng.chance(0.5) { None } else { Some(dur_text(rng, ooo)) };
    let idle_text = if idle == 30_000 && rng.chance(0.6) { None } else { Some(dur_text(rng, idle)) };
    Stream {
        name: name.into(),
        ooo,
        ooo_text,
        idle,
        idle_text,
        extra_field: extra_field.into(),
        extra_type: extra_type.into(),
        lines: vec![],
    }
}

fn fill_extra(rng: &mut Rng, st: &mut Stream) {
    for l in &mut st.lines {
        if let Some(r) = l.row_mut() {
            r.extra = if st.extra_type == "float" {
                json!(rng.range(-400, 400) as f64 / 4.0)
            } else {
                json!(rng.pick(&["on", "off", "reboot", "set-point", "ünïcode"]))
            };
        }
    }
}

fn gen_join(rng: &mut Rng, name: &str, left: &str, right: &str, grid: i64, notes: &mut Vec<String>) -> Join {
    let lower = grid * rng.range(-8, 5);
    let upper = lower + grid * rng.range(0, 8);
    let mut lower_excl = rng.pick(&[None, Some(false), Some(true)]);
    let mut upper_excl = rng.pick(&[None, Some(false), Some(true)]);
    if lower + i64::from(lower_excl == Some(true)) > upper - i64::from(upper_excl == Some(true)) {
        lower_excl = rng.pick(&[None, Some(false)]);
        upper_excl = rng.pick(&[None, Some(false)]);
    }
    let join =
        rng.pick(&[None, Some(JoinType::Inner), Some(JoinType::Left), Some(JoinType::Right), Some(JoinType::Full)]);
    notes.push(format!(
        "{name}: [{lower}{}, {upper}{}] {}",
        if lower_excl == Some(true) { " excl" } else { "" },
        if upper_excl == Some(true) { " excl" } else { "" },
        join.unwrap_or(JoinType::Inner).name()
    ));
    Join {
        name: name.into(),
        left: left.into(),
        right: right.into(),
        lower,
        upper,
        lower_text: dur_text(rng, lower),
        upper_text: dur_text(rng, upper),
        lower_excl,
        upper_excl,
        join,
        select: vec![],
        where_mod: None,
    }
}

/// The select list of the main join: the two seqs always, the rest by chance, in random order.
fn gen_select(rng: &mut Rng) -> Vec<Sel> {
    let mut sel = vec![Sel::new(0, "seq", Some("lseq")), Sel::new(1, "seq", Some("rseq"))];
    if rng.chance(0.6) {
        sel.push(Sel::new(0, "device", None));
    }
    if rng.chance(0.6) {
        sel.push(Sel::new(1, "device", Some("rdevice")));
    }
    if rng.chance(0.6) {
        sel.push(Sel::new(0, "cmd", None));
    }
    if rng.chance(0.6) {
        sel.push(Sel::new(1, "temp", Some("temperature")));
    }
    if rng.chance(0.4) {
        sel.push(Sel::new(1, "ts", Some("status_ts")));
    }
    if rng.chance(0.4) {
        sel.push(Sel::new(0, "ts", Some("command_ts")));
    }
    rng.shuffle(&mut sel);
    sel
}

fn gen_layout(rng: &mut Rng, o: &GenOpts, int_keys: bool, notes: &mut Vec<String>) -> Layout {
    let grid = rng.pick(&[100, 250]);
    let n_keys = rng.range(1, 4) as usize;
    let mut keys: Vec<Key> = if int_keys {
        INT_KEYS.iter().map(|&k| Key::Int(k)).collect()
    } else {
        STRING_KEYS.iter().map(|&k| Key::Str(k.into())).collect()
    };
    rng.shuffle(&mut keys);
    keys.truncate(n_keys);
    let span = grid * rng.range(8, 12_000 / grid);
    let idle_key_until = (o.idle && n_keys > 1 && rng.chance(0.5)).then(|| BASE_TS + span / 4);
    let late_share = if o.late { rng.pick(&[0.0, 0.05, 0.15, 0.3]) } else { 0.0 };
    let neg_share = if o.negative_delays && rng.chance(0.3) { 0.05 } else { 0.0 };
    let delay_gran = rng.pick(&[1, 50, 100]);
    let jitter = if rng.chance(0.3) { 0.15 } else { 0.0 };
    let pause = (o.idle && rng.chance(0.1))
        .then(|| (BASE_TS + grid * rng.range(1, span / grid), grid * rng.range(30_000 / grid, 600_000 / grid)));
    notes.push(format!(
        "grid {grid} ms, span {span} ms, {n_keys} keys{}, late share {late_share}, delays /{delay_gran}{}{}{}",
        if idle_key_until.is_some() { " (one idle device)" } else { "" },
        if neg_share > 0.0 { ", some negative" } else { "" },
        if jitter > 0.0 { ", ts ±1 ms" } else { "" },
        pause.map_or(String::new(), |(at, len)| format!(", pause of {len} ms at +{}", at - BASE_TS)),
    ));
    Layout { grid, span, keys, idle_key_until, delay_gran, late_share, neg_share, jitter, pause }
}

/// A random two-stream interval-join workload (`command` ⋈ `status` → `effect`).
pub fn gen_workload(seed: u64, o: &GenOpts) -> Workload {
    let mut rng = Rng::new(seed);
    let mut notes = vec![];
    let int_keys = rng.chance(0.3);
    let lay = gen_layout(&mut rng, o, int_keys, &mut notes);

    let (ooo_l, ooo_r) = match o.same_ooo_min {
        Some(min) => {
            let v: Vec<i64> = OOO_CHOICES.iter().copied().filter(|&x| x >= min).collect();
            let x = rng.pick(&v);
            (x, x)
        }
        None => {
            let a = rng.pick(&OOO_CHOICES);
            (a, if rng.chance(0.5) { a } else { rng.pick(&OOO_CHOICES) })
        }
    };
    let idle_choices: &[i64] = if o.idle { &[0, 400, 450, 700, 1000, 1500, 2000, 3000, 30_000] } else { &[0, 30_000] };
    let (idle_l, idle_r) = (rng.pick(idle_choices), rng.pick(idle_choices));
    let mut streams = vec![
        new_stream(&mut rng, "command", "cmd", "string", ooo_l, idle_l),
        new_stream(&mut rng, "status", "temp", "float", ooo_r, idle_r),
    ];
    notes.push(format!("ooo {ooo_l}/{ooo_r}, idle_timeout {idle_l}/{idle_r}"));

    // silent stretches: one stream, or both (then every input of the join is idle)
    let mut silences: [Silence; 2] = [None, None];
    if o.idle && rng.chance(0.4) {
        let which = rng.below(3) as usize;
        for (i, s) in silences.iter_mut().enumerate() {
            if which == 2 || which == i {
                *s = silence_for(&mut rng, &lay, streams[i].idle);
            }
        }
        if which == 2 && rng.chance(0.5) {
            silences[1] = silences[0];
        }
        notes.push(format!("silent: {silences:?}"));
    }

    let mut seq = 0;
    for (i, st) in streams.iter_mut().enumerate() {
        let n = if rng.chance(0.05) { 0 } else { rng.range(1, o.max_rows as i64) as usize };
        let rows = gen_rows(&mut rng, &lay, n, st.ooo, silences[i], &mut seq);
        st.lines = rows.into_iter().map(Line::Row).collect();
        fill_extra(&mut rng, st);
    }
    if o.negative_delays && rng.chance(0.08) {
        // a row from far in the future (within max_skew): its stream's watermark jumps
        let i = rng.below(2) as usize;
        let n = streams[i].lines.len();
        if n > 0 {
            let r = streams[i].lines[rng.below(n as u64) as usize].row_mut().unwrap();
            r.ts = r.arrival + lay.grid * rng.range(1, 300_000 / lay.grid);
            r.write_arrival = true;
            let seq = r.seq;
            notes.push(format!("{} #{seq} from the future", streams[i].name));
        }
    }
    if o.late && rng.chance(0.2) {
        // redeliveries: the same line again, later (same fields, so the same row id; rule 10)
        for _ in 0..rng.range(1, 3) {
            let i = rng.below(2) as usize;
            let n = streams[i].lines.len();
            if n > 0 {
                let mut r = streams[i].lines[rng.below(n as u64) as usize].row().unwrap().clone();
                r.arrival += rng.range(0, 2000);
                r.write_arrival = true;
                notes.push(format!("{} #{} redelivered", streams[i].name, r.seq));
                streams[i].lines.push(Line::Row(r));
            }
        }
    }
    if o.dead_letters && rng.chance(0.3) {
        let first = streams.iter().flat_map(|s| s.lines.iter().filter_map(Line::own_arrival)).min();
        let first = first.unwrap_or(BASE_TS);
        for _ in 0..rng.range(1, 3) {
            let i = rng.below(2) as usize;
            let arrival = if rng.chance(0.5) {
                first - rng.range(1, 3000) // the replay may start with a dead-lettered line
            } else {
                BASE_TS + rng.range(0, lay.span)
            };
            let key = rng.pick(&lay.keys);
            let line = bad_line(&mut rng, &streams[i], &key, lay.grid, arrival);
            streams[i].lines.push(line);
        }
        notes.push("dead letters".into());
    }
    for st in &mut streams {
        order_lines(&mut rng, &mut st.lines);
        if !st.lines.iter().any(|l| l.own_arrival().is_some()) {
            st.lines.clear(); // only lines that inherit an arrival: rule 1 would give them 0
        }
    }

    let mut join = gen_join(&mut rng, "effect", "command", "status", lay.grid, &mut notes);
    join.select = gen_select(&mut rng);
    let idle_advance = rng.pick(&[None, Some(true), Some(false)]);
    let flag_order = if rng.chance(0.5) { vec![0, 1] } else { vec![1, 0] };
    notes.push(format!("idle_advance {idle_advance:?}, inputs {flag_order:?}"));
    Workload { seed, grid: lay.grid, idle_advance, int_keys, streams, ops: vec![join], flag_order, notes }
}

/// A chain: `effect` = command ⋈ status, then `audit` = effect ⋈ ack (the second operator's left
/// input is the first one's output). command and status keep flowing (never idle: an upstream
/// operator whose inputs all went idle may legitimately produce late rows downstream); late rows
/// and idleness of `ack` are allowed.
pub fn gen_chain(seed: u64, max_rows: usize) -> Workload {
    let mut o = GenOpts::everything(max_rows);
    o.idle = false;
    o.dead_letters = false;
    let mut w = gen_workload(seed, &o);
    let mut rng = Rng::new(seed ^ 0xC0FF_EE00_0000_0001);
    // command and status never go idle: idle_timeout is "0ms" or 30 s, longer than any workload
    assert!(w.streams.iter().all(|s| s.idle == 0 || s.idle == 30_000));
    let grid = w.grid;
    let keys: BTreeSet<Key> = w.streams.iter().flat_map(Stream::rows).map(|r| r.key.clone()).collect();
    let mut keys: Vec<Key> = keys.into_iter().collect();
    if keys.is_empty() {
        keys.push(if w.int_keys { Key::Int(1) } else { Key::Str("d0".into()) });
    }
    let lay = Layout {
        grid,
        span: grid * rng.range(8, 12_000 / grid),
        keys,
        idle_key_until: None,
        delay_gran: rng.pick(&[1, 50, 100]),
        late_share: rng.pick(&[0.0, 0.1]),
        neg_share: 0.0,
        jitter: 0.1,
        pause: None,
    };
    let ooo = rng.pick(&OOO_CHOICES);
    let idle = rng.pick(&[0, 1000, 30_000]);
    let mut ack = new_stream(&mut rng, "ack", "cmd", "string", ooo, idle);
    let mut seq = w.streams.iter().flat_map(Stream::rows).map(|r| r.seq).max().unwrap_or(0) + 1000;
    let n = rng.range(1, max_rows as i64) as usize;
    ack.lines = gen_rows(&mut rng, &lay, n, ooo, None, &mut seq).into_iter().map(Line::Row).collect();
    fill_extra(&mut rng, &mut ack);
    order_lines(&mut rng, &mut ack.lines);
    w.streams.push(ack);
    w.flag_order.insert(rng.below(3) as usize, 2);
    let mut audit = gen_join(&mut rng, "audit", "effect", "ack", grid, &mut w.notes);
    audit.select = vec![
        Sel::new(0, "lseq", Some("e_lseq")),
        Sel::new(0, "rseq", Some("e_rseq")),
        Sel::new(1, "seq", Some("aseq")),
    ];
    w.ops.push(audit);
    w.notes.push(format!("ack: ooo {ooo}, idle {idle}, {n} rows"));
    w
}

/// The same rows with their arrivals permuted: random transpositions of arrival values between
/// rows (of both streams) that keep every row within `ts ≤ arrival ≤ ts + ooo`; the lines of each
/// file are then put in a new order too. Only meant for `GenOpts::never_late` workloads.
pub fn permute_arrivals(w: &Workload, seed: u64) -> Workload {
    let mut rng = Rng::new(seed);
    let mut v = w.clone();
    let mut slots: Vec<(usize, usize)> = vec![];
    for (si, st) in v.streams.iter().enumerate() {
        for (li, l) in st.lines.iter().enumerate() {
            if l.row().is_some() {
                slots.push((si, li));
            }
        }
    }
    if slots.len() >= 2 {
        for _ in 0..slots.len() * 8 {
            let a = slots[rng.below(slots.len() as u64) as usize];
            let b = slots[rng.below(slots.len() as u64) as usize];
            let (ra, rb) = (v.streams[a.0].lines[a.1].row().unwrap(), v.streams[b.0].lines[b.1].row().unwrap());
            let (oa, ob) = (v.streams[a.0].ooo, v.streams[b.0].ooo);
            let ok = |r: &Row, arr: i64, ooo: i64| r.ts <= arr && arr <= r.ts + ooo;
            if ok(ra, rb.arrival, oa) && ok(rb, ra.arrival, ob) {
                let (x, y) = (ra.arrival, rb.arrival);
                let r = v.streams[a.0].lines[a.1].row_mut().unwrap();
                r.arrival = y;
                r.write_arrival = true;
                let r = v.streams[b.0].lines[b.1].row_mut().unwrap();
                r.arrival = x;
                r.write_arrival = true;
            }
        }
    }
    for st in &mut v.streams {
        order_lines(&mut rng, &mut st.lines);
    }
    v.notes.push(format!("arrivals permuted (seed {seed})"));
    v
}

// ------------------------------------------------------------------------------ the runner ---

/// Runs `braid replay` on the workload (fresh temp dir) and reads the named outputs.
pub fn run_replay(w: &Workload, shards: Option<u32>, outputs: &[&str]) -> Result<Outputs, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (cfg, inputs) = w.write_to(dir.path());
    replay(dir.path(), &cfg, shards, &inputs, outputs, RUN_TIMEOUT)
}

// --------------------------------------------------------------------- the brute-force reference ---

/// What the simulation of rules 1–8 found for one operator over two input streams.
#[derive(Debug, Default, Clone)]
pub struct Sim {
    /// (stream index, line index) of every late row.
    pub late_lines: BTreeSet<(usize, usize)>,
    /// (stream index, seq) of every late row (a redelivered row: of a late copy).
    pub late: BTreeSet<(usize, i64)>,
    /// Rows whose ts was exactly the operator's watermark when processed (on time, rule 7).
    pub on_watermark: usize,
    /// Rows late by exactly 1 ms (ts == watermark − 1).
    pub just_late: usize,
    /// Some input stream of the operator was idle at some tick.
    pub some_idle: bool,
    /// Every input of the operator was idle at some tick.
    pub all_idle: bool,
    /// The operator's watermark advanced with processing time while all inputs were idle.
    pub idle_advanced: bool,
    /// An idle stream came back (a row after idleness).
    pub reactivated: bool,
    /// Number of ticks run.
    pub ticks: usize,
    /// Per row: the operator watermark it was judged against (seq → wm; None = −∞).
    pub judged: BTreeMap<i64, Option<i64>>,
}

struct StreamState {
    max_ts: Option<i64>,
    wm: i128,
    idle: bool,
    last_arrival: i64,
    rows_since_tick: bool,
}

/// Simulates CONTRACT.md rules 1–8 for operator `op` of `w`, whose two inputs must be input
/// streams, and decides which rows are late (ts < the operator's watermark as of the last tick).
pub fn simulate(w: &Workload, op: usize) -> Sim {
    let j = &w.ops[op];
    let li = w.stream_index(&j.left).expect("left input must be an input stream");
    let ri = w.stream_index(&j.right).expect("right input must be an input stream");
    let mut sim = Sim::default();

    // rule 1: merge by (arrival, position of the --input flag, line number)
    let mut lines: Vec<(i64, usize, usize, usize)> = vec![];
    for (flag, &si) in w.flag_order.iter().enumerate() {
        for (ln, a) in w.streams[si].arrivals().into_iter().enumerate() {
            lines.push((a, flag, ln, si));
        }
    }
    lines.sort();
    let Some(&(start, ..)) = lines.first() else { return sim };

    // rule 4: before a stream's first row, idleness counts from the start of the replay
    let mut st: Vec<StreamState> = w
        .streams
        .iter()
        .map(|_| StreamState { max_ts: None, wm: NEG_INF, idle: false, last_arrival: start, rows_since_tick: false })
        .collect();
    let mut op_wm: i128 = NEG_INF;
    let mut all_idle_since: Option<(i64, i128)> = None; // (tick, watermark then)
    let mut now = start;

    for (a, _, ln, si) in lines {
        // rule 3: every tick T with now < T <= a runs before the line
        let mut t = (now.div_euclid(TICK) + 1) * TICK;
        while t <= a {
            sim.ticks += 1;
            for (i, s) in st.iter_mut().enumerate() {
                let idle_timeout = w.streams[i].idle;
                if s.rows_since_tick {
                    s.idle = false;
                    s.rows_since_tick = false;
                } else if idle_timeout > 0 && t - s.last_arrival >= idle_timeout {
                    s.idle = true;
                }
                if let Some(m) = s.max_ts {
                    s.wm = i128::from(m) - i128::from(w.streams[i].ooo) - 1;
                }
            }
            // rule 5
            let active: Vec<i128> = [li, ri].iter().filter(|&&i| !st[i].idle).map(|&i| st[i].wm).collect();
            if st[li].idle || st[ri].idle {
                sim.some_idle = true;
            }
            if let Some(&m) = active.iter().min() {
                all_idle_since = None;
                op_wm = op_wm.max(m);
            } else {
                sim.all_idle = true;
                if w.idle_advance() {
                    let (t0, base) = *all_idle_since.get_or_insert((t, op_wm));
                    let v = base + i128::from(t - t0);
                    if v > op_wm && op_wm > NEG_INF / 2 {
                        sim.idle_advanced = true;
                    }
                    op_wm = op_wm.max(v);
                }
            }
            t += TICK;
        }
        now = now.max(a);

        let Line::Row(r) = &w.streams[si].lines[ln] else { continue }; // dead letter: no row
        let s = &mut st[si];
        s.rows_since_tick = true;
        s.last_arrival = a;
        s.max_ts = Some(s.max_ts.map_or(r.ts, |m| m.max(r.ts)));
        if s.idle {
            sim.reactivated = true; // an idle stream gets a row: active again at the next tick
        }
        if si == li || si == ri {
            // rule 7: late iff ts < the operator's watermark as of the last tick
            let ts = i128::from(r.ts);
            sim.judged.insert(r.seq, (op_wm > NEG_INF / 2).then_some(op_wm as i64));
            if ts < op_wm {
                sim.late.insert((si, r.seq));
                sim.late_lines.insert((si, ln));
                if ts == op_wm - 1 {
                    sim.just_late += 1;
                }
            } else if ts == op_wm {
                sim.on_watermark += 1;
            }
        }
    }
    sim
}

/// A result as the comparison sees it: (kind, left seq, right seq).
pub type Triple = (String, Option<i64>, Option<i64>);

/// The expected results of operator 0 of `w` by brute force: on-time × on-time nested loops.
#[derive(Debug, Default)]
pub struct Expected {
    pub results: BTreeMap<Triple, usize>,
    /// (stream name, seq)
    pub late: BTreeMap<(String, i64), usize>,
    pub sim: Sim,
    /// Matches with r.ts exactly on l.ts + lower′ or l.ts + upper′.
    pub on_bound: usize,
    /// Pairs of the same key that miss the bounds by exactly 1 ms.
    pub off_by_one: usize,
}

pub fn expected(w: &Workload) -> Expected {
    let j = &w.ops[0];
    let (li, ri) = (w.stream_index(&j.left).unwrap(), w.stream_index(&j.right).unwrap());
    let sim = simulate(w, 0);
    let mut e = Expected::default();
    let on_time = |si: usize| -> Vec<&Row> {
        let lines = w.streams[si].lines.iter().enumerate();
        lines.filter(|(ln, _)| !sim.late_lines.contains(&(si, *ln))).filter_map(|(_, l)| l.row()).collect()
    };
    let (ls, rs) = (on_time(li), on_time(ri));
    let mut matched: BTreeSet<i64> = BTreeSet::new();
    for l in &ls {
        for r in &rs {
            if l.key != r.key {
                continue;
            }
            if j.cond(l.ts, r.ts) && !j.passes_where(l, r) {
                // Within the bounds, filtered out by `where`: not a pair.
            } else if j.cond(l.ts, r.ts) {
                *e.results.entry(("match".into(), Some(l.seq), Some(r.seq))).or_insert(0) += 1;
                matched.insert(l.seq);
                matched.insert(r.seq);
                if r.ts == l.ts + j.lo() || r.ts == l.ts + j.hi() {
                    e.on_bound += 1;
                }
            } else if r.ts == l.ts + j.lo() - 1 || r.ts == l.ts + j.hi() + 1 {
                e.off_by_one += 1;
            }
        }
    }
    let jt = j.join_type();
    if jt.keeps_left() {
        for l in ls.iter().filter(|l| !matched.contains(&l.seq)) {
            *e.results.entry(("left_only".into(), Some(l.seq), None)).or_insert(0) += 1;
        }
    }
    if jt.keeps_right() {
        for r in rs.iter().filter(|r| !matched.contains(&r.seq)) {
            *e.results.entry(("right_only".into(), None, Some(r.seq))).or_insert(0) += 1;
        }
    }
    for &(si, ln) in &sim.late_lines {
        let seq = w.streams[si].lines[ln].row().unwrap().seq;
        *e.late.entry((w.streams[si].name.clone(), seq)).or_insert(0) += 1;
    }
    e.sim = sim;
    e
}

// ----------------------------------------------------------------------------- the checker ---

fn same_value(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if a.is_f64() || b.is_f64() => x == y,
        _ => a == b,
    }
}

/// Reads operator 0's output as triples and checks every result object on its own:
/// the exact set of fields, `_kind`, the key (rule 9), selected values and nulls, `_ts`, `_id`.
/// Problems are appended to `errs`.
pub fn result_triples(w: &Workload, rows: &[Value], errs: &mut Vec<String>) -> BTreeMap<Triple, usize> {
    let j = &w.ops[0];
    let by_seq = w.rows_by_seq();
    let (li, ri) = (w.stream_index(&j.left).unwrap(), w.stream_index(&j.right).unwrap());
    let lalias = j.alias_of(0, "seq").expect("left.seq must be selected");
    let ralias = j.alias_of(1, "seq").expect("right.seq must be selected");
    let mut want_fields: BTreeSet<String> = j.select.iter().map(|s| s.alias.clone()).collect();
    want_fields.extend(["device", "_id", "_ts", "_kind"].map(String::from));

    let mut out = BTreeMap::new();
    let mut ids: BTreeMap<String, Triple> = BTreeMap::new();
    let mut triple_ids: BTreeMap<Triple, String> = BTreeMap::new();
    for v in rows {
        let mut err = |m: String| errs.push(format!("{m}\n    in {v}"));
        let Some(obj) = v.as_object() else {
            err("result is not an object".into());
            continue;
        };
        let got: BTreeSet<String> = obj.keys().cloned().collect();
        if got != want_fields {
            err(format!("fields {got:?}, want {want_fields:?}"));
        }
        let kind = obj.get("_kind").and_then(Value::as_str).unwrap_or("?").to_string();
        let seq_of = |alias: &str| obj.get(alias).and_then(Value::as_i64);
        let (ls, rs) = (seq_of(lalias), seq_of(ralias));
        let triple = (kind.clone(), ls, rs);
        *out.entry(triple.clone()).or_insert(0) += 1;

        let lrow = ls.and_then(|s| by_seq.get(&s)).map(|&(si, r)| (si, r));
        let rrow = rs.and_then(|s| by_seq.get(&s)).map(|&(si, r)| (si, r));
        let shape_ok = match kind.as_str() {
            "match" => lrow.is_some() && rrow.is_some(),
            "left_only" => lrow.is_some() && obj.get(ralias) == Some(&Value::Null),
            "right_only" => rrow.is_some() && obj.get(lalias) == Some(&Value::Null),
            _ => false,
        };
        if !shape_ok {
            err(format!("bad _kind {kind:?} or seq fields {lalias}/{ralias}"));
            continue;
        }
        if lrow.is_some_and(|(si, _)| si != li) || rrow.is_some_and(|(si, _)| si != ri) {
            err("a seq names a row of the wrong input".into());
            continue;
        }
        let (l, r) = (lrow.map(|x| x.1), rrow.map(|x| x.1));
        let key = l.or(r).unwrap().key.clone();
        if let (Some(l), Some(r)) = (l, r)
            && l.key != r.key
        {
            err(format!("match of different keys {:?} and {:?}", l.key, r.key));
        }
        // rule 9: the key under the left input's key field name, on every result
        if obj.get("device") != Some(&key.to_json()) {
            err(format!("\"device\" should be the key {}", key.to_json()));
        }
        for s in &j.select {
            let row = if s.side == 0 { l } else { r };
            let stream = &w.streams[if s.side == 0 { li } else { ri }];
            let want = if s.field == "device" {
                key.to_json() // a selected key field holds the key on every result
            } else {
                match row {
                    None => Value::Null,
                    Some(row) => stream.row_fields(row).get(&s.field).cloned().unwrap_or(Value::Null),
                }
            };
            let have = obj.get(&s.alias).cloned().unwrap_or(Value::Null);
            if !same_value(&have, &want) {
                err(format!("{} = {have}, want {want}", s.text()));
            }
        }
        let want_ts = match (l, r) {
            (Some(l), Some(r)) => l.ts.max(r.ts),
            (Some(x), None) | (None, Some(x)) => x.ts,
            _ => unreachable!(),
        };
        if obj.get("_ts").and_then(Value::as_i64) != Some(want_ts) {
            err(format!("_ts should be {want_ts}"));
        }
        match obj.get("_id") {
            Some(id) if is_id_value(id) => {
                let id = id.as_str().unwrap().to_string();
                if let Some(t) = ids.insert(id.clone(), triple.clone())
                    && t != triple
                {
                    err(format!("_id {id} shared by {t:?} and {triple:?}"));
                }
                if let Some(old) = triple_ids.insert(triple.clone(), id.clone())
                    && old != id
                {
                    err(format!("{triple:?} has two _ids {old} and {id}"));
                }
            }
            other => err(format!("_id {other:?} is not 16 lowercase hex digits")),
        }
    }
    out
}

/// Reads an operator's late output as (stream, seq) and checks each row: its declared fields,
/// `_stream`, `_ts`, nothing else.
pub fn late_pairs(w: &Workload, rows: &[Value], errs: &mut Vec<String>) -> BTreeMap<(String, i64), usize> {
    let by_seq = w.rows_by_seq();
    let mut out = BTreeMap::new();
    for v in rows {
        let stream = v.get("_stream").and_then(Value::as_str).unwrap_or("?").to_string();
        let seq = v.get("seq").and_then(Value::as_i64).unwrap_or(-1);
        *out.entry((stream.clone(), seq)).or_insert(0) += 1;
        let Some(&(si, r)) = by_seq.get(&seq) else {
            errs.push(format!("late row with unknown seq: {v}"));
            continue;
        };
        let st = &w.streams[si];
        let mut want = st.row_fields(r);
        want.insert("_stream".into(), json!(st.name));
        want.insert("_ts".into(), json!(r.ts));
        let ok = v.as_object().is_some_and(|o| {
            o.len() == want.len() && want.iter().all(|(k, x)| o.get(k).is_some_and(|y| same_value(x, y)))
        });
        if !ok {
            errs.push(format!("late row {v}\n    want {}", Value::Object(want)));
        }
    }
    out
}

/// Explains a (missing or unexpected) triple in terms of the rows involved.
fn explain(w: &Workload, e: &Expected, t: &Triple) -> String {
    let by_seq = w.rows_by_seq();
    let desc = |s: Option<i64>| -> String {
        match s.and_then(|s| by_seq.get(&s)) {
            None => "-".into(),
            Some(&(si, r)) => {
                let judged = e.sim.judged.get(&r.seq).copied().flatten();
                format!(
                    "{}#{} key {:?} ts {} (+{}) arrival {} wm {} {}",
                    w.streams[si].name,
                    r.seq,
                    r.key,
                    r.ts,
                    r.ts - BASE_TS,
                    r.arrival,
                    judged.map_or("-inf".into(), |x| x.to_string()),
                    if e.sim.late.contains(&(si, r.seq)) { "LATE" } else { "on time" }
                )
            }
        }
    };
    format!("{} [{}] [{}]", t.0, desc(t.1), desc(t.2))
}

fn count_diff<K: Ord + Clone>(want: &BTreeMap<K, usize>, got: &BTreeMap<K, usize>) -> (Vec<(K, usize, usize)>, usize) {
    let keys: BTreeSet<&K> = want.keys().chain(got.keys()).collect();
    let mut v = vec![];
    for k in keys {
        let (a, b) = (want.get(k).copied().unwrap_or(0), got.get(k).copied().unwrap_or(0));
        if a != b {
            v.push((k.clone(), a, b));
        }
    }
    let n = v.len();
    (v, n)
}

/// Statistics of one checked workload (for coverage assertions).
#[derive(Debug, Default, Clone)]
pub struct CaseStats {
    pub join: Option<JoinType>,
    pub rows: usize,
    pub matches: usize,
    pub outer: usize,
    pub late: usize,
    pub on_watermark: usize,
    pub just_late: usize,
    pub on_bound: usize,
    pub off_by_one: usize,
    pub some_idle: bool,
    pub all_idle: bool,
    pub idle_advanced: bool,
    pub reactivated: bool,
    pub negative_lower: bool,
    pub positive_lower: bool,
    pub negative_upper: bool,
    pub exclusive: bool,
    pub int_keys: bool,
    pub dead_letters: usize,
    pub empty_stream: bool,
    /// Dead-letter reasons of the workload's bad lines.
    pub dead_reasons: BTreeSet<String>,
    /// Some row is in the input twice (a redelivery).
    pub redelivered: bool,
    /// Some row arrives more than a minute before its event time.
    pub from_future: bool,
    /// Processing time has a gap above 30 s (the default idle_timeout).
    pub long_pause: bool,
}

/// Runs braid on `w` and compares operator 0's output and late output with the brute-force
/// reference. Err: a readable description of every difference.
pub fn check_reference(w: &Workload, shards: Option<u32>) -> Result<CaseStats, String> {
    let j = &w.ops[0];
    let late_name = format!("{}.late", j.name);
    let out = run_replay(w, shards, &[&j.name, &late_name, "dead_letter"])?;
    let e = expected(w);
    let mut errs = vec![];
    let got = result_triples(w, out.get(&j.name), &mut errs);
    let got_late = late_pairs(w, out.get(&late_name), &mut errs);

    let (d, n) = count_diff(&e.results, &got);
    for (t, want, have) in d.iter().take(25) {
        errs.push(format!("result expected ×{want}, braid ×{have}: {}", explain(w, &e, t)));
    }
    if n > 25 {
        errs.push(format!("... {} more result differences", n - 25));
    }
    let (d, n) = count_diff(&e.late, &got_late);
    for ((stream, seq), want, have) in d.iter().take(25) {
        let t: Triple =
            if stream == &j.left { ("late".into(), Some(*seq), None) } else { ("late".into(), None, Some(*seq)) };
        errs.push(format!("late row expected ×{want}, braid ×{have}: {}", explain(w, &e, &t)));
    }
    if n > 25 {
        errs.push(format!("... {} more late differences", n - 25));
    }
    let dl = out.get("dead_letter");
    let want_dl: BTreeMap<String, usize> = w
        .streams
        .iter()
        .flat_map(|s| {
            s.lines.iter().filter_map(move |l| match l {
                Line::Bad { reason, text, .. } => Some(format!("{}:{reason}:{text}", s.name)),
                Line::Row(_) => None,
            })
        })
        .fold(BTreeMap::new(), |mut m, k| {
            *m.entry(k).or_insert(0) += 1;
            m
        });
    let got_dl = dl.iter().fold(BTreeMap::new(), |mut m, v| {
        let k = format!(
            "{}:{}:{}",
            v.get("_stream").and_then(Value::as_str).unwrap_or("?"),
            v.get("_reason").and_then(Value::as_str).unwrap_or("?"),
            v.get("raw").and_then(Value::as_str).unwrap_or("?")
        );
        *m.entry(k).or_insert(0) += 1;
        m
    });
    if want_dl != got_dl {
        errs.push(format!("dead_letter: want {want_dl:?}, braid {got_dl:?}"));
    }

    if !errs.is_empty() {
        return Err(format!("shards {shards:?}: {} problem(s):\n  {}", errs.len(), errs.join("\n  ")));
    }
    let s = &e.sim;
    Ok(CaseStats {
        join: Some(j.join_type()),
        rows: w.n_rows(),
        matches: e.results.keys().filter(|t| t.0 == "match").count(),
        outer: e.results.keys().filter(|t| t.0 != "match").count(),
        late: s.late_lines.len(),
        on_watermark: s.on_watermark,
        just_late: s.just_late,
        on_bound: e.on_bound,
        off_by_one: e.off_by_one,
        some_idle: s.some_idle,
        all_idle: s.all_idle,
        idle_advanced: s.idle_advanced,
        reactivated: s.reactivated,
        negative_lower: j.lower < 0,
        positive_lower: j.lower > 0,
        negative_upper: j.upper < 0,
        exclusive: j.lower_excl == Some(true) || j.upper_excl == Some(true),
        int_keys: w.int_keys,
        dead_letters: w.n_bad(),
        empty_stream: w.streams.iter().any(|s| s.rows().next().is_none()),
        dead_reasons: w
            .streams
            .iter()
            .flat_map(|s| s.lines.iter())
            .filter_map(|l| match l {
                Line::Bad { reason, .. } => Some(reason.clone()),
                Line::Row(_) => None,
            })
            .collect(),
        redelivered: w
            .streams
            .iter()
            .any(|s| s.rows().count() > s.rows().map(|r| r.seq).collect::<BTreeSet<_>>().len()),
        from_future: w.streams.iter().flat_map(Stream::rows).any(|r| r.ts - r.arrival > 60_000),
        long_pause: {
            let mut a: Vec<i64> = w.streams.iter().flat_map(Stream::arrivals).collect();
            a.sort();
            a.windows(2).any(|p| p[1] - p[0] > 30_000)
        },
    })
}

// ------------------------------------------------------------------------------ the shrinker ---

/// Greedy delta debugging: removes chunks of input lines, then single lines, as long as
/// `fails` still returns Some; stops after `budget` calls. Returns the smallest failing workload
/// found and its failure message.
pub fn shrink(
    w: &Workload,
    msg: String,
    budget: usize,
    fails: impl Fn(&Workload) -> Option<String>,
) -> (Workload, String) {
    let mut best = (w.clone(), msg);
    if best.1.contains("did not finish within") {
        return best; // a hang: shrinking would take RUN_TIMEOUT per step
    }
    let mut calls = 0;
    let mut chunk = (w.streams.iter().map(|s| s.lines.len()).max().unwrap_or(1) / 2).max(1);
    loop {
        let mut progress = false;
        for si in 0..best.0.streams.len() {
            let mut start = 0;
            while start < best.0.streams[si].lines.len() {
                if calls >= budget {
                    return best;
                }
                let mut cand = best.0.clone();
                let end = (start + chunk).min(cand.streams[si].lines.len());
                cand.streams[si].lines.drain(start..end);
                if !cand.is_sane() {
                    start += chunk;
                    continue;
                }
                calls += 1;
                if let Some(m) = fails(&cand) {
                    best = (cand, m);
                    progress = true;
                } else {
                    start += chunk;
                }
            }
        }
        if !progress {
            if chunk == 1 {
                return best;
            }
            chunk = (chunk / 2).max(1);
        }
    }
}
