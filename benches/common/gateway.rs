//! The gateway workload of CONTRACT.md: `command` (left) ⋈ `status` (right) on `device`
//! (BENCHMARKS.md "Workload: the gateway join").
//!
//! Per device: a status every 4 s (±0.5 s jitter, seq counting up) from a random phase, and a
//! command on average every 5 s (uniform 1–9 s gaps) from a random start in [0, 9 s); one device
//! in ten is "dark" (commands, no status). The draws of one device's statuses and of its commands
//! are [`statuses`] and [`commands`]; [`gateway`] makes them device after device, the statuses of
//! a device before its commands. A bench that orders them otherwise calls the two itself.

use braid::config::StreamDef;
use braid::record::id::{IdHasher, key_hash};
use braid::record::input::InputRows;
use braid::record::{Key, Row, Value};

use super::EPOCH_MS;
use super::rng::Rng;

pub const STATUS_PERIOD_MS: i64 = 4_000;
pub const STATUS_JITTER_MS: i64 = 500;
/// Command gaps are uniform in [MIN, MAX): mean 5 s.
pub const COMMAND_GAP_MS: (i64, i64) = (1_000, 9_000);
pub const COMMANDS: [&str; 4] = ["reboot", "set_mode", "ping", "update_fw"];
pub const STATES: [&str; 3] = ["ok", "busy", "rebooting"];

/// Device `d`'s name (and key): `dev-000042`.
pub fn device(d: usize) -> String {
    format!("dev-{d:06}")
}

/// Whether device `d` is dark: it sends commands and no status.
pub fn dark(d: usize) -> bool {
    d % 10 == 9
}

/// One device's rows of a periodic stream: a row every `period` ms (± `jitter`, none if 0) from
/// a random phase in [0, `period`), until `end`; `row(rng, ts, seq)` draws the rest of each.
pub fn periodic(rng: &mut Rng, end: i64, (period, jitter): (i64, i64), mut row: impl FnMut(&mut Rng, i64, i64)) {
    let phase = rng.range(0, period);
    for seq in 0.. {
        let jitter = if jitter > 0 { rng.range(-jitter, jitter) } else { 0 };
        let ts = (EPOCH_MS + phase + seq * period + jitter).max(EPOCH_MS);
        if ts >= end {
            break;
        }
        row(rng, ts, seq);
    }
}

/// A `status` row: device, ts, temp, state, seq.
pub struct Status {
    pub ts: i64,
    pub temp: f64,
    pub state: &'static str,
    pub seq: i64,
}

impl Status {
    /// The status at `ts`: draws its temp, then its state.
    pub fn draw(rng: &mut Rng, ts: i64, seq: i64) -> Status {
        let temp = 20.0 + rng.range(0, 1500) as f64 / 100.0;
        Status { ts, temp, state: rng.pick(&STATES), seq }
    }

    /// The values in the stream's field order.
    pub fn values(self, device: &str) -> Vec<Value> {
        vec![
            Value::Str(device.into()),
            Value::Int(self.ts),
            Value::Float(self.temp),
            Value::Str(self.state.into()),
            Value::Int(self.seq),
        ]
    }

    /// The JSON line.
    pub fn json(&self, device: &str) -> String {
        let Status { ts, temp, state, seq } = self;
        format!(r#"{{"device":"{device}","ts":{ts},"temp":{temp:?},"state":"{state}","seq":{seq}}}"#)
    }
}

/// A `command` row: device, ts, cmd, arg, cmd_id.
pub struct Command {
    pub ts: i64,
    pub cmd: &'static str,
    pub arg: String,
    pub cmd_id: String,
}

impl Command {
    /// The command at `ts`: draws its cmd, its arg, then its cmd_id.
    pub fn draw(rng: &mut Rng, ts: i64) -> Command {
        let cmd = rng.pick(&COMMANDS);
        let arg = format!("v={}", rng.range(0, 100));
        Command { ts, cmd, arg, cmd_id: format!("c-{:016x}", rng.next()) }
    }

