//! Operators: sans-IO state machines (STYLE.md 4–6).
//!
//! An operator never reads a clock and never does I/O: rows and watermarks come in as arguments,
//! results and late rows go into a borrowed [`Output`]. Its [`host`] owns its time (it computes the
//! operator's watermark from its inputs, rule 5) and counters, the shard runtime its routing; one
//! operator instance runs per shard and sees only that shard's keys.
//!
//! Every kind is listed in [`OperatorSpec`] and [`Operator`]; adding one means adding a variant
//! and the compiler shows every `match` to extend.

pub mod absence;
pub mod cogroup;
pub mod connect;
pub mod expr;
pub mod host;
pub mod interval_join;
pub mod projection;
pub mod temporal_join;
pub mod union;
pub mod window;
pub mod window_join;

use crate::record::Row;
use crate::time::Time;

pub use absence::{Absence, AbsenceSpec};
pub use cogroup::{CoGroup, CoGroupSpec};
pub use connect::{Connect, ConnectSpec};
pub use interval_join::{IntervalJoin, IntervalJoinSpec};
pub use projection::Projection;
pub use temporal_join::{TemporalJoin, TemporalJoinSpec};
pub use union::{Union, UnionSpec};
pub use window_join::{WindowJoin, WindowJoinSpec};

/// The `_kind` of a result (the `kind` label of `braid_operator_results_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResultKind {
    Match,
    LeftOnly,
    RightOnly,
    /// absence: a key went silent.
    Absent,
    /// absence: a silent key is back.
    Present,
    /// union: a row passed through (union rows carry no `_kind`).
    Row,
}

impl ResultKind {
    pub const ALL: [ResultKind; 6] = [
        ResultKind::Match,
        ResultKind::LeftOnly,
        ResultKind::RightOnly,
        ResultKind::Absent,
        ResultKind::Present,
        ResultKind::Row,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResultKind::Match => "match",
            ResultKind::LeftOnly => "left_only",
            ResultKind::RightOnly => "right_only",
            ResultKind::Absent => "absent",
            ResultKind::Present => "present",
            ResultKind::Row => "row",
        }
    }
}

/// What one activation of an operator produced; the runtime drains it after every call.
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

/// A checked operator configuration: what the runtime instantiates once per shard.
#[derive(Clone, Debug)]
pub enum OperatorSpec {
    Union(UnionSpec),
    Connect(ConnectSpec),
    WindowJoin(WindowJoinSpec),
    CoGroup(CoGroupSpec),
    IntervalJoin(IntervalJoinSpec),
    TemporalJoin(TemporalJoinSpec),
    Absence(AbsenceSpec),
}

impl OperatorSpec {
    /// An instance keeping its state in memory.
    pub fn build(&self) -> Operator {
        match self {
            OperatorSpec::Union(spec) => Operator::Union(Union::new(spec.clone())),
            OperatorSpec::Connect(spec) => Operator::Connect(Connect::new(spec.clone())),
            OperatorSpec::WindowJoin(spec) => Operator::WindowJoin(WindowJoin::new(spec.clone())),
            OperatorSpec::CoGroup(spec) => Operator::CoGroup(CoGroup::new(spec.clone())),
            OperatorSpec::IntervalJoin(spec) => Operator::IntervalJoin(IntervalJoin::new(spec.clone())),
            OperatorSpec::TemporalJoin(spec) => Operator::TemporalJoin(TemporalJoin::new(spec.clone())),
            OperatorSpec::Absence(spec) => Operator::Absence(Absence::new(spec.clone())),
        }
    }

