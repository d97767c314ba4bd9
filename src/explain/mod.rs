//! `braid explain`: why rows of a key did or did not join (CONTRACT.md "Extensions under way").
//!
//! Explain is a replay ([`crate::replay::run_observed`]) through the one shard runtime, watched:
//! the replay tells it every line of the key (decoded or dead-lettered, and the stream's watermark
//! when it arrived), the operator hosts note every arrival of the key at every operator (the
//! operator's watermark then, late or not) and every move of an operator's watermark
//! ([`Trace`](crate::operator::host::Trace)), and the collector hands over the results. From
//! those facts [`fate`] tells, per row and operator, what happened and why — the bound or window
//! it had to meet and by how many ms it missed, when it left the state, what it paired with —
//! and [`keys`] points out keys that differ from the one asked about only in type, case or
//! whitespace. Every tick runs (as `replay --every-tick`), so times are those of the tick that
//! moved the watermark.

pub mod fate;
pub mod keys;
pub mod live;
pub mod pair;
pub mod watch;

use std::io::Write;
use std::path::PathBuf;

use crate::operator::host::{Arrival, TraceNote};
use crate::plan::{NodeRef, Plan};
use crate::record::id::hex;
use crate::replay::{ReplayArgs, ReplayError};
use crate::time::Time;

use fate::{AtOperator, Fate, late_by, shown_time};
use keys::AskedKey;
use watch::{Seen, Watch};

pub struct ExplainArgs<'a> {
    pub shards: usize,
    pub inputs: &'a [(String, PathBuf)],
    /// The key, as a stream's key field reads it.
    pub key: &'a str,
}

/// What explain found: every row of the key, in the order the replay took them.
pub struct Story {
    pub key: String,
    pub rows: Vec<RowStory>,
    /// Keys that resemble the one asked about, if any differ from it ("status has 'DEV-1',
    /// command has 'dev-1'").
    pub resembling: Option<String>,
}

/// One row of the key and its fate at every operator it reached.
#[derive(Clone)]
pub struct RowStory {
    /// Its stream (or the operator it is a result of).
    pub stream: String,
    pub ts: Option<i64>,
    pub id: Option<u64>,
    pub arrival: Option<i64>,
    pub shard: Option<usize>,
    pub stream_watermark: Option<Time>,
    /// How it entered, in words ("decoded", "dead-lettered as wrong_type:device: ...").
    pub head: String,
    pub dead_letter: Option<String>,
    pub at: Vec<Told>,
}

/// A row's fate at one operator.
#[derive(Clone)]
pub struct Told {
    pub operator: String,
    /// `None`: the row passed an operator that is no join (shown, not judged).
    pub fate: Option<Fate>,
    pub late_by_ms: Option<i64>,
    pub watermark: Time,
    pub why: String,
}

pub fn run(plan: &Plan, args: &ExplainArgs<'_>) -> Result<Story, ReplayError> {
    let watch = watched(plan, args, args.key)?;
    Ok(tell(plan, &watch, args.shards.max(1)))
}

/// The replay of `args.inputs`, watched for `key`.
fn watched<'p>(plan: &'p Plan, args: &ExplainArgs<'_>, key: &str) -> Result<Watch<'p>, ReplayError> {
    let mut watch = Watch::new(plan, AskedKey::new(plan, key));
    crate::replay::run_observed(plan, &replay_args(args), &mut watch)?;
    Ok(watch)
}

fn replay_args<'a>(args: &ExplainArgs<'a>) -> ReplayArgs<'a> {
    ReplayArgs {
        shards: args.shards,
        every_tick: true,
        inputs: args.inputs,
        outputs: &[],
        sort_run_bytes: crate::replay::input::SORT_RUN_BYTES,
    }
}

