//! Workloads for checking the shard runtime against the oracle (`common::oracle`)
//! (`tests/it/runtime.rs`): a configuration of one to three operators of any kind, chained through
//! `key = "FIELD"` re-keying so results cross shards, over input files built for ties.
//!
//! Every stream has the fields `k` and `g` (the key type: string or int, `g` drawn from the
//! first few `k` values so joins across the two fields match), `ts`, `v` and `seq` (a line
//! number over all inputs, so every row and every choice between rows shows in the outputs):
//!
//! - `a`, `b`, `d`: keyed by `k`; `c`: keyed by `g` (the partner of an operator re-keyed by `g`);
//!   `bc`: broadcast (key `"*"`, the right side of threshold and temporal joins).
//! - Event times on a 100 ms grid (many equal), bursts of rows with one ts and one arrival over
//!   many keys (so an upstream operator emits results with equal `_ts` on every shard in the same
//!   tick, which re-keying by `g` sends to one downstream key), silent stretches (idleness, idle
//!   advancing), late uploads, lines without `arrival`, redelivered lines and a few bad lines
//!   (`dead_letter`).
//!
//! An operator's output carries `k`, `g`, `v` and `seq` of its left input (`select` or, for
//! cogroup, `first`/`last`/`count` aggregates) plus `rseq`/`rv` of its right one, so it can feed
//! any kind downstream. Only the runtime's and the oracle's outputs are compared: nothing here predicts results.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::BASE_TS;
use super::config_text::stream_section_ms;
use super::rng::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Union,
    Interval,
    Window,
    Cogroup,
    Temporal,
    Threshold,
    Reconcile,
    Absence,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Union,
        Kind::Interval,
        Kind::Window,
        Kind::Cogroup,
        Kind::Temporal,
        Kind::Threshold,
        Kind::Reconcile,
        Kind::Absence,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Union => "union",
            Kind::Interval => "interval_join",
            Kind::Window => "window_join",
            Kind::Cogroup => "cogroup",
            Kind::Temporal => "temporal_join",
            Kind::Threshold => "threshold",
            Kind::Reconcile => "reconcile",
            Kind::Absence => "absence",
        }
    }

    /// Whether a result's `g` can be non-null, so the output can be re-keyed by it.
    fn can_rekey(self) -> bool {
        !matches!(self, Kind::Reconcile | Kind::Absence)
    }

    /// Reads a broadcast stream on the right.
    fn takes_broadcast(self) -> bool {
        matches!(self, Kind::Temporal | Kind::Threshold)
    }

    /// Chooses between tied rows (CONTRACT.md rule 11) when another operator feeds it.
    pub fn order_sensitive(self) -> bool {
        matches!(self, Kind::Temporal | Kind::Threshold | Kind::Reconcile | Kind::Cogroup)
    }
}

/// A stream or an operator's output, as an operator reading it sees it.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    /// The key field; `None`: broadcast.
    pub key: Option<String>,
    /// (name, may be null).
    pub fields: Vec<(String, bool)>,
}

impl Node {
    fn has(&self, field: &str) -> bool {
        self.fields.iter().any(|(f, _)| f == field)
    }

    fn nullable(&self, field: &str) -> bool {
        self.fields.iter().any(|(f, n)| f == field && *n)
    }

    fn key_name(&self) -> &str {
        self.key.as_deref().unwrap_or("")
    }
}

/// An operator output that another operator reads after `key = "FIELD"` moved it off its key.
#[derive(Clone, Debug)]
pub struct Rekeyed {
    pub op: String,
    /// The field holding the key it had (its left input's key).
    pub from: String,
    /// The field it is keyed by now.
    pub to: String,
    pub readers: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Workload {
    pub label: String,
    pub config: String,
    /// (stream, file text), in `--input` order.
    pub inputs: Vec<(String, String)>,
    /// Operators, upstream first.
    pub ops: Vec<(String, Kind)>,
    /// (upstream, reader) for every operator reading another.
    pub edges: Vec<(String, String)>,
    pub rekeyed: Vec<Rekeyed>,
}

impl Workload {
    /// Every operator, `OPERATOR.late` and `dead_letter`.
    pub fn outputs(&self) -> Vec<String> {
        let mut names: Vec<String> =
            self.ops.iter().flat_map(|(name, _)| [name.clone(), format!("{name}.late")]).collect();
        names.push("dead_letter".into());
        names
    }

