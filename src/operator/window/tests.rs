use super::*;
use crate::record::Row;

fn fixed(size: i64, slide: i64, offset: i64) -> WindowSpec {
    WindowSpec { kind: WindowKind::Fixed { size, slide, offset }, allowed_lateness: 0 }
}

/// The window spec of `[operators.w]` (a window_join), or the configuration errors.
fn configured(window: &str, extra: &str) -> Result<WindowSpec, String> {
    let text = format!(
        "[streams.a]\nkey = \"k\"\nfields = {{ k = \"string\", v = \"int\" }}\n\
         [operators.w]\nkind = \"window_join\"\nleft = \"a\"\nright = \"a\"\nselect = [\"left.v\"]\n\
         window = {window}\n{extra}"
    );
    match crate::config::parse("w.toml", &text) {
        Ok(plan) => match &plan.operators[0].spec {
            crate::operator::OperatorSpec::WindowJoin(spec) => Ok(spec.window),
            _ => Err("not a window join".into()),
        },
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn window_configuration() {
    let tumbling = configured("{ kind = \"tumbling\", size = \"5m\", offset = \"-1m\" }", "");
    let kind = WindowKind::Fixed { size: 300_000, slide: 300_000, offset: -60_000 };
    assert_eq!(tumbling, Ok(WindowSpec { kind, allowed_lateness: 0 }));
    let sliding = configured("{ kind = \"sliding\", size = \"10s\", slide = \"2s\" }", "allowed_lateness = \"1s\"");
    let kind = WindowKind::Fixed { size: 10_000, slide: 2_000, offset: 0 };
    assert_eq!(sliding, Ok(WindowSpec { kind, allowed_lateness: 1_000 }));
    let session = configured("{ kind = \"session\", gap = \"30s\" }", "");
    assert_eq!(session.map(|s| s.kind), Ok(WindowKind::Session { gap: 30_000 }));
    let refused = [
        ("{ kind = \"sliding\", size = \"10s\" }", "", "operators.w.window.slide: required"),
        ("{ kind = \"session\", gap = \"1s\", offset = \"1s\" }", "", "this window kind takes gap"),
        ("{ kind = \"tumbling\", size = \"0s\" }", "", "operators.w.window.size: must be positive"),
        ("{ kind = \"hopping\", size = \"1s\" }", "", "must be tumbling, sliding or session"),
        ("{ kind = \"tumbling\", size = \"1s\" }", "allowed_lateness = \"-1s\"", "must not be negative"),
    ];
    for (window, extra, message) in refused {
        let err = configured(window, extra).unwrap_err();
        assert!(err.contains(message), "{window} {extra}: {err}");
        assert!(!err.contains("not available"), "{err}");
    }
}

#[test]
fn assignment_is_epoch_aligned_with_offset() {
    assert_eq!(fixed(10, 10, 0).assign(10).collect::<Vec<_>>(), [(10, 20)]);
    assert_eq!(fixed(10, 10, 0).assign(9).collect::<Vec<_>>(), [(0, 10)]);
    assert_eq!(fixed(10, 10, 0).assign(-1).collect::<Vec<_>>(), [(-10, 0)]);
    assert_eq!(fixed(10, 10, 3).assign(12).collect::<Vec<_>>(), [(3, 13)]);
    assert_eq!(fixed(10, 10, -3).assign(7).collect::<Vec<_>>(), [(7, 17)]);
    assert_eq!(fixed(10, 5, 0).assign(12).collect::<Vec<_>>(), [(10, 20), (5, 15)]);
    assert_eq!(fixed(10, 4, 0).assign(12).collect::<Vec<_>>(), [(12, 22), (8, 18), (4, 14)]);
    // A gap between hopping windows: the row belongs to none.
    assert_eq!(fixed(5, 10, 0).assign(17).count(), 0);
    assert_eq!(fixed(5, 10, 0).assign(14).collect::<Vec<_>>(), [(10, 15)]);
}

/// Counts rows; emits (start, end, version, count) as the result's values.
#[derive(Clone, Default)]
struct Count(usize);

impl Contents for Count {
    type Item = ();
    fn add(&mut self, _: usize, _: &(), _: u64) {
        self.0 += 1;
    }
    fn absorb(&mut self, other: Self) {
        self.0 += other.0;
    }
    fn rows(&self) -> usize {
        self.0
    }
    fn bytes(&self) -> usize {
        0
    }
    fn has(&self, _: usize) -> bool {
        self.0 > 0
    }
}

struct Emit;

impl Fire<Count> for Emit {
    fn fire(&mut self, w: &Window<Count>, out: &mut Output) -> Option<u64> {
        let mut values = w.meta().to_vec();
        values.push(Value::Int(w.contents.0 as i64));
        values.extend(w.supersedes.iter().map(|&id| Value::Int(id as i64)));
        let id = (w.start as u64) << 32 | w.end as u64;
        let row = Row { ts: w.end - 1, key: w.key.clone(), key_hash: 0, id, values: values.into() };
        out.results.push((crate::operator::ResultKind::Match, row));
        Some(id)
    }
}

fn results(out: &mut Output) -> Vec<Vec<i64>> {
    let int = |v: &Value| if let Value::Int(i) = v { *i } else { -1 };
    out.results.drain(..).map(|(_, r)| r.values.iter().map(int).collect()).collect()
}

fn row(w: &mut Windows<Count>, ts: i64, out: &mut Output) -> bool {
    w.on_row(RowRef { input: 0, ts, key: &Key::Int(1), key_hash: 1 }, &(), &mut Emit, out)
}

#[test]
fn fires_at_end_minus_one_and_refires_within_allowed_lateness() {
    let spec = WindowSpec { allowed_lateness: 5, ..fixed(10, 10, 0) };
    let mut w = Windows::new(spec, OnMerge::ContinueVersions, Count(0));
    let mut out = Output::default();
    assert!(row(&mut w, 9, &mut out));
    assert!(row(&mut w, 10, &mut out));
    w.on_watermark(Time::ms(8), &mut Emit, &mut out);
    assert!(out.results.is_empty());
    assert_eq!(w.output_watermark(), Time::ms(3));
    w.on_watermark(Time::ms(9), &mut Emit, &mut out);
    assert_eq!(results(&mut out), [[0, 10, 1, 1]]);
    assert!(row(&mut w, 0, &mut out), "9 + 5 > 9: within allowed lateness");
    assert_eq!(results(&mut out), [[0, 10, 2, 2]]);
    w.on_watermark(Time::ms(14), &mut Emit, &mut out);
    assert!(!row(&mut w, 3, &mut out), "9 + 5 ≤ 14: late");
    assert_eq!((w.windows(), w.state_rows()), (1, 1), "[0, 10) freed, [10, 20) kept");
    assert!(!w.is_quiescent());
    w.on_watermark(Time::POS_INF, &mut Emit, &mut out);
    assert_eq!(results(&mut out), [[10, 20, 1, 1]]);
    assert_eq!((w.windows(), w.state_rows(), w.state_bytes()), (0, 0, 0));
    assert!(w.is_quiescent());
}

#[test]
fn sessions_merge_when_they_touch_and_supersede_what_they_replace() {
    let spec = WindowSpec { kind: WindowKind::Session { gap: 10 }, allowed_lateness: 100 };
    let mut w = Windows::new(spec, OnMerge::Supersede, Count(0));
    let mut out = Output::default();
    row(&mut w, 0, &mut out); // [0, 10)
    row(&mut w, 20, &mut out); // [20, 30)
    w.on_watermark(Time::ms(40), &mut Emit, &mut out);
    let first = results(&mut out);
    assert_eq!(first, [vec![0, 10, 1, 1], vec![20, 30, 1, 1]]);
    // [10, 20) touches both: one session [0, 30), new result superseding both.
    row(&mut w, 10, &mut out);
    let id = |s: i64, e: i64| ((s as u64) << 32 | e as u64) as i64;
    let mut want = vec![0, 30, 1, 3, id(0, 10), id(20, 30)];
    want[4..].sort_unstable_by_key(|&i| i as u64);
    assert_eq!(results(&mut out), [want]);
    assert_eq!(w.windows(), 1);
}

#[test]
fn merged_sessions_continue_versions_and_firing_order() {
    let spec = WindowSpec { kind: WindowKind::Session { gap: 10 }, allowed_lateness: 100 };
    let mut w = Windows::new(spec, OnMerge::ContinueVersions, Count(0));
    let mut out = Output::default();
    row(&mut w, 0, &mut out);
    w.on_watermark(Time::ms(9), &mut Emit, &mut out);
    row(&mut w, 0, &mut out); // same bounds: re-fire of [0, 10), version 2
    row(&mut w, 30, &mut out);
    row(&mut w, 25, &mut out); // [25, 40)
    row(&mut w, 8, &mut out); // [0, 18): extended, not due: pending, version continues
    w.on_watermark(Time::ms(50), &mut Emit, &mut out);
    assert_eq!(results(&mut out), [vec![0, 10, 1, 1], vec![0, 10, 2, 2], vec![0, 18, 3, 3], vec![25, 40, 1, 2]]);
}

#[test]
fn an_extended_session_is_a_new_result_superseding_what_it_emitted() {
    let spec = WindowSpec { kind: WindowKind::Session { gap: 10 }, allowed_lateness: 100 };
    let mut w = Windows::new(spec, OnMerge::Supersede, Count(0));
    let mut out = Output::default();
    let id = |s: i64, e: i64| ((s as u64) << 32 | e as u64) as i64;
    row(&mut w, 0, &mut out); // [0, 10)
    w.on_watermark(Time::ms(9), &mut Emit, &mut out);
    assert_eq!(results(&mut out), [[0, 10, 1, 1]]);
    row(&mut w, 5, &mut out); // [0, 15): not due yet, version 0 again
    row(&mut w, 3, &mut out); // same bounds
    w.on_watermark(Time::ms(20), &mut Emit, &mut out);
    assert_eq!(results(&mut out), [[0, 15, 1, 3, id(0, 10)]]);
    row(&mut w, 14, &mut out); // [0, 24): not due (23 > 20)
    w.on_watermark(Time::ms(30), &mut Emit, &mut out);
    let mut want = vec![0, 24, 1, 4, id(0, 10), id(0, 15)];
    want[4..].sort_unstable_by_key(|&i| i as u64);
    assert_eq!(results(&mut out), [want.clone()]);
    row(&mut w, 10, &mut out); // same bounds, due: a re-fire, same result
    want[2..4].copy_from_slice(&[2, 5]);
    assert_eq!(results(&mut out), [want]);
    row(&mut w, -5, &mut out); // the start moves: [-5, 24), due, fires at once
    let mut want = vec![-5, 24, 1, 6, id(0, 10), id(0, 15), id(0, 24)];
    want[4..].sort_unstable_by_key(|&i| i as u64);
    assert_eq!(results(&mut out), [want]);
    assert_eq!((w.windows(), w.state_rows()), (1, 6));
    w.on_watermark(Time::POS_INF, &mut Emit, &mut out);
    assert!(out.results.is_empty());
    assert_eq!((w.windows(), w.state_rows()), (0, 0));
}

/// Keeps the tags of its rows in the order they were added and absorbed.
#[derive(Clone, Default)]
struct Tags(Vec<i64>);

impl Contents for Tags {
    type Item = i64;
    fn add(&mut self, _: usize, tag: &i64, _: u64) {
        self.0.push(*tag);
    }
    fn absorb(&mut self, other: Self) {
        self.0.extend(other.0);
    }
    fn rows(&self) -> usize {
        self.0.len()
    }
    fn bytes(&self) -> usize {
        0
    }
    fn has(&self, _: usize) -> bool {
        !self.0.is_empty()
    }
}

impl Fire<Tags> for Emit {
    fn fire(&mut self, w: &Window<Tags>, out: &mut Output) -> Option<u64> {
        let values = w.contents.0.iter().map(|&t| Value::Int(t)).collect();
        let row = Row { ts: w.end - 1, key: w.key.clone(), key_hash: 0, id: 0, values };
        out.results.push((crate::operator::ResultKind::Match, row));
        None
    }
}

#[test]
fn an_extended_session_is_absorbed_where_a_merged_one_would_be() {
    // A merge absorbs its parts in the order of the key's list, and puts the merged session
    // last; a session extended in place moves there too (min/max keep the first of equal
    // values, so the order can show in a result).
    let spec = WindowSpec { kind: WindowKind::Session { gap: 10 }, allowed_lateness: 0 };
    let mut w = Windows::new(spec, OnMerge::ContinueVersions, Tags::default());
    let mut out = Output::default();
    let mut tag = |w: &mut Windows<Tags>, ts: i64, tag: i64| {
        w.on_row(RowRef { input: 0, ts, key: &Key::Int(1), key_hash: 1 }, &tag, &mut Emit, &mut out)
    };
    tag(&mut w, 0, 1); // A [0, 10)
    tag(&mut w, 30, 2); // B [30, 40)
    tag(&mut w, 5, 3); // A [0, 15), now after B
    tag(&mut w, 15, 4); // [15, 25) touches A → [0, 25), A alone: in place
    tag(&mut w, 20, 5); // [0, 30) touches B: B's rows, then A's, then the row
    w.on_watermark(Time::POS_INF, &mut Emit, &mut out);
    assert_eq!(results(&mut out), [[2, 1, 3, 4, 5]]);
}
