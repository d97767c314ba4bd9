//! connect: two inputs with shared keyed state and timers (DESIGN.md "Operators"; CONTRACT.md
//! "The other operators", rules 5, 7, 8, 10, 11). The logic is a [`CoProcess`]: the built-ins
//! [`Threshold`] and [`Reconcile`], or a library user's own ([`ConnectSpec::custom`]).
//!
//! The operator around the function does what every function needs done the same way:
//!
//! - lateness (rule 7): a row of either input with `ts < watermark` goes to `NAME.late` and
//!   reaches no handler;
//! - time: the host moves the watermark (event timers strictly past their time fire, in order)
//!   and processing time (processing timers due fire; at the end of input every pending one);
//! - output watermark (rule 5): `min(watermark, smallest hold of a pending timer)` — "the
//!   smallest `_ts` still waiting to be emitted";
//! - results: projected by `select` (rule 9), ids H(operator, kind, ids of the rows) (rule 10);
//! - leaving early (`ttl`, `evict_oldest`): the built-ins report the rows they store (a
//!   threshold limit, a reconcile row waiting) to the host's `ttl` clock and name them to the
//!   state budget; such a row leaves to `NAME.expired` as itself, with what of the function
//!   names it (reconcile's timer). A custom [`CoProcess`]'s state neither expires nor is evicted:
//!   the operator cannot know what its rows mean.
//!
//! Files: `coprocess.rs` (the trait, keyed state, timers, emitter), `threshold.rs`,
//! `reconcile.rs`.

pub mod coprocess;
pub mod reconcile;
pub mod threshold;

use std::fmt;
use std::sync::Arc;

use crate::config::operators::{Builder, Built, output_schema, select};
use crate::config::walk::{Errors, Table};
use crate::record::Row;
use crate::record::id::IdHasher;
use crate::state::RowHandle;
use crate::state::snapshot::{self, SavedStore, SnapshotError};
use crate::state::ttl::{Due, StoredRow};
use crate::time::Time;

use coprocess::TimersState;
pub use coprocess::{CoProcess, Context, Domain, Emitter, Fired, KeyedState, Timer, TimerService};
pub use reconcile::{Reconcile, ReconcileSpec};
pub use threshold::{Threshold, ThresholdSpec};

use super::interval_join::{LEFT, RIGHT};
use super::{Expired, ExpiryReason, OperatorSpec, Output, Projection};

/// Checks `[operators.NAME]` of this kind.
pub(crate) fn check(b: &mut Builder<'_, '_, '_>, name: &str, t: Table<'_, '_>, errors: &mut Errors) -> Option<Built> {
    let function = t.required_str("function", errors, "threshold or reconcile");
    let threshold = match function {
        Some(("threshold", _)) => true,
        Some(("reconcile", _)) => false,
        Some((_, span)) => {
            errors.at(&span, &t.child_path("function"), "must be threshold or reconcile");
            return None;
        }
        None => return None,
    };
    let inputs = b.two_inputs(t, threshold, errors);
    let misplaced = |key: &str, owner: &str, errors: &mut Errors| {
        if t.get(key).is_some() {
            t.error(key, errors, format!("belongs to function = {owner:?}"));
        }
    };
    let function = if threshold {
        misplaced("timeout", "reconcile", errors);
        let mut positions = [None, None];
        if let Some(inputs) = &inputs {
            for (i, (key, input)) in [("value", &inputs[LEFT]), ("limit", &inputs[RIGHT])].into_iter().enumerate() {
                if let Some((f, span)) = t.required_str(key, errors, &format!("a field of {}", input.name)) {
                    match input.schema.position(f) {
                        Some(pos) => positions[i] = Some(pos),
                        None => errors.at(&span, &t.child_path(key), format!("{f:?} is not a field of {}", input.name)),
                    }
                }
            }
        }
        let broadcast = inputs.as_ref().is_some_and(|i| i[RIGHT].is_broadcast());
        // A bad `value` / `limit` is reported already: the positions then only fill the spec.
        let [value, limit] = positions.map(|p| p.unwrap_or(0));
        FunctionSpec::Threshold(ThresholdSpec { value, limit, broadcast })
    } else {
        misplaced("value", "threshold", errors);
        misplaced("limit", "threshold", errors);
        if t.get("timeout").is_none() {
            t.missing("timeout", errors, "a duration such as \"5s\"");
        }
        let timeout = t.duration_or("timeout", 0, errors);
        FunctionSpec::Reconcile(ReconcileSpec { timeout })
    };
    let missing = if threshold { [false, false] } else { [true, true] };
    let (columns, fields) = select(t, inputs.as_ref()?, missing, errors)?;
    let (output, rekey) = output_schema(t, fields, inputs.as_ref()?[LEFT].key_fields().len(), errors)?;
    let projection = Projection { columns, rekey };
    let spec = OperatorSpec::Connect(ConnectSpec { name: name.to_owned(), projection, function });
    Some(Built { inputs: inputs?.map(|i| i.node).to_vec(), output, spec })
}

