//! Operators: sans-IO state machines (STYLE.md 4–6).
//!
//! An operator never reads a clock and never does I/O: rows and watermarks come in as arguments,
//! results and late rows go into a borrowed [`Output`]. The engine owns time (it computes each
//! operator's watermark from its inputs, rule 5), routing and metrics; one operator instance runs
//! per shard and sees only that shard's keys.
//!
//! Every kind is listed in [`OperatorSpec`] and [`Operator`]; adding one means adding a variant
//! and the compiler shows every `match` to extend.

pub mod interval_join;
pub mod projection;

use crate::record::Row;
use crate::time::Time;

pub use interval_join::{IntervalJoin, IntervalJoinSpec};
pub use projection::Projection;

/// The `_kind` of a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResultKind {
    Match,
    LeftOnly,
    RightOnly,
}

impl ResultKind {
    pub const ALL: [ResultKind; 3] = [ResultKind::Match, ResultKind::LeftOnly, ResultKind::RightOnly];

    pub fn as_str(self) -> &'static str {
        match self {
            ResultKind::Match => "match",
            ResultKind::LeftOnly => "left_only",
            ResultKind::RightOnly => "right_only",
        }
    }
}

/// What one activation of an operator produced; the engine drains it after every call.
#[derive(Default, Debug)]
pub struct Output {
    pub results: Vec<(ResultKind, Row)>,
    /// Late rows with the index of the input they came on.
    pub late: Vec<(usize, Row)>,
}

impl Output {
    pub fn is_empty(&self) -> bool {
        self.results.is_empty() && self.late.is_empty()
    }
}

/// A checked operator configuration: what the engine instantiates once per shard.
#[derive(Clone, Debug)]
pub enum OperatorSpec {
    IntervalJoin(IntervalJoinSpec),
}

impl OperatorSpec {
    pub fn build(&self) -> Operator {
        match self {
            OperatorSpec::IntervalJoin(spec) => Operator::IntervalJoin(IntervalJoin::new(spec.clone())),
        }
    }
}

/// One shard's instance of an operator.
pub enum Operator {
    IntervalJoin(IntervalJoin),
}

impl Operator {
    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        match self {
            Operator::IntervalJoin(op) => op.on_row(input, row, out),
        }
    }

    /// The operator's watermark moved forward to `watermark` (+∞ at the end of input).
    pub fn on_watermark(&mut self, watermark: Time, out: &mut Output) {
        match self {
            Operator::IntervalJoin(op) => op.on_watermark(watermark, out),
        }
    }

    /// A lower bound on the `_ts` of every result this instance may still emit (rule 5).
    pub fn output_watermark(&self) -> Time {
        match self {
            Operator::IntervalJoin(op) => op.output_watermark(),
        }
    }

    /// Nothing is pending that a moving watermark could emit (no timers).
    pub fn is_quiescent(&self) -> bool {
        match self {
            Operator::IntervalJoin(op) => op.is_quiescent(),
        }
    }

    pub fn state_rows(&self) -> usize {
        match self {
            Operator::IntervalJoin(op) => op.state_rows(),
        }
    }

    pub fn state_bytes(&self) -> usize {
        match self {
            Operator::IntervalJoin(op) => op.state_bytes(),
        }
    }
}
