use super::*;
use crate::operator::window::WindowKind;
use crate::record::Key;

#[test]
fn aggregate_items() {
    assert_eq!(parse_aggregate("count(left) AS views", false), Some(("count", LEFT, None, Some("views"))));
    assert_eq!(parse_aggregate("sum(right.amount)", false), Some(("sum", RIGHT, Some("amount"), None)));
    assert_eq!(parse_aggregate("avg(right.amount)", false), Some(("avg", RIGHT, Some("amount"), None)));
    assert_eq!(parse_aggregate("median(right.amount)", false), None);
    assert_eq!(parse_aggregate("count(up)", false), None);
}

#[test]
fn output_schema_and_aggregates() {
    let text = |window: &str| {
        format!(
            "[streams.a]\nkey = \"k\"\nfields = {{ k = \"int\", x = \"float\", s = \"string\" }}\n\
             [operators.g]\nkind = \"cogroup\"\nleft = \"a\"\nright = \"a\"\njoin = \"right\"\n\
             window = {window}\naggregate = [\"count(left)\", \"sum(left.x) AS total\", \"last(right.s)\"]\n"
        )
    };
    let plan = crate::config::parse("g.toml", &text("{ kind = \"session\", gap = \"1s\" }")).unwrap();
    let fields: Vec<(&str, FieldType, bool)> =
        plan.operators[0].output.fields.iter().map(|f| (f.name.as_str(), f.ty, f.nullable)).collect();
    let want = [
        ("k", FieldType::Int, false),
        ("count_left", FieldType::Int, false),
        ("total", FieldType::Float, true),
        ("last_right_s", FieldType::String, false),
        ("_kind", FieldType::String, false),
        ("_window_start", FieldType::Int, false),
        ("_window_end", FieldType::Int, false),
        ("_version", FieldType::Int, false),
        ("_supersedes", FieldType::IdList, false),
    ];
    assert_eq!(fields, want);
    let plan = crate::config::parse("g.toml", &text("{ kind = \"tumbling\", size = \"1s\" }")).unwrap();
    assert_eq!(plan.operators[0].output.fields.len(), want.len() - 1, "no _supersedes without sessions");
    let OperatorSpec::CoGroup(spec) = &plan.operators[0].spec else { panic!("not a cogroup") };
    assert_eq!(spec.join, JoinType::Right);
    assert_eq!(
        spec.aggregates[1],
        Aggregate { function: Function::Sum, input: LEFT, pos: Some(1), ty: FieldType::Float }
    );
}

#[test]
fn exact_float_sums_do_not_depend_on_order() {
    let values = [1e16, 1.0, -1e16, 0.1, 0.2, 3.0e-5, 1e100, -1e100];
    let mut forward = ExactSum::default();
    values.iter().for_each(|&v| forward.add(v));
    let mut backward = ExactSum::default();
    values.iter().rev().for_each(|&v| backward.add(v));
    let (mut a, mut b) = (ExactSum::default(), ExactSum::default());
    values[..3].iter().for_each(|&v| a.add(v));
    values[3..].iter().for_each(|&v| b.add(v));
    a.absorb(b);
    // 1 + 0.1 + 0.2 + 3e-5 correctly rounded (naive left-to-right gives 1.30003 + error).
    let exact = 1.30003;
    assert_eq!((forward.value(), backward.value(), a.value()), (exact, exact, exact));
    let mut big = ExactSum::default();
    big.add(f64::MAX);
    big.add(f64::MAX);
    assert_eq!(big.value(), f64::INFINITY);
}

fn cogroup(join: JoinType, kind: WindowKind, allowed_lateness: i64) -> CoGroup {
    let agg = |function, input, pos: Option<usize>, ty| Aggregate { function, input, pos, ty };
    let aggregates = vec![
        agg(Function::Count, LEFT, None, FieldType::Int),
        agg(Function::Sum, RIGHT, Some(0), FieldType::Int),
        agg(Function::Min, LEFT, Some(0), FieldType::Int),
        agg(Function::Max, LEFT, Some(0), FieldType::Int),
        agg(Function::First, LEFT, Some(0), FieldType::Int),
        agg(Function::Last, LEFT, Some(0), FieldType::Int),
        agg(Function::Count, RIGHT, Some(0), FieldType::Int),
    ];
    let window = WindowSpec { kind, allowed_lateness };
    CoGroup::new(CoGroupSpec { name: "g".into(), window, join, aggregates, rekey: None, one: None })
}

fn row(ts: i64, v: Value) -> Row {
    Row { ts, key: Key::Int(7), key_hash: 3, id: ts as u64, values: Box::new([v]) }
}

fn values(out: &mut Output) -> Vec<Vec<Value>> {
    out.results.drain(..).map(|(_, r)| r.values.to_vec()).collect()
}