/// A checked `connect` operator.
#[derive(Clone, Debug)]
pub struct ConnectSpec {
    pub name: String,
    /// `select` (rule 9) and `key`.
    pub projection: Projection,
    pub function: FunctionSpec,
}

/// Which function runs; one instance is made per shard.
#[derive(Clone)]
pub enum FunctionSpec {
    Threshold(ThresholdSpec),
    Reconcile(ReconcileSpec),
    /// A library user's [`CoProcess`], made by this factory.
    Custom(Arc<dyn Fn() -> Box<dyn CoProcess> + Send + Sync>),
}

impl fmt::Debug for FunctionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FunctionSpec::Threshold(spec) => f.debug_tuple("Threshold").field(spec).finish(),
            FunctionSpec::Reconcile(spec) => f.debug_tuple("Reconcile").field(spec).finish(),
            FunctionSpec::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl ConnectSpec {
    /// An operator running a custom [`CoProcess`]; `projection` is what [`Emitter::emit`] builds
    /// results with.
    pub fn custom(
        name: &str,
        projection: Projection,
        function: impl Fn() -> Box<dyn CoProcess> + Send + Sync + 'static,
    ) -> ConnectSpec {
        ConnectSpec { name: name.to_owned(), projection, function: FunctionSpec::Custom(Arc::new(function)) }
    }

    /// The same operator (name, inputs' `select`, `key`) running a custom [`CoProcess`] instead:
    /// declare it in the configuration as a built-in, then swap the function in the plan.
    pub fn with_function(self, function: impl Fn() -> Box<dyn CoProcess> + Send + Sync + 'static) -> ConnectSpec {
        ConnectSpec { function: FunctionSpec::Custom(Arc::new(function)), ..self }
    }
}

/// The running function: built-ins without dynamic dispatch.
enum Function {
    Threshold(Threshold),
    Reconcile(Reconcile),
    Custom(Box<dyn CoProcess>),
}

/// One shard's instance.
pub struct Connect {
    spec: ConnectSpec,
    function: Function,
    watermark: Time,
    /// Processing time as last told by the runtime.
    now: i128,
    state: KeyedState,
    timers: TimerService,
    ids: IdHasher,
}

/// Processing time at the end of input ([`Connect::on_processing_time`]).
pub const END_OF_INPUT: i128 = i128::MAX;

impl Connect {
    pub fn new(spec: ConnectSpec) -> Connect {
        Connect::with_state(spec, KeyedState::default())
    }

    /// A connect keeping its keyed state in `state` (e.g. [`KeyedState::in_arenas`]).
    pub fn with_state(spec: ConnectSpec, state: KeyedState) -> Connect {
        let function = match &spec.function {
            FunctionSpec::Threshold(s) => Function::Threshold(Threshold::new(*s)),
            FunctionSpec::Reconcile(s) => Function::Reconcile(Reconcile::new(*s)),
            FunctionSpec::Custom(make) => Function::Custom(make()),
        };
        Connect {
            spec,
            function,
            watermark: Time::NEG_INF,
            now: i128::MIN,
            state,
            timers: TimerService::default(),
            ids: IdHasher::default(),
        }
    }

