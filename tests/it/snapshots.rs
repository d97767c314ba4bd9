//! Snapshots of every operator kind (issue "Checkpoints"): an instance restored from a snapshot
//! behaves exactly as the snapshotted one would.
//!
//! Each case is a configuration of one operator; each seed a generated workload for it — rows of
//! every input (with disorder, ties, late rows, broadcast rows), processing time and watermark
//! ticks (with idle inputs, so `idle_advance` moves watermarks too) — driven through an
//! [`OperatorHost`] as a shard does, rows alternately as owned rows and as ring frames read in
//! place. The uninterrupted run, ended as replay ends one (timers, then the watermark to +∞), is
//! the reference. Then the workload is cut at many points: the prefix runs, the host is
//! snapshotted, a freshly built host (memory stores, or arena stores in an empty directory) takes
//! up the snapshot and runs the rest. What the two emit one after the other — results, late
//! rows, `_id`s, order — and the counters at the end (rows in, late, results, join quality) must
//! equal the reference's. A restored host snapshotted again (at once, or after more events) and
//! restored once more must do the same; a damaged snapshot (truncated, a byte flipped) is an
//! error; a snapshot of another operator or shape is refused.

#![allow(clippy::unwrap_used)] // test helpers: a panic is a failed test

use braid::operator::connect::{CoProcess, Context, Domain, Fired, Timer};
use braid::operator::host::OperatorHost;
use braid::operator::{OperatorKind, OperatorSpec, Output, ResultKind};
use braid::plan::{NodeRef, Plan};
use braid::record::frame::{RowEncoder, access};
use braid::record::id::key_hash;
use braid::record::{FieldType, Key, Row, Schema, Value};
use braid::state::snapshot::SnapshotError;
use braid::time::Time;
use braid::time::clock::InputTime;

use crate::common::BASE_TS;
use crate::common::rng::Rng;

const STREAMS: &str = r#"
[streams.a]
key = "device"
fields = { device = "string", v = "int", x = "float", s = "string" }

[streams.b]
key = "device"
fields = { device = "string", v = "int", x = "float", s = "string" }

[streams.lim]
key = "*"
fields = { site = "string", v = "int", max = "float" }

[streams.c]
key = ["site", "unit"]
fields = { site = "string", unit = "int", v = "int", x = "float", s = "string" }

[streams.e]
key = ["site", "unit"]
fields = { site = "string", unit = "int", v = "int", x = "float", s = "string" }
"#;

/// Watermark of an input at a tick: its greatest ts so far minus this, minus 1.
const OUT_OF_ORDERNESS: i64 = 300;

/// One configuration under test: the operator `[operators.op]`.
struct Case {
    name: &'static str,
    operator: String,
    /// A custom connect function replaces the configured one.
    custom: bool,
}

fn case(name: &'static str, body: &str) -> Case {
    Case { name, operator: format!("[operators.op]\n{body}\n"), custom: false }
}

