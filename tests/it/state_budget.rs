//! The state budget (issue 12 item 2; src/state/budget.rs): `runtime.state_budget` per shard with
//! `on_state_full`, through `braid::shard::Runtime` in process, arenas on the scratch file system
//! as `braid run` has them.
//!
//! The flood: command rows of ever new device ids into a left interval join whose other input
//! never sends, so nothing but the budget bounds the state:
//!
//! - `evict_oldest`, the status stream never idle (`idle_timeout = "0ms"`): the watermark stands
//!   still; the shard's state bytes plateau under the budget, the arena directory holds a bounded
//!   number of segment files, every evicted row goes to `OPERATOR.expired` with `_reason`
//!   `budget`, oldest first (every evicted row is older by (ts, id) than every row left), and
//!   evicted + left at the end = every row (nothing lost silently). Without a budget the same flood
//!   grows past it (the test's control).
//! - The same flood into a left window join (tumbling 1 s, one window per new device) under
//!   `evict_oldest`: its windows are evicted whole, oldest `_ts` first, each one's would-be
//!   `left_only` to `OPERATOR.expired` (`_reason` `budget`, no input); state plateaus under the
//!   budget and evicted + emitted at the end = every row.
//! - `backpressure`, streams idle after 1 s: the driver stops feeding while a shard says full and
//!   only moves processing time (as the service's intake does, 5 s a step here); the state
//!   plateaus, idleness frees it (rows stay 10 minutes: the join's upper bound), and at the end
//!   every row has left the join counted (`left_only` or late): nothing dropped.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use braid::operator::ExpiryReason;
use braid::plan::Plan;
use braid::record::input::InputRows;
use braid::record::{Row, Value};
use braid::shard::{Emit, Runtime, RuntimeOptions};
use braid::state::arena::ArenaConfig;

const BUDGET: u64 = 6 << 20;

/// The arenas' segment size: what a store maps at a time.
fn segment_bytes() -> u64 {
    ArenaConfig::default().segment_bytes as u64
}
const ROWS: usize = 40_000;

fn config(budget: Option<&str>, status_idle: &str) -> Plan {
    let join = "kind = \"interval_join\"\nlower = \"-1s\"\nupper = \"10m\"";
    plan(budget, status_idle, join)
}

/// The flood's plan with operator `effect` of `kind` (its kind and kind-specific keys).
fn plan(budget: Option<&str>, status_idle: &str, kind: &str) -> Plan {
    let runtime =
        budget.map_or(String::new(), |b| format!("[runtime]\nstate_budget = \"6MiB\"\non_state_full = \"{b}\"\n"));
    let text = format!(
        r#"{runtime}
[streams.command]
key = "device"
time = {{ field = "ts" }}
idle_timeout = "1s"
fields = {{ device = "string", ts = "int", pad = "string" }}

[streams.status]
key = "device"
time = {{ field = "ts" }}
idle_timeout = "{status_idle}"
fields = {{ device = "string", ts = "int" }}

[operators.effect]
{kind}
left = "command"
right = "status"
join = "left"
select = ["left.pad"]
"#
    );
    braid::config::parse("budget.toml", &text).unwrap_or_else(|e| panic!("{e}"))
}

/// Command row `n`: device `dev-n`, ts = arrival = `at`, 100 bytes of padding.
fn command(plan: &Plan, n: usize, at: i64, ids: &mut InputRows) -> Row {
    let def = &plan.streams[plan.stream("command").unwrap()];
    let values = def
        .schema
        .fields
        .iter()
        .map(|f| match f.name.as_str() {
            "device" => Value::Str(format!("dev-{n}").into()),
            "ts" => Value::Int(at),
            _ => Value::Str("p".repeat(100).into()),
        })
        .collect();
    braid::source::row_of(def, values, at, ids)
}

#[derive(Default)]
struct Out {
    left_only: Vec<(i64, u64)>,
    late: usize,
    expired: Vec<(i64, u64)>,
    /// The inputs expired rows came on (None: a would-be result).
    expired_inputs: std::collections::BTreeSet<Option<usize>>,
}

