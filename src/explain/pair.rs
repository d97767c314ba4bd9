//! `braid explain --row STREAM:FIELD=VALUE[,...] --row ...` (or `--id ID`): two given rows, what
//! happened to each and to the pair.
//!
//! A first replay finds the two rows ([`Finder`]: by field values, decoded or dead-lettered, or by
//! `_id`) and reads their keys. Rows with one key are then explained by one watched replay of that
//! key, as `--key` does, and the pair's verdict reads the same facts ([`fate::pair`]: their
//! arrivals at the join both reached, its watermark's moves and the results it emitted). Rows
//! with different keys never meet: each is explained by a replay of its own key, and the verdict
//! names the keys (and whether they differ only in type, case or whitespace).

use std::io::Write;

use thiserror::Error;

use crate::operator::host::{Arrival, TraceNote};
use crate::plan::{NodeRef, Plan};
use crate::record::id::hex;
use crate::record::view::RowView;
use crate::record::{Key, Value};
use crate::replay::{Observer, ReplayError};
use crate::shard::Runtime;

use super::fate;
use super::keys::{self, shown, shown_json};
use super::watch::{Seen, Watch};
use super::{ExplainArgs, RowStory, at_operator, tell, time_json, watched};

#[derive(Debug, Error)]
pub enum PairError {
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error("{0}")]
    Pick(String),
}

/// One row named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pick {
    /// `--row STREAM:FIELD=VALUE[,FIELD=VALUE...]`: the row of STREAM whose fields read so (a
    /// string as is, a number as written in JSON).
    Fields { stream: String, fields: Vec<(String, String)> },
    /// `--id ID`: the input row with this `_id` (16 hex digits).
    Id(u64),
}

impl Pick {
    pub fn parse_row(text: &str) -> Result<Pick, String> {
        let expected = || format!("--row {text:?}: expected STREAM:FIELD=VALUE[,FIELD=VALUE...]");
        let (stream, rest) = text.split_once(':').ok_or_else(expected)?;
        let fields = rest
            .split(',')
            .map(|pair| pair.split_once('=').map(|(f, v)| (f.trim().to_owned(), v.to_owned())))
            .collect::<Option<Vec<_>>>()
            .filter(|fields| !fields.is_empty() && fields.iter().all(|(f, _)| !f.is_empty()))
            .ok_or_else(expected)?;
        Ok(Pick::Fields { stream: stream.trim().to_owned(), fields })
    }

    pub fn parse_id(text: &str) -> Result<Pick, String> {
        let text = text.trim();
        if text.len() != 16 {
            return Err(format!("--id {text:?}: expected an _id of 16 hex digits"));
        }
        u64::from_str_radix(text, 16).map(Pick::Id).map_err(|_| format!("--id {text:?}: expected 16 hex digits"))
    }

    /// As given: "command:cmd_id=c5", "id 38eed7104cd8c28a".
    fn shown(&self) -> String {
        match self {
            Pick::Fields { stream, fields } => {
                let fields: Vec<String> = fields.iter().map(|(f, v)| format!("{f}={v}")).collect();
                format!("{stream}:{}", fields.join(","))
            }
            Pick::Id(id) => format!("id {}", hex(*id)),
        }
    }

    /// Checks the stream and fields against the config.
    fn check(&self, plan: &Plan) -> Result<(), String> {
        let Pick::Fields { stream, fields } = self else { return Ok(()) };
        let def = plan
            .streams
            .iter()
            .find(|s| &s.name == stream)
            .ok_or_else(|| format!("--row {}: no stream {stream} in the config", self.shown()))?;
        match fields.iter().find(|(f, _)| !def.schema.fields.iter().any(|d| &d.name == f)) {
            Some((field, _)) => Err(format!("--row {}: stream {stream} has no field {field}", self.shown())),
            None => Ok(()),
        }
    }
}

/// A picked row, as the finding replay saw it.
#[derive(Clone)]
struct Found {
    stream: usize,
    arrival: i64,
    /// `None`: dead-lettered.
    id: Option<u64>,
    key: FoundKey,
}

