//! What explain watches of its replay ([`Observer`]): the lines of the key asked about (decoded
//! or dead-lettered) with the stream's watermark when each arrived, the keys that resemble it,
//! and the results the operators emitted for it. The operator hosts' [`Trace`] adds what happened
//! inside the shards.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::operator::host::Trace;
use crate::plan::Plan;
use crate::record::view::RowView;
use crate::record::{Key, TimeSpec, TimeUnit, json};
use crate::replay::Observer;
use crate::shard::{Runtime, RuntimeOptions};
use crate::time::Time;

use super::keys::{self, AskedKey, shown};

/// One input line of the key asked about.
pub struct Line {
    pub stream: usize,
    pub arrival: i64,
    pub seen: Seen,
}

pub enum Seen {
    Decoded {
        id: u64,
        ts: i64,
        key_hash: u64,
        /// The stream's watermark when it arrived (after the ticks up to its arrival).
        stream_watermark: Time,
    },
    DeadLetter {
        reason: String,
        /// The key field as the raw line holds it.
        key_shown: String,
        /// The event time, when the raw line holds one in ms.
        ts: Option<i64>,
    },
}

/// A result an operator emitted for the key.
pub struct Emitted {
    pub op: usize,
    pub id: u64,
    pub ts: i64,
    pub kind: String,
}

pub struct Watch<'p> {
    plan: &'p Plan,
    pub key: AskedKey,
    hashes: Vec<u64>,
    pub trace: Arc<Trace>,
    pub lines: Vec<Line>,
    /// Per stream: the keys seen that resemble the one asked about, as shown ([`shown`]).
    pub resembling: Vec<BTreeSet<String>>,
    pub emitted: Vec<Emitted>,
    buf: Vec<u8>,
}

impl<'p> Watch<'p> {
    pub fn new(plan: &'p Plan, key: AskedKey) -> Watch<'p> {
        let hashes = key.hashes();
        Watch {
            plan,
            trace: Arc::new(Trace::new(hashes.clone())),
            hashes,
            key,
            lines: Vec::new(),
            resembling: vec![BTreeSet::new(); plan.streams.len()],
            emitted: Vec::new(),
            buf: Vec::new(),
        }
    }
}

impl Observer for Watch<'_> {
    fn runtime_options(&self, options: &mut RuntimeOptions<'_>) {
        options.trace = Some(Arc::clone(&self.trace));
        // Every tick runs, so a watermark's moves are noted at the tick they happened.
        options.every_tick = true;
    }

    fn row(&mut self, stream: usize, arrival: i64, row: RowView<'_>, runtime: &Runtime) {
        let row = &*row.to_row();
        if row.key == Key::Broadcast {
            return;
        }
        let text = keys::text(&row.key);
        if self.key.resembles(&text) {
            self.resembling[stream].insert(shown(&row.key));
        }
        if self.key.is(stream, &row.key) {
            let stream_watermark = runtime.stream_watermark(stream);
            let seen = Seen::Decoded { id: row.id, ts: row.ts, key_hash: row.key_hash, stream_watermark };
            self.lines.push(Line { stream, arrival, seen });
        }
    }

    fn dead_letter(&mut self, stream: usize, arrival: i64, raw: &[u8], reason: &str) {
        let Ok(serde_json::Value::Object(object)) = serde_json::from_slice::<serde_json::Value>(raw) else { return };
        let schema = &self.plan.streams[stream].schema;
        let Some((key_shown, text)) = keys::json_key(schema, &object) else { return };
        if self.key.resembles(&text) {
            self.resembling[stream].insert(key_shown.clone());
        }
        if text == self.key.text {
            let schema = &self.plan.streams[stream].schema;
            let ts = match schema.time {
                TimeSpec::Field { pos, unit: TimeUnit::Ms } => {
                    object.get(&schema.fields[pos].name).and_then(|v| v.as_i64())
                }
                _ => None,
            };
            let seen = Seen::DeadLetter { reason: reason.to_owned(), key_shown, ts };
            self.lines.push(Line { stream, arrival, seen });
        }
    }

    fn result(&mut self, op: usize, row: RowView<'_>) {
        if !self.hashes.contains(&row.key_hash()) {
            return;
        }
        self.buf.clear();
        json::write_result(&mut self.buf, &self.plan.operators[op].output, row);
        let kind = serde_json::from_slice::<serde_json::Value>(&self.buf)
            .ok()
            .and_then(|v| v.get("_kind").and_then(|k| k.as_str().map(str::to_owned)))
            .unwrap_or_default();
        self.emitted.push(Emitted { op, id: row.id(), ts: row.ts(), kind });
    }
}