    /// The values in the stream's field order.
    pub fn values(self, device: &str) -> Vec<Value> {
        vec![
            Value::Str(device.into()),
            Value::Int(self.ts),
            Value::Str(self.cmd.into()),
            Value::Str(self.arg.into()),
            Value::Str(self.cmd_id.into()),
        ]
    }

    /// The JSON line.
    pub fn json(&self, device: &str) -> String {
        let Command { ts, cmd, arg, cmd_id } = self;
        format!(r#"{{"device":"{device}","ts":{ts},"cmd":"{cmd}","arg":"{arg}","cmd_id":"{cmd_id}"}}"#)
    }
}

/// One device's statuses until `end`, in event-time order.
pub fn statuses(rng: &mut Rng, end: i64, mut status: impl FnMut(Status)) {
    periodic(rng, end, (STATUS_PERIOD_MS, STATUS_JITTER_MS), |rng, ts, seq| status(Status::draw(rng, ts, seq)));
}

/// One device's commands until `end`, in event-time order.
pub fn commands(rng: &mut Rng, end: i64, mut command: impl FnMut(Command)) {
    let mut ts = EPOCH_MS + rng.range(0, COMMAND_GAP_MS.1);
    while ts < end {
        command(Command::draw(rng, ts));
        ts += rng.range(COMMAND_GAP_MS.0, COMMAND_GAP_MS.1);
    }
}

/// A row of the gateway workload.
pub enum Event {
    Status(Status),
    Command(Command),
}

/// The gateway rows of `devices` devices until `end`, device after device (each device's
/// statuses, if it is not dark, then its commands): `row(device, event)`.
pub fn gateway(rng: &mut Rng, devices: usize, end: i64, mut row: impl FnMut(&str, Event)) {
    for d in 0..devices {
        let device = device(d);
        if !dark(d) {
            statuses(rng, end, |s| row(&device, Event::Status(s)));
        }
        commands(rng, end, |c| row(&device, Event::Command(c)));
    }
}

/// A row as replay builds one (`src/replay/mod.rs` `feed`): its key hashed, its id over the
/// stream name and the values in `id_order`.
pub fn row(ids: &mut IdHasher, stream: &str, id_order: &[usize], key: Key, ts: i64, values: Vec<Value>) -> Row {
    ids.begin().str(stream);
    for &pos in id_order {
        ids.value(&values[pos]);
    }
    Row { ts, key_hash: key_hash(&key), key, id: ids.finish(), values: values.into() }
}

/// A row of a stream of a plan, exactly as replay builds it (`braid::source::row_of`: the key
/// from the key field, broadcast without one; the id over the values in field-name order).
pub fn stream_row(rows: &mut InputRows, def: &StreamDef, ts: i64, values: Vec<Value>) -> Row {
    braid::source::row_of(def, values, ts, rows)
}

// Config texts. Every bench stream is keyed by `device`, ms event times in `ts`,
// max_out_of_orderness 500 ms, idle_timeout 5 s.

/// A `[streams.NAME]` section (after a blank line) with these `fields` (the inside of the table).
pub fn stream_section(name: &str, fields: &str) -> String {
    format!(
        "\n[streams.{name}]\nkey = \"device\"\ntime = {{ field = \"ts\", unit = \"ms\" }}\nmax_out_of_orderness = \
         \"500ms\"\nidle_timeout = \"5s\"\nfields = {{ {fields} }}\n"
    )
}

pub const STATUS_FIELDS: &str = r#"device = "string", ts = "int", temp = "float", state = "string", seq = "int""#;
pub const COMMAND_FIELDS: &str = r#"device = "string", ts = "int", cmd = "string", arg = "string", cmd_id = "string""#;

/// The gateway join of CONTRACT.md.
pub const INTERVAL_JOIN: &str = r#"
[operators.effect]
kind = "interval_join"
left = "command"
right = "status"
lower = "-3s"
upper = "5s"
join = "inner"
select = ["left.cmd_id", "left.device", "right.seq", "right.ts AS status_ts"]
"#;

/// The gateway config: streams `status` and `command`, and [`INTERVAL_JOIN`].
pub fn config() -> String {
    [stream_section("status", STATUS_FIELDS), stream_section("command", COMMAND_FIELDS), INTERVAL_JOIN.into()].concat()
}