    /// The config and the inputs as text, for a failure message.
    pub fn dump(&self) -> String {
        let mut text = format!("{}\n--- braid.toml\n{}", self.label, self.config);
        for (name, lines) in &self.inputs {
            write!(text, "--- {name}.jsonl\n{lines}").unwrap();
        }
        text
    }
}

/// How a workload is generated.
#[derive(Clone, Copy, Debug)]
pub struct Profile {
    /// Rows per input stream (about).
    pub rows: usize,
    /// Values of `k`, and of `g` (a prefix of them).
    pub keys: u64,
    pub g_keys: u64,
    /// One in how many rows starts a burst (one ts, one arrival, many keys).
    pub burst_one_in: u64,
}

impl Profile {
    pub const DEFAULT: Profile = Profile { rows: 30, keys: 5, g_keys: 2, burst_one_in: 5 };
    /// Many keys upstream, one or two downstream, bursts: tied results from every shard.
    pub const TIES: Profile = Profile { rows: 30, keys: 8, g_keys: 1, burst_one_in: 3 };
}

struct Gen {
    rng: Rng,
    int_keys: bool,
    profile: Profile,
    text: String,
    streams: Vec<Node>,
    ops: Vec<(String, Kind)>,
    edges: Vec<(String, String)>,
    rekeyed: Vec<Rekeyed>,
    /// The join type of every join from now on (else drawn).
    join: Option<&'static str>,
}

const STREAM_FIELDS: [&str; 5] = ["k", "g", "ts", "v", "seq"];

impl Gen {
    fn new(seed: u64, profile: Profile) -> Gen {
        let mut rng = Rng::new(seed ^ 0x5a4d_0f1e);
        let int_keys = rng.one_in(3);
        let idle_advance = !rng.one_in(3);
        let text = format!("[runtime]\nidle_advance = {idle_advance}\n");
        let mut g = Gen {
            rng,
            int_keys,
            profile,
            text,
            streams: Vec::new(),
            ops: Vec::new(),
            edges: Vec::new(),
            rekeyed: Vec::new(),
            join: None,
        };
        for (name, key) in [("a", Some("k")), ("b", Some("k")), ("c", Some("g")), ("d", Some("k")), ("bc", None)] {
            g.stream(name, key);
        }
        g
    }

    fn stream(&mut self, name: &str, key: Option<&str>) {
        let kt = if self.int_keys { "int" } else { "string" };
        let ooo = self.rng.pick(&[0, 0, 100, 300]);
        let idle = self.rng.pick(&[0, 500, 1000, 3000]);
        let fields = [("k", kt), ("g", kt), ("ts", "int"), ("v", "int"), ("seq", "int")];
        self.text += &stream_section_ms(name, key.unwrap_or("*"), ooo, idle, &fields);
        self.streams.push(Node {
            name: name.into(),
            key: key.map(str::to_owned),
            fields: STREAM_FIELDS.iter().map(|f| (f.to_string(), false)).collect(),
        });
    }

    fn node(&self, name: &str) -> Node {
        self.streams.iter().find(|s| s.name == name).unwrap().clone()
    }

    fn key(&self, i: u64) -> Value {
        if self.int_keys { json!(i) } else { json!(format!("k{i}")) }
    }

    /// The lines of every stream (in `--input` order), only of the streams some operator reads.
    fn inputs(&mut self) -> Vec<(String, String)> {
        let read: Vec<String> = self.streams.iter().map(|s| s.name.clone()).collect();
        let mut seq = 0i64;
        let mut inputs = Vec::new();
        for name in read {
            let uses = format!("\"{name}\"");
            if !self.text.contains(&uses) {
                continue;
            }
            let rows = self.profile.rows / 2 + self.rng.below(self.profile.rows as u64) as usize;
            let text = self.lines(rows, &mut seq, name == "bc");
            inputs.push((name, text));
        }
        inputs
    }

