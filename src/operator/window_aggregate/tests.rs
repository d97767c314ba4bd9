use super::*;
use crate::operator::cogroup::CoGroup;
use crate::operator::{Output, ResultKind};
use crate::record::{FieldType, Key, Row, Value, id};
use crate::time::Time;

const STREAM: &str = "[streams.t]\nkey = \"device\"\ntime = { field = \"ts\", unit = \"ms\" }\n\
                      fields = { device = \"string\", ts = \"int\", temp = \"float\", state = \"string\" }\n";

fn plan(operator: &str) -> crate::plan::Plan {
    let text = format!("{STREAM}[operators.a]\nkind = \"window_aggregate\"\ninput = \"t\"\n{operator}");
    crate::config::parse("a.toml", &text).unwrap_or_else(|e| panic!("{e:?}"))
}

fn aggregate(window: &str) -> CoGroup {
    let plan = plan(&format!(
        "window = {window}\nwhere = \"temp > -40\"\n\
         aggregate = [\"count(*)\", \"avg(temp)\", \"min(state) AS low\", \"first(state)\", \"last(temp)\"]\n"
    ));
    let OperatorSpec::WindowAggregate(spec) = &plan.operators[0].spec else { panic!("not a window aggregate") };
    CoGroup::new(spec.clone())
}

#[test]
fn results_hold_the_key_aggregates_and_window_fields_without_kind() {
    let plan = plan(
        "window = { kind = \"session\", gap = \"1s\" }\naggregate = [\"count(*)\", \"sum(temp) AS total\", \"max(state)\"]\n",
    );
    let fields: Vec<(&str, FieldType, bool)> =
        plan.operators[0].output.fields.iter().map(|f| (f.name.as_str(), f.ty, f.nullable)).collect();
    let want = [
        ("device", FieldType::String, false),
        ("count", FieldType::Int, false),
        ("total", FieldType::Float, false),
        ("max_state", FieldType::String, false),
        ("_window_start", FieldType::Int, false),
        ("_window_end", FieldType::Int, false),
        ("_version", FieldType::Int, false),
        ("_supersedes", FieldType::IdList, false),
    ];
    assert_eq!(fields, want);
}

fn row(device: &str, ts: i64, temp: f64, state: &str) -> Row {
    let key = Key::Str(device.into());
    let values = [Value::Str(device.into()), Value::Int(ts), Value::Float(temp), Value::Str(state.into())];
    Row { ts, key_hash: id::key_hash(&key), key, id: ts as u64 ^ temp.to_bits(), values: Box::new(values) }
}

/// Every result of one run, sorted (results of different keys come in no fixed order).
fn run(a: &mut CoGroup, rows: &[Row]) -> Vec<(u64, Vec<Value>)> {
    let mut out = Output::default();
    for r in rows {
        a.on_row(0, r.clone(), &mut out);
    }
    a.on_watermark(Time::POS_INF, &mut out);
    assert!(out.late.is_empty(), "nothing is late before the watermark moves");
    assert!(out.results.iter().all(|(kind, _)| *kind == ResultKind::Row));
    let mut results: Vec<(u64, Vec<Value>)> = out.results.into_iter().map(|(_, r)| (r.id, r.values.to_vec())).collect();
    results.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    results
}

/// When nothing is late, the results (ids included) do not depend on the order rows arrive in
/// (distinct times: first/last break ties by arrival), for every window kind.
#[test]
fn results_do_not_depend_on_arrival_order_when_nothing_is_late() {
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let states = ["ok", "warm", "hot"];
    let rows: Vec<Row> = (0..60)
        .map(|i| {
            let device = ["a", "b", "c"][next(3) as usize];
            let temp = if next(10) == 0 { -273.0 } else { next(80) as f64 / 4.0 - 5.0 };
            row(device, i * 37 + next(30) as i64, temp, states[next(3) as usize])
        })
        .collect();
    for window in [
        "{ kind = \"tumbling\", size = \"500ms\" }",
        "{ kind = \"sliding\", size = \"700ms\", slide = \"200ms\", offset = \"50ms\" }",
        "{ kind = \"session\", gap = \"60ms\" }",
    ] {
        let want = run(&mut aggregate(window), &rows);
        assert!(want.len() > 3, "{window}: several results");
        for round in 0..20 {
            let mut shuffled = rows.clone();
            for i in (1..shuffled.len()).rev() {
                shuffled.swap(i, next(i as u64 + 1) as usize);
            }
            assert_eq!(run(&mut aggregate(window), &shuffled), want, "{window}, shuffle {round}");
        }
    }
}

#[test]
fn where_drops_a_row_before_the_windows_and_counts_it() {
    let mut a = aggregate("{ kind = \"tumbling\", size = \"1s\" }");
    let mut out = Output::default();
    a.on_watermark(Time::ms(5_000), &mut out);
    a.on_row(0, row("a", 100, -273.0, "fault"), &mut out);
    assert_eq!((out.filtered, out.late.len()), (1, 0), "dropped by where, so not late");
    a.on_row(0, row("a", 100, 20.0, "ok"), &mut out);
    assert_eq!((out.filtered, out.late.len()), (1, 1), "on the windows' side: late");
}