#[test]
fn aggregates_and_join_types() {
    let tumbling = WindowKind::Fixed { size: 10, slide: 10, offset: 0 };
    for join in [JoinType::Inner, JoinType::Left, JoinType::Right, JoinType::Full] {
        let mut g = cogroup(join, tumbling, 0);
        let mut out = Output::default();
        g.on_row(LEFT, row(5, Value::Int(3)), &mut out);
        g.on_row(LEFT, row(1, Value::Int(9)), &mut out);
        g.on_row(LEFT, row(5, Value::Int(4)), &mut out);
        g.on_row(RIGHT, row(2, Value::Int(10)), &mut out);
        g.on_row(RIGHT, row(3, Value::Null), &mut out);
        g.on_row(RIGHT, row(15, Value::Int(1)), &mut out); // [10, 20): right only
        g.on_watermark(Time::POS_INF, &mut out);
        let kinds: Vec<ResultKind> = out.results.iter().map(|(k, _)| *k).collect();
        let got = values(&mut out);
        let i = Value::Int;
        let matched =
            vec![i(7), i(3), i(10), i(3), i(9), i(9), i(4), i(1), Value::Str("match".into()), i(0), i(10), i(1)];
        let right_only = vec![
            i(7),
            i(0),
            i(1),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            i(1),
            Value::Str("right_only".into()),
            i(10),
            i(20),
            i(1),
        ];
        let (want, want_kinds) = match join {
            JoinType::Inner | JoinType::Left => (vec![matched], vec![ResultKind::Match]),
            _ => (vec![matched, right_only], vec![ResultKind::Match, ResultKind::RightOnly]),
        };
        assert_eq!((got, kinds), (want, want_kinds), "{join:?}");
        assert_eq!((g.state_rows(), g.state_bytes()), (0, 0));
    }
}

#[test]
fn merged_sessions_supersede_only_what_was_emitted() {
    let mut g = cogroup(JoinType::Inner, WindowKind::Session { gap: 10 }, 100);
    let mut out = Output::default();
    g.on_row(LEFT, row(0, Value::Int(1)), &mut out);
    g.on_row(RIGHT, row(1, Value::Int(1)), &mut out); // [0, 11): match
    g.on_row(LEFT, row(30, Value::Int(1)), &mut out); // [30, 40): left only, inner: nothing
    g.on_watermark(Time::ms(50), &mut out);
    let first: Vec<u64> = out.results.iter().map(|(_, r)| r.id).collect();
    assert_eq!(first.len(), 1);
    out.results.clear();
    g.on_row(LEFT, row(20, Value::Int(1)), &mut out); // [20, 30) merges with [30, 40) only
    assert!(out.results.is_empty(), "inner, and still no right rows");
    g.on_row(RIGHT, row(11, Value::Int(1)), &mut out); // [11, 21) touches [0, 11) and [20, 40)
    let (_, merged) = &out.results[0];
    assert_eq!(merged.values[9..12], [Value::Int(0), Value::Int(40), Value::Int(1)]);
    assert_eq!(merged.values[12], Value::IdList(first.as_slice().into()), "the never-emitted parts supersede nothing");
    assert_ne!(merged.id, first[0]);
    assert_eq!(g.state_rows(), 1);
}

/// Golden-style: a row counts as its group's window is freed, matched when the other group is not
/// empty, whatever `join` emits; merged sessions carry their parts' rows.
#[test]
fn quality_counts_rows_by_whether_the_other_group_is_empty() {
    let mut g = cogroup(JoinType::Inner, WindowKind::Session { gap: 10 }, 0);
    let mut out = Output::default();
    g.on_row(LEFT, row(0, Value::Int(1)), &mut out);
    g.on_row(RIGHT, row(1, Value::Int(1)), &mut out); // [0, 11): both groups
    g.on_row(LEFT, row(30, Value::Int(1)), &mut out); // [30, 40)
    g.on_row(LEFT, row(20, Value::Int(1)), &mut out); // [20, 30) touches it: [20, 40), two left rows
    g.on_row(RIGHT, row(50, Value::Int(1)), &mut out);
    g.on_row(LEFT, row(55, Value::Int(1)), &mut out); // [50, 65): both groups
    g.on_watermark(Time::ms(45), &mut out);
    assert_eq!(
        g.quality(),
        Quality { matched: [1, 1], unmatched: [2, 0], ..Quality::default() },
        "[0, 11) and [20, 40) freed"
    );
    g.on_row(RIGHT, row(25, Value::Int(1)), &mut out); // late
    g.on_watermark(Time::POS_INF, &mut out);
    assert_eq!(g.quality(), Quality { matched: [2, 2], unmatched: [2, 0], ..Quality::default() });
    assert_eq!((out.results.len(), out.late.len()), (2, 1), "inner: the two groups with both sides");
}

