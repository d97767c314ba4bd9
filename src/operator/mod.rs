//! Operators: sans-IO state machines (STYLE.md 4–6).
//!
//! An operator never reads a clock and never does I/O: rows and watermarks come in as arguments,
//! results and late rows go into a borrowed [`Output`]. Its [`host`] owns its time (it computes the
//! operator's watermark from its inputs, rule 5) and counters, the shard runtime its routing; one
//! operator instance runs per shard and sees only that shard's keys.
//!
//! # The registry
//!
//! What exists is listed here, three times in one place, with no macro and no wildcard:
//! [`OperatorKind`] (what the `kind` key names: parsed once by `config`, which picks each kind's
//! allowed keys and checks by matching on it), [`OperatorSpec`] (a kind's checked settings, what a
//! [`Plan`](crate::plan::Plan) holds) and [`Operator`] (one shard's running instance). Every
//! `match` over them — here, in `config/operators.rs`, in [`OperatorSpec::kind`] — names every
//! variant, so adding a kind means adding a variant to each, and the compiler then lists every
//! place that must handle it (STYLE.md 3). The one list the compiler cannot check for
//! completeness, [`OperatorKind::ALL`] (what `parse` searches), has a const assertion that it is
//! in declaration order.

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
pub mod window_aggregate;
pub mod window_join;

use crate::record::archiver::RowArchives;
use crate::record::frame::to_row;
use crate::record::{ArchivedRow, Row};
use rkyv::rancor;

use crate::state::snapshot::{self, NestResolver, SnapshotError, SnapshotSerializer};
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

/// Why state left an operator other than by its watermark: the `_reason` of a row of
/// `OPERATOR.expired` and the `reason` label of `braid_operator_expired_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExpiryReason {
    /// The operator's `ttl` passed since the row (or its key's state) was last written.
    Ttl,
    /// The shard's byte budget (`runtime.state_budget`, `on_state_full = "evict_oldest"`).
    Budget,
}

impl ExpiryReason {
    pub const ALL: [ExpiryReason; 2] = [ExpiryReason::Ttl, ExpiryReason::Budget];

    pub fn as_str(self) -> &'static str {
        match self {
            ExpiryReason::Ttl => "ttl",
            ExpiryReason::Budget => "budget",
        }
    }
}

/// A row of `OPERATOR.expired`: state the operator gave up before its watermark freed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Expired {
    pub reason: ExpiryReason,
    /// The input a stored row came on; `None` for a result the operator would have emitted
    /// (an open window or aggregate), laid out by the operator's output schema.
    pub input: Option<usize>,
    pub row: Row,
}

/// Which of an operator's outputs a row leaving a shard belongs to. It travels to the collector
/// as one `u32` (shard/wire.rs `Output` frames, a checkpoint's early rows): [`Side::code`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Result,
    /// `OPERATOR.late`, with the input the row came on.
    Late(usize),
    /// `OPERATOR.expired` ([`Expired`]).
    Expired {
        reason: ExpiryReason,
        input: Option<usize>,
    },
    /// A result or side row too large for the rings: a stand-in for `dead_letter`.
    TooLarge,
}

impl Side {
    const RESULT: u32 = u32::MAX;
    const TOO_LARGE: u32 = u32::MAX - 1;
    /// Set on an expired row's code, with the reason in the next byte and the input (or
    /// [`Self::NO_INPUT`]) in the low 16 bits; a late row's code is its input, below it.
    const EXPIRED: u32 = 1 << 31;
    const NO_INPUT: u32 = 0xffff;

    pub fn code(self) -> u32 {
        match self {
            Side::Result => Side::RESULT,
            Side::TooLarge => Side::TOO_LARGE,
            Side::Late(input) => input as u32,
            Side::Expired { reason, input } => {
                let input = input.map_or(Side::NO_INPUT, |i| i as u32);
                Side::EXPIRED | (reason as u32) << 16 | input
            }
        }
    }