#[derive(Clone, PartialEq, Eq)]
struct FoundKey {
    /// As a person reads it ('dev-1', 1 (a number)).
    shown: String,
    /// Its text, the `--key` that explains it.
    text: String,
}

/// Finds the picked rows in a replay.
struct Finder<'p> {
    plan: &'p Plan,
    picks: &'p [Pick],
    found: Vec<Vec<Found>>,
    /// Per pick: the result with its `_id` (operator, key), if it names one.
    results: Vec<Option<(usize, Key)>>,
}

fn value_text(value: &Value) -> Option<String> {
    Some(match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Str(s) => s.to_string(),
        Value::IdList(_) => return None,
    })
}

impl Finder<'_> {
    fn stream_is(&self, stream: usize, name: &str) -> bool {
        self.plan.streams[stream].name == name
    }
}

impl Observer for Finder<'_> {
    fn row(&mut self, stream: usize, arrival: i64, row: RowView<'_>, _runtime: &Runtime) {
        let row = &*row.to_row();
        let text = keys::text(&row.key);
        let schema = &self.plan.streams[stream].schema;
        for (i, pick) in self.picks.iter().enumerate() {
            let hit = match pick {
                Pick::Id(id) => row.id == *id,
                Pick::Fields { stream: name, fields } => {
                    self.stream_is(stream, name)
                        && fields.iter().all(|(field, want)| {
                            let pos = schema.fields.iter().position(|f| &f.name == field);
                            pos.and_then(|p| row.values.get(p)).and_then(value_text).as_deref() == Some(want.as_str())
                        })
                }
            };
            if hit {
                let key = FoundKey { shown: shown(&row.key), text: text.clone() };
                self.found[i].push(Found { stream, arrival, id: Some(row.id), key });
            }
        }
    }

    fn result(&mut self, op: usize, row: RowView<'_>) {
        for (i, pick) in self.picks.iter().enumerate() {
            if *pick == Pick::Id(row.id()) && self.results[i].is_none() {
                self.results[i] = Some((op, row.key().to_key()));
            }
        }
    }

    fn dead_letter(&mut self, stream: usize, arrival: i64, raw: &[u8], _reason: &str) {
        let Ok(serde_json::Value::Object(object)) = serde_json::from_slice::<serde_json::Value>(raw) else { return };
        let schema = &self.plan.streams[stream].schema;
        let key = keys::json_key(schema, &object);
        for (i, pick) in self.picks.iter().enumerate() {
            let Pick::Fields { stream: name, fields } = pick else { continue };
            let hit = self.stream_is(stream, name)
                && fields.iter().all(|(field, want)| object.get(field).map(|v| shown_json(v).1).as_ref() == Some(want));
            if hit {
                let (shown, text) = key.clone().unwrap_or_else(|| ("no key".into(), String::new()));
                self.found[i].push(Found { stream, arrival, id: None, key: FoundKey { shown, text } });
            }
        }
    }
}

/// What became of the pair.
pub struct PairVerdict {
    /// `joined`, `dead_letter`, `different_keys`, `not_met`, or a [`fate::PairFate`] verdict.
    pub verdict: &'static str,
    /// The join both reached.
    pub operator: Option<String>,
    pub result_id: Option<u64>,
    pub by_ms: Option<i64>,
    pub why: String,
}

/// Two rows' stories and the pair's verdict.
pub struct PairStory {
    /// The first line: the rows as named, and their keys.
    pub title: String,
    pub rows: Vec<RowStory>,
    /// Each row's key, as shown.
    pub keys: [String; 2],
    pub verdict: PairVerdict,
}

