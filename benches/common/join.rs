//! The gateway interval join alone: the operator as `[operators.effect]` of CONTRACT.md plans it,
//! the rows of `benches/interval_join.rs`, and a driver that gives the operator a watermark
//! `tick − 501 ms` (max_out_of_orderness 500 ms) at every 200 ms event-time tick, as the engine's
//! ticks would, and hands its output to a counting [`Sink`] after every call.

use braid::operator::interval_join::{JoinType, LEFT, RIGHT};
use braid::operator::projection::Column;
use braid::operator::{IntervalJoin, IntervalJoinSpec, Output, Projection, ResultKind};
use braid::record::id::IdHasher;
use braid::record::{Key, Row};
use braid::time::{TICK_MS, Time};

use super::EPOCH_MS;
use super::gateway::{Event, gateway, row};
use super::rng::Rng;

pub const LOWER_MS: i64 = -3_000;
pub const UPPER_MS: i64 = 5_000;
pub const MAX_OUT_OF_ORDERNESS_MS: i64 = 500;
/// The seed of [`rows`] (mixed with the number of devices).
pub const SEED: u64 = 0x5eed_b4a1_d000_0001;

/// `(input, row)` in event-time order over `devices` devices and `seconds` of event time: the
/// gateway rows, keyed by device, each id over the stream name and the values in field order.
pub fn rows(devices: usize, seconds: i64) -> Vec<(usize, Row)> {
    let mut rng = Rng(SEED ^ devices as u64);
    let mut ids = IdHasher::default();
    let mut rows = Vec::new();
    gateway(&mut rng, devices, EPOCH_MS + seconds * 1000, |device, event| {
        let key = Key::Str(device.into());
        rows.push(match event {
            Event::Status(s) => (RIGHT, row(&mut ids, "status", &[0, 1, 2, 3, 4], key, s.ts, s.values(device))),
            Event::Command(c) => (LEFT, row(&mut ids, "command", &[0, 1, 2, 3, 4], key, c.ts, c.values(device))),
        });
    });
    rows.sort_by_key(|(input, row)| (row.ts, *input));
    rows
}

/// The gateway join as `[operators.effect]` of CONTRACT.md plans it.
pub fn gateway_join(join: JoinType) -> IntervalJoin {
    // Result: device (key), cmd_id (command pos 4), seq (status pos 4), status_ts (status pos 1), _kind.
    let columns = vec![
        Column::Key(0),
        Column::Field { input: LEFT, pos: 4 },
        Column::Field { input: RIGHT, pos: 4 },
        Column::Field { input: RIGHT, pos: 1 },
        Column::Kind,
    ];
    let projection = Projection { columns, rekey: None };
    IntervalJoin::new(IntervalJoinSpec {
        name: "effect".into(),
        lower: LOWER_MS,
        upper: UPPER_MS,
        join,
        condition: None,
        projection,
    })
}

/// Where the driver hands the operator's output.
pub trait Sink {
    /// Counts what the operator emitted and clears it.
    fn take(&mut self, out: &mut Output);

    /// Sees the operator after each tick's watermark.
    fn ticked(&mut self, _op: &IntervalJoin) {}
}

/// Results by kind, and late rows.
#[derive(Default, Debug)]
pub struct Counts {
    pub matches: u64,
    pub left_only: u64,
    pub right_only: u64,
    /// Kinds an interval join never emits.
    pub other: u64,
    pub late: u64,
}

impl Sink for Counts {
    fn take(&mut self, out: &mut Output) {
        for kind in out.results.iter().map(|(kind, _)| kind).chain(out.archived.kinds()) {
            match kind {
                ResultKind::Match => self.matches += 1,
                ResultKind::LeftOnly => self.left_only += 1,
                ResultKind::RightOnly => self.right_only += 1,
                _ => self.other += 1,
            }
        }
        self.late += out.late.len() as u64;
        clear(out);
    }
}

/// Results and late rows, all together.
#[derive(Default, Debug)]
pub struct Total(pub u64);

impl Sink for Total {
    fn take(&mut self, out: &mut Output) {
        self.0 += out.result_count() as u64 + out.late.len() as u64;
        clear(out);
    }
}

/// The largest state (rows, bytes as the operator counts them) seen at a tick; output dropped.
#[derive(Default, Debug)]
pub struct PeakState(pub (usize, usize));

impl Sink for PeakState {
    fn take(&mut self, out: &mut Output) {
        clear(out);
    }

    fn ticked(&mut self, op: &IntervalJoin) {
        self.0 = self.0.max((op.state_rows(), op.state_bytes()));
    }
}

/// Empties `out` as the shard's host does after each call (operator/host.rs): the stored rows
/// and touched keys go to the `ttl` clock, which these benches do not keep.
fn clear(out: &mut Output) {
    out.results.clear();
    out.archived.clear();
    out.late.clear();
    out.stored.clear();
    out.touched.clear();
}

/// A fresh gateway join fed row by row, with the watermarks of the 200 ms ticks in between.
pub struct Driver<S> {
    op: IntervalJoin,
    out: Output,
    next_tick: Option<i64>,
    sink: S,
}

impl<S: Sink> Driver<S> {
    pub fn new(join: JoinType, sink: S) -> Driver<S> {
        Driver { op: gateway_join(join), out: Output::default(), next_tick: None, sink }
    }

    /// Feeds `rows` in order, then the watermark +∞.
    pub fn run(join: JoinType, sink: S, rows: impl IntoIterator<Item = (usize, Row)>) -> S {
        let mut driver = Driver::new(join, sink);
        for (input, row) in rows {
            driver.before(row.ts);
            driver.on_row(input, row);
        }
        driver.finish()
    }

    /// Gives the watermarks of the ticks up to `ts`; call before a row's `on_row`.
    pub fn before(&mut self, ts: i64) {
        let tick = TICK_MS as i64;
        let mut next_tick = *self.next_tick.get_or_insert((ts / tick + 1) * tick);
        while ts >= next_tick {
            self.op.on_watermark(Time::ms(next_tick - MAX_OUT_OF_ORDERNESS_MS - 1), &mut self.out);
            next_tick += tick;
            self.sink.take(&mut self.out);
            self.sink.ticked(&self.op);
        }
        self.next_tick = Some(next_tick);
    }

    pub fn on_row(&mut self, input: usize, row: Row) {
        self.op.on_row(input, row, &mut self.out);
        self.sink.take(&mut self.out);
    }

    /// A row read in place from a ring frame (`bytes`: its archive).
    #[allow(dead_code)]
    pub fn on_frame(&mut self, input: usize, row: &braid::record::ArchivedRow, bytes: &[u8]) {
        self.op.on_frame(input, row, bytes, &mut self.out);
        self.sink.take(&mut self.out);
    }

    /// The same driver around another instance of the operator (e.g. with arena state).
    #[allow(dead_code)]
    pub fn with_op(mut self, op: IntervalJoin) -> Driver<S> {
        self.op = op;
        self
    }

    /// The watermark +∞; what the sink counted.
    pub fn finish(mut self) -> S {
        self.op.on_watermark(Time::POS_INF, &mut self.out);
        self.sink.take(&mut self.out);
        self.sink
    }
}