    pub fn of(code: u32) -> Side {
        match code {
            Side::RESULT => Side::Result,
            Side::TOO_LARGE => Side::TooLarge,
            c if c & Side::EXPIRED != 0 => {
                let reason = ExpiryReason::ALL[(((c >> 16) & 0xff) as usize).min(ExpiryReason::ALL.len() - 1)];
                let input = c & 0xffff;
                Side::Expired { reason, input: (input != Side::NO_INPUT).then_some(input as usize) }
            }
            input => Side::Late(input as usize),
        }
    }
}

// An operator's inputs fit the 16 bits an expired row's code gives them.
const _: () = assert!(crate::plan::MAX_INPUTS < Side::NO_INPUT as usize);

/// What one activation of an operator produced; the runtime drains it after every call.
#[derive(Default, Debug)]
pub struct Output {
    pub results: Vec<(ResultKind, Row)>,
    /// Results written straight into their archives, never built as heap rows (the interval
    /// join's: projected from the rows it joins, read in place). An operator writes its results
    /// either here or to `results`, never both, so their order is the order of emission.
    pub archived: ArchivedResults,
    /// Late rows with the index of the input they came on.
    pub late: Vec<(usize, Row)>,
    /// Rows and would-be results removed by `ttl` or the byte budget (`OPERATOR.expired`).
    pub expired: Vec<Expired>,
    /// Rows the operator stored in this activation: its host's `ttl` clock takes them (and
    /// clears this), nothing else reads it.
    pub stored: Vec<crate::state::ttl::StoredRow>,
    /// Per-key state written in this activation, as (input, key hash): its host's `ttl` clock
    /// restarts the key's `ttl` (and clears this), nothing else reads it.
    pub touched: Vec<(u32, u64)>,
    /// Rows that left the state inside a would-be result in `expired` (a window join's dropped
    /// window), as (reason, key hash, row id): its host's trace notes them for `braid explain`
    /// (and the host clears this), nothing else reads it.
    pub left_early: Vec<(ExpiryReason, u64, u64)>,
    /// Rows a window aggregate's `where` dropped: a running count, never drained (explain's
    /// trace compares it before and after a row; nothing else is done with such a row).
    pub filtered: usize,
}

impl Output {
    pub fn is_empty(&self) -> bool {
        self.results.is_empty() && self.archived.is_empty() && self.late.is_empty() && self.expired.is_empty()
    }

    /// Every result, heap or archived, as heap rows, in order of emission; both emptied. For
    /// tests and reference runs: the runtime reads archived results in place.
    pub fn take_results(&mut self) -> Vec<(ResultKind, Row)> {
        let mut results: Vec<(ResultKind, Row)> = self.results.drain(..).collect();
        results.extend(self.archived.iter().map(|(kind, row)| (kind, to_row(row))));
        self.archived.clear();
        results
    }

    /// Every result as a heap row, in order of emission, left in place (for tests).
    pub fn result_rows(&self) -> Vec<(ResultKind, Row)> {
        let heap = self.results.iter().cloned();
        heap.chain(self.archived.iter().map(|(kind, row)| (kind, to_row(row)))).collect()
    }

    /// How many results there are, heap and archived.
    pub fn result_count(&self) -> usize {
        self.results.len() + self.archived.len()
    }
}

/// Results written as row archives ([`RowArchives`]), with their kinds.
#[derive(Default, Debug)]
pub struct ArchivedResults {
    pub rows: RowArchives,
    kinds: Vec<ResultKind>,
}

impl ArchivedResults {
    /// The row just ended in `rows` is a result of this kind.
    pub fn ended(&mut self, kind: ResultKind) {
        self.kinds.push(kind);
        debug_assert_eq!(self.kinds.len(), self.rows.len(), "one kind per archived row");
    }

    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    pub fn kind(&self, i: usize) -> ResultKind {
        self.kinds[i]
    }

    pub fn kinds(&self) -> &[ResultKind] {
        &self.kinds
    }

    /// Result `i`'s archive (a frame payload).
    pub fn bytes(&self, i: usize) -> &[u8] {
        self.rows.bytes(i)
    }

    pub fn iter(&self) -> impl Iterator<Item = (ResultKind, &ArchivedRow)> {
        self.kinds.iter().enumerate().map(|(i, &kind)| (kind, self.rows.row(i)))
    }