/// Explains two picked rows, or the two rows behind one result `_id` (a single `--id`).
pub fn run(plan: &Plan, args: &ExplainArgs<'_>, picks: &[Pick]) -> Result<PairStory, PairError> {
    if !(1..=2).contains(&picks.len()) {
        return Err(PairError::Pick(format!(
            "name two rows (--row or --id, twice in all), or one result with --id; not {}",
            picks.len()
        )));
    }
    for pick in picks {
        pick.check(plan).map_err(PairError::Pick)?;
    }
    let mut finder = Finder { plan, picks, found: vec![Vec::new(); picks.len()], results: vec![None; picks.len()] };
    crate::replay::run_observed(plan, &super::replay_args(args), &mut finder)?;
    let found = match (picks, &finder.results[..]) {
        ([Pick::Id(id)], [Some((op, key))]) if finder.found[0].is_empty() => behind_result(plan, args, *id, *op, key)?,
        ([one], _) => {
            let what = if finder.found[0].is_empty() { "matches no row or result" } else { "is one row" };
            return Err(PairError::Pick(format!("{} {what}: name a second row, or one result's _id", one.shown())));
        }
        _ => found_rows(picks, finder.found)?,
    };
    let title = match picks {
        [one] => format!(
            "result _id {}: the rows it paired (key {})",
            one.shown().trim_start_matches("id "),
            found[0].key.shown
        ),
        _ => format!(
            "rows {} (key {}) and {} (key {})",
            picks[0].shown(),
            found[0].key.shown,
            picks[1].shown(),
            found[1].key.shown
        ),
    };
    explain_found(plan, args, &found, title)
}

/// The one row each pick names.
fn found_rows(picks: &[Pick], found: Vec<Vec<Found>>) -> Result<Vec<Found>, PairError> {
    let mut rows = Vec::new();
    for (pick, hits) in picks.iter().zip(found) {
        if hits.is_empty() && matches!(pick, Pick::Id(_)) {
            let why =
                format!("no input row has {} (a result's _id names a pair by itself: give it alone)", pick.shown());
            return Err(PairError::Pick(why));
        }
        let first = hits.first().cloned().ok_or_else(|| PairError::Pick(format!("no row matches {}", pick.shown())))?;
        if hits.len() > 1 && matches!(pick, Pick::Fields { .. }) {
            return Err(PairError::Pick(format!(
                "{} rows match {}: name more fields (or use --id)",
                hits.len(),
                pick.shown()
            )));
        }
        rows.push(first);
    }
    Ok(rows)
}

/// The two rows result `id` of operator `op` paired, found by their pair id among the arrivals
/// of its key.
fn behind_result(plan: &Plan, args: &ExplainArgs<'_>, id: u64, op: usize, key: &Key) -> Result<Vec<Found>, PairError> {
    let name = &plan.operators[op].name;
    if *key == Key::Broadcast {
        return Err(PairError::Pick(format!("result {} of {name} has no key", hex(id))));
    }
    let text = keys::text(key);
    let watch = watched(plan, args, &text)?;
    let notes = watch.trace.notes();
    let arrivals: Vec<&Arrival> =
        notes.iter().filter_map(|n| if let TraceNote::Arrival(a) = n { Some(a) } else { None }).collect();
    let at = at_operator(plan, &watch, &notes, &arrivals, op);
    let on = |input: usize| at.arrivals.iter().copied().filter(move |a| a.input == input);
    let pair = on(0).find_map(|x| on(1).find(|y| fate::pair_result(&at, x, y) == Some(id)).map(|y| [x, y]));
    let Some(pair) = pair else {
        return Err(PairError::Pick(format!("result {} of {name} is no pair of two rows (not a match)", hex(id))));
    };
    pair.iter()
        .map(|row| {
            let NodeRef::Stream(stream) = plan.operators[op].inputs[row.input] else {
                let from = plan.node_name(plan.operators[op].inputs[row.input]);
                return Err(PairError::Pick(format!(
                    "result {} of {name}: a row of it comes from {from}; explain that result",
                    hex(id)
                )));
            };
            let arrival = watch
                .lines
                .iter()
                .find(|l| l.stream == stream && matches!(l.seen, Seen::Decoded { id, .. } if id == row.id))
                .map_or(0, |l| l.arrival);
            Ok(Found { stream, arrival, id: Some(row.id), key: FoundKey { shown: shown(key), text: text.clone() } })
        })
        .collect()
}