    pub fn on_row(&mut self, input: usize, row: Row, out: &mut Output) {
        if self.watermark.is_past(row.ts) {
            out.late.push((input, row));
            return;
        }
        let Connect { spec, function, watermark, now, state, timers, ids } = self;
        let mut ctx =
            Context::new(state, timers, Emitter::new(&spec.name, &spec.projection, ids, out), *watermark, *now);
        // Built-ins are matched here so that their handlers are called directly.
        match (function, input) {
            (Function::Threshold(f), LEFT) => f.on_left(row, &mut ctx),
            (Function::Threshold(f), _) => f.on_right(row, &mut ctx),
            (Function::Reconcile(f), LEFT) => f.on_left(row, &mut ctx),
            (Function::Reconcile(f), _) => f.on_right(row, &mut ctx),
            (Function::Custom(f), LEFT) => f.on_left(row, &mut ctx),
            (Function::Custom(f), _) => f.on_right(row, &mut ctx),
        }
    }

    /// Fires every event timer strictly behind `watermark` (those set meanwhile too), in order.
    pub fn on_watermark(&mut self, watermark: Time, out: &mut Output) {
        self.watermark = watermark;
        while let Some(fired) = self.timers.pop_due(Domain::Event, |at| at < watermark) {
            self.fire(fired, out);
        }
    }

    /// Processing time reached `now`: due processing timers fire, in order. At
    /// [`END_OF_INPUT`] every pending one fires once, with its own time as processing time;
    /// timers set during that last sweep are dropped.
    pub fn on_processing_time(&mut self, now: i128, out: &mut Output) {
        if now == END_OF_INPUT {
            for (at, seq) in self.timers.processing_snapshot() {
                if let Some(fired) = self.timers.take_processing(at, seq) {
                    self.now = self.now.max(at.raw());
                    self.fire(fired, out);
                }
            }
            self.timers.clear_processing();
            return;
        }
        while let Some(fired) = self.timers.pop_due(Domain::Processing, |at| at.raw() <= now) {
            // A timer sees its own due time as processing time, however late after it this call
            // comes (the shard runtime learns processing time at events, not in between).
            self.now = self.now.max(fired.timer.at.raw());
            self.fire(fired, out);
        }
        self.now = self.now.max(now);
    }

    fn fire(&mut self, fired: Fired, out: &mut Output) {
        let Connect { spec, function, watermark, now, state, timers, ids } = self;
        let mut ctx =
            Context::new(state, timers, Emitter::new(&spec.name, &spec.projection, ids, out), *watermark, *now);
        match function {
            Function::Threshold(f) => f.on_timer(fired, &mut ctx),
            Function::Reconcile(f) => f.on_timer(fired, &mut ctx),
            Function::Custom(f) => f.on_timer(fired, &mut ctx),
        }
    }

    /// The earliest processing time at which a timer is due.
    pub fn next_processing_timer(&self) -> Option<i128> {
        self.timers.next(Domain::Processing).map(Time::raw)
    }

    /// min(watermark, the smallest `_ts` a pending timer may still emit) (rule 5).
    pub fn output_watermark(&self) -> Time {
        self.watermark.min(self.timers.min_hold())
    }

    /// No event timer waits for the watermark.
    pub fn is_quiescent(&self) -> bool {
        self.timers.is_empty(Domain::Event)
    }

    pub fn state_rows(&self) -> usize {
        self.state.rows()
    }

    pub fn state_bytes(&self) -> usize {
        self.state.bytes()
    }

    /// What this instance costs the shard's state budget (state/budget.rs).
    pub fn budget_bytes(&self) -> usize {
        self.state.footprint()
    }

    /// `ttl` passed for a row a built-in function stored (the host's clock says): it leaves to
    /// `OPERATOR.expired` as itself — a threshold limit, a reconcile row still waiting, which
    /// then is never emitted alone. A row gone meanwhile (replaced, matched, timed out) is not.
    pub fn expire(&mut self, due: Due, out: &mut Output) {
        let Due::Row(StoredRow { input, key_hash, handle }) = due else { return };
        let input = input as usize;
        let Some(row) = self.give_up(input, key_hash, handle) else { return };
        out.expired.push(Expired { reason: ExpiryReason::Ttl, input: Some(input), row });
    }