    /// One line of stream (broadcast or not) with key number `key`: (its arrival, its text).
    fn line(&mut self, ts: i64, arrival: i64, key: u64, seq: &mut i64, broadcast: bool) -> (i64, String) {
        let g_keys = self.profile.g_keys.max(1);
        *seq += 1;
        let k = self.key(key);
        let gk = if broadcast || self.rng.one_in(4) { self.rng.below(g_keys) } else { key % g_keys };
        let v = self.rng.below(6);
        let mut obj = json!({"k": k, "g": self.key(gk), "ts": ts, "v": v, "seq": *seq});
        let at = if self.rng.one_in(8) {
            ts
        } else {
            obj["arrival"] = json!(arrival);
            arrival
        };
        if self.rng.one_in(50) {
            obj["v"] = json!("x");
        }
        let text = if self.rng.one_in(80) { "{not json".to_owned() } else { obj.to_string() };
        (at, text)
    }

    fn lines(&mut self, n: usize, seq: &mut i64, broadcast: bool) -> String {
        let keys = self.profile.keys;
        let mut t = BASE_TS + 100 * self.rng.below(8) as i64;
        // (arrival, line)
        let mut rows: Vec<(i64, String)> = Vec::new();
        while rows.len() < n {
            t += self.rng.pick(&[0, 0, 0, 100, 100, 200, 300]);
            if self.rng.one_in(10) {
                let gap = self.rng.pick(&[700, 1500, 4000]);
                if self.rng.one_in(2) {
                    // An upload of rows from inside the silence, at its end.
                    for _ in 0..1 + self.rng.below(3) {
                        let ts = t + 100 * self.rng.below((gap / 100) as u64) as i64;
                        let key = self.rng.below(keys);
                        rows.push(self.line(ts, t + gap, key, seq, broadcast));
                    }
                }
                t += gap;
            }
            let ts = if self.rng.one_in(4) { t - self.rng.pick(&[1, 100]) } else { t };
            let delay = if self.rng.one_in(10) {
                self.rng.pick(&[500, 1500, 3000])
            } else {
                self.rng.pick(&[0, 0, 0, 50, 200])
            };
            if self.rng.one_in(self.profile.burst_one_in) {
                // One ts, one arrival, many keys: every shard gets some.
                let first = self.rng.below(keys);
                for i in 0..2 + self.rng.below(keys) {
                    rows.push(self.line(ts, t + delay, (first + i) % keys, seq, broadcast));
                }
            } else {
                let key = self.rng.below(keys);
                rows.push(self.line(ts, t + delay, key, seq, broadcast));
            }
            if self.rng.one_in(30)
                && let Some((at, line)) = rows.last().cloned()
            {
                // Redelivered later.
                rows.push((at + 100, line));
            }
        }
        // Stable: lines of one arrival stay in generation order.
        rows.sort_by_key(|r| r.0);
        rows.into_iter().map(|(_, line)| line + "\n").collect()
    }

