//! One MQTT message → rows of the streams its topic feeds, or dead letters.
//!
//! The same path runs for live messages and for journal entries replayed at start, so a restart
//! rebuilds exactly the rows the first run had. Processing time is the intake's clock when it took
//! the message (journaled with it), never a field of the payload.

use crate::plan::Plan;
use crate::record::Value;
use crate::record::decode::{FieldRoom, decode_payload_in};
use crate::record::input::InputRows;
use crate::shard::{Runtime, RuntimeError};
use crate::source::route::{MAX_CAPTURES, Router, TopicFilter};
use crate::source::{Arrived, ingest};

use super::outputs::Outputs;

/// One message as the intake takes it.
pub struct Message<'m> {
    /// The source's index in `Plan::sources`.
    pub source: usize,
    pub topic: &'m str,
    pub payload: &'m [u8],
    /// Processing time when the intake took it (journaled with it).
    pub now: i128,
}

pub struct Ingest {
    /// Per source (by index in `Plan::sources`): its streams' topic filters.
    routers: Vec<Router>,
    rows: InputRows,
    /// The last message's decoded values, handed back: each message decodes in their allocation.
    room: FieldRoom,
}

impl Ingest {
    /// Compiles every stream's filter (validation accepted them, so compiling cannot fail; a
    /// stream whose filter did is left out and logged).
    pub fn new(plan: &Plan) -> Ingest {
        let mut routers = vec![Router::default(); plan.sources.len()];
        for (source, router) in routers.iter_mut().enumerate() {
            for (stream, def) in plan.source_streams(source) {
                let Some(topic) = def.topic.as_deref() else { continue };
                match TopicFilter::compile(topic, &def.schema) {
                    Ok(filter) => router.add(stream, filter),
                    Err(error) => tracing::error!(stream = %def.name, %error, "topic filter left out"),
                }
            }
        }
        Ingest { routers, rows: InputRows::default(), room: FieldRoom::default() }
    }

    /// Feeds one message to every stream its topic matches; whether any did (a topic braid did
    /// not subscribe to matches none: the caller counts it, never silently).
    pub fn accept(
        &mut self,
        plan: &Plan,
        message: Message<'_>,
        runtime: &mut Runtime,
        outputs: &mut Outputs,
    ) -> Result<bool, RuntimeError> {
        let Message { source, topic, payload, now } = message;
        let Some(router) = self.routers.get(source) else { return Ok(false) };
        let mut matched = false;
        for (stream, captures) in router.route(topic) {
            matched = true;
            let def = &plan.streams[stream];
            let captures = match captures {
                Ok(captures) => captures,
                Err(bad) => {
                    let label = bad.label(&def.schema);
                    runtime.count_dead_letter(stream, &label);
                    outputs.dead_letter(&def.name, &String::from_utf8_lossy(payload), &label);
                    continue;
                }
            };
            // As many as `captures` holds, so never full.
            let captured: heapless::Vec<_, MAX_CAPTURES> =
                captures.iter().map(|&(pos, c)| (pos, c.as_value_ref())).collect();
            let decoded = decode_payload_in(&def.schema, payload, def.max_payload, &captured, &mut self.room);
            let input = Arrived {
                stream,
                line: payload,
                decoded: decoded.outcome.as_ref().map_err(|r| *r),
                arrival: now as i64,
            };
            ingest(
                runtime,
                def,
                input,
                &mut self.rows,
                outputs,
                |outputs, row, _| outputs.input_row(stream, row),
                |outputs, label, raw| outputs.dead_letter(&def.name, raw, label),
            )?;
            if let Ok(fields) = decoded.outcome {
                self.room.keep(fields);
            }
        }
        Ok(matched)
    }
}

impl Ingest {
    /// A journaled message as `braid replay` input lines (`GET /journal`, `braid explain
    /// --live`): one `{"stream":NAME,"line":LINE}` per stream its topic feeds, LINE being the
    /// payload object with the fields its topic captured and `"arrival"` (the processing time it
    /// was taken at). A payload that is no JSON object, or a topic level that does not type as
    /// its field, has no such line (it was dead-lettered): left out, counted in the return.
    pub fn replay_lines(
        &self,
        plan: &Plan,
        source: usize,
        topic: &str,
        payload: &[u8],
        arrival: i128,
        out: &mut String,
    ) -> usize {
        let Some(router) = self.routers.get(source) else { return 0 };
        let mut left_out = 0;
        for (stream, captures) in router.route(topic) {
            let def = &plan.streams[stream];
            let (Ok(captures), Ok(serde_json::Value::Object(mut line))) =
                (captures, serde_json::from_slice::<serde_json::Value>(payload))
            else {
                left_out += 1;
                continue;
            };
            for &(pos, captured) in &captures {
                let value = match captured.to_value() {
                    Value::Str(s) => serde_json::Value::from(s.as_ref()),
                    Value::Int(i) => serde_json::Value::from(i),
                    _ => continue,
                };
                line.entry(def.schema.fields[pos].name.clone()).or_insert(value);
            }
            line.insert("arrival".into(), serde_json::Value::from(arrival as i64));
            let wrapped = serde_json::json!({ "stream": def.name, "line": line });
            out.push_str(&wrapped.to_string());
            out.push('\n');
        }
        left_out
    }
}