/// Puts the facts of a watched replay together, row by row.
fn tell(plan: &Plan, watch: &Watch<'_>, shards: usize) -> Story {
    let mut notes = watch.trace.notes();
    // Each shard noted in processing order; one key lives on one shard.
    notes.sort_by_key(|n| match n {
        TraceNote::Arrival(a) => (0, a.shard),
        TraceNote::Watermark { .. } => (1, 0),
        TraceNote::Expired { .. } => (2, 0),
    });
    let arrivals: Vec<&Arrival> =
        notes.iter().filter_map(|n| if let TraceNote::Arrival(a) = n { Some(a) } else { None }).collect();
    let operators: Vec<AtOperator<'_>> =
        (0..plan.operators.len()).map(|op| at_operator(plan, watch, &notes, &arrivals, op)).collect();
    let mut taken = vec![false; arrivals.len()];
    let mut rows = Vec::new();
    for line in &watch.lines {
        let stream = plan.streams[line.stream].name.clone();
        let story = match &line.seen {
            Seen::DeadLetter { reason, key_shown, ts } => RowStory {
                head: dead_head(plan, line.stream, reason, key_shown),
                stream,
                ts: *ts,
                id: None,
                arrival: Some(line.arrival),
                shard: None,
                stream_watermark: None,
                dead_letter: Some(reason.clone()),
                at: Vec::new(),
            },
            &Seen::Decoded { id, ts, key_hash, stream_watermark } => {
                let shard = (key_hash % shards as u64) as usize;
                let mut at = Vec::new();
                for (i, a) in arrivals.iter().enumerate() {
                    let from_line = plan.operators[a.op].inputs[a.input] == NodeRef::Stream(line.stream);
                    // A row reaches each (operator, input) reading its stream once (a self-join: twice).
                    let reached = |t: &(usize, usize, Told)| (t.0, t.1) == (a.op, a.input);
                    if !taken[i] && from_line && a.id == id && !at.iter().any(reached) {
                        taken[i] = true;
                        at.push((a.op, a.input, told(&operators[a.op], a)));
                    }
                }
                let head = format!(
                    "decoded, arrival {}, shard {shard}, {stream}'s watermark {} when it arrived",
                    line.arrival,
                    shown_time(stream_watermark)
                );
                RowStory {
                    stream,
                    ts: Some(ts),
                    id: Some(id),
                    arrival: Some(line.arrival),
                    shard: Some(shard),
                    stream_watermark: Some(stream_watermark),
                    head,
                    dead_letter: None,
                    at: at.into_iter().map(|(_, _, t)| t).collect(),
                }
            }
        };
        rows.push(story);
    }
    // What is left reached an operator from another operator: results of the key, passed on.
    for (i, a) in arrivals.iter().enumerate().filter(|(i, _)| !taken[*i]) {
        let NodeRef::Operator(from) = plan.operators[a.op].inputs[a.input] else { continue };
        rows.push(RowStory {
            stream: plan.operators[from].name.clone(),
            ts: Some(a.ts),
            id: Some(a.id),
            arrival: None,
            shard: Some(a.shard),
            stream_watermark: None,
            head: format!("a result of {}, shard {}", plan.operators[from].name, a.shard),
            dead_letter: None,
            at: vec![told(&operators[arrivals[i].op], a)],
        });
    }
    Story { key: watch.key.text.clone(), rows, resembling: resembling_note(plan, watch) }
}

/// "dead-lettered as wrong_type:device (device holds 1 (a number), status declares it a string);
/// it reached no operator".
fn dead_head(plan: &Plan, stream: usize, reason: &str, key_shown: &str) -> String {
    let def = &plan.streams[stream];
    let wrong = reason.strip_prefix("wrong_type:");
    let declared = match def.schema.key_fields().find(|f| Some(f.name.as_str()) == wrong) {
        Some(field) => format!(", {} declares it {}", def.name, type_words(field.ty)),
        None => String::new(),
    };
    let field = match def.schema.key_fields().len() {
        0 => "its key field".to_owned(),
        1 => def.schema.key_names(),
        _ => format!("its key ({})", def.schema.key_names()),
    };
    format!("dead-lettered as {reason} ({field} holds {key_shown}{declared}); it reached no operator")
}

fn type_words(ty: crate::record::FieldType) -> &'static str {
    use crate::record::FieldType;
    match ty {
        FieldType::String => "a string",
        FieldType::Int => "an int",
        FieldType::Float => "a float",
        FieldType::Bool => "a bool",
        FieldType::Bytes => "bytes (base64)",
        FieldType::IdList => "a list of ids",
    }
}

fn at_operator<'a>(
    plan: &'a Plan,
    watch: &'a Watch<'_>,
    notes: &'a [TraceNote],
    arrivals: &[&'a Arrival],
    op: usize,
) -> AtOperator<'a> {
    let def = &plan.operators[op];
    let exact = |s: usize| watch.key.per_stream[s].as_ref().map(keys::shown);
    let hints = def
        .inputs
        .iter()
        .map(|node| {
            let NodeRef::Stream(s) = *node else { return None };
            let name = &plan.streams[s].name;
            let other: Vec<&str> = watch.resembling[s]
                .iter()
                .filter(|k| Some(k.as_str()) != exact(s).as_deref())
                .map(String::as_str)
                .collect();
            let dead: Vec<&str> = watch
                .lines
                .iter()
                .filter_map(|l| match &l.seen {
                    Seen::DeadLetter { reason, .. } if l.stream == s => Some(reason.as_str()),
                    _ => None,
                })
                .collect();
            let mut hints = Vec::new();
            if !other.is_empty() {
                hints.push(format!("{name} has {}", other.join(", ")));
            }
            if !dead.is_empty() {
                let rows = if dead.len() == 1 { "row" } else { "rows" };
                hints.push(format!("{} {name} {rows} of this key dead-lettered: {}", dead.len(), dead.join(", ")));
            }
            (!hints.is_empty()).then(|| hints.join("; "))
        })
        .collect();
    AtOperator {
        name: &def.name,
        spec: &def.spec,
        inputs: def.inputs.iter().map(|&n| plan.node_name(n)).collect(),
        arrivals: arrivals.iter().copied().filter(|a| a.op == op).collect(),
        moves: notes
            .iter()
            .filter_map(|n| match *n {
                TraceNote::Watermark { op: o, tick, watermark } if o == op => Some((tick, watermark)),
                _ => None,
            })
            .collect(),
        emitted: watch.emitted.iter().filter(|e| e.op == op).collect(),
        expired: notes
            .iter()
            .filter_map(|n| match *n {
                TraceNote::Expired { op: o, id, reason, .. } if o == op => Some((id, reason)),
                _ => None,
            })
            .collect(),
        hints,
        key: format!("'{}'", watch.key.text),
    }
}