#[test]
fn avg_is_the_exact_sum_over_the_count() {
    let a = Aggregate { function: Function::Avg, input: RIGHT, pos: Some(0), ty: FieldType::Float };
    let mut acc = Acc::new(&a);
    assert_eq!(acc.value(), Value::Null, "no values: null");
    for (i, f) in [-1.5, 0.75, -0.5, 4.5, 2.25, -4.25].into_iter().enumerate() {
        acc.add(&Value::Float(f), 0, i as u64);
    }
    assert_eq!(acc.value(), Value::Float(1.25 / 6.0));
}

#[test]
fn avg_absorbs_exactly() {
    let a = Aggregate { function: Function::Avg, input: RIGHT, pos: Some(0), ty: FieldType::Float };
    let values = [-1.5, 0.75, -0.5, 4.5, 2.25, -4.25];
    for split in 0..=values.len() {
        let (mut x, mut y) = (Acc::new(&a), Acc::new(&a));
        values[..split].iter().for_each(|&f| x.add(&Value::Float(f), 0, 0));
        values[split..].iter().for_each(|&f| y.add(&Value::Float(f), 0, 0));
        x.absorb(y);
        assert_eq!(x.value(), Value::Float(1.25 / 6.0), "split at {split}");
    }
}

#[test]
fn ttl_drops_a_keys_windows_and_puts_only_results_not_yet_out_in_expired() {
    use crate::state::ttl::Due;
    let due = Due::Key { input: 0, key_hash: 3 };
    let tumbling = WindowKind::Fixed { size: 10, slide: 10, offset: 0 };
    // Window [0, 10) fired at watermark 9 and kept for lateness; [10, 20) still open.
    let mut g = cogroup(JoinType::Full, tumbling, 100);
    let mut out = Output::default();
    g.on_row(LEFT, row(1, Value::Int(1)), &mut out);
    g.on_watermark(Time::ms(9), &mut out);
    g.on_row(LEFT, row(12, Value::Int(2)), &mut out);
    assert_eq!(out.touched, [(0, 3)], "one entry per run of rows of a key");
    assert_eq!(values(&mut out).len(), 1, "[0, 10) fired");
    g.expire(due, &mut out);
    assert_eq!(out.expired.len(), 1, "the fired window's result is out already: only [10, 20) expires");
    let e = &out.expired[0];
    assert_eq!((e.reason, e.input), (crate::operator::ExpiryReason::Ttl, None));
    assert_eq!(e.row.ts, 19);
    assert_eq!(g.state_rows(), 0, "both windows are gone");
    g.on_watermark(Time::POS_INF, &mut out);
    assert!(out.results.is_empty(), "an expired window never fires");
    let expired = Quality { expired: [2, 0], ..Quality::default() };
    assert_eq!(g.quality(), expired, "both rows left with a dropped window, the fired one's too");
    // Sessions: found by key too; a later row starts fresh.
    let mut g = cogroup(JoinType::Full, WindowKind::Session { gap: 5 }, 0);
    let mut out = Output::default();
    g.on_row(LEFT, row(1, Value::Int(1)), &mut out);
    g.on_row(LEFT, row(3, Value::Int(2)), &mut out);
    g.expire(due, &mut out);
    assert_eq!(out.expired.len(), 1);
    assert_eq!(out.expired[0].row.values[1], Value::Int(2), "count(left) of the would-be result");
    g.on_row(LEFT, row(4, Value::Int(3)), &mut out);
    g.on_watermark(Time::POS_INF, &mut out);
    assert_eq!(values(&mut out)[0][1], Value::Int(1), "a fresh session of one row");
}

#[test]
fn evict_oldest_takes_windows_by_their_ts_and_puts_the_would_be_result_in_expired() {
    let tumbling = WindowKind::Fixed { size: 10, slide: 10, offset: 0 };
    let mut g = cogroup(JoinType::Full, tumbling, 0);
    let mut out = Output::default();
    g.on_row(LEFT, row(25, Value::Int(1)), &mut out);
    g.on_row(LEFT, row(5, Value::Int(2)), &mut out);
    let mut seen = Vec::new();
    g.visit_evictable(&mut |input, ts, id, key_hash, handle| seen.push((ts, id, input, key_hash, handle)));
    seen.sort_unstable();
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [9, 29], "by _ts = end − 1");
    let (_, _, _, _, oldest) = seen[0];
    assert!(g.evict(oldest, &mut out));
    assert!(!g.evict(oldest, &mut out), "gone already");
    assert_eq!(out.expired.len(), 1);
    assert_eq!(out.expired[0].reason, crate::operator::ExpiryReason::Budget);
    assert_eq!((out.expired[0].input, out.expired[0].row.ts), (None, 9));
    g.on_watermark(Time::POS_INF, &mut out);
    assert_eq!(out.results.iter().map(|(_, r)| r.ts).collect::<Vec<_>>(), [29], "the evicted window never fires");
}