fn cases() -> Vec<Case> {
    let pair = r#"select = ["left.v", "right.v AS rv", "left.s"]"#;
    let mut cases = vec![
        case(
            "union",
            r#"kind = "union"
inputs = ["a", "b"]"#,
        ),
        case(
            "reconcile",
            &format!(
                "kind = \"connect\"\nfunction = \"reconcile\"\nleft = \"a\"\nright = \"b\"\ntimeout = \"300ms\"\n{pair}"
            ),
        ),
        Case {
            custom: true,
            ..case(
                "custom_connect",
                &format!(
                    "kind = \"connect\"\nfunction = \"reconcile\"\nleft = \"a\"\nright = \"b\"\ntimeout = \"300ms\"\n{pair}"
                ),
            )
        },
        case(
            "absence",
            r#"kind = "absence"
input = "a"
timeout = "600ms""#,
        ),
    ];
    for (name, right, limit, select) in [
        ("threshold", "b", "x", r#"["left.v", "right.v AS rv"]"#),
        ("threshold_broadcast", "lim", "max", r#"["left.v", "right.site"]"#),
    ] {
        let body = format!(
            "kind = \"connect\"\nfunction = \"threshold\"\nleft = \"a\"\nright = \"{right}\"\nvalue = \"x\"\nlimit = \"{limit}\"\nselect = {select}"
        );
        cases.push(case(name, &body));
    }
    for (name, window, extra) in [
        ("window_join_tumbling", r#"{ kind = "tumbling", size = "1s" }"#, ""),
        (
            "window_join_sliding",
            r#"{ kind = "sliding", size = "1s", slide = "400ms" }"#,
            "where = \"left.v <= right.v\"\n",
        ),
        ("window_join_session", r#"{ kind = "session", gap = "250ms" }"#, "allowed_lateness = \"400ms\"\n"),
        (
            "window_join_tumbling_late",
            r#"{ kind = "tumbling", size = "500ms", offset = "100ms" }"#,
            "allowed_lateness = \"700ms\"\n",
        ),
    ] {
        let body = format!("kind = \"window_join\"\nleft = \"a\"\nright = \"b\"\nwindow = {window}\n{extra}{pair}");
        cases.push(case(name, &body));
    }
    let aggregates = r#"aggregate = ["count(left) AS nl", "count(right.v) AS nr", "sum(left.v) AS sv", "sum(right.x) AS sx", "min(left.s) AS mn", "max(right.x) AS mx", "first(left.v) AS f", "last(right.s) AS l", "min(right.v) AS mv", "max(left.s) AS ms", "first(right.x) AS fx", "last(left.x) AS lx"]"#;
    for (name, window, join, extra) in [
        ("cogroup_tumbling_inner", r#"{ kind = "tumbling", size = "1s" }"#, "inner", ""),
        (
            "cogroup_sliding_left",
            r#"{ kind = "sliding", size = "1s", slide = "300ms" }"#,
            "left",
            "allowed_lateness = \"200ms\"\n",
        ),
        ("cogroup_session_full", r#"{ kind = "session", gap = "300ms" }"#, "full", "allowed_lateness = \"500ms\"\n"),
        ("cogroup_session_right", r#"{ kind = "session", gap = "150ms" }"#, "right", ""),
    ] {
        let body = format!(
            "kind = \"cogroup\"\nleft = \"a\"\nright = \"b\"\nwindow = {window}\njoin = \"{join}\"\n{extra}{aggregates}"
        );
        cases.push(case(name, &body));
    }
    let one_input = r#"aggregate = ["count(*) AS n", "count(v) AS nv", "sum(v) AS sv", "sum(x) AS sx", "avg(x) AS ax", "min(s) AS mn", "max(x) AS mx", "first(v) AS f", "last(s) AS l"]"#;
    for (name, window, extra) in [
        (
            "window_aggregate_sliding_where",
            r#"{ kind = "sliding", size = "1s", slide = "300ms" }"#,
            "where = \"v > 2 or s == 'ok'\"\n",
        ),
        ("window_aggregate_session", r#"{ kind = "session", gap = "300ms" }"#, "allowed_lateness = \"500ms\"\n"),
    ] {
        let body = format!("kind = \"window_aggregate\"\ninput = \"a\"\nwindow = {window}\n{extra}{one_input}");
        cases.push(case(name, &body));
    }
    for (name, lower, upper, join) in [
        ("interval_inner", "-300ms", "500ms", "inner"),
        ("interval_left", "0ms", "400ms", "left"),
        ("interval_right_negative", "-900ms", "-200ms", "right"),
        ("interval_full", "-500ms", "100ms", "full"),
        ("interval_full_positive", "200ms", "700ms", "full"),
    ] {
        let body = format!(
            "kind = \"interval_join\"\nleft = \"a\"\nright = \"b\"\nlower = \"{lower}\"\nupper = \"{upper}\"\njoin = \"{join}\"\n{pair}"
        );
        cases.push(case(name, &body));
    }
    for (name, right, join, select) in [
        ("temporal_inner", "b", "inner", pair),
        ("temporal_left", "b", "left", pair),
        ("temporal_broadcast_left", "lim", "left", r#"select = ["left.v", "right.site", "right.max"]"#),
    ] {
        let body = format!("kind = \"temporal_join\"\nleft = \"a\"\nright = \"{right}\"\njoin = \"{join}\"\n{select}");
        cases.push(case(name, &body));
    }
    // Composite keys (site, unit): stored, windowed and per-key state keyed by several fields.
    for (name, body) in [
        (
            "composite_interval_full",
            format!(
                "kind = \"interval_join\"\nleft = \"c\"\nright = \"e\"\nlower = \"-500ms\"\nupper = \"100ms\"\njoin = \"full\"\n{pair}"
            ),
        ),
        (
            "composite_temporal_left",
            format!("kind = \"temporal_join\"\nleft = \"c\"\nright = \"e\"\njoin = \"left\"\n{pair}"),
        ),
        (
            "composite_cogroup_session",
            format!(
                "kind = \"cogroup\"\nleft = \"c\"\nright = \"e\"\nwindow = {{ kind = \"session\", gap = \"300ms\" }}\njoin = \"full\"\n{aggregates}"
            ),
        ),
        ("composite_absence", "kind = \"absence\"\ninput = \"c\"\ntimeout = \"600ms\"".to_owned()),
    ] {
        cases.push(case(name, &body));
    }
    cases
}

/// A custom connect function using everything a [`CoProcess`] has: keyed state in two slots,
/// event timers named by row handles (with holds), processing-time timers, deletes.
struct Custom;

impl Custom {
    /// A waiting left row's expiry (tags 1.. name rows; the report's is 0).
    fn expiry(ts: i64, handle: u64) -> Timer {
        Timer::event(Time::ms(ts + 250), handle + 1).holding(Time::ms(ts))
    }
}

impl CoProcess for Custom {
    fn on_left(&mut self, row: Row, ctx: &mut Context<'_>) {
        let mut first = true;
        ctx.state.scan(0, &row.key, row.key_hash, |_, _| {
            first = false;
            false
        });
        let (key, key_hash, ts) = (row.key.clone(), row.key_hash, row.ts);
        let handle = ctx.state.insert(0, row);
        ctx.timers.set(&key, key_hash, Custom::expiry(ts, handle));
        if first {
            let report = Timer::processing(ctx.processing_time() + 700, 0).holding(Time::ms(ts));
            ctx.timers.set(&key, key_hash, report);
        }
    }

    fn on_right(&mut self, row: Row, ctx: &mut Context<'_>) {
        let mut oldest = None;
        ctx.state.scan(0, &row.key, row.key_hash, |handle, left| {
            oldest = Some((handle, left.ts));
            false
        });
        let Some((handle, ts)) = oldest else {
            ctx.state.insert(1, row);
            return;
        };
        ctx.timers.delete(&row.key, row.key_hash, Custom::expiry(ts, handle));
        if let Some(left) = ctx.state.remove(0, row.key_hash, handle) {
            ctx.out.emit(ResultKind::Match, row.ts.max(left.ts), &row.key, row.key_hash, Some(&left), Some(&row));
        }
    }

    fn on_timer(&mut self, fired: Fired, ctx: &mut Context<'_>) {
        let Fired { timer, key, key_hash } = fired;
        if timer.domain == Domain::Processing {
            // The report: the key's oldest waiting left row with its oldest unpaired right row.
            let right = ctx.state.take_first(1, &key, key_hash);
            if let Some(left) = ctx.state.take_first(0, &key, key_hash) {
                ctx.out.emit(ResultKind::Match, left.ts, &key, key_hash, Some(&left), right.as_ref());
            }
        } else if let Some(left) = ctx.state.remove(0, key_hash, timer.tag - 1) {
            ctx.out.emit(ResultKind::LeftOnly, left.ts, &key, key_hash, Some(&left), None);
        }
    }
}

/// One input event of the workload.
#[derive(Clone, Debug)]
enum Event {
    /// `frame`: delivered as a ring frame read in place.
    Row {
        input: usize,
        row: Row,
        broadcast: bool,
        frame: bool,
    },
    Processing(i128),
    Tick(i128, Vec<InputTime>),
}

/// What a host emitted, in order.
#[derive(Clone, Debug, PartialEq)]
enum Emitted {
    Result(ResultKind, Row),
    Late(usize, Row),
}

/// A case's plan and operator spec, with what it takes to build and feed hosts.
struct Subject {
    name: &'static str,
    spec: OperatorSpec,
    schemas: Vec<Schema>,
}

impl Subject {
    fn new(case: &Case) -> Subject {
        let text = format!("{STREAMS}\n{}", case.operator);
        let plan: Plan = braid::config::parse(case.name, &text).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let op = &plan.operators[0];
        let mut spec = op.spec.clone();
        if case.custom {
            let OperatorSpec::Connect(connect) = spec else { panic!("{}: not a connect", case.name) };
            spec = OperatorSpec::Connect(connect.with_function(|| Box::new(Custom)));
        }
        let schemas = op.inputs.iter().map(|&node: &NodeRef| plan.node_schema(node).clone()).collect();
        Subject { name: case.name, spec, schemas }
    }

    /// A freshly built host: memory stores, or arena stores under `dir` (empty).
    fn host(&self, dir: Option<&std::path::Path>) -> OperatorHost {
        let operator = match dir {
            None => self.spec.build(),
            Some(dir) => self.spec.build_in(dir).expect("arena stores open"),
        };
        OperatorHost::new(operator, self.schemas.len(), None, 0)
    }

    /// Shard instances of this kind keep rows in arenas ([`OperatorSpec::build_in`]).
    fn uses_arenas(&self) -> bool {
        matches!(self.spec, OperatorSpec::IntervalJoin(_) | OperatorSpec::TemporalJoin(_) | OperatorSpec::Connect(_))
    }

    /// A fresh host restored from `snapshot`.
    fn restored(&self, snapshot: &[u8], dir: Option<&std::path::Path>) -> OperatorHost {
        let mut host = self.host(dir);
        host.restore(snapshot).unwrap_or_else(|e| panic!("{}: restore: {e}", self.name));
        host
    }

    /// A seeded workload: `rows` rows with ticks and processing time between them.
    fn workload(&self, seed: u64, rows: usize) -> Vec<Event> {
        let mut rng = Rng::new(seed);
        let inputs = self.schemas.len();
        let broadcast: Vec<bool> = self.schemas.iter().map(|s| s.key.is_empty()).collect();
        let mut max_ts: Vec<Option<i64>> = vec![None; inputs];
        let mut events = Vec::new();
        let (mut now, mut clock) = (i128::from(BASE_TS), BASE_TS);
        for n in 0..rows {
            // Broadcast inputs are rarer, as limits and reference data are.
            let mut input = rng.below(inputs as u64) as usize;
            if broadcast[input] && rng.percent(60) {
                input = 0;
            }
            clock += rng.range(0, 60);
            let ts = match rng.below(20) {
                0 => clock - rng.range(OUT_OF_ORDERNESS, 3 * OUT_OF_ORDERNESS), // mostly late
                1 => clock + rng.range(0, 400),
                2..=4 => clock - clock.rem_euclid(100), // on a grid: ties, bounds, window edges
                _ => clock - rng.range(0, OUT_OF_ORDERNESS),
            };
            let row = self.row(&mut rng, input, ts, seed << 16 | n as u64);
            max_ts[input] = max_ts[input].max(Some(ts));
            events.push(Event::Row { input, row, broadcast: broadcast[input], frame: rng.percent(50) });
            if rng.percent(30) {
                now += 200 * i128::from(rng.range(1, 2));
                events.push(Event::Processing(now));
                let times = max_ts
                    .iter()
                    .map(|max| InputTime {
                        watermark: max.map_or(Time::NEG_INF, |m| Time::ms(m - OUT_OF_ORDERNESS - 1)),
                        idle: rng.percent(15),
                    })
                    .collect();
                events.push(Event::Tick(now, times));
            }
        }
        events
    }

    fn row(&self, rng: &mut Rng, input: usize, ts: i64, id: u64) -> Row {
        let schema = &self.schemas[input];
        let number = rng.below(5);
        let device = format!("d{number}");
        // A composite key's other part: drawn only for such a schema (one-field cases keep their
        // workloads).
        let site = if schema.key.len() > 1 { format!("s{}", rng.below(2)) } else { String::new() };
        let words = ["ok", "busy", "idle", "reboot"];
        let values: Box<[Value]> = schema
            .fields
            .iter()
            .enumerate()
            .map(|(pos, field)| match field.ty {
                _ if schema.key.contains(&pos) && field.ty == FieldType::Int => Value::Int(number as i64),
                _ if schema.key.contains(&pos) && field.name == "site" => Value::Str(site.as_str().into()),
                _ if schema.key.contains(&pos) => Value::Str(device.as_str().into()),
                FieldType::Int => Value::Int(rng.range(-3, 12)),
                FieldType::Float => Value::Float(rng.range(-40, 40) as f64 / 4.0),
                FieldType::String => Value::Str(rng.pick(&words).into()),
                FieldType::Bool => Value::Bool(rng.percent(50)),
                _ => Value::Null,
            })
            .collect();
        let key = schema.key_of(&values).unwrap_or(Key::Broadcast);
        Row { ts, key_hash: key_hash(&key), key, id, values }
    }
}

/// Feeds `events` to `host`, appending what it emits to `out`.
fn run(host: &mut OperatorHost, events: &[Event], out: &mut Vec<Emitted>) {
    let mut encoder = RowEncoder::new();
    for event in events {
        let mut output = Output::default();
        match event {
            Event::Row { input, row, broadcast, frame: false } => {
                host.on_row(*input, row.clone(), *broadcast, &mut output)
            }
            Event::Row { input, row, broadcast, frame: true } => {
                let bytes = encoder.encode(row).expect("a row encodes");
                let archived = access(bytes).expect("a fresh frame is valid");
                host.on_frame(*input, archived, bytes, *broadcast, &mut output);
            }
            Event::Processing(now) => host.on_processing_time(*now, &mut output),
            Event::Tick(t, inputs) => host.on_tick(*t, inputs, true, &mut output),
        }
        drain(&mut output, out);
    }
}

/// The end of input, as replay ends a run: every timer, then the watermark to +∞.
fn finish(host: &mut OperatorHost, out: &mut Vec<Emitted>) {
    let mut output = Output::default();
    host.finish_timers(&mut output);
    drain(&mut output, out);
    host.finish_watermark(&mut output);
    drain(&mut output, out);
}

fn drain(output: &mut Output, out: &mut Vec<Emitted>) {
    out.extend(output.take_results().into_iter().map(|(kind, row)| Emitted::Result(kind, row)));
    out.extend(output.late.drain(..).map(|(input, row)| Emitted::Late(input, row)));
}

/// The uninterrupted run: what it emitted and its counters at the end.
struct Reference {
    out: Vec<Emitted>,
    counters: String,
}

/// Runs `events[from..]` on `host` and the end of input; checks that `prefix` followed by what
/// it emitted is the reference, and the counters.
fn check_rest(
    subject: &Subject,
    what: &str,
    mut host: OperatorHost,
    events: &[Event],
    prefix: &[Emitted],
    reference: &Reference,
) {
    let mut out = prefix.to_vec();
    run(&mut host, events, &mut out);
    finish(&mut host, &mut out);
    if out != reference.out {
        let at = out.iter().zip(&reference.out).position(|(a, b)| a != b).unwrap_or(out.len().min(reference.out.len()));
        panic!(
            "{} ({what}): output differs from the uninterrupted run's at item {at} of {} (expected {}):\n  got      {:?}\n  expected {:?}",
            subject.name,
            out.len(),
            reference.out.len(),
            out.get(at),
            reference.out.get(at)
        );
    }
    assert_eq!(format!("{:?}", host.counters()), reference.counters, "{} ({what}): counters", subject.name);
}

/// Every point at which a snapshot of `host` is taken while it runs `events`: (events done,
/// output so far, snapshot).
fn snapshots(
    subject: &Subject,
    mut host: OperatorHost,
    events: &[Event],
    at: &[usize],
) -> Vec<(usize, Vec<Emitted>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut done = 0;
    let mut taken = Vec::new();
    for &k in at {
        run(&mut host, &events[done..k], &mut out);
        done = k;
        let snapshot = host.snapshot().unwrap_or_else(|e| panic!("{}: snapshot: {e}", subject.name));
        taken.push((k, out.clone(), snapshot));
    }
    taken
}

/// Splits, restores and compares one case over `seeds`.
fn check_case(case: &Case, seeds: std::ops::Range<u64>, rows: usize) {
    let subject = Subject::new(case);
    let seeds_start = seeds.start;
    for seed in seeds {
        let events = subject.workload(seed, rows);
        let mut reference = Reference { out: Vec::new(), counters: String::new() };
        let mut host = subject.host(None);
        run(&mut host, &events, &mut reference.out);
        finish(&mut host, &mut reference.out);
        reference.counters = format!("{:?}", host.counters());
        let results = reference.out.iter().filter(|e| matches!(e, Emitted::Result(..))).count();
        assert!(results > 5, "{} seed {seed}: the workload yields only {results} results", subject.name);

        // Memory stores: a cut after every event (every third for the later seeds).
        let step = if seed == seeds_start { 1 } else { 3 };
        let every: Vec<usize> = (0..=events.len()).filter(|k| k % step == 0).collect();
        let taken = snapshots(&subject, subject.host(None), &events, &every);
        for (k, prefix, snapshot) in &taken {
            let host = subject.restored(snapshot, None);
            check_rest(&subject, &format!("seed {seed}, memory, cut at {k}"), host, &events[*k..], prefix, &reference);
        }

        // A few random cuts: restored twice (at once, and after more events); for the kinds whose
        // shard instances keep rows in arenas, arena stores snapshotted and restored, and
        // across the two kinds of store.
        let mut rng = Rng::new(seed ^ 0xA4E4A);
        let mut cuts: Vec<usize> = (0..3).map(|_| rng.below(events.len() as u64 + 1) as usize / step * step).collect();
        cuts.sort_unstable();
        let dir = tempfile::tempdir().unwrap();
        let arenas = subject.uses_arenas();
        let store = |name: String| arenas.then(|| dir.path().join(name));
        let from_arenas = snapshots(&subject, subject.host(store("source".into()).as_deref()), &events, &cuts);
        for (i, (k, prefix, snapshot)) in from_arenas.iter().enumerate() {
            let what = |how: &str| format!("seed {seed}, {how}, cut at {k}");
            if arenas {
                let memory_snapshot = &taken.iter().find(|t| t.0 == *k).expect("a memory snapshot at each cut").2;
                let host = subject.restored(snapshot, store(format!("a{i}")).as_deref());
                check_rest(&subject, &what("arena to arena"), host, &events[*k..], prefix, &reference);
                let host = subject.restored(snapshot, None);
                check_rest(&subject, &what("arena to memory"), host, &events[*k..], prefix, &reference);
                let host = subject.restored(memory_snapshot, store(format!("m{i}")).as_deref());
                check_rest(&subject, &what("memory to arena"), host, &events[*k..], prefix, &reference);
            }

            let again = subject.restored(snapshot, store(format!("b{i}")).as_deref()).snapshot().unwrap();
            let host = subject.restored(&again, store(format!("c{i}")).as_deref());
            check_rest(&subject, &what("restored twice"), host, &events[*k..], prefix, &reference);

            let later = (*k + rng.below((events.len() - k) as u64 + 1) as usize).min(events.len());
            let mut first = subject.restored(snapshot, store(format!("d{i}")).as_deref());
            let mut out = prefix.clone();
            run(&mut first, &events[*k..later], &mut out);
            let second = subject.restored(&first.snapshot().unwrap(), store(format!("e{i}")).as_deref());
            check_rest(&subject, &what(&format!("cut again at {later}")), second, &events[later..], &out, &reference);
        }

        // Damage: truncated or with a byte flipped, a snapshot is refused, and the host stays
        // as built.
        let (_, _, snapshot) = taken.iter().max_by_key(|(_, _, s)| s.len()).unwrap();
        for _ in 0..20 {
            let len = rng.below(snapshot.len() as u64) as usize;
            let mut host = subject.host(None);
            assert!(host.restore(&snapshot[..len]).is_err(), "{}: truncated to {len} bytes", subject.name);
            let mut damaged = snapshot.clone();
            let at = rng.below(snapshot.len() as u64) as usize;
            damaged[at] ^= 1 << rng.below(8);
            assert!(host.restore(&damaged).is_err(), "{}: byte {at} flipped", subject.name);
            assert_eq!(host.state(), (0, 0), "{}: a refused snapshot leaves nothing behind", subject.name);
        }
    }
}

/// Workloads per case: enough rows for every window kind to merge, re-fire and expire, few
/// enough that a cut after every event stays fast.
const ROWS: usize = 120;

macro_rules! split_tests {
    ($($test:ident: $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                let case = cases().into_iter().find(|c| c.name == $name).expect("a case of that name");
                check_case(&case, 1..3, ROWS);
            }
        )*
        /// Every case has its test, and every operator kind a case.
        #[test]
        fn every_case_is_tested() {
            let tested = [$($name),*];
            for case in cases() {
                assert!(tested.contains(&case.name), "case {} has no test", case.name);
            }
            let kinds: Vec<OperatorKind> = cases().iter().map(|c| Subject::new(c).spec.kind()).collect();
            for kind in OperatorKind::ALL {
                assert!(kinds.contains(&kind), "no case of kind {}", kind.name());
            }
        }
    };
}

split_tests! {
    union_resumes_exactly: "union",
    threshold_resumes_exactly: "threshold",
    threshold_broadcast_resumes_exactly: "threshold_broadcast",
    reconcile_resumes_exactly: "reconcile",
    custom_connect_resumes_exactly: "custom_connect",
    absence_resumes_exactly: "absence",
    window_join_tumbling_resumes_exactly: "window_join_tumbling",
    window_join_sliding_resumes_exactly: "window_join_sliding",
    window_join_session_resumes_exactly: "window_join_session",
    window_join_tumbling_late_resumes_exactly: "window_join_tumbling_late",
    cogroup_tumbling_inner_resumes_exactly: "cogroup_tumbling_inner",
    cogroup_sliding_left_resumes_exactly: "cogroup_sliding_left",
    cogroup_session_full_resumes_exactly: "cogroup_session_full",
    cogroup_session_right_resumes_exactly: "cogroup_session_right",
    window_aggregate_sliding_where_resumes_exactly: "window_aggregate_sliding_where",
    window_aggregate_session_resumes_exactly: "window_aggregate_session",
    interval_inner_resumes_exactly: "interval_inner",
    interval_left_resumes_exactly: "interval_left",
    interval_right_negative_resumes_exactly: "interval_right_negative",
    interval_full_resumes_exactly: "interval_full",
    interval_full_positive_resumes_exactly: "interval_full_positive",
    temporal_inner_resumes_exactly: "temporal_inner",
    temporal_left_resumes_exactly: "temporal_left",
    temporal_broadcast_left_resumes_exactly: "temporal_broadcast_left",
    composite_interval_full_resumes_exactly: "composite_interval_full",
    composite_temporal_left_resumes_exactly: "composite_temporal_left",
    composite_cogroup_session_resumes_exactly: "composite_cogroup_session",
    composite_absence_resumes_exactly: "composite_absence",
}

/// A host of `subject` that ran a short workload (without its end: state is left).
fn used_host(subject: &Subject, dir: Option<&std::path::Path>) -> OperatorHost {
    let mut host = subject.host(dir);
    run(&mut host, &subject.workload(7, 60), &mut Vec::new());
    host
}

fn is_mismatch(result: Result<(), SnapshotError>) -> bool {
    matches!(result, Err(SnapshotError::Mismatch { .. }))
}

/// A snapshot restored into an operator of another kind, of another shape (inputs, window kind,
/// aggregates, connect function) or into an instance that holds state already is refused as a
/// mismatch, never misread.
#[test]
fn a_snapshot_that_does_not_fit_is_refused() {
    let subjects: Vec<Subject> = cases().iter().map(Subject::new).collect();
    let snapshots: Vec<Vec<u8>> = subjects.iter().map(|s| used_host(s, None).snapshot().unwrap()).collect();
    for (subject, snapshot) in subjects.iter().zip(&snapshots) {
        for other in subjects.iter().filter(|o| o.spec.kind() != subject.spec.kind()) {
            let refused = is_mismatch(other.host(None).restore(snapshot));
            assert!(refused, "{} took a snapshot of {}", other.name, subject.name);
        }
        let mut wider = OperatorHost::new(subject.spec.build(), subject.schemas.len() + 1, None, 0);
        assert!(is_mismatch(wider.restore(snapshot)), "{}: another number of inputs", subject.name);
    }
    let by_name = |name: &str| subjects.iter().position(|s| s.name == name).expect("a case of that name");
    for (from, into) in [
        ("window_join_tumbling", "window_join_session"),
        ("cogroup_session_full", "cogroup_sliding_left"),
        ("window_aggregate_session", "window_aggregate_sliding_where"),
        ("reconcile", "threshold"),
        ("threshold", "custom_connect"),
    ] {
        let refused = is_mismatch(subjects[by_name(into)].host(None).restore(&snapshots[by_name(from)]));
        assert!(refused, "{into} took a snapshot of {from}");
    }
    let fewer = Case {
        operator: cases()[by_name("cogroup_tumbling_inner")]
            .operator
            .replace("aggregate = [", "aggregate = [\"count(right)\", "),
        ..case("cogroup_more_aggregates", "")
    };
    let refused = is_mismatch(Subject::new(&fewer).host(None).restore(&snapshots[by_name("cogroup_tumbling_inner")]));
    assert!(refused, "a cogroup took a snapshot with other aggregates");

    // Into an instance that is not fresh: its stores hold rows already.
    let dir = tempfile::tempdir().unwrap();
    for name in ["interval_full", "temporal_left", "reconcile", "window_join_session"] {
        let subject = &subjects[by_name(name)];
        let mut used = used_host(subject, Some(dir.path().join(name).as_path()));
        assert!(used.state().0 > 0, "{name}: the workload leaves state");
        assert!(is_mismatch(used.restore(&snapshots[by_name(name)])), "{name}: restored into a used instance");
    }
}

/// The figure for BENCHMARKS.md: snapshot bytes per stored row of the gateway interval join
/// (configs/gateway.toml), against the arena bytes those rows take. 2 000 devices send one
/// command and one status each; the watermark never moves, so every row stays.
#[test]
#[allow(clippy::disallowed_methods)] // timing the snapshot itself, not engine time
fn snapshot_bytes_per_stored_row_of_the_gateway_join() {
    let plan = braid::config::parse("gateway.toml", include_str!("../../configs/gateway.toml")).unwrap();
    let op = &plan.operators[0];
    let dir = tempfile::tempdir().unwrap();
    let mut host = OperatorHost::new(op.spec.build_in(dir.path()).unwrap(), 2, None, 0);
    let mut encoder = RowEncoder::new();
    let mut output = Output::default();
    let devices = 2_000;
    for d in 0..devices {
        let device: Box<str> = format!("dev-{d:06}").into();
        let ts = BASE_TS + 1_000 * d;
        let key = Key::Str(device.clone());
        let command = Row {
            ts,
            key_hash: key_hash(&key),
            key: key.clone(),
            id: 2 * d as u64,
            values: Box::new([
                Value::Str(device.clone()),
                Value::Int(ts),
                Value::Str("set_mode".into()),
                Value::Str(format!("v={}", d % 100).into()),
                Value::Str(format!("c-{:016x}", d * 7919).into()),
            ]),
        };
        let status = Row {
            ts: ts + 700,
            key_hash: key_hash(&key),
            key,
            id: 2 * d as u64 + 1,
            values: Box::new([
                Value::Str(device),
                Value::Int(ts + 700),
                Value::Float(21.5),
                Value::Str("busy".into()),
                Value::Int(d),
            ]),
        };
        for (input, row) in [(0, command), (1, status)] {
            let bytes = encoder.encode(&row).unwrap();
            host.on_frame(input, access(bytes).unwrap(), bytes, false, &mut output);
        }
        output.take_results();
    }
    let (rows, arena_bytes) = host.state();
    assert_eq!(rows, 2 * devices as usize);
    let started = std::time::Instant::now();
    let snapshot = host.snapshot().unwrap();
    let snapshot_time = started.elapsed();
    let (per_row, arena_per_row) = (snapshot.len() as f64 / rows as f64, arena_bytes as f64 / rows as f64);
    eprintln!(
        "gateway interval join: {rows} stored rows, snapshot {} bytes = {per_row:.0} bytes per row (rows, handles, \
         flags, timers); the arena holds {arena_per_row:.0} bytes per row",
        snapshot.len()
    );
    assert!(per_row < 1.5 * arena_per_row, "{per_row:.0} bytes per row in a snapshot, {arena_per_row:.0} in the arena");
    let mut restored = OperatorHost::new(op.spec.build_in(&dir.path().join("restored")).unwrap(), 2, None, 0);
    let started = std::time::Instant::now();
    restored.restore(&snapshot).unwrap();
    let restore_time = started.elapsed();
    assert_eq!(restored.state(), (rows, arena_bytes));
    eprintln!(
        "  snapshot took {snapshot_time:?}, restore into fresh arenas {restore_time:?} (a debug build unless --release)"
    );
}