    /// Every row a built-in function stored: its input, (ts, id), key hash and handle
    /// (state/budget.rs, eviction). Broadcast limits are left out (every shard holds them, and
    /// shards evict on their own budgets); a custom function's state is not evictable.
    pub fn visit_evictable(&self, visit: &mut dyn FnMut(usize, i64, u64, u64, u64)) {
        let slots: &[(usize, usize)] = match self.function {
            Function::Threshold(_) => &[(threshold::LIMITS, RIGHT)],
            Function::Reconcile(_) => &[(LEFT, LEFT), (RIGHT, RIGHT)],
            Function::Custom(_) => &[],
        };
        let broadcast = crate::record::id::key_hash(&crate::record::Key::Broadcast);
        for &(slot, input) in slots {
            self.state.visit_ages(slot, &mut |ts, id, key_hash, handle| {
                if key_hash != broadcast {
                    visit(input, ts, id, key_hash, handle);
                }
            });
        }
    }

    /// Takes a row [`visit_evictable`](Self::visit_evictable) named out of the state
    /// (`evict_oldest`); the caller sends it to `OPERATOR.expired`.
    pub fn evict(&mut self, input: usize, key_hash: u64, handle: RowHandle) -> Option<Row> {
        self.give_up(input, key_hash, handle)
    }

    /// A stored row leaving early (`ttl`, the budget), with whatever of the function names it.
    fn give_up(&mut self, input: usize, key_hash: u64, handle: RowHandle) -> Option<Row> {
        match &self.function {
            Function::Threshold(_) => Threshold::give_up(input, key_hash, handle, &mut self.state),
            Function::Reconcile(f) => f.give_up(input, key_hash, handle, &mut self.state, &mut self.timers),
            Function::Custom(_) => None,
        }
    }
}

/// What a checkpoint keeps of a connect (state/snapshot.rs).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct ConnectState {
    /// The function that kept this state ([`Function::name`]).
    function: String,
    watermark: Time,
    now: i128,
    /// Per slot of keyed state, its rows with the handles functions name them by (reconcile's
    /// timer tags carry them).
    slots: Vec<SavedStore>,
    timers: TimersState,
}

impl Function {
    fn name(&self) -> &'static str {
        match self {
            Function::Threshold(_) => "threshold",
            Function::Reconcile(_) => "reconcile",
            Function::Custom(_) => "custom",
        }
    }

    /// The slots of keyed state the function uses (`None`: any number).
    fn slots(&self) -> Option<usize> {
        match self {
            Function::Threshold(_) => Some(1),
            Function::Reconcile(_) => Some(2),
            Function::Custom(_) => None,
        }
    }
}

impl Connect {
    /// Everything this instance's output depends on: the keyed state (every slot's rows with
    /// their handles), the pending timers of both domains with their holds and order, the
    /// watermark and processing time. The built-in functions keep nothing else; a custom
    /// [`CoProcess`] that keeps state in its own fields (against the trait's advice) loses it.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        snapshot::encode(&ConnectState {
            function: self.function.name().to_owned(),
            watermark: self.watermark,
            now: self.now,
            slots: self.state.save()?,
            timers: self.timers.save(),
        })
    }

    /// Takes up a [`snapshot`](Self::snapshot); `self` is freshly built from the same spec.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let saved: ConnectState = snapshot::decode(bytes)?;
        let function = self.function.name();
        if saved.function != function {
            let expected = format!("connect function {function}");
            return Err(SnapshotError::Mismatch { expected, found: format!("connect function {}", saved.function) });
        }
        if let Some(slots) = self.function.slots()
            && saved.slots.len() > slots
        {
            return Err(SnapshotError::Mismatch {
                expected: format!("at most {slots} slots of keyed state"),
                found: format!("{} slots", saved.slots.len()),
            });
        }
        if !self.timers.is_empty(Domain::Event) || !self.timers.is_empty(Domain::Processing) {
            let expected = "a freshly built instance (no timers)".to_owned();
            return Err(SnapshotError::Mismatch { expected, found: "pending timers".into() });
        }
        self.state.check(&saved.slots)?;
        self.timers.load(saved.timers)?;
        self.state.load(&saved.slots)?;
        self.watermark = saved.watermark;
        self.now = saved.now;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::ResultKind;
    use crate::operator::projection::Column;
    use crate::record::id::key_hash;
    use crate::record::{Key, Value};

    const STREAMS: &str = r#"
[streams.telemetry]
key = "device"
fields = { device = "string", temp = "float" }

[streams.limits]
key = "*"
fields = { site = "string", max_temp = "float" }