    /// Adds `[operators.NAME]` of `kind` reading `inputs`, re-keyed by `rekey` when its results
    /// can be (else left on its key); its output as a node.
    fn op(&mut self, kind: Kind, name: &str, inputs: &[&Node], rekey: Option<&str>) -> Node {
        for input in inputs {
            if self.ops.iter().any(|(o, _)| *o == input.name) {
                self.edges.push((input.name.clone(), name.to_owned()));
            }
        }
        let mut t = format!("\n[operators.{name}]\n");
        let left = inputs[0];
        let right = inputs.get(1).copied();
        // Outer sides are allowed only where the re-key field stays non-null.
        let forced = self.join.map(|join| [join]);
        let joins: &[&str] = match &forced {
            Some(join) => join,
            None if rekey.is_some() => &["inner", "left"],
            None => &["inner", "left", "right", "full"],
        };
        let (mut out, kind_text) = match kind {
            Kind::Union => {
                let names: Vec<String> = inputs.iter().map(|i| format!("\"{}\"", i.name)).collect();
                let mut fields: Vec<(String, bool)> = left
                    .fields
                    .iter()
                    .filter(|(f, _)| f != "_stream")
                    .map(|(f, _)| (f.clone(), inputs.iter().any(|i| i.nullable(f))))
                    .collect();
                fields.push(("_stream".into(), false));
                (fields, format!("kind = \"union\"\ninputs = [{}]\n", names.join(", ")))
            }
            Kind::Absence => {
                let timeout = self.rng.pick(&[200, 300, 700, 1500]);
                let fields = vec![(left.key_name().to_owned(), false), ("_kind".into(), false)];
                (fields, format!("kind = \"absence\"\ninput = \"{}\"\ntimeout = \"{timeout}ms\"\n", left.name))
            }
            Kind::Cogroup => {
                let right = right.unwrap();
                let join = self.rng.pick(joins);
                let (aggregates, fields) = cogroup_aggregates(left, right, join);
                let window = self.window();
                let text = format!(
                    "kind = \"cogroup\"\nleft = \"{}\"\nright = \"{}\"\n{window}join = \"{join}\"\naggregate = [{}]\n",
                    left.name,
                    right.name,
                    aggregates.join(", ")
                );
                let mut fields = fields;
                fields.extend(window_meta(&window));
                (fields, text)
            }
            _ => {
                let right = right.unwrap();
                let (join, specific) = match kind {
                    Kind::Interval => {
                        let lower = self.rng.pick(&[-1000, -300, 0, 0, 100]);
                        let upper = lower + self.rng.pick(&[0, 200, 500, 1500]);
                        let room = upper - lower >= 2;
                        let (le, ue) = (room && self.rng.one_in(4), room && self.rng.one_in(4));
                        let join = self.rng.pick(joins);
                        let text = format!(
                            "kind = \"interval_join\"\nlower = \"{lower}ms\"\nupper = \"{upper}ms\"\n\
                             lower_exclusive = {le}\nupper_exclusive = {ue}\njoin = \"{join}\"\n"
                        );
                        (join, text)
                    }
                    Kind::Window => {
                        let window = self.window();
                        let cond = if left.has("v") && right.has("v") && self.rng.one_in(3) {
                            "where = \"left.v <= right.v\"\n"
                        } else {
                            ""
                        };
                        ("inner", format!("kind = \"window_join\"\n{window}{cond}"))
                    }
                    Kind::Temporal => {
                        let join = self.join.unwrap_or_else(|| self.rng.pick(&["inner", "left"]));
                        (join, format!("kind = \"temporal_join\"\njoin = \"{join}\"\n"))
                    }
                    Kind::Threshold => (
                        "inner",
                        "kind = \"connect\"\nfunction = \"threshold\"\nvalue = \"v\"\nlimit = \"v\"\n".to_owned(),
                    ),
                    _ => {
                        let timeout = self.rng.pick(&[0, 200, 500, 1000]);
                        ("full", format!("kind = \"connect\"\nfunction = \"reconcile\"\ntimeout = \"{timeout}ms\"\n"))
                    }
                };
                let miss = match join {
                    "left" => [false, true],
                    "right" => [true, false],
                    "full" => [true, true],
                    _ => [false, false],
                };
                let (items, mut fields) = carry(left, right, miss);
                let text = format!(
                    "{specific}left = \"{}\"\nright = \"{}\"\nselect = [{}]\n",
                    left.name,
                    right.name,
                    items.join(", ")
                );
                if kind == Kind::Window {
                    fields.extend(window_meta(&specific));
                }
                (fields, text)
            }
        };
        t += &kind_text;
        let mut key = match kind {
            Kind::Union => left.key.clone(),
            _ => Some(left.key_name().to_owned()),
        };
        if let Some(to) = rekey
            && key.as_deref() != Some(to)
            && out.iter().any(|(f, nullable)| f == to && !nullable)
        {
            writeln!(t, "key = \"{to}\"").unwrap();
            let from = if kind == Kind::Union { left.key_name().to_owned() } else { key.clone().unwrap() };
            self.rekeyed.push(Rekeyed { op: name.to_owned(), from, to: to.to_owned(), readers: Vec::new() });
            key = Some(to.to_owned());
        }
        if !out.iter().any(|(f, _)| f == "_kind") && kind != Kind::Union {
            out.push(("_kind".into(), false));
        }
        self.text += &t;
        self.ops.push((name.to_owned(), kind));
        for r in &mut self.rekeyed {
            if inputs.iter().any(|i| i.name == r.op) {
                r.readers.push(name.to_owned());
            }
        }
        Node { name: name.to_owned(), key, fields: out }
    }