fn told(at: &AtOperator<'_>, row: &Arrival) -> Told {
    let (fate, why) = match fate::fate(at, row) {
        Some((fate, why)) => (Some(fate), why),
        None => (None, "passed (no join)".to_owned()),
    };
    let late_by_ms = (fate == Some(Fate::Late)).then(|| late_by(row));
    Told { operator: at.name.to_owned(), fate, late_by_ms, watermark: row.watermark, why }
}

/// "status has 'DEV-1', command has 'dev-1'" when some stream's key differs from the one asked
/// about only in type, case or whitespace.
fn resembling_note(plan: &Plan, watch: &Watch<'_>) -> Option<String> {
    let exact = |s: usize| watch.key.per_stream[s].as_ref().map(keys::shown);
    let differs = (0..plan.streams.len()).any(|s| watch.resembling[s].iter().any(|k| Some(k) != exact(s).as_ref()));
    if !differs {
        return None;
    }
    let listed: Vec<String> = (0..plan.streams.len())
        .filter(|&s| !watch.resembling[s].is_empty())
        .map(|s| {
            let found: Vec<&str> = watch.resembling[s].iter().map(String::as_str).collect();
            format!("{} has {}", plan.streams[s].name, found.join(" and "))
        })
        .collect();
    Some(listed.join(", "))
}

/// A time in JSON: a number of ms, or the string `-inf` / `+inf`.
fn time_json(t: Time) -> serde_json::Value {
    if t.is_finite() { serde_json::json!(t.as_i64_saturating()) } else { serde_json::json!(shown_time(t)) }
}

impl RowStory {
    /// The fields every JSON object of the row carries.
    fn json_base(&self) -> serde_json::Value {
        serde_json::json!({
            "stream": self.stream,
            "ts": self.ts,
            "id": self.id.map(hex),
            "arrival": self.arrival,
            "shard": self.shard,
            "stream_watermark": self.stream_watermark.map(time_json),
        })
    }

    /// "command ts 5000: decoded, ...", then a line per operator it reached.
    pub fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let ts = self.ts.map(|ts| format!(" ts {ts}")).unwrap_or_default();
        writeln!(out, "{}{ts}: {}", self.stream, self.head)?;
        for t in &self.at {
            let fate = t.fate.map_or("passed", Fate::as_str);
            let on_time = if t.fate == Some(Fate::Late) { "" } else { ", on time" };
            writeln!(
                out,
                "  {}: {fate} (watermark {} when it arrived{on_time}): {}",
                t.operator,
                shown_time(t.watermark),
                t.why
            )?;
        }
        Ok(())
    }
}

impl Story {
    /// Plain words: a block per row, a line per operator it reached.
    pub fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let rows = if self.rows.len() == 1 { "1 row".to_owned() } else { format!("{} rows", self.rows.len()) };
        writeln!(out, "key '{}': {rows}", self.key)?;
        for row in &self.rows {
            row.write_text(out)?;
        }
        if let Some(note) = &self.resembling {
            writeln!(out, "keys that differ only in type, case or whitespace: {note}")?;
        }
        Ok(())
    }

    /// One JSON object per row and operator (a dead-lettered row: one, `"operator": null`).
    pub fn write_json(&self, out: &mut impl Write) -> std::io::Result<()> {
        use serde_json::{Value, json};
        for row in &self.rows {
            let mut base = row.json_base();
            if let Some(note) = &self.resembling {
                base["resembling_keys"] = json!(note);
            }
            if let Some(reason) = &row.dead_letter {
                let mut object = base.clone();
                object["operator"] = Value::Null;
                object["fate"] = json!(Fate::DeadLetter.as_str());
                object["reason"] = json!(reason);
                object["why"] = json!(row.head);
                writeln!(out, "{object}")?;
            }
            for t in &row.at {
                let Some(fate) = t.fate else { continue };
                let mut object = base.clone();
                object["operator"] = json!(t.operator);
                object["fate"] = json!(fate.as_str());
                if let Some(by) = t.late_by_ms {
                    object["late_by_ms"] = json!(by);
                }
                object["operator_watermark"] = time_json(t.watermark);
                object["why"] = json!(t.why);
                writeln!(out, "{object}")?;
            }
        }
        Ok(())
    }
}