    /// A shard's instance, keeping its stored rows in mmap arenas under `dir` (one directory
    /// per operator and input, opened fresh or recovered). The interval and temporal joins' rows
    /// and connect's keyed state live there; the window kinds, absence and union keep their
    /// (per-key, aggregated or no) state in memory.
    pub fn build_in(&self, dir: &std::path::Path) -> Result<Operator, crate::state::arena::ArenaError> {
        use crate::state::arena::ArenaStore;
        Ok(match self {
            OperatorSpec::IntervalJoin(spec) => {
                let left = ArenaStore::open(&dir.join(format!("{}.left", spec.name)))?;
                let right = ArenaStore::open(&dir.join(format!("{}.right", spec.name)))?;
                Operator::IntervalJoin(IntervalJoin::with_state(spec.clone(), [Box::new(left), Box::new(right)]))
            }
            OperatorSpec::Connect(spec) => {
                Operator::Connect(Connect::with_state(spec.clone(), connect::KeyedState::in_arenas(dir, &spec.name)))
            }
            OperatorSpec::TemporalJoin(spec) => {
                let left = ArenaStore::open(&dir.join(format!("{}.left", spec.name)))?;
                let right = ArenaStore::open(&dir.join(format!("{}.right", spec.name)))?;
                Operator::TemporalJoin(TemporalJoin::with_state(spec.clone(), [Box::new(left), Box::new(right)]))
            }
            _ => self.build(),
        })
    }
}

/// One shard's instance of an operator.
// One instance per operator per shard, never moved on the row path: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Operator {
    Union(Union),
    Connect(Connect),
    WindowJoin(WindowJoin),
    CoGroup(CoGroup),
    IntervalJoin(IntervalJoin),
    TemporalJoin(TemporalJoin),
    Absence(Absence),
}

/// Calls the same method on whichever operator this is.
macro_rules! dispatch {
    ($self:expr, $op:ident => $call:expr) => {
        match $self {
            Operator::Union($op) => $call,
            Operator::Connect($op) => $call,
            Operator::WindowJoin($op) => $call,
            Operator::CoGroup($op) => $call,
            Operator::IntervalJoin($op) => $call,
            Operator::TemporalJoin($op) => $call,
            Operator::Absence($op) => $call,
        }
    };
}

impl Operator {
    /// A row read in place from a ring frame (`bytes`: its archive) reached input `input`. Each
    /// kind copies out only what it keeps: the interval and temporal joins store the archive as
    /// it is (arenas), union and cogroup copy the values they pass on or aggregate, absence a key
    /// it has not seen; window join keeps the row in its windows and connect hands it to its
    /// function (the `CoProcess` API takes rows), so both take a copy of the row.
    pub fn on_frame(&mut self, input: usize, row: &crate::record::ArchivedRow, bytes: &[u8], out: &mut Output) {
        match self {
            Operator::IntervalJoin(op) => op.on_frame(input, row, bytes, out),
            Operator::TemporalJoin(op) => op.on_frame(input, row, bytes, out),
            Operator::Union(op) => op.on_frame(input, row, out),
            Operator::Absence(op) => op.on_frame(input, row, out),
            Operator::CoGroup(op) => op.on_frame(input, row, out),
            other => other.on_row(input, crate::record::frame::to_row(row), out),
        }
    }

    /// A row reached input `input` (its index in the operator's inputs).
    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        dispatch!(self, op => op.on_row(input, row, out))
    }

    /// The operator's watermark moved forward to `watermark` (+∞ at the end of input).
    pub fn on_watermark(&mut self, watermark: Time, out: &mut Output) {
        dispatch!(self, op => op.on_watermark(watermark, out))
    }

    /// A lower bound on the `_ts` of every result this instance may still emit (rule 5).
    pub fn output_watermark(&self) -> Time {
        dispatch!(self, op => op.output_watermark())
    }

    /// Nothing is pending that a moving watermark could emit (no timers).
    pub fn is_quiescent(&self) -> bool {
        dispatch!(self, op => op.is_quiescent())
    }

    /// Processing time reached `now` (`connect::END_OF_INPUT` at the end of input): timers due
    /// by then fire. Only connect has processing-time timers.
    pub fn on_processing_time(&mut self, now: i128, out: &mut Output) {
        if let Operator::Connect(op) = self {
            op.on_processing_time(now, out);
        }
    }

    /// The earliest processing time at which a timer of this instance is due.
    pub fn next_processing_timer(&self) -> Option<i128> {
        match self {
            Operator::Connect(op) => op.next_processing_timer(),
            _ => None,
        }
    }

    pub fn state_rows(&self) -> usize {
        dispatch!(self, op => op.state_rows())
    }

    pub fn state_bytes(&self) -> usize {
        dispatch!(self, op => op.state_bytes())
    }
}