    pub fn clear(&mut self) {
        self.rows.clear();
        self.kinds.clear();
    }
}

/// Join quality (CONTRACT.md "Metrics": `braid_operator_matched_total` and
/// `braid_operator_unmatched_total`): per input, the rows that left the operator's state having
/// found a partner, and those that found none by their last chance. A join kind counts each of its
/// on-time rows once, when the row leaves its state (evicted by the watermark, or at the end of
/// input when the watermark goes to +∞), so once an input is done `matched + unmatched + late +
/// expired` is every row of that input. What "a partner" is depends on the kind: its module doc
/// says. A row that leaves early (`ttl`, the state budget) is expired, neither matched nor
/// unmatched: the host counts the rows that go to `OPERATOR.expired` as themselves; `expired`
/// here counts those that leave inside a would-be result (the rows a dropped window held).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Quality {
    pub matched: [u64; 2],
    pub unmatched: [u64; 2],
    pub expired: [u64; 2],
}

/// Whether join kinds count their [`Quality`]: always, except while a benchmark measures what
/// the counting costs (benches/shards.rs, BENCHMARKS.md "Cost of the join-quality counters").
static COUNT_QUALITY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns the join-quality counting on or off, process-wide. For measuring its cost only: with
/// it off, `braid_operator_matched_total` and `..._unmatched_total` stay 0.
pub fn count_join_quality(on: bool) {
    COUNT_QUALITY.store(on, std::sync::atomic::Ordering::Relaxed);
}

impl Quality {
    /// `rows` rows of `input` left the state, matched or not.
    pub fn count(&mut self, input: usize, matched: bool, rows: u64) {
        if !COUNT_QUALITY.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        if matched {
            self.matched[input] += rows;
        } else {
            self.unmatched[input] += rows;
        }
    }

    /// `rows` rows of `input` left the state inside a would-be result sent to `OPERATOR.expired`.
    pub fn count_expired(&mut self, input: usize, rows: u64) {
        if COUNT_QUALITY.load(std::sync::atomic::Ordering::Relaxed) {
            self.expired[input] += rows;
        }
    }
}

/// An operator kind: the value of `[operators.NAME] kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OperatorKind {
    Union,
    Connect,
    WindowJoin,
    CoGroup,
    IntervalJoin,
    TemporalJoin,
    Absence,
    WindowAggregate,
}

impl OperatorKind {
    /// Every kind, in variant order (the order error messages list them in).
    pub const ALL: [OperatorKind; 8] = [
        OperatorKind::Union,
        OperatorKind::Connect,
        OperatorKind::WindowJoin,
        OperatorKind::CoGroup,
        OperatorKind::IntervalJoin,
        OperatorKind::TemporalJoin,
        OperatorKind::Absence,
        OperatorKind::WindowAggregate,
    ];