    fn window(&mut self) -> String {
        let lateness = self.rng.pick(&[0, 0, 0, 300]);
        let window = match self.rng.below(4) {
            0 | 1 => format!("{{ kind = \"tumbling\", size = \"{}ms\" }}", self.rng.pick(&[200, 500, 1000])),
            2 => {
                let slide = self.rng.pick(&[200, 500]);
                format!(
                    "{{ kind = \"sliding\", size = \"{}ms\", slide = \"{slide}ms\" }}",
                    slide * self.rng.pick(&[1, 2, 3])
                )
            }
            _ => format!("{{ kind = \"session\", gap = \"{}ms\" }}", self.rng.pick(&[200, 400])),
        };
        format!("window = {window}\nallowed_lateness = \"{lateness}ms\"\n")
    }

    fn finish(mut self, label: String) -> Workload {
        let inputs = self.inputs();
        Workload {
            label,
            config: self.text,
            inputs,
            ops: self.ops,
            edges: self.edges,
            rekeyed: self.rekeyed.into_iter().filter(|r| !r.readers.is_empty()).collect(),
        }
    }
}

/// `select` of a two-input operator: the left input's `k`, `g`, `v`, `seq` (those it has) and
/// the right input's `seq AS rseq`, `v AS rv`; the output fields (the key column first).
fn carry(left: &Node, right: &Node, miss: [bool; 2]) -> (Vec<String>, Vec<(String, bool)>) {
    let mut items = Vec::new();
    let mut fields = vec![(left.key_name().to_owned(), false)];
    for f in ["k", "g", "v", "seq", "_kind"] {
        if left.has(f) && f != left.key_name() {
            let alias = if f == "_kind" { " AS up_kind" } else { "" };
            items.push(format!("\"left.{f}{alias}\""));
            let name = if f == "_kind" { "up_kind" } else { f };
            fields.push((name.to_owned(), miss[0] || left.nullable(f)));
        }
    }
    for (f, alias) in [("seq", "rseq"), ("v", "rv")] {
        if right.has(f) {
            items.push(format!("\"right.{f} AS {alias}\""));
            fields.push((alias.to_owned(), miss[1] || right.nullable(f)));
        }
    }
    fields.push(("_kind".into(), false));
    (items, fields)
}

/// cogroup's aggregates: `k`/`g` (first of the left group), `v` (its count), `seq` (last of it),
/// first/last of both sides for ties; the output fields.
fn cogroup_aggregates(left: &Node, right: &Node, join: &str) -> (Vec<String>, Vec<(String, bool)>) {
    let empty = [matches!(join, "right" | "full"), matches!(join, "left" | "full")];
    let mut items = Vec::new();
    let mut fields = vec![(left.key_name().to_owned(), false)];
    let mut add = |item: String, name: &str, nullable: bool| {
        items.push(format!("\"{item} AS {name}\""));
        fields.push((name.to_owned(), nullable));
    };
    for f in ["k", "g"] {
        if left.has(f) && f != left.key_name() {
            add(format!("first(left.{f})"), f, empty[0] || left.nullable(f));
        }
    }
    add("count(left)".into(), "v", false);
    add("count(right)".into(), "rn", false);
    for (side, node, e) in [("left", left, empty[0]), ("right", right, empty[1])] {
        let short = &side[..1];
        if node.has("seq") {
            let n = node.nullable("seq");
            let name = if side == "left" { "seq".to_owned() } else { format!("{short}last") };
            add(format!("last({side}.seq)"), &name, e || n);
            add(format!("first({side}.seq)"), &format!("{short}first"), e || n);
        }
        if node.has("v") {
            add(format!("sum({side}.v)"), &format!("{short}sum"), e || node.nullable("v"));
            add(format!("max({side}.v)"), &format!("{short}max"), e || node.nullable("v"));
        }
        if node.has("_kind") {
            add(format!("last({side}._kind)"), &format!("{short}kind"), e || node.nullable("_kind"));
        }
    }
    (items, fields)
}

fn window_meta(window: &str) -> Vec<(String, bool)> {
    let mut meta: Vec<(String, bool)> =
        ["_window_start", "_window_end", "_version"].iter().map(|f| (f.to_string(), false)).collect();
    if window.contains("session") {
        meta.push(("_supersedes".into(), false));
    }
    meta
}

/// One operator of `kind` over streams (`bc` on the right of threshold and temporal joins half
/// the time).
pub fn gen_single(seed: u64, kind: Kind) -> Workload {
    let mut g = Gen::new(seed, Profile::DEFAULT);
    let (a, b, bc) = (g.node("a"), g.node("b"), g.node("bc"));
    // Every other seed reads the broadcast stream where the kind can.
    let right = if kind.takes_broadcast() && seed % 2 == 1 { &bc } else { &b };
    match kind {
        Kind::Absence => g.op(kind, "x", &[&a], None),
        _ => g.op(kind, "x", &[&a, right], None),
    };
    let label = format!("single {} seed {seed} (right {})", kind.name(), right.name);
    g.finish(label)
}

/// An upstream operator `u` over `a` and `b` (or `bc`), re-keyed by `g` when its kind allows, and
/// a downstream `x` reading it (with `c`, on either side, or `u` twice, or a twin `u2` through a
/// union); a third operator `y` half the time, reading `x` re-keyed back by `k` (with `d`).
/// `up`/`down`: the kinds, else drawn.
pub fn gen_chain(seed: u64, profile: Profile, up: Option<Kind>, down: Option<Kind>) -> Workload {
    let mut g = Gen::new(seed, profile);
    let (a, b, c, d, bc) = (g.node("a"), g.node("b"), g.node("c"), g.node("d"), g.node("bc"));
    let up = up.unwrap_or_else(|| {
        if g.rng.one_in(6) {
            g.rng.pick(&[Kind::Reconcile, Kind::Absence])
        } else {
            g.rng.pick(&[Kind::Union, Kind::Interval, Kind::Window, Kind::Cogroup, Kind::Temporal, Kind::Threshold])
        }
    });
    let down = down.unwrap_or_else(|| g.rng.pick(&Kind::ALL));
    let up_right = if up.takes_broadcast() && g.rng.one_in(3) { bc.clone() } else { b.clone() };
    let rekey = up.can_rekey().then_some("g");
    let before_u = g.rng.clone();
    let u = match up {
        Kind::Absence => g.op(up, "u", &[&a], None),
        _ => g.op(up, "u", &[&a, &up_right], rekey),
    };
    let mut shape = String::new();
    let third = g.rng.one_in(2);
    let x_rekey = third.then_some("k");
    // Absence output carries only the key and `_kind`: the kinds needing `v` do not read it.
    let down = match down {
        Kind::Threshold if !u.has("v") => Kind::Temporal,
        Kind::Union if up == Kind::Absence => Kind::Reconcile,
        other => other,
    };
    let partner = if u.key.as_deref() == Some("g") { &c } else { &d };
    let x = match down {
        Kind::Absence => g.op(down, "x", &[&u], None),
        Kind::Union => {
            // A twin of u over other inputs, drawing u's parameters again: the same output schema.
            let (twin_left, twin_right) = if up_right.name == "bc" { (&b, &bc) } else { (&b, &a) };
            let mut rng = std::mem::replace(&mut g.rng, before_u);
            let u2 = g.op(up, "u2", &[twin_left, twin_right], rekey);
            std::mem::swap(&mut g.rng, &mut rng);
            let names = |n: &Node| n.fields.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
            assert_eq!(names(&u), names(&u2), "the twin of u has another schema");
            shape = " (u ∪ u2)".into();
            g.op(down, "x", &[&u, &u2], x_rekey)
        }
        _ => {
            let pick = g.rng.below(6);
            let inputs: [&Node; 2] = match pick {
                // u on the right: its results are the versions / limits / partners chosen between.
                0 | 1 => [partner, &u],
                2 if down.takes_broadcast() => [&u, &bc],
                3 => [&u, &u],
                _ => [&u, partner],
            };
            shape = format!(" ({} ⋈ {})", inputs[0].name, inputs[1].name);
            g.op(down, "x", &inputs, x_rekey)
        }
    };
    if third && x.key.as_deref() == Some("k") {
        let last = g.rng.pick(&[
            Kind::Interval,
            Kind::Temporal,
            Kind::Threshold,
            Kind::Reconcile,
            Kind::Cogroup,
            Kind::Absence,
        ]);
        let last = if last == Kind::Threshold && !x.has("v") { Kind::Reconcile } else { last };
        match last {
            Kind::Absence => g.op(last, "y", &[&x], None),
            _ if g.rng.one_in(2) => g.op(last, "y", &[&d, &x], None),
            _ => g.op(last, "y", &[&x, &d], None),
        };
        shape += &format!(" → {}", last.name());
    }
    let label = format!("chain seed {seed}: {} → {}{shape}", up.name(), down.name());
    g.finish(label)
}

/// An upstream `u` of kind `up` over `a` and `b`, re-keyed by `g`, read on both inputs by `x` of
/// kind `down` (a self-join: every result of `u` reaches `x` twice, with one position in the
/// single-threaded order, left input first).
pub fn gen_self_join(seed: u64, profile: Profile, up: Kind, down: Kind) -> Workload {
    let mut g = Gen::new(seed, profile);
    let (a, b) = (g.node("a"), g.node("b"));
    let u = g.op(up, "u", &[&a, &b], up.can_rekey().then_some("g"));
    g.op(down, "x", &[&u, &u], None);
    g.finish(format!("self-join seed {seed}: {} → {} (u ⋈ u)", up.name(), down.name()))
}

/// A diamond: `u` of kind `up` over `a` and `b` re-keyed by `g`; `x` a union of `u` alone,
/// re-keyed by `k`; `y` of kind `last` reading both (`u` one hop from each activation of `u`,
/// `x` two): `y` takes every result of one hop before any of two.
pub fn gen_diamond(seed: u64, profile: Profile, up: Kind, last: Kind) -> Workload {
    let mut g = Gen::new(seed, profile);
    let (a, b) = (g.node("a"), g.node("b"));
    let u = g.op(up, "u", &[&a, &b], Some("g"));
    let x = g.op(Kind::Union, "x", &[&u], Some("k"));
    let inputs = if g.rng.one_in(2) { [&x, &u] } else { [&u, &x] };
    g.op(last, "y", &inputs, None);
    let label = format!(
        "diamond seed {seed}: {} → union → {} ({} ⋈ {})",
        up.name(),
        last.name(),
        inputs[0].name,
        inputs[1].name
    );
    g.finish(label)
}

/// A chain of `n` operators, `o0` a union of `a` and `b`, each next one reading the previous one
/// (with `c` or `d`), alternately re-keyed by `g` and `k`; joins are left joins, so rows make it
/// to the end.
pub fn gen_deep(seed: u64, n: usize) -> Workload {
    let mut g = Gen::new(seed, Profile::DEFAULT);
    g.join = Some("left");
    let (a, b, c, d) = (g.node("a"), g.node("b"), g.node("c"), g.node("d"));
    let kinds = [Kind::Interval, Kind::Temporal, Kind::Cogroup, Kind::Union, Kind::Threshold];
    let mut prev = g.op(Kind::Union, "o0", &[&a, &b], Some("g"));
    for i in 1..n {
        let kind = kinds[(i - 1) % kinds.len()];
        let rekey = if i % 2 == 0 { "g" } else { "k" };
        let partner = if prev.key.as_deref() == Some("g") { &c } else { &d };
        let name = format!("o{i}");
        prev = match kind {
            Kind::Union => g.op(kind, &name, &[&prev, &prev.clone()], Some(rekey)),
            _ => g.op(kind, &name, &[&prev, partner], Some(rekey)),
        };
    }
    g.finish(format!("deep chain of {n} seed {seed}"))
}
