//! Warnings: conditions worth a look that are no reason to restart the service, so `/healthz`
//! lists them in its body and stays 200. Judged about once a second from the runtime's figures
//! (never on the row path), each named by `warning` and `subject` (the
//! `braid_warning_active{warning,subject}` metric):
//!
//! - `no_match` (subject: the join): it emitted no match and counted no matched row for
//!   `[ops] no_match_warning` (default 5 min) while both inputs received rows all along.
//! - `watermark_skew` (subject: `join/input`): the input's watermark trails the other input's by
//!   more than the join can bridge — its span (interval: upper′ − lower′; windows: the size or
//!   session gap) plus lateness (the inputs' largest `max_out_of_orderness`, plus a window's
//!   `allowed_lateness`). Idle inputs are left out: idleness is how a quiet input stops holding
//!   the join back.
//! - `silent_stream` (subject: the stream): no row for [`SILENT_FACTOR`] times its usual gap
//!   between rows (from its first row to its last), and at least [`SILENT_FLOOR_MS`], after at
//!   least [`SILENT_MIN_ROWS`] rows.
//! - `state_stalled` (subject: the operator): its state grew while its watermark did not move for
//!   `[ops] state_stall_warning` (default 1 min).
//! - `hot_key` (subject: `shard N`): one key carries more than [`HOT_KEY_SHARE`] of the shard's
//!   recent rows (among several keys), named with its share
//!   ([`HotKeys`](crate::shard::hot_keys::HotKeys)).
//!
//! Each warning is logged when it starts, again at most every [`RELOG_MS`] while it lasts, and
//! when it ends.

use crate::operator::OperatorSpec;
use crate::operator::window::{WindowKind, WindowSpec};
use crate::plan::{NodeRef, Plan};
use crate::shard::Figures;
use crate::time::Time;

/// Every warning's name (the `warning` label), in the module doc's order.
pub const WARNINGS: [&str; 5] = ["no_match", "watermark_skew", "silent_stream", "state_stalled", "hot_key"];

pub const SILENT_FACTOR: i128 = 20;
pub const SILENT_FLOOR_MS: i128 = 5_000;
pub const SILENT_MIN_ROWS: u64 = 10;
pub const HOT_KEY_SHARE: f64 = 0.5;
/// A warning that lasts is logged again this often.
pub const RELOG_MS: i128 = 600_000;

/// `[ops]` settings of the warnings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// `no_match_warning`, ms.
    pub no_match_ms: i64,
    /// `state_stall_warning`, ms.
    pub state_stall_ms: i64,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds { no_match_ms: 300_000, state_stall_ms: 60_000 }
    }
}

/// One active warning.
#[derive(Clone, Debug, PartialEq)]
pub struct Warning {
    pub warning: &'static str,
    pub subject: String,
    /// What is wrong, in plain words.
    pub message: String,
}

impl Warning {
    /// `warning no_match effect: ...`, as logs, `/healthz` and `braid status` show it.
    pub fn line(&self) -> String {
        format!("warning {} {}: {}", self.warning, self.subject, self.message)
    }
}

/// What a join's history shows so far.
#[derive(Clone, Default)]
struct JoinSeen {
    matches: u64,
    /// Since when nothing matched (the first look, or the last match), and each input's rows then.
    matchless_since: i128,
    rows_then: [u64; 2],
    /// Per input: rows, and the last look they grew at.
    rows: [u64; 2],
    last_growth: [i128; 2],
}

#[derive(Clone, Default)]
struct StreamSeen {
    rows: u64,
    /// (time, rows) of the first look with rows, and the time of the last look rows grew.
    first: Option<(i128, u64)>,
    last_growth: i128,
}

#[derive(Clone, Default)]
struct StateSeen {
    watermark: Option<Time>,
    /// When the watermark last moved, and the state rows then.
    moved_at: i128,
    rows_then: usize,
}

/// The warnings of one running plan, judged at every look.
pub struct Warnings {
    thresholds: Thresholds,
    joins: Vec<JoinSeen>,
    streams: Vec<StreamSeen>,
    states: Vec<StateSeen>,
    active: Vec<Warning>,
    /// (warning, subject, when last logged) of the active ones.
    logged: Vec<(&'static str, String, i128)>,
    first_look: bool,
}

impl Warnings {
    pub fn new(plan: &Plan, thresholds: Thresholds) -> Warnings {
        Warnings {
            thresholds,
            joins: vec![JoinSeen::default(); plan.operators.len()],
            streams: vec![StreamSeen::default(); plan.streams.len()],
            states: vec![StateSeen::default(); plan.operators.len()],
            active: Vec::new(),
            logged: Vec::new(),
            first_look: true,
        }
    }

    pub fn active(&self) -> &[Warning] {
        &self.active
    }