    /// The kind's name in a configuration.
    pub const fn name(self) -> &'static str {
        match self {
            OperatorKind::Union => "union",
            OperatorKind::Connect => "connect",
            OperatorKind::WindowJoin => "window_join",
            OperatorKind::CoGroup => "cogroup",
            OperatorKind::IntervalJoin => "interval_join",
            OperatorKind::TemporalJoin => "temporal_join",
            OperatorKind::Absence => "absence",
            OperatorKind::WindowAggregate => "window_aggregate",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<OperatorKind> {
        OperatorKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// A join of two inputs whose rows find partners or not: it has join-quality counters
    /// ([`Quality`]). Union, connect and absence have none.
    pub const fn is_join(self) -> bool {
        match self {
            OperatorKind::WindowJoin
            | OperatorKind::CoGroup
            | OperatorKind::IntervalJoin
            | OperatorKind::TemporalJoin => true,
            OperatorKind::Union | OperatorKind::Connect | OperatorKind::Absence | OperatorKind::WindowAggregate => {
                false
            }
        }
    }

    /// Instances may hold processing-time timers (only connect's functions set them): the runtime
    /// sends them processing time and runs every tick while they exist.
    pub const fn is_clocked(self) -> bool {
        match self {
            OperatorKind::Connect => true,
            OperatorKind::Union
            | OperatorKind::WindowJoin
            | OperatorKind::CoGroup
            | OperatorKind::IntervalJoin
            | OperatorKind::TemporalJoin
            | OperatorKind::Absence
            | OperatorKind::WindowAggregate => false,
        }
    }
}

// `ALL` lists the variants in declaration order, each once: entry i has discriminant i (a variant
// inserted in the middle fails this until `ALL` has it; one appended at the end is caught by the
// first config test of the new kind, which `parse` would refuse).
const _: () = {
    let mut i = 0;
    while i < OperatorKind::ALL.len() {
        assert!(OperatorKind::ALL[i] as usize == i);
        i += 1;
    }
};

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
    /// One input's window aggregate: a cogroup's machinery over one input ([`window_aggregate`]).
    WindowAggregate(CoGroupSpec),
}

impl OperatorSpec {
    pub fn kind(&self) -> OperatorKind {
        match self {
            OperatorSpec::Union(_) => OperatorKind::Union,
            OperatorSpec::Connect(_) => OperatorKind::Connect,
            OperatorSpec::WindowJoin(_) => OperatorKind::WindowJoin,
            OperatorSpec::CoGroup(_) => OperatorKind::CoGroup,
            OperatorSpec::IntervalJoin(_) => OperatorKind::IntervalJoin,
            OperatorSpec::TemporalJoin(_) => OperatorKind::TemporalJoin,
            OperatorSpec::Absence(_) => OperatorKind::Absence,
            OperatorSpec::WindowAggregate(_) => OperatorKind::WindowAggregate,
        }
    }

    /// What a `ttl` shorter than this cuts short (`braid validate` warns): the event-time span
    /// the kind's state must last, and its name.
    pub fn ttl_floor(&self) -> Option<(i64, &'static str)> {
        match self {
            OperatorSpec::IntervalJoin(spec) => Some((spec.upper - spec.lower, "the join span")),
            OperatorSpec::CoGroup(CoGroupSpec { window, .. })
            | OperatorSpec::WindowAggregate(CoGroupSpec { window, .. })
            | OperatorSpec::WindowJoin(WindowJoinSpec { window, .. }) => {
                Some((window.ttl_floor(), "the window's span (size or gap, plus allowed_lateness)"))
            }
            OperatorSpec::Connect(ConnectSpec { function: connect::FunctionSpec::Reconcile(r), .. }) => {
                Some((r.timeout, "the reconcile timeout"))
            }
            OperatorSpec::Absence(spec) => {
                Some((i64::try_from(spec.timeout).unwrap_or(i64::MAX), "the absence timeout"))
            }
            OperatorSpec::Union(_) | OperatorSpec::Connect(_) | OperatorSpec::TemporalJoin(_) => None,
        }
    }

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
            OperatorSpec::WindowAggregate(spec) => Operator::WindowAggregate(CoGroup::new(spec.clone())),
        }
    }

    /// A shard's instance, keeping its stored rows in mmap arenas under `dir` (one scratch store
    /// per operator and input, started empty: a restart's state comes from a checkpoint). The
    /// interval and temporal joins' rows and connect's keyed state live there; the window kinds,
    /// absence and union keep their (per-key, aggregated or no) state in memory.
    pub fn build_in(&self, dir: &std::path::Path) -> Result<Operator, crate::state::arena::ArenaError> {
        use crate::state::arena::{ArenaConfig, ArenaStore};
        let open = |name: String| ArenaStore::open_with(&dir.join(name), ArenaConfig::scratch());
        Ok(match self {
            OperatorSpec::IntervalJoin(spec) => {
                let left = open(format!("{}.left", spec.name))?;
                let right = open(format!("{}.right", spec.name))?;
                Operator::IntervalJoin(IntervalJoin::with_state(spec.clone(), [Box::new(left), Box::new(right)]))
            }
            OperatorSpec::Connect(spec) => {
                Operator::Connect(Connect::with_state(spec.clone(), connect::KeyedState::in_arenas(dir, &spec.name)))
            }
            OperatorSpec::TemporalJoin(spec) => {
                let left = open(format!("{}.left", spec.name))?;
                let right = open(format!("{}.right", spec.name))?;
                Operator::TemporalJoin(TemporalJoin::with_state(spec.clone(), [Box::new(left), Box::new(right)]))
            }
            OperatorSpec::Union(_)
            | OperatorSpec::WindowJoin(_)
            | OperatorSpec::CoGroup(_)
            | OperatorSpec::WindowAggregate(_)
            | OperatorSpec::Absence(_) => self.build(),
        })
    }
}