[streams.psp]
key = "device"
fields = { device = "string", amount = "int" }
"#;

    fn connect_spec(text: &str) -> Result<ConnectSpec, String> {
        let plan = crate::config::parse("c.toml", &format!("{STREAMS}{text}")).map_err(|e| e.to_string())?;
        match &plan.operators[0].spec {
            OperatorSpec::Connect(spec) => Ok(spec.clone()),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn config_yields_the_function_spec() {
        let threshold = "[operators.o]\nkind = \"connect\"\nfunction = \"threshold\"\nleft = \"telemetry\"\n\
                         right = \"limits\"\nvalue = \"temp\"\nlimit = \"max_temp\"\nselect = [\"right.site\"]\n";
        let spec = connect_spec(threshold).unwrap();
        let FunctionSpec::Threshold(t) = spec.function else { panic!("{spec:?}") };
        assert_eq!((t.value, t.limit, t.broadcast), (1, 1, true));
        assert_eq!(spec.projection.columns, [Column::Key(0), Column::Field { input: RIGHT, pos: 0 }, Column::Kind]);
        let reconcile = "[operators.o]\nkind = \"connect\"\nfunction = \"reconcile\"\nleft = \"telemetry\"\n\
                         right = \"psp\"\ntimeout = \"1500ms\"\nselect = [\"right.amount\"]\n";
        let spec = connect_spec(reconcile).unwrap();
        assert!(matches!(spec.function, FunctionSpec::Reconcile(ReconcileSpec { timeout: 1500 })), "{spec:?}");
        let bad = threshold.replace("value = \"temp\"", "value = \"tmp\"");
        let message = connect_spec(&bad).unwrap_err();
        assert!(message.contains("operators.o.value: \"tmp\" is not a field of telemetry"), "{message}");
        assert!(!message.contains("not available"), "{message}");
        let message = connect_spec(&reconcile.replace("1500ms", "-1s")).unwrap_err();
        assert!(message.contains("operators.o.timeout: must not be negative"), "{message}");
    }

    #[test]
    fn a_ttl_shorter_than_the_reconcile_timeout_is_warned_about() {
        let reconcile = |ttl: &str| {
            format!(
                "{STREAMS}[operators.o]\nkind = \"connect\"\nfunction = \"reconcile\"\nleft = \"telemetry\"\n\
                 right = \"psp\"\ntimeout = \"1500ms\"\nttl = \"{ttl}\"\nselect = [\"right.amount\"]\n"
            )
        };
        let plan = crate::config::parse("c.toml", &reconcile("1500ms")).unwrap();
        assert_eq!(plan.operators[0].ttl, Some(1500));
        assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
        let plan = crate::config::parse("c.toml", &reconcile("1s")).unwrap();
        assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
        assert!(
            plan.warnings[0]
                .contains("operators.o.ttl: ttl of 1000 ms is shorter than the reconcile timeout (1500 ms)"),
            "{:?}",
            plan.warnings
        );
        let threshold = format!(
            "{STREAMS}[operators.o]\nkind = \"connect\"\nfunction = \"threshold\"\nleft = \"telemetry\"\n\
             right = \"limits\"\nvalue = \"temp\"\nlimit = \"max_temp\"\nttl = \"1ms\"\nselect = [\"right.site\"]\n"
        );
        let plan = crate::config::parse("c.toml", &threshold).unwrap();
        assert!(plan.warnings.is_empty(), "a threshold waits for nothing: {:?}", plan.warnings);
    }

    fn spec(function: FunctionSpec) -> ConnectSpec {
        ConnectSpec { name: "c".into(), projection: Projection::key_and_first_values(), function }
    }

    fn row(key: &str, ts: i64, v: Value) -> Row {
        let key = Key::Str(key.into());
        Row { ts, key_hash: key_hash(&key), key, id: ts as u64, values: Box::new([v]) }
    }

    fn broadcast(ts: i64, v: f64) -> Row {
        Row {
            ts,
            key: Key::Broadcast,
            key_hash: key_hash(&Key::Broadcast),
            id: ts as u64,
            values: Box::new([Value::Float(v)]),
        }
    }

    fn results(out: &Output) -> Vec<(ResultKind, i64, Value, Value)> {
        out.results.iter().map(|(k, r)| (*k, r.ts, r.values[1].clone(), r.values[2].clone())).collect()
    }

    fn threshold(broadcast: bool) -> Connect {
        Connect::new(spec(FunctionSpec::Threshold(ThresholdSpec { value: 0, limit: 0, broadcast })))
    }

    #[test]
    fn threshold_uses_the_latest_processed_limit_of_the_key() {
        let mut op = threshold(false);
        let mut out = Output::default();
        op.on_row(LEFT, row("a", 100, Value::Float(50.0)), &mut out);
        assert!(out.is_empty(), "no limit yet: nothing");
        op.on_row(RIGHT, row("a", 200, Value::Float(30.0)), &mut out);
        op.on_row(RIGHT, row("a", 150, Value::Float(40.0)), &mut out);
        op.on_row(LEFT, row("a", 300, Value::Float(35.0)), &mut out);
        assert!(out.is_empty(), "the later-processed limit (40) applies, whatever its ts");
        op.on_row(LEFT, row("b", 300, Value::Float(99.0)), &mut out);
        assert!(out.is_empty(), "b has no limit of its own");
        op.on_row(LEFT, row("a", 310, Value::Float(40.5)), &mut out);
        assert_eq!(results(&out), [(ResultKind::Match, 310, Value::Float(40.5), Value::Float(40.0))]);
        assert_eq!(op.state_rows(), 1, "one limit per key");
        assert_eq!(op.output_watermark(), Time::NEG_INF);
    }

    #[test]
    fn a_broadcast_limit_applies_to_every_key_and_late_rows_go_aside() {
        let mut op = threshold(true);
        let mut out = Output::default();
        op.on_row(RIGHT, broadcast(100, 30.0), &mut out);
        op.on_row(LEFT, row("a", 200, Value::Int(31)), &mut out);
        op.on_row(LEFT, row("b", 200, Value::Int(30)), &mut out);
        op.on_row(LEFT, row("c", 200, Value::Int(45)), &mut out);
        assert_eq!(
            out.results.iter().map(|(_, r)| r.key.clone()).collect::<Vec<_>>(),
            [Key::Str("a".into()), Key::Str("c".into())]
        );
        op.on_watermark(Time::ms(500), &mut out);
        op.on_row(RIGHT, broadcast(499, 10.0), &mut out);
        op.on_row(LEFT, row("a", 500, Value::Int(20)), &mut out);
        assert_eq!(out.late.len(), 1, "a limit behind the watermark is late and not applied");
        assert_eq!(out.results.len(), 2);
        assert_eq!(op.output_watermark(), Time::ms(500));
    }

    fn reconcile(timeout: i64) -> Connect {
        Connect::new(spec(FunctionSpec::Reconcile(ReconcileSpec { timeout })))
    }

    #[test]
    fn reconcile_pairs_the_smallest_ts_within_the_timeout() {
        let mut op = reconcile(100);
        let mut out = Output::default();
        op.on_row(RIGHT, row("a", 1000, Value::Int(1)), &mut out);
        op.on_row(RIGHT, row("a", 950, Value::Int(2)), &mut out);
        op.on_row(RIGHT, row("a", 899, Value::Int(3)), &mut out);
        op.on_row(LEFT, row("a", 1000, Value::Int(10)), &mut out);
        assert_eq!(results(&out), [(ResultKind::Match, 1000, Value::Int(10), Value::Int(2))], "899 is 101 ms away");
        op.on_row(LEFT, row("a", 1100, Value::Int(11)), &mut out);
        assert_eq!(results(&out)[1], (ResultKind::Match, 1100, Value::Int(11), Value::Int(1)), "exactly timeout");
        assert_eq!(op.state_rows(), 1);
        assert_eq!(op.output_watermark(), Time::NEG_INF);
        op.on_watermark(Time::ms(900), &mut out);
        assert_eq!(op.output_watermark(), Time::ms(899), "held at the waiting row's ts");
    }

    #[test]
    fn reconcile_emits_lone_rows_strictly_after_their_last_chance_in_order() {
        let mut op = reconcile(100);
        let mut out = Output::default();
        op.on_row(LEFT, row("b", 1000, Value::Int(1)), &mut out);
        op.on_row(RIGHT, row("a", 1000, Value::Int(2)), &mut out);
        op.on_row(LEFT, row("a", 990, Value::Int(3)), &mut out);
        op.on_row(RIGHT, row("c", 950, Value::Int(4)), &mut out);
        assert_eq!(out.results.len(), 1);
        op.on_watermark(Time::ms(1100), &mut out);
        assert_eq!(results(&out)[1..], [(ResultKind::RightOnly, 950, Value::Null, Value::Int(4))]);
        assert_eq!(op.output_watermark(), Time::ms(1000));
        op.on_watermark(Time::ms(1101), &mut out);
        assert_eq!(results(&out)[2..], [(ResultKind::LeftOnly, 1000, Value::Int(1), Value::Null)]);
        op.on_row(RIGHT, row("b", 1100, Value::Int(5)), &mut out);
        assert_eq!(out.late.len(), 1);
        assert_eq!((op.state_rows(), op.state_bytes()), (0, 0));
        assert!(op.is_quiescent());
        assert_eq!(op.output_watermark(), Time::ms(1101));
    }

    /// Every stored row the built-ins report, by input.
    fn evictable(op: &Connect) -> Vec<(usize, i64, u64)> {
        let mut rows = Vec::new();
        op.visit_evictable(&mut |input, ts, _, _, handle| rows.push((input, ts, handle)));
        rows.sort();
        rows
    }

    #[test]
    fn a_reconcile_row_leaving_early_takes_its_timer_and_is_never_emitted_alone() {
        let mut op = reconcile(100);
        let mut out = Output::default();
        op.on_row(LEFT, row("a", 1000, Value::Int(1)), &mut out);
        op.on_row(RIGHT, row("b", 1010, Value::Int(2)), &mut out);
        let [a, b] = [out.stored[0], out.stored[1]];
        assert_eq!((a.input, b.input), (LEFT as u32, RIGHT as u32), "each waiting row is reported stored");
        assert_eq!(evictable(&op), [(LEFT, 1000, a.handle), (RIGHT, 1010, b.handle)]);
        op.expire(Due::Row(a), &mut out);
        assert_eq!(
            out.expired,
            [Expired { reason: ExpiryReason::Ttl, input: Some(LEFT), row: row("a", 1000, Value::Int(1)) }]
        );
        op.expire(Due::Row(a), &mut out);
        assert_eq!(out.expired.len(), 1, "gone once");
        assert_eq!(op.evict(RIGHT, b.key_hash, b.handle), Some(row("b", 1010, Value::Int(2))));
        assert!(op.is_quiescent(), "both timers left with their rows");
        op.on_watermark(Time::ms(1000), &mut out);
        assert_eq!(op.output_watermark(), Time::ms(1000), "no hold left at the rows' ts");
        op.on_row(RIGHT, row("a", 1050, Value::Int(3)), &mut out);
        op.on_watermark(Time::POS_INF, &mut out);
        assert_eq!(results(&out), [(ResultKind::RightOnly, 1050, Value::Null, Value::Int(3))], "a's left row is gone");
    }

    #[test]
    fn a_threshold_limit_leaving_early_leaves_its_key_without_a_limit_unless_replaced() {
        let mut op = threshold(false);
        let mut out = Output::default();
        op.on_row(RIGHT, row("a", 100, Value::Float(30.0)), &mut out);
        op.on_row(RIGHT, row("b", 100, Value::Float(30.0)), &mut out);
        let [a, b] = [out.stored[0], out.stored[1]];
        op.on_row(RIGHT, row("b", 200, Value::Float(40.0)), &mut out);
        op.expire(Due::Row(a), &mut out);
        op.expire(Due::Row(b), &mut out);
        assert_eq!(
            out.expired,
            [Expired { reason: ExpiryReason::Ttl, input: Some(RIGHT), row: row("a", 100, Value::Float(30.0)) }],
            "b's first limit was replaced before its ttl: nothing of b expires"
        );
        op.on_row(LEFT, row("a", 300, Value::Float(50.0)), &mut out);
        op.on_row(LEFT, row("b", 300, Value::Float(35.0)), &mut out);
        assert!(out.results.is_empty(), "a has no limit; b's is 40");
        assert_eq!(evictable(&op).len(), 1);
        assert!(op.evict(LEFT, b.key_hash, out.stored[2].handle).is_none(), "limits are right rows");
        assert!(op.evict(RIGHT, b.key_hash, out.stored[2].handle).is_some());
        assert_eq!(op.state_rows(), 0);
        let mut broadcast_limit = threshold(true);
        broadcast_limit.on_row(RIGHT, broadcast(100, 1.0), &mut out);
        assert!(evictable(&broadcast_limit).is_empty(), "every shard holds a broadcast limit: not evicted");
    }

    /// Counts each key's left rows and reports the count 1 s of processing time after the key's
    /// first row (the count lives in keyed state; the report holds the output watermark at the
    /// first row's ts). Right rows reset the key's count and cancel its report.
    struct Counter;

    const COUNT: usize = 0;

    impl Counter {
        fn report(now: i128) -> Timer {
            Timer::processing(now + 1000, 7)
        }
    }

    impl CoProcess for Counter {
        fn on_left(&mut self, row: Row, ctx: &mut Context<'_>) {
            // The count row: [count, processing time the count started at].
            let (count, started) = match ctx.state.take_first(COUNT, &row.key, row.key_hash) {
                Some(old) => (old.values[0].clone(), old.values[1].clone()),
                None => {
                    let now = ctx.processing_time();
                    let report = Counter::report(now).holding(Time::ms(row.ts));
                    ctx.timers.set(&row.key, row.key_hash, report);
                    (Value::Int(0), Value::Int(now as i64))
                }
            };
            let Value::Int(n) = count else { return };
            ctx.state.insert(COUNT, Row { values: Box::new([Value::Int(n + 1), started]), ..row });
        }

        fn on_right(&mut self, row: Row, ctx: &mut Context<'_>) {
            if let Some(count) = ctx.state.take_first(COUNT, &row.key, row.key_hash) {
                let Value::Int(started) = count.values[1] else { return };
                assert!(ctx.timers.delete(&row.key, row.key_hash, Counter::report(i128::from(started))));
                ctx.out.late(RIGHT, row);
            }
        }

        fn on_timer(&mut self, fired: Fired, ctx: &mut Context<'_>) {
            assert_eq!(fired.timer.tag, 7);
            let Some(count) = ctx.state.take_first(COUNT, &fired.key, fired.key_hash) else { return };
            let Context { out, .. } = ctx;
            out.emit(ResultKind::Match, count.ts, &fired.key, fired.key_hash, Some(&count), None);
        }
    }

    #[test]
    fn a_custom_coprocess_counts_with_processing_time_timers() {
        let mut op =
            Connect::new(ConnectSpec::custom("counter", Projection::key_and_first_values(), || Box::new(Counter)));
        let mut out = Output::default();
        let at = |key: &str, ts: i64| row(key, ts, Value::Int(0));
        op.on_processing_time(10_000, &mut out);
        op.on_row(LEFT, at("a", 500), &mut out);
        op.on_processing_time(10_300, &mut out);
        op.on_row(LEFT, at("a", 400), &mut out);
        op.on_row(LEFT, at("b", 700), &mut out);
        op.on_row(LEFT, at("a", 900), &mut out);
        assert_eq!(op.next_processing_timer(), Some(11_000));
        assert_eq!(op.output_watermark(), Time::NEG_INF);
        op.on_watermark(Time::ms(450), &mut out);
        assert_eq!(op.output_watermark(), Time::ms(450));
        op.on_row(LEFT, at("a", 449), &mut out);
        assert_eq!(out.late.len(), 1, "the operator, not the function, routes late rows");
        assert!(op.is_quiescent(), "processing timers do not wait for the watermark");
        op.on_processing_time(10_999, &mut out);
        assert!(out.results.is_empty());
        op.on_processing_time(11_000, &mut out);
        // a's count (3) is reported with the ts of its last row; its hold (500) is released.
        assert_eq!(results(&out), [(ResultKind::Match, 900, Value::Int(3), Value::Null)]);
        assert_eq!(op.output_watermark(), Time::ms(450), "b's report still holds at 700 > watermark");
        // b's count is reset by a right row, which deletes its report.
        op.on_row(RIGHT, at("b", 800), &mut out);
        assert_eq!(op.next_processing_timer(), None);
        assert_eq!(op.state_rows(), 0);
        // At the end of input every pending processing timer fires once; ones set meanwhile drop.
        op.on_row(LEFT, at("c", 900), &mut out);
        op.on_processing_time(END_OF_INPUT, &mut out);
        assert_eq!(results(&out)[1..], [(ResultKind::Match, 900, Value::Int(1), Value::Null)]);
        assert_eq!(op.next_processing_timer(), None);
    }
}