/// Both rows' stories and the pair's verdict.
fn explain_found(plan: &Plan, args: &ExplainArgs<'_>, found: &[Found], title: String) -> Result<PairStory, PairError> {
    let (a, b) = (&found[0], &found[1]);
    let shards = args.shards.max(1);
    let mut rows: Vec<Option<RowStory>> = vec![None, None];
    let mut verdict = None;
    let mut texts = vec![a.key.text.as_str()];
    if b.key.text != a.key.text {
        texts.push(&b.key.text);
    }
    for text in texts {
        let watch = watched(plan, args, text)?;
        let story = tell(plan, &watch, shards);
        for (i, f) in found.iter().enumerate() {
            if f.key.text == text && rows[i].is_none() {
                rows[i] = story.rows.iter().position(|r| is_found(plan, r, f)).map(|p| story.rows[p].clone());
            }
        }
        if a.key == b.key && a.id.is_some() && b.id.is_some() {
            verdict = Some(met(plan, &watch, a, b));
        }
    }
    let verdict = match (rows.iter().position(|r| r.as_ref().is_some_and(|r| r.dead_letter.is_some())), verdict) {
        (Some(dead), _) => dead_verdict(plan, rows[dead].as_ref(), &found[dead], &found[1 - dead]),
        (None, _) if a.key != b.key => different_keys(plan, a, b),
        (None, Some(verdict)) => verdict,
        (None, None) => not_met("they did not meet at any join".into()),
    };
    let keys = [a.key.shown.clone(), b.key.shown.clone()];
    Ok(PairStory { title, rows: rows.into_iter().flatten().collect(), keys, verdict })
}

fn is_found(plan: &Plan, row: &RowStory, f: &Found) -> bool {
    match f.id {
        Some(id) => row.id == Some(id),
        None => {
            row.dead_letter.is_some() && row.stream == plan.streams[f.stream].name && row.arrival == Some(f.arrival)
        }
    }
}

fn not_met(why: String) -> PairVerdict {
    PairVerdict { verdict: "not_met", operator: None, result_id: None, by_ms: None, why }
}

/// "status ts 1500 was dead-lettered as wrong_type:device, so it reached no operator (its key 1
/// (a number) differs only in type from command's '1')".
fn dead_verdict(plan: &Plan, row: Option<&RowStory>, dead: &Found, other: &Found) -> PairVerdict {
    let (name, reason) = row.map_or(("a row".into(), ""), |r| {
        let ts = r.ts.map(|ts| format!(" ts {ts}")).unwrap_or_default();
        (format!("{}{ts}", r.stream), r.dead_letter.as_deref().unwrap_or(""))
    });
    let schema = &plan.streams[dead.stream].schema;
    let typed = reason.strip_prefix("wrong_type:").is_some_and(|f| schema.key_fields().any(|k| k.name == f))
        && dead.key.text == other.key.text
        && dead.key.shown != other.key.shown;
    let near = if typed {
        format!(
            " (its key {} differs only in type from {}'s {})",
            dead.key.shown, plan.streams[other.stream].name, other.key.shown
        )
    } else {
        String::new()
    };
    let why = format!("they did not join: {name} was dead-lettered as {reason}, so it reached no operator{near}");
    PairVerdict { verdict: "dead_letter", operator: None, result_id: None, by_ms: None, why }
}

/// "their keys differ: command has 'dev-1', status has 'DEV-1' (only in case)".
fn different_keys(plan: &Plan, a: &Found, b: &Found) -> PairVerdict {
    let fold_space = |t: &str| t.split_whitespace().collect::<String>();
    let (x, y) = (&a.key.text, &b.key.text);
    let near = if x == y {
        " (only in type)"
    } else if x.to_lowercase() == y.to_lowercase() {
        " (only in case)"
    } else if fold_space(x) == fold_space(y) {
        " (only in whitespace)"
    } else if fold_space(x).to_lowercase() == fold_space(y).to_lowercase() {
        " (only in case and whitespace)"
    } else {
        ""
    };
    let why = format!(
        "they did not join: their keys differ: {} has {}, {} has {}{near}",
        plan.streams[a.stream].name, a.key.shown, plan.streams[b.stream].name, b.key.shown
    );
    PairVerdict { verdict: "different_keys", operator: None, result_id: None, by_ms: None, why }
}