/// An operator's snapshot with the kind that wrote it.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct KindState {
    kind: String,
    state: Vec<u8>,
}

/// [`KindState`] as a snapshot writes it: the operator's state serialized in place.
pub(crate) struct KindStateView<'a> {
    kind: String,
    state: OperatorState<'a>,
}

impl rkyv::Archive for KindStateView<'_> {
    type Archived = ArchivedKindState;
    type Resolver = (rkyv::string::StringResolver, NestResolver);

    fn resolve(&self, (kind, state): Self::Resolver, out: rkyv::Place<ArchivedKindState>) {
        rkyv::munge::munge!(let ArchivedKindState { kind: out_kind, state: out_state } = out);
        rkyv::Archive::resolve(&self.kind, kind, out_kind);
        state.resolve(out_state);
    }
}

impl<'a> rkyv::Serialize<SnapshotSerializer<'a>> for KindStateView<'_> {
    fn serialize(&self, serializer: &mut SnapshotSerializer<'a>) -> Result<Self::Resolver, rancor::Error> {
        Ok((self.kind.serialize(serializer)?, self.state.serialize(serializer)?))
    }
}

/// An operator's state, serialized as the `Vec<u8>` of its snapshot: the interval join's nested
/// in place, its stored rows read from its stores, or its delta; the other kinds' encoded on
/// their own and copied in (state/snapshot.rs, "Nesting without copies", "Deltas").
pub(crate) enum OperatorState<'a> {
    IntervalJoin(interval_join::IntervalJoinStateView<'a>),
    IntervalJoinDelta(interval_join::IntervalJoinDeltaView<'a>),
    Other(&'a Operator),
}

impl rkyv::Archive for OperatorState<'_> {
    type Archived = rkyv::vec::ArchivedVec<u8>;
    type Resolver = NestResolver;

    fn resolve(&self, resolver: NestResolver, out: rkyv::Place<Self::Archived>) {
        resolver.resolve(out);
    }
}

impl<'a> rkyv::Serialize<SnapshotSerializer<'a>> for OperatorState<'_> {
    fn serialize(&self, serializer: &mut SnapshotSerializer<'a>) -> Result<NestResolver, rancor::Error> {
        let encoded = match self {
            OperatorState::IntervalJoin(view) => return snapshot::nest(view, serializer),
            OperatorState::IntervalJoinDelta(delta) => return snapshot::nest(delta, serializer),
            OperatorState::Other(op) => match op {
                Operator::Union(op) => op.snapshot(),
                Operator::Connect(op) => op.snapshot(),
                Operator::WindowJoin(op) => op.snapshot(),
                Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.snapshot(),
                Operator::TemporalJoin(op) => op.snapshot(),
                Operator::Absence(op) => op.snapshot(),
                Operator::IntervalJoin(op) => op.snapshot(),
            },
        };
        NestResolver::copy(&encoded.map_err(rancor::Source::new)?, serializer)
    }
}

impl KindStateView<'_> {
    /// Whether it holds a delta.
    pub(crate) fn is_delta(&self) -> bool {
        matches!(self.state, OperatorState::IntervalJoinDelta(_))
    }
}

/// The kind name of a delta snapshot of kind `kind`.
fn delta_kind(kind: &str) -> String {
    format!("{kind} delta")
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
    WindowAggregate(CoGroup),
}