impl Emit for Out {
    fn result(&mut self, _operator: usize, row: &Row, _after_barrier: bool) {
        self.left_only.push((row.ts, row.id));
    }

    fn late(&mut self, _operator: usize, _input: usize, _row: &Row, _after_barrier: bool) {
        self.late += 1;
    }

    fn expired(
        &mut self,
        _operator: usize,
        reason: ExpiryReason,
        input: Option<usize>,
        row: &Row,
        _after_barrier: bool,
    ) {
        assert_eq!(reason, ExpiryReason::Budget, "evicted for the budget");
        self.expired_inputs.insert(input);
        self.expired.push((row.ts, row.id));
    }
}

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("braid-budget-").tempdir_in(braid::storage::mapped_file::scratch_base()).unwrap()
}

fn segment_files(dir: &Path) -> usize {
    walk(dir).iter().filter(|p| p.extension().is_some_and(|e| e == "arena")).count()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// What a flood left: the largest state bytes and segment files seen, the output, the rows fed.
struct Flood {
    max_bytes: u64,
    max_segments: usize,
    pauses: usize,
    out: Out,
}

/// Feeds `ROWS` command rows 1 ms apart; with `hold`, waits (moving processing time only) while
/// a shard says it is full, as the service's intake does.
fn flood(plan: &Plan, hold: bool) -> Flood {
    let dir = scratch();
    let options = RuntimeOptions::new(1, dir.path());
    let start = 1_000_000;
    let mut runtime = Runtime::start(plan, &options, i128::from(start)).unwrap();
    let (mut out, mut ids) = (Out::default(), InputRows::default());
    let (mut max_bytes, mut max_segments, mut pauses) = (0, 0, 0);
    let mut now = start;
    let stream = plan.stream("command").unwrap();
    for n in 0..ROWS {
        if n % 500 == 0 {
            runtime.flush(&mut out).unwrap();
            // Let the shard take what was published and count its state.
            for _ in 0..200 {
                if runtime.live_figures().shard_ring_used_bytes[0] == 0 {
                    break;
                }
                runtime.wait(&mut out, std::time::Duration::from_millis(5), || false).unwrap();
            }
            max_bytes = max_bytes.max(runtime.shard_state()[0].0);
            max_segments = max_segments.max(segment_files(dir.path()));
            if hold && runtime.state_full() {
                pauses += 1;
                let mut waited = 0;
                while runtime.state_full() {
                    now += 5_000;
                    runtime.advance_to(i128::from(now), &mut out).unwrap();
                    runtime.flush(&mut out).unwrap();
                    runtime.wait(&mut out, std::time::Duration::from_millis(5), || false).unwrap();
                    waited += 1;
                    assert!(waited < 2_000, "the state never freed while the intake waited");
                }
            }
        }
        now += 1;
        runtime.advance_to(i128::from(now), &mut out).unwrap();
        runtime.ingest(stream, &command(plan, n, now, &mut ids), i128::from(now), &mut out).unwrap();
    }
    runtime.finish(&mut out).unwrap();
    Flood { max_bytes, max_segments, pauses, out }
}

#[test]
fn without_a_budget_the_flood_grows_past_it() {
    let flood = flood(&config(None, "0ms"), false);
    assert!(flood.max_bytes == 0, "no budget, no accounting");
    assert!(flood.max_segments > (BUDGET / segment_bytes()) as usize + 2, "{} segment files", flood.max_segments);
    assert_eq!(flood.out.left_only.len(), ROWS);
}

#[test]
fn evict_oldest_keeps_state_under_the_budget_and_evicts_oldest_first() {
    let flood = flood(&config(Some("evict_oldest"), "0ms"), false);
    // Eviction runs at ticks (200 ms): at most a new segment (mapped at once) and a tick's rows
    // (200 × ~330 B) past the budget.
    let bound = BUDGET + segment_bytes() + (256 << 10);
    assert!(flood.max_bytes <= bound, "state bytes {} over the budget {BUDGET}", flood.max_bytes);
    assert!(flood.max_bytes > BUDGET / 2, "the flood must reach the budget: {}", flood.max_bytes);
    assert!(flood.max_segments <= (BUDGET / segment_bytes()) as usize + 2, "{} segment files", flood.max_segments);
    let Out { left_only, expired, late, expired_inputs } = flood.out;
    assert_eq!(late, 0);
    assert_eq!(expired_inputs, [Some(0)].into(), "command rows evicted as themselves");
    assert!(!expired.is_empty(), "nothing evicted");
    assert_eq!(left_only.len() + expired.len(), ROWS, "every row evicted or left at the end");
    let newest_evicted = expired.iter().max().unwrap();
    let oldest_left = left_only.iter().min().unwrap();
    assert!(newest_evicted < oldest_left, "evicted {newest_evicted:?} is not older than kept {oldest_left:?}");
}

#[test]
fn evict_oldest_takes_window_join_windows_oldest_first_as_their_would_be_results() {
    let window = "kind = \"window_join\"\nwindow = { kind = \"tumbling\", size = \"1s\" }";
    let flood = flood(&plan(Some("evict_oldest"), "0ms", window), false);
    // At most a tick's rows (200 windows of ~600 B) past the budget; no segments here.
    assert!(flood.max_bytes <= BUDGET + (256 << 10), "state bytes {} over the budget {BUDGET}", flood.max_bytes);
    assert!(flood.max_bytes > BUDGET / 2, "the flood must reach the budget: {}", flood.max_bytes);
    let Out { left_only, expired, late, expired_inputs } = flood.out;
    assert_eq!(late, 0);
    assert_eq!(expired_inputs, [None].into(), "windows leave as would-be results");
    assert!(!expired.is_empty(), "nothing evicted");
    assert_eq!(left_only.len() + expired.len(), ROWS, "every window evicted or fired at the end, once");
    // Windows are taken by `_ts` (end − 1), then creation: none evicted is later than one kept.
    let newest_evicted = expired.iter().map(|e| e.0).max().unwrap();
    let oldest_left = left_only.iter().map(|l| l.0).min().unwrap();
    assert!(newest_evicted <= oldest_left, "evicted _ts {newest_evicted} is later than kept {oldest_left}");
}

#[test]
fn backpressure_holds_the_flood_at_the_budget_and_loses_nothing() {
    let flood = flood(&config(Some("backpressure"), "1s"), true);
    assert!(flood.pauses > 0, "the budget never held the intake (max {} bytes)", flood.max_bytes);
    // Checked every 500 rows: at most that many rows (~170 KiB) plus a segment past the budget.
    assert!(flood.max_bytes <= BUDGET + (2 << 20), "state bytes {} over the budget {BUDGET}", flood.max_bytes);
    let Out { left_only, expired, late, .. } = flood.out;
    assert!(expired.is_empty(), "backpressure evicts nothing: {} expired", expired.len());
    assert_eq!(left_only.len() + late, ROWS, "every row left the join counted");
}

/// `braid run` through mosquitto with `backpressure`: 6 000 command messages of ~1.6 KB, each a
/// new device, published at once into a join that keeps rows 5 s (its upper bound) under a 4 MiB
/// budget (2 800 such rows), once `status` (which gets no rows) is idle. The shard fills, the
/// intake waits (`/healthz` 503 naming the state budget, `braid_state_budget_full` 1) while the
/// brokers keep the rest; `command` turns idle after 1 s, the idle watermark evicts, the intake
/// takes input again. At the end every message
/// was taken and every row left the join counted (`left_only` or late): nothing lost.
#[test]
fn braid_run_holds_its_intake_at_the_budget_says_why_and_takes_every_message() {
    use crate::common::mqtt::{Mosquitto, free_port, publish_all};
    use crate::common::service::{Braid, http_get, metric, now_ms, poll_until, read_complete_jsonl};
    use std::time::Duration;

    const MESSAGES: usize = 6_000;
    let dir = tempfile::Builder::new().prefix("braid-budget-run-").tempdir().unwrap();
    let devices = Mosquitto::start();
    let ops = free_port();
    let d = dir.path().display();
    let config = format!(
        r#"[runtime]
shards = 1
state_dir = "{d}/state"
scratch_dir = "{d}/scratch"
state_budget = "4MiB"

[ops]
listen = "127.0.0.1:{ops}"

[sources.devices]
kind = "mqtt"
url = "{url}"

[streams.command]
key = "device"
time = {{ field = "ts" }}
idle_timeout = "1s"
fields = {{ device = "string", ts = "int", pad = "string" }}
source = "devices"
topic = "flood/command"

[streams.status]
key = "device"
time = {{ field = "ts" }}
idle_timeout = "1s"
fields = {{ device = "string", ts = "int" }}
source = "devices"
topic = "flood/status"

[operators.effect]
kind = "interval_join"
left = "command"
right = "status"
lower = "-1s"
upper = "5s"
join = "left"
select = ["left.pad"]

[sinks.archive]
kind = "file"
path = "{d}/out.jsonl"
inputs = ["effect", "effect.late"]
"#,
        url = devices.url()
    );
    std::fs::create_dir_all(dir.path().join("scratch")).unwrap();
    let path = dir.path().join("budget.toml");
    std::fs::write(&path, config).unwrap();
    let mut braid = Braid::start(&path, &dir.path().join("braid.log"));
    assert!(poll_until(Duration::from_secs(20), || http_get(ops, "/metrics").is_some()), "braid did not start");
    assert!(
        poll_until(Duration::from_secs(20), || http_get(ops, "/healthz").is_some_and(|(code, _)| code == 200)),
        "not healthy: {}",
        braid.log()
    );
    // CONTRACT.md rule 5: an operator whose inputs all turn idle before it ever had a watermark
    // stays at −∞ (its idle advance starts from there), and so would the intake. The flood must
    // find `status` idle already: the join's watermark is then `command`'s, and moves on with
    // processing time once `command` turns idle too. (With both turning idle at one tick, which
    // depends on when the flood starts, the intake waits for good: the test was flaky.)
    let status_idle = || {
        let text = http_get(ops, "/metrics").map(|(_, text)| text).unwrap_or_default();
        metric(&text, "braid_stream_idle", "stream=\"status\"") == Some(1.0)
    };
    assert!(poll_until(Duration::from_secs(20), status_idle), "status never turned idle: {}", braid.log());
    let base = now_ms();
    let pad = "p".repeat(1500);
    let msgs: Vec<(String, Vec<u8>)> = (0..MESSAGES)
        .map(|n| {
            let payload = format!(r#"{{"device":"dev-{n}","ts":{},"pad":"{pad}"}}"#, base + n as i64 / 10);
            ("flood/command".to_owned(), payload.into_bytes())
        })
        .collect();
    let port = devices.port();
    let publisher = std::thread::spawn(move || publish_all(port, &msgs, rumqttc::QoS::AtLeastOnce));
    let metrics = || http_get(ops, "/metrics").map(|(_, text)| text).unwrap_or_default();
    let mut said_why = String::new();
    let held = poll_until(Duration::from_secs(60), || {
        let full = metric(&metrics(), "braid_state_budget_full", "shard=\"0\"") == Some(1.0);
        if let Some((503, body)) = http_get(ops, "/healthz")
            && body.contains("state budget full on shard 0")
        {
            said_why = body;
        }
        full && !said_why.is_empty()
    });
    assert!(held, "the budget never held the intake: {}\n{said_why}", metrics());
    assert!(said_why.contains("until idle inputs move the watermark and free state"), "{said_why}");
    let taken = || metric(&metrics(), "braid_ingest_taken_total", "").unwrap_or(0.0) as usize;
    assert!(taken() < MESSAGES, "everything was taken while full");
    assert!(poll_until(Duration::from_secs(120), || taken() == MESSAGES), "taken {} of {MESSAGES}", taken());
    let out = dir.path().join("out.jsonl");
    let counted = || read_complete_jsonl(&out).len();
    // Every row leaves the join within its 5 s once both inputs are idle.
    assert!(poll_until(Duration::from_secs(60), || counted() == MESSAGES), "{} of {MESSAGES} rows out", counted());
    let peak = metric(&metrics(), "braid_shard_state_bytes", "shard=\"0\"").unwrap_or(f64::MAX);
    assert!(peak <= (8 << 20) as f64, "state {peak} bytes");
    publisher.join().unwrap();
    braid.terminate(Duration::from_secs(20));
}