    /// Looks at the figures (as of `figures.now`), logs what started or ended; the active warnings.
    pub fn look(&mut self, plan: &Plan, figures: &Figures) -> &[Warning] {
        let now = figures.now;
        let mut active = Vec::new();
        self.no_match(plan, figures, now, &mut active);
        watermark_skew(plan, figures, &mut active);
        self.silent_streams(plan, figures, now, &mut active);
        self.stalled_state(plan, figures, now, &mut active);
        hot_keys(figures, &mut active);
        self.first_look = false;
        self.log(now, &active);
        self.active = active;
        &self.active
    }

    fn no_match(&mut self, plan: &Plan, figures: &Figures, now: i128, active: &mut Vec<Warning>) {
        let window = i128::from(self.thresholds.no_match_ms);
        for (op, def) in plan.operators.iter().enumerate() {
            if !def.spec.kind().is_join() {
                continue;
            }
            let counters = &figures.operator_counters[op];
            let matches =
                counters.results[crate::operator::ResultKind::Match as usize] + counters.matched.iter().sum::<u64>();
            let seen = &mut self.joins[op];
            let rows = [0, 1].map(|i| counters.rows_in.get(i).copied().unwrap_or(0));
            for ((now_rows, seen_rows), growth) in rows.iter().zip(&seen.rows).zip(&mut seen.last_growth) {
                if now_rows > seen_rows {
                    *growth = now;
                }
            }
            seen.rows = rows;
            if self.first_look || matches != seen.matches {
                seen.matches = matches;
                seen.matchless_since = now;
                seen.rows_then = rows;
            }
            // Both inputs brought rows since the last match, and lately (within half the window).
            let recent = (window / 2).max(2_000);
            let flowing = (0..2).all(|i| rows[i] > seen.rows_then[i] && now - seen.last_growth[i] <= recent);
            if flowing && now - seen.matchless_since >= window {
                let message = format!(
                    "matched nothing for {} s while both inputs flow (rows in: {} and {})",
                    (now - seen.matchless_since) / 1000,
                    seen.rows[0],
                    seen.rows[1]
                );
                active.push(Warning { warning: "no_match", subject: def.name.clone(), message });
            }
        }
    }

    fn silent_streams(&mut self, plan: &Plan, figures: &Figures, now: i128, active: &mut Vec<Warning>) {
        for (s, def) in plan.streams.iter().enumerate() {
            let rows = figures.streams[s].rows;
            let seen = &mut self.streams[s];
            if rows > seen.rows {
                seen.first.get_or_insert((now, rows));
                seen.rows = rows;
                seen.last_growth = now;
            }
            let Some((first_at, first_rows)) = seen.first else { continue };
            if rows < SILENT_MIN_ROWS || rows == first_rows {
                continue;
            }
            let gap = (seen.last_growth - first_at) / i128::from(rows - first_rows);
            let silent = now - seen.last_growth;
            if silent > (SILENT_FACTOR * gap).max(SILENT_FLOOR_MS) {
                let message = format!("no row for {} s; it usually brings one every {gap} ms", silent / 1000);
                active.push(Warning { warning: "silent_stream", subject: def.name.clone(), message });
            }
        }
    }

    fn stalled_state(&mut self, plan: &Plan, figures: &Figures, now: i128, active: &mut Vec<Warning>) {
        for (op, def) in plan.operators.iter().enumerate() {
            let watermark = figures.operator_watermarks[op];
            let rows = figures.operator_state[op].0;
            let seen = &mut self.states[op];
            if seen.watermark != Some(watermark) {
                *seen = StateSeen { watermark: Some(watermark), moved_at: now, rows_then: rows };
            }
            let still = now - seen.moved_at;
            if still >= i128::from(self.thresholds.state_stall_ms) && rows > seen.rows_then {
                let message = format!(
                    "state grew from {} to {rows} rows while its watermark stayed at {} for {} s",
                    seen.rows_then,
                    shown(watermark),
                    still / 1000
                );
                active.push(Warning { warning: "state_stalled", subject: def.name.clone(), message });
            }
        }
    }

