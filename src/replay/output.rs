//! Replay outputs: one JSON-lines file per `--output NAME=FILE`, every one created even when
//! nothing is written to it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::plan::{NodeRef, Plan, Target};
use crate::record::{Row, json};
use crate::shard::Emit;

pub struct Outputs<'p> {
    plan: &'p Plan,
    files: Vec<(Target, BufWriter<File>)>,
    buf: Vec<u8>,
    error: Option<std::io::Error>,
}

impl<'p> Outputs<'p> {
    pub fn create(plan: &'p Plan, outputs: &[(Target, &Path)]) -> Result<Outputs<'p>, (usize, std::io::Error)> {
        let mut files = Vec::new();
        for (i, (target, path)) in outputs.iter().enumerate() {
            files.push((*target, BufWriter::new(File::create(path).map_err(|e| (i, e))?)));
        }
        Ok(Outputs { plan, files, buf: Vec::with_capacity(512), error: None })
    }

    fn wants(&self, target: Target) -> bool {
        self.files.iter().any(|(t, _)| *t == target)
    }

    /// Writes the line in `self.buf` to every file of `target`.
    fn write(&mut self, target: Target) {
        for (t, file) in &mut self.files {
            if *t == target
                && let Err(e) = file.write_all(&self.buf)
            {
                self.error.get_or_insert(e);
            }
        }
        self.buf.clear();
    }

    pub fn input_row(&mut self, stream: usize, row: &Row) {
        if self.wants(Target::Stream(stream)) {
            let def = &self.plan.streams[stream];
            json::write_input_row(&mut self.buf, &def.schema, &def.name, row);
            self.write(Target::Stream(stream));
        }
    }

    pub fn dead_letter(&mut self, stream: usize, raw: &str, reason: &str) {
        if self.wants(Target::DeadLetter) {
            json::write_dead_letter(&mut self.buf, &self.plan.streams[stream].name, raw, reason);
            self.write(Target::DeadLetter);
        }
    }

    /// Flushes every file; the first write error, if any.
    pub fn finish(mut self) -> std::io::Result<()> {
        for (_, file) in &mut self.files {
            if let Err(e) = file.flush() {
                self.error.get_or_insert(e);
            }
        }
        self.error.map_or(Ok(()), Err)
    }
}

impl Emit for Outputs<'_> {
    fn result(&mut self, operator: usize, row: &Row) {
        if self.wants(Target::Operator(operator)) {
            json::write_result(&mut self.buf, &self.plan.operators[operator].output, row);
            self.write(Target::Operator(operator));
        }
    }

    fn late(&mut self, operator: usize, input: usize, row: &Row) {
        if self.wants(Target::Late(operator)) {
            let node = self.plan.operators[operator].inputs[input];
            let from_operator = matches!(node, NodeRef::Operator(_));
            json::write_late(&mut self.buf, self.plan.node_schema(node), from_operator, self.plan.node_name(node), row);
            self.write(Target::Late(operator));
        }
    }
}