/// The verdict at the first join both rows reached on different inputs.
fn met(plan: &Plan, watch: &Watch<'_>, a: &Found, b: &Found) -> PairVerdict {
    let notes = watch.trace.notes();
    let arrivals: Vec<&Arrival> =
        notes.iter().filter_map(|n| if let TraceNote::Arrival(a) = n { Some(a) } else { None }).collect();
    let of = |f: &Found| -> Vec<&Arrival> {
        arrivals
            .iter()
            .copied()
            .filter(|x| Some(x.id) == f.id && plan.operators[x.op].inputs[x.input] == NodeRef::Stream(f.stream))
            .collect()
    };
    let (xs, ys) = (of(a), of(b));
    let met = xs.iter().find_map(|x| ys.iter().find(|y| y.op == x.op && y.input != x.input).map(|y| (*x, *y)));
    let Some((x, y)) = met else {
        return not_met("they did not join: no operator takes both rows on different inputs".into());
    };
    let at = at_operator(plan, watch, &notes, &arrivals, x.op);
    let fate = fate::pair(&at, x, y);
    PairVerdict {
        verdict: fate.verdict,
        operator: Some(at.name.to_owned()),
        result_id: fate.result_id,
        by_ms: fate.by_ms,
        why: fate.why,
    }
}

impl PairStory {
    /// The title, each row's block as `--key` prints it, then the pair's verdict.
    pub fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(out, "{}", self.title)?;
        for row in &self.rows {
            row.write_text(out)?;
        }
        writeln!(out, "pair: {}", self.verdict.why)
    }

    /// One JSON object for the pair (README "braid explain" lists its fields).
    pub fn write_json(&self, out: &mut impl Write) -> std::io::Result<()> {
        use serde_json::json;
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|row| {
                let at: Vec<serde_json::Value> = row
                    .at
                    .iter()
                    .map(|t| {
                        json!({
                            "operator": t.operator,
                            "fate": t.fate.map(fate::Fate::as_str),
                            "late_by_ms": t.late_by_ms,
                            "operator_watermark": time_json(t.watermark),
                            "why": t.why,
                        })
                    })
                    .collect();
                let mut object = row.json_base();
                object["dead_letter"] = json!(row.dead_letter);
                object["head"] = json!(row.head);
                object["at"] = json!(at);
                object
            })
            .collect();
        let v = &self.verdict;
        let object = json!({
            "rows": rows,
            "keys": self.keys,
            "verdict": v.verdict,
            "joined": v.verdict == "joined",
            "operator": v.operator,
            "result_id": v.result_id.map(hex),
            "by_ms": v.by_ms,
            "why": v.why,
        });
        writeln!(out, "{object}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_parse_or_say_what_was_expected() {
        let pick = Pick::parse_row("command:cmd_id=c5,device=dev-1").unwrap();
        let fields = vec![("cmd_id".to_owned(), "c5".to_owned()), ("device".to_owned(), "dev-1".to_owned())];
        assert_eq!(pick, Pick::Fields { stream: "command".into(), fields });
        assert!(Pick::parse_row("command").unwrap_err().contains("STREAM:FIELD=VALUE"));
        assert!(Pick::parse_row("command:cmd_id").is_err());
        assert_eq!(Pick::parse_id("38eed7104cd8c28a").unwrap(), Pick::Id(0x38ee_d710_4cd8_c28a));
        assert!(Pick::parse_id("38eed71").is_err());
        assert!(Pick::parse_id("zzeed7104cd8c28a").is_err());
    }
}