impl Operator {
    pub fn kind(&self) -> OperatorKind {
        match self {
            Operator::Union(_) => OperatorKind::Union,
            Operator::Connect(_) => OperatorKind::Connect,
            Operator::WindowJoin(_) => OperatorKind::WindowJoin,
            Operator::CoGroup(_) => OperatorKind::CoGroup,
            Operator::IntervalJoin(_) => OperatorKind::IntervalJoin,
            Operator::TemporalJoin(_) => OperatorKind::TemporalJoin,
            Operator::Absence(_) => OperatorKind::Absence,
            Operator::WindowAggregate(_) => OperatorKind::WindowAggregate,
        }
    }

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
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.on_frame(input, row, out),
            Operator::WindowJoin(op) => op.on_row(input, crate::record::frame::to_row(row), out),
            Operator::Connect(op) => op.on_row(input, crate::record::frame::to_row(row), out),
        }
    }

    /// A row reached input `input` (its index in the operator's inputs).
    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        match self {
            Operator::Union(op) => op.on_row(input, row, out),
            Operator::Connect(op) => op.on_row(input, row, out),
            Operator::WindowJoin(op) => op.on_row(input, row, out),
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.on_row(input, row, out),
            Operator::IntervalJoin(op) => op.on_row(input, row, out),
            Operator::TemporalJoin(op) => op.on_row(input, row, out),
            Operator::Absence(op) => op.on_row(input, row, out),
        }
    }

    /// The operator's watermark moved forward to `watermark` (+∞ at the end of input).
    pub fn on_watermark(&mut self, watermark: Time, out: &mut Output) {
        match self {
            Operator::Union(op) => op.on_watermark(watermark, out),
            Operator::Connect(op) => op.on_watermark(watermark, out),
            Operator::WindowJoin(op) => op.on_watermark(watermark, out),
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.on_watermark(watermark, out),
            Operator::IntervalJoin(op) => op.on_watermark(watermark, out),
            Operator::TemporalJoin(op) => op.on_watermark(watermark, out),
            Operator::Absence(op) => op.on_watermark(watermark, out),
        }
    }

    /// A lower bound on the `_ts` of every result this instance may still emit (rule 5).
    pub fn output_watermark(&self) -> Time {
        match self {
            Operator::Union(op) => op.output_watermark(),
            Operator::Connect(op) => op.output_watermark(),
            Operator::WindowJoin(op) => op.output_watermark(),
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.output_watermark(),
            Operator::IntervalJoin(op) => op.output_watermark(),
            Operator::TemporalJoin(op) => op.output_watermark(),
            Operator::Absence(op) => op.output_watermark(),
        }
    }

    /// Nothing is pending that a moving watermark could emit (no timers).
    pub fn is_quiescent(&self) -> bool {
        match self {
            Operator::Union(op) => op.is_quiescent(),
            Operator::Connect(op) => op.is_quiescent(),
            Operator::WindowJoin(op) => op.is_quiescent(),
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.is_quiescent(),
            Operator::IntervalJoin(op) => op.is_quiescent(),
            Operator::TemporalJoin(op) => op.is_quiescent(),
            Operator::Absence(op) => op.is_quiescent(),
        }
    }

    /// Processing time reached `now` (`connect::END_OF_INPUT` at the end of input): timers due
    /// by then fire. Only connect has processing-time timers.
    pub fn on_processing_time(&mut self, now: i128, out: &mut Output) {
        match self {
            Operator::Connect(op) => op.on_processing_time(now, out),
            Operator::Union(_)
            | Operator::WindowJoin(_)
            | Operator::CoGroup(_)
            | Operator::WindowAggregate(_)
            | Operator::IntervalJoin(_)
            | Operator::TemporalJoin(_)
            | Operator::Absence(_) => {}
        }
    }

    /// `ttl` passed for `due` (its host's clock says): the state goes to `out.expired`, if still
    /// there.
    pub fn expire(&mut self, due: crate::state::ttl::Due, out: &mut Output) {
        match self {
            Operator::IntervalJoin(op) => op.expire(due, out),
            Operator::TemporalJoin(op) => op.expire(due, out),
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.expire(due, out),
            Operator::Connect(op) => op.expire(due, out),
            Operator::WindowJoin(op) => op.expire(due, out),
            Operator::Absence(op) => op.expire(due, out),
            // A union keeps no state: nothing ever expires.
            Operator::Union(_) => {}
        }
    }

    /// The earliest processing time at which a timer of this instance is due.
    pub fn next_processing_timer(&self) -> Option<i128> {
        match self {
            Operator::Connect(op) => op.next_processing_timer(),
            Operator::Union(_)
            | Operator::WindowJoin(_)
            | Operator::CoGroup(_)
            | Operator::WindowAggregate(_)
            | Operator::IntervalJoin(_)
            | Operator::TemporalJoin(_)
            | Operator::Absence(_) => None,
        }
    }

    /// The join-quality counters of a join kind ([`OperatorKind::is_join`]); none for the others.
    pub fn quality(&self) -> Option<Quality> {
        match self {
            Operator::WindowJoin(op) => Some(op.quality()),
            Operator::CoGroup(op) => Some(op.quality()),
            Operator::IntervalJoin(op) => Some(op.quality()),
            Operator::TemporalJoin(op) => Some(op.quality()),
            Operator::Union(_) | Operator::Connect(_) | Operator::Absence(_) | Operator::WindowAggregate(_) => None,
        }
    }

    /// Everything this instance's output depends on (state/snapshot.rs), tagged with its kind.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        snapshot::encode_nesting(&self.snapshot_view(false)?)
    }

    /// What [`snapshot`](Self::snapshot) encodes, to nest it in its host's in place; with
    /// `delta`, only what changed since the last snapshot where this instance can tell
    /// (state/snapshot.rs, "Deltas"), tagged as a delta of its kind.
    pub(crate) fn snapshot_view(&self, delta: bool) -> Result<KindStateView<'_>, SnapshotError> {
        let kind = self.kind().name();
        Ok(match self {
            Operator::IntervalJoin(op) => match delta.then(|| op.snapshot_delta()).flatten() {
                Some(delta) => KindStateView { kind: delta_kind(kind), state: OperatorState::IntervalJoinDelta(delta) },
                None => {
                    KindStateView { kind: kind.to_owned(), state: OperatorState::IntervalJoin(op.snapshot_view()?) }
                }
            },
            _ => KindStateView { kind: kind.to_owned(), state: OperatorState::Other(self) },
        })
    }

    /// A snapshot of this instance was taken: what changes from here is noted for a delta.
    pub(crate) fn note_snapshot(&mut self) {
        if let Operator::IntervalJoin(op) = self {
            op.note_snapshot();
        }
    }

    /// Takes up a [`snapshot`](Self::snapshot) of an instance of the same operator; `self` is
    /// freshly built from the same spec (its stores empty).
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        self.restore_chain(&[bytes])
    }

    /// Takes up a whole snapshot followed by the deltas taken after it, each of the one before
    /// (state/snapshot.rs, "Deltas"). Only the interval join writes deltas.
    pub fn restore_chain(&mut self, chain: &[&[u8]]) -> Result<(), SnapshotError> {
        let saved = chain.iter().map(|bytes| snapshot::decode::<KindState>(bytes)).collect::<Result<Vec<_>, _>>()?;
        let Some((whole, deltas)) = saved.split_first() else {
            return Err(SnapshotError::Decode("an empty chain of snapshots".into()));
        };
        let kind = self.kind().name();
        if whole.kind != kind {
            return Err(SnapshotError::Mismatch { expected: kind.to_owned(), found: whole.kind.clone() });
        }
        if let Some(other) = deltas.iter().find(|d| d.kind != delta_kind(kind)) {
            return Err(SnapshotError::Mismatch { expected: delta_kind(kind), found: other.kind.clone() });
        }
        let state = &whole.state;
        match self {
            Operator::IntervalJoin(op) => {
                let deltas: Vec<&[u8]> = deltas.iter().map(|d| d.state.as_slice()).collect();
                op.restore_chain(state, &deltas)
            }
            _ if !deltas.is_empty() => {
                Err(SnapshotError::Mismatch { expected: "a whole snapshot".into(), found: delta_kind(kind) })
            }
            Operator::Union(op) => op.restore(state),
            Operator::Connect(op) => op.restore(state),
            Operator::WindowJoin(op) => op.restore(state),
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.restore(state),
            Operator::TemporalJoin(op) => op.restore(state),
            Operator::Absence(op) => op.restore(state),
        }
    }

    pub fn state_rows(&self) -> usize {
        match self {
            Operator::Union(op) => op.state_rows(),
            Operator::Connect(op) => op.state_rows(),
            Operator::WindowJoin(op) => op.state_rows(),
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.state_rows(),
            Operator::IntervalJoin(op) => op.state_rows(),
            Operator::TemporalJoin(op) => op.state_rows(),
            Operator::Absence(op) => op.state_rows(),
        }
    }

    /// Visits every row this instance can give up to `evict_oldest` (state/budget.rs): its
    /// input, (ts, id), key hash and handle. The interval and temporal joins' stored rows,
    /// connect's (threshold limits, reconcile's waiting rows), the window kinds' windows (by
    /// end − 1) and absence's keys (by the newest ts each saw). A union holds nothing; a
    /// connect's own `CoProcess` state is counted but not evicted (README "Bounded state").
    pub fn visit_evictable(&self, visit: &mut dyn FnMut(usize, i64, u64, u64, u64)) {
        match self {
            Operator::IntervalJoin(op) => op.visit_evictable(visit),
            Operator::TemporalJoin(op) => op.visit_evictable(visit),
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.visit_evictable(visit),
            Operator::Connect(op) => op.visit_evictable(visit),
            Operator::WindowJoin(op) => op.visit_evictable(visit),
            Operator::Absence(op) => op.visit_evictable(visit),
            Operator::Union(_) => {}
        }
    }

    /// Takes what [`visit_evictable`](Self::visit_evictable) named out of the state, into
    /// `out.expired` (reason budget): a stored row, or an open window's would-be result (none
    /// when its result is out already). False when it left meanwhile.
    pub fn evict(&mut self, input: usize, key_hash: u64, handle: u64, out: &mut Output) -> bool {
        let row = match self {
            Operator::IntervalJoin(op) => op.evict(input, key_hash, handle),
            Operator::TemporalJoin(op) => op.evict(input, key_hash, handle),
            Operator::Connect(op) => op.evict(input, key_hash, handle),
            // A window leaves as the result it would have emitted, which it puts out itself.
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => return op.evict(handle, out),
            Operator::WindowJoin(op) => return op.evict(handle, out),
            // A key leaves as the results it would emit silent, which it puts out itself.
            Operator::Absence(op) => return op.evict(key_hash, handle, out),
            Operator::Union(_) => None,
        };
        row.map(|row| out.expired.push(Expired { reason: ExpiryReason::Budget, input: Some(input), row })).is_some()
    }

    /// What this instance costs its shard's state budget (state/budget.rs): stored rows as the
    /// arenas map them, plus indexes, timers and per-key state; O(1) for every kind.
    pub fn budget_bytes(&self) -> usize {
        match self {
            Operator::Connect(op) => op.budget_bytes(),
            Operator::IntervalJoin(op) => op.budget_bytes(),
            Operator::TemporalJoin(op) => op.budget_bytes(),
            Operator::Union(op) => op.state_bytes(),
            Operator::WindowJoin(op) => op.state_bytes(),
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.state_bytes(),
            Operator::Absence(op) => op.state_bytes(),
        }
    }

    pub fn state_bytes(&self) -> usize {
        match self {
            Operator::Union(op) => op.state_bytes(),
            Operator::Connect(op) => op.state_bytes(),
            Operator::WindowJoin(op) => op.state_bytes(),
            Operator::CoGroup(op) | Operator::WindowAggregate(op) => op.state_bytes(),
            Operator::IntervalJoin(op) => op.state_bytes(),
            Operator::TemporalJoin(op) => op.state_bytes(),
            Operator::Absence(op) => op.state_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_side_travels_as_one_word_and_back() {
        let mut sides = vec![Side::Result, Side::TooLarge, Side::Late(0), Side::Late(crate::plan::MAX_INPUTS - 1)];
        for reason in ExpiryReason::ALL {
            for input in [None, Some(0), Some(3), Some(crate::plan::MAX_INPUTS - 1)] {
                sides.push(Side::Expired { reason, input });
            }
        }
        for side in sides {
            assert_eq!(Side::of(side.code()), side, "{side:?} as {:#x}", side.code());
        }
    }
}