    fn log(&mut self, now: i128, active: &[Warning]) {
        for w in active {
            match self.logged.iter_mut().find(|(k, s, _)| *k == w.warning && *s == w.subject) {
                Some((_, _, at)) if now - *at < RELOG_MS => {}
                Some((_, _, at)) => {
                    *at = now;
                    tracing::warn!(warning = w.warning, subject = %w.subject, detail = %w.message, "Warning still active");
                }
                None => {
                    self.logged.push((w.warning, w.subject.clone(), now));
                    tracing::warn!(warning = w.warning, subject = %w.subject, detail = %w.message, "Warning");
                }
            }
        }
        self.logged.retain(|(k, s, _)| {
            let lasts = active.iter().any(|w| w.warning == *k && w.subject == *s);
            if !lasts {
                tracing::info!(warning = *k, subject = %s, "Warning ended");
            }
            lasts
        });
    }
}

fn shown(t: Time) -> String {
    if t.is_finite() {
        t.raw().to_string()
    } else if t == Time::NEG_INF {
        "-inf".into()
    } else {
        "+inf".into()
    }
}

/// What a join can bridge between its inputs' watermarks: its span plus lateness (ms).
fn bridge(plan: &Plan, op: usize) -> i64 {
    let def = &plan.operators[op];
    let ooo = def
        .inputs
        .iter()
        .map(|n| match *n {
            NodeRef::Stream(s) => plan.streams[s].max_out_of_orderness,
            NodeRef::Operator(_) => 0,
        })
        .max()
        .unwrap_or(0);
    let window = |w: &WindowSpec| {
        let span = match w.kind {
            WindowKind::Fixed { size, .. } => size,
            WindowKind::Session { gap } => gap,
        };
        span.saturating_add(w.allowed_lateness)
    };
    let span = match &def.spec {
        OperatorSpec::IntervalJoin(s) => s.upper.saturating_sub(s.lower),
        OperatorSpec::WindowJoin(s) => window(&s.window),
        OperatorSpec::CoGroup(s) => window(&s.window),
        _ => 0,
    };
    span.saturating_add(ooo)
}

fn watermark_skew(plan: &Plan, figures: &Figures, active: &mut Vec<Warning>) {
    for (op, def) in plan.operators.iter().enumerate() {
        if !def.spec.kind().is_join() || def.inputs.len() != 2 {
            continue;
        }
        let seen: Vec<(Time, bool)> = def
            .inputs
            .iter()
            .map(|n| match *n {
                NodeRef::Stream(s) => (figures.stream_watermarks[s], figures.stream_idle[s]),
                NodeRef::Operator(u) => (figures.operator_watermarks[u], false),
            })
            .collect();
        if seen.iter().any(|(w, idle)| *idle || !w.is_finite()) {
            continue;
        }
        let bridge = bridge(plan, op);
        for input in 0..2 {
            let trail = seen[1 - input].0.raw() - seen[input].0.raw();
            if trail > i128::from(bridge) {
                let message = format!(
                    "its watermark trails {}'s by {trail} ms, more than the {bridge} ms the join can bridge (span plus lateness)",
                    plan.node_name(def.inputs[1 - input])
                );
                let subject = format!("{}/{}", def.name, plan.node_name(def.inputs[input]));
                active.push(Warning { warning: "watermark_skew", subject, message });
            }
        }
    }
}

fn hot_keys(figures: &Figures, active: &mut Vec<Warning>) {
    for (shard, hot) in figures.hot_keys.iter().enumerate() {
        let Some(hot) = hot.as_ref().filter(|h| h.many_keys && h.share > HOT_KEY_SHARE) else { continue };
        let message =
            format!("key '{}' carries {:.0} % of the shard's last {} rows", hot.key, hot.share * 100.0, hot.rows);
        active.push(Warning { warning: "hot_key", subject: format!("shard {shard}"), message });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::host::OperatorCounters;
    use crate::shard::StreamCounters;
    use crate::shard::hot_keys::HotKey;

    const CONFIG: &str = r#"
[ops]
no_match_warning = "10s"
state_stall_warning = "20s"

[streams.a]
key = "k"
time = { field = "ts", unit = "ms" }
max_out_of_orderness = "500ms"
fields = { k = "string", ts = "int" }

[streams.b]
key = "k"
time = { field = "ts", unit = "ms" }
fields = { k = "string", ts = "int" }

[operators.j]
kind = "interval_join"
left = "a"
right = "b"
lower = "-1s"
upper = "2s"
select = ["left.k"]
"#;

    fn plan() -> Plan {
        crate::config::parse("w.toml", CONFIG).unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// Figures at `now`: rows per stream (also the join's rows in), matches, watermarks, state.
    fn figures(now: i128, rows: [u64; 2], matches: u64, watermarks: [i64; 2], state: usize) -> Figures {
        let mut counters = OperatorCounters::new(2);
        counters.rows_in = rows.to_vec();
        counters.matched = vec![matches, 0];
        Figures {
            streams: rows.iter().map(|&rows| StreamCounters { rows, ..Default::default() }).collect(),
            stream_watermarks: watermarks.iter().map(|&w| Time::ms(w)).collect(),
            stream_idle: vec![false, false],
            operator_counters: vec![counters],
            operator_watermarks: vec![Time::ms(watermarks[0].min(watermarks[1]))],
            operator_state: vec![(state, state * 100)],
            now,
            ..Default::default()
        }
    }

    fn kinds(warnings: &[Warning]) -> Vec<(&'static str, &str)> {
        assert!(warnings.iter().all(|w| WARNINGS.contains(&w.warning)), "{warnings:?}");
        warnings.iter().map(|w| (w.warning, w.subject.as_str())).collect()
    }

    #[test]
    fn a_join_that_matches_nothing_while_both_inputs_flow_warns_after_no_match_warning() {
        let plan = plan();
        let mut warnings = Warnings::new(&plan, plan.ops_thresholds);
        for s in 0..=10 {
            let rows = 10 * (s + 1);
            let active = warnings.look(&plan, &figures(1_000 * i128::from(s), [rows, rows], 0, [0, 0], 0));
            assert_eq!(kinds(active).contains(&("no_match", "j")), s >= 10, "at {s} s: {active:?}");
        }
        // A match ends it; an input that stops flowing keeps it from starting again.
        let active = warnings.look(&plan, &figures(11_000, [130, 130], 1, [0, 0], 0));
        assert!(!kinds(active).contains(&("no_match", "j")));
        for s in 12..30 {
            let active = warnings.look(&plan, &figures(1_000 * s, [130 + s as u64, 130], 1, [0, 0], 0));
            assert!(!kinds(active).contains(&("no_match", "j")), "at {s} s b is silent: {active:?}");
        }
    }

    #[test]
    fn an_input_trailing_the_other_by_more_than_span_plus_lateness_warns() {
        let plan = plan();
        let mut warnings = Warnings::new(&plan, plan.ops_thresholds);
        // span 3000 + lateness 500: a trails b by 3500 → fine, by 3501 → warned.
        let active = warnings.look(&plan, &figures(0, [1, 1], 1, [10_000, 13_500], 0));
        assert!(kinds(active).is_empty(), "{active:?}");
        let active = warnings.look(&plan, &figures(0, [1, 1], 1, [10_000, 13_501], 0));
        assert_eq!(kinds(active), vec![("watermark_skew", "j/a")]);
        let mut idle = figures(0, [1, 1], 1, [10_000, 13_501], 0);
        idle.stream_idle[0] = true;
        assert!(warnings.look(&plan, &idle).is_empty(), "an idle input holds nothing back");
    }

    #[test]
    fn a_stream_silent_far_past_its_usual_gap_warns() {
        let plan = plan();
        let mut warnings = Warnings::new(&plan, plan.ops_thresholds);
        // b: 10 rows a second for 10 s (a gap of 100 ms), then nothing; a keeps flowing.
        for s in 0..10u64 {
            warnings.look(&plan, &figures(1_000 * i128::from(s), [10 * (s + 1), 10 * (s + 1)], 1, [0, 0], 0));
        }
        let silent_at = |s: i128, warnings: &mut Warnings| {
            let rows_a = 100 + s as u64;
            kinds(warnings.look(&plan, &figures(1_000 * s, [rows_a, 100], 1, [0, 0], 0)))
                .contains(&("silent_stream", "b"))
        };
        // Silent for 2 s × 20 = 2 s < the 5 s floor: not yet; past the floor: warned.
        assert!(!silent_at(14, &mut warnings));
        assert!(silent_at(15, &mut warnings));
    }

    #[test]
    fn state_growing_under_a_still_watermark_warns_after_state_stall_warning() {
        let plan = plan();
        let mut warnings = Warnings::new(&plan, plan.ops_thresholds);
        let mut stalled = Vec::new();
        for s in 0..=21 {
            let active = warnings.look(&plan, &figures(1_000 * s, [1, 1], 1, [5_000, 5_000], 10 + s as usize));
            stalled.push(kinds(active).contains(&("state_stalled", "j")));
        }
        assert_eq!(stalled.iter().position(|&s| s), Some(20));
        let active = warnings.look(&plan, &figures(22_000, [1, 1], 1, [6_000, 6_000], 40));
        assert!(!kinds(active).contains(&("state_stalled", "j")), "the watermark moved");
    }

    #[test]
    fn a_hot_key_is_named_with_its_share() {
        let plan = plan();
        let mut warnings = Warnings::new(&plan, plan.ops_thresholds);
        let mut f = figures(0, [1, 1], 1, [0, 0], 0);
        f.hot_keys = vec![
            Some(HotKey { key: "dev-7".into(), share: 0.8, rows: 1000, many_keys: true }),
            Some(HotKey { key: "dev-1".into(), share: 0.9, rows: 1000, many_keys: false }),
            Some(HotKey { key: "dev-2".into(), share: 0.4, rows: 1000, many_keys: true }),
        ];
        let active = warnings.look(&plan, &f);
        assert_eq!(kinds(active), vec![("hot_key", "shard 0")]);
        assert_eq!(active[0].message, "key 'dev-7' carries 80 % of the shard's last 1000 rows");
    }
}
