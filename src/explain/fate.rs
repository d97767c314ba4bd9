//! A row's fate at one operator, in plain words, from what the run showed: the watermark the row
//! met on arrival (the host's [`Arrival`] note), the watermark's moves, the results the operator
//! emitted and the other input's rows of the same key. Nothing is re-run here: every "why" reads
//! the operator's own rules (its spec's bounds and windows, rule 8's last chances) against those
//! facts, and partners are found by the result ids the operator emitted ([`IdHasher::pair`]).

use crate::operator::connect::END_OF_INPUT;
use crate::operator::host::Arrival;
use crate::operator::window::WindowSpec;
use crate::operator::{ExpiryReason, OperatorSpec};
use crate::record::id::IdHasher;
use crate::time::Time;

use super::watch::Emitted;

/// What became of a row at an operator (CONTRACT.md: `braid explain --json`'s `"fate"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Matched,
    Unmatched,
    Late,
    DeadLetter,
    /// Removed by `ttl` or the state budget: it went to `OPERATOR.expired`.
    Expired,
}

impl Fate {
    pub fn as_str(self) -> &'static str {
        match self {
            Fate::Matched => "matched",
            Fate::Unmatched => "unmatched",
            Fate::Late => "late",
            Fate::DeadLetter => "dead_letter",
            Fate::Expired => "expired",
        }
    }
}

/// Everything one operator showed of the key.
pub struct AtOperator<'a> {
    pub name: &'a str,
    pub spec: &'a OperatorSpec,
    /// Names of its inputs (stream or upstream operator), by input index.
    pub inputs: Vec<&'a str>,
    /// Every arrival of the key at this operator, in processing order.
    pub arrivals: Vec<&'a Arrival>,
    /// The operator's watermark moves: (tick, watermark), in order.
    pub moves: Vec<(i128, Time)>,
    pub emitted: Vec<&'a Emitted>,
    /// Rows of the key (by id) the operator gave up to `OPERATOR.expired`, and why.
    pub expired: Vec<(u64, ExpiryReason)>,
    /// Per input: why its rows of the key may be missing — keys that resemble the one asked
    /// about ("status has 'DEV-1'"), rows of the key dead-lettered.
    pub hints: Vec<Option<String>>,
    /// The key as shown ('dev-1').
    pub key: String,
}

/// The fate of `row` (one of `at.arrivals`) and why; `None`: nothing to say (a row passing an
/// operator that is no join).
pub fn fate(at: &AtOperator<'_>, row: &Arrival) -> Option<(Fate, String)> {
    if row.late {
        return Some((Fate::Late, late(at, row)));
    }
    if let Some(&(_, reason)) = at.expired.iter().find(|(id, _)| *id == row.id) {
        return Some((Fate::Expired, expired(at, reason)));
    }
    let told = match at.spec {
        OperatorSpec::IntervalJoin(spec) => interval_join(at, row, spec),
        OperatorSpec::TemporalJoin(_) => temporal_join(at, row),
        OperatorSpec::WindowJoin(spec) => windowed(at, row, &spec.window, true),
        OperatorSpec::CoGroup(spec) => windowed(at, row, &spec.window, false),
        OperatorSpec::WindowAggregate(spec) => aggregated(at, row, &spec.window),
        OperatorSpec::Union(_) | OperatorSpec::Connect(_) | OperatorSpec::Absence(_) => return None,
    };
    Some(told)
}

/// Why a row went to `OPERATOR.expired`.
fn expired(at: &AtOperator<'_>, reason: ExpiryReason) -> String {
    let cause = match reason {
        ExpiryReason::Ttl => "its ttl passed (processing time since it was written) before the watermark freed it",
        ExpiryReason::Budget => "the shard's state budget was full and it was among the oldest rows",
    };
    format!("expired: {cause}, so it left {}'s state and went to {}.expired", at.name, at.name)
}

/// A time for people: `-inf` / `+inf` for the infinities.
pub fn shown_time(t: Time) -> String {
    match t {
        Time::NEG_INF => "-inf".into(),
        Time::POS_INF => "+inf".into(),
        t => t.raw().to_string(),
    }
}

fn late(at: &AtOperator<'_>, row: &Arrival) -> String {
    let by = late_by(row);
    format!(
        "late by {by} ms: it arrived when {}'s watermark was {} (its ts {} is behind it), so it went to {}.late{}",
        at.name,
        shown_time(row.watermark),
        row.ts,
        at.name,
        would_have(at, row),
    )
}

/// `late_by_ms`: the operator's watermark when the row arrived minus its ts.
pub fn late_by(row: &Arrival) -> i64 {
    row.watermark.plus(-i128::from(row.ts)).as_i64_saturating()
}

/// For a late row of an interval join: the partner it missed and when that partner left.
fn would_have(at: &AtOperator<'_>, row: &Arrival) -> String {
    let OperatorSpec::IntervalJoin(spec) = at.spec else { return String::new() };
    let (lo, hi) = interval_bound(spec.lower, spec.upper, row);
    let Some(partner) = others(at, row).find(|o| !o.late && (lo..=hi).contains(&o.ts)) else { return String::new() };
    let other = at.inputs[partner.input];
    match left_state(at, spec.last_chance(partner.input, partner.ts)) {
        Some(when) => format!("; {other} ts {} (within the bound) had left the state {when}", partner.ts),
        None => format!("; it would have paired with {other} ts {} (within the bound)", partner.ts),
    }
}

/// The rows of the other input with the same key, in processing order.
fn others<'a>(at: &'a AtOperator<'_>, row: &'a Arrival) -> impl Iterator<Item = &'a Arrival> + 'a {
    at.arrivals.iter().copied().filter(move |o| o.input != row.input && o.key_hash == row.key_hash)
}

/// When the watermark first passed `last_chance`: "at processing time T (watermark W, past its
/// last chance L)"; `None` while it never did.
fn left_state(at: &AtOperator<'_>, last_chance: Time) -> Option<String> {
    let (tick, watermark) = left_at(at, last_chance)?;
    let when =
        if tick == END_OF_INPUT { "at the end of input".to_owned() } else { format!("at processing time {tick}") };
    Some(format!(
        "{when} (the watermark reached {}, past its last chance {})",
        shown_time(watermark),
        shown_time(last_chance)
    ))
}

/// The first watermark move past `last_chance`: (tick, watermark).
fn left_at(at: &AtOperator<'_>, last_chance: Time) -> Option<(i128, Time)> {
    at.moves.iter().copied().find(|(_, w)| *w > last_chance)
}

/// The ts range a partner of `row` must fall in: for a left row `[ts + lower′, ts + upper′]`,
/// for a right row `[ts − upper′, ts − lower′]`.
fn interval_bound(lower: i64, upper: i64, row: &Arrival) -> (i64, i64) {
    if row.input == 0 {
        (row.ts.saturating_add(lower), row.ts.saturating_add(upper))
    } else {
        (row.ts.saturating_sub(upper), row.ts.saturating_sub(lower))
    }
}

/// How far `ts` lies outside `[lo, hi]` (0 inside).
fn outside(ts: i64, (lo, hi): (i64, i64)) -> i64 {
    if ts < lo {
        lo - ts
    } else if ts > hi {
        ts - hi
    } else {
        0
    }
}

/// The ids of the pairs the operator emitted that `row` is part of, with the partner.
fn partners<'a>(at: &'a AtOperator<'_>, row: &'a Arrival, window: Option<(i64, i64)>) -> Vec<&'a Arrival> {
    let mut ids = IdHasher::default();
    others(at, row)
        .filter(|o| {
            let (l, r) = if row.input == 0 { (row.id, o.id) } else { (o.id, row.id) };
            let id = ids.pair(at.name, l, r);
            if let Some((start, end)) = window {
                id.u64(start as u64).u64(end as u64);
            }
            let id = id.finish();
            at.emitted.iter().any(|e| e.kind == "match" && e.id == id)
        })
        .collect()
}

fn listed(at: &AtOperator<'_>, rows: &[&Arrival]) -> String {
    let other = |o: &Arrival| format!("{} ts {}", at.inputs[o.input], o.ts);
    rows.iter().map(|o| other(o)).collect::<Vec<_>>().join(", ")
}

/// "no status row with key 'dev-1' reached effect (status has 'DEV-1')".
fn nobody(at: &AtOperator<'_>, row: &Arrival) -> String {
    let other = 1 - row.input.min(1);
    let hint = at.hints.get(other).and_then(Option::as_ref).map(|h| format!(" ({h})")).unwrap_or_default();
    format!("no {} row with key {} reached {}{hint}", at.inputs[other], at.key, at.name)
}

fn interval_join(at: &AtOperator<'_>, row: &Arrival, spec: &crate::operator::IntervalJoinSpec) -> (Fate, String) {
    let bound = interval_bound(spec.lower, spec.upper, row);
    let shown_bound = format!("[{}, {}]", bound.0, bound.1);
    let found = partners(at, row, None);
    if !found.is_empty() {
        return (Fate::Matched, format!("paired with {} (within the bound {shown_bound})", listed(at, &found)));
    }
    let gone = left_state(at, spec.last_chance(row.input, row.ts));
    let left = gone.as_ref().map(|g| format!("; it left the state {g}")).unwrap_or_default();
    if others(at, row).next().is_none() {
        return (Fate::Unmatched, format!("{}{left}", nobody(at, row)));
    }
    if let Some(inside) = others(at, row).find(|o| outside(o.ts, bound) == 0) {
        let other = at.inputs[inside.input];
        let why = if inside.late {
            let when = gone.map(|g| format!(", after this row had left the state {g}")).unwrap_or_default();
            format!(
                "{other} ts {} was within the bound {shown_bound} but arrived late by {} ms{when}",
                inside.ts,
                late_by(inside)
            )
        } else {
            format!("{other} ts {} was within the bound {shown_bound} but did not pair{left}", inside.ts)
        };
        return (Fate::Unmatched, why);
    }
    let Some(nearest) = others(at, row).min_by_key(|o| outside(o.ts, bound)) else {
        return (Fate::Unmatched, nobody(at, row));
    };
    let by = outside(nearest.ts, bound);
    let also_late = if nearest.late { format!(" and arrived late by {} ms", late_by(nearest)) } else { String::new() };
    let why = format!(
        "outside the bound by {by} ms: the nearest {} row, ts {}, had to be in {shown_bound} (lower {} ms, upper {} ms){also_late}{left}",
        at.inputs[nearest.input], nearest.ts, spec.lower, spec.upper,
    );
    (Fate::Unmatched, why)
}

fn temporal_join(at: &AtOperator<'_>, row: &Arrival) -> (Fate, String) {
    let found = partners(at, row, None);
    if row.input == 0 {
        if let Some(version) = found.first() {
            return (Fate::Matched, format!("took the version {}", listed(at, &[version])));
        }
        let Some(earliest) = others(at, row).map(|o| o.ts).min() else {
            return (Fate::Unmatched, nobody(at, row));
        };
        let why = format!(
            "no {} version with ts <= {} had arrived when it was decided (the earliest, ts {earliest}, is {} ms later)",
            at.inputs[1],
            row.ts,
            earliest.saturating_sub(row.ts),
        );
        return (Fate::Unmatched, why);
    }
    if found.is_empty() {
        let why = format!("no {} row took this version (one takes the greatest ts <= its own)", at.inputs[0]);
        return (Fate::Unmatched, why);
    }
    (Fate::Matched, format!("served {}", listed(at, &found)))
}

/// Window join (`pairs`: pairs found by id) and cogroup (a group with rows of both inputs).
fn windowed(at: &AtOperator<'_>, row: &Arrival, window: &WindowSpec, pairs: bool) -> (Fate, String) {
    let windows: Vec<(i64, i64)> = window.assign(row.ts).collect();
    let shown = |w: &[(i64, i64)]| w.iter().map(|(s, e)| format!("[{s}, {e})")).collect::<Vec<_>>().join(", ");
    let in_window = |o: &&Arrival| !o.late && windows.iter().any(|&(s, e)| (s..e).contains(&o.ts));
    if pairs {
        let found: Vec<&Arrival> = if window.is_session() {
            partners(at, row, None)
        } else {
            windows.iter().flat_map(|&w| partners(at, row, Some(w))).collect()
        };
        if !found.is_empty() {
            return (Fate::Matched, format!("paired with {}", listed(at, &found)));
        }
    } else if window.is_session() {
        if others(at, row).any(|o| !o.late) {
            return (
                Fate::Matched,
                format!("grouped with the {} rows of its session", at.inputs[1 - row.input.min(1)]),
            );
        }
    } else {
        let group: Vec<&Arrival> = others(at, row).filter(in_window).collect();
        if !group.is_empty() {
            return (Fate::Matched, format!("grouped in {} with {}", shown(&windows), listed(at, &group)));
        }
    }
    if others(at, row).next().is_none() {
        return (Fate::Unmatched, nobody(at, row));
    }
    if window.is_session() {
        return (Fate::Unmatched, format!("no {} row paired with it in its session", at.inputs[1 - row.input.min(1)]));
    }
    if let Some(same) = others(at, row).find(in_window) {
        let why = format!(
            "{} ts {} shared its window {} but the `where` condition did not hold",
            at.inputs[same.input],
            same.ts,
            shown(&windows)
        );
        return (Fate::Unmatched, why);
    }
    let span =
        (windows.iter().map(|w| w.0).min().unwrap_or(row.ts), windows.iter().map(|w| w.1 - 1).max().unwrap_or(row.ts));
    let Some(nearest) = others(at, row).min_by_key(|o| outside(o.ts, span)) else {
        return (Fate::Unmatched, nobody(at, row));
    };
    let why = format!(
        "outside its window by {} ms: the nearest {} row, ts {}, is not in {}",
        outside(nearest.ts, span),
        at.inputs[nearest.input],
        nearest.ts,
        shown(&windows),
    );
    (Fate::Unmatched, why)
}

/// Window aggregate: a row on time is in the result of every window it belongs to (`matched`),
/// unless its `where` dropped it (`unmatched`).
fn aggregated(at: &AtOperator<'_>, row: &Arrival, window: &WindowSpec) -> (Fate, String) {
    if row.filtered {
        return (Fate::Unmatched, format!("the `where` condition of {} did not hold: it was not aggregated", at.name));
    }
    if window.is_session() {
        return (Fate::Matched, "aggregated into its session's result".into());
    }
    let windows: Vec<String> = window.assign(row.ts).map(|(start, end)| format!("[{start}, {end})")).collect();
    let refired = if row.watermark > Time::ms(row.ts) {
        format!(" (behind the watermark by {} ms, within allowed lateness: re-fired)", late_by(row))
    } else {
        String::new()
    };
    (Fate::Matched, format!("aggregated into the result of window {}{refired}", windows.join(", ")))
}

/// What became of two given rows together at the operator both reached (`braid explain --row`):
/// `verdict` is one of `joined`, `late`, `left_state`, `outside_bound`, `outside_window`,
/// `not_paired`.
pub struct PairFate {
    pub verdict: &'static str,
    /// The result the pair became (a `match` id; none for a cogroup's group).
    pub result_id: Option<u64>,
    /// How far it missed: ms late, or ms outside the bound or window.
    pub by_ms: Option<i64>,
    pub why: String,
}

/// The fate of the pair `x`, `y` (arrivals of two rows on different inputs of `at`).
pub fn pair(at: &AtOperator<'_>, x: &Arrival, y: &Arrival) -> PairFate {
    let (l, r) = if x.input <= y.input { (x, y) } else { (y, x) };
    let row = |o: &Arrival| format!("{} ts {}", at.inputs[o.input], o.ts);
    let fate = |verdict, by_ms, why: String| PairFate { verdict, result_id: None, by_ms, why };
    if let Some(id) = pair_result(at, l, r) {
        let why = format!("they joined at {} as result _id {}", at.name, crate::record::id::hex(id));
        return PairFate { verdict: "joined", result_id: Some(id), by_ms: None, why };
    }
    if let Some(late) = [l, r].into_iter().find(|o| o.late) {
        let other = if std::ptr::eq(late, l) { r } else { l };
        let by = late_by(late);
        let head = format!(
            "they did not join at {}: {} arrived late by {by} ms ({}'s watermark was {} when it arrived)",
            at.name,
            row(late),
            at.name,
            shown_time(late.watermark)
        );
        if let OperatorSpec::IntervalJoin(spec) = at.spec {
            let missed = outside(r.ts, interval_bound(spec.lower, spec.upper, l));
            if missed > 0 {
                let why =
                    format!("{head}, so it went to {}.late; it was outside the bound by {missed} ms as well", at.name);
                return fate("late", Some(by), why);
            }
            let last_chance = spec.last_chance(other.input, other.ts);
            if let Some((tick, watermark)) = left_at(at, last_chance).filter(|&(tick, _)| tick <= late.tick) {
                let why = format!(
                    "{head}, after {} had left the state at processing time {tick} (the watermark reached {}, past its last chance {})",
                    row(other),
                    shown_time(watermark),
                    shown_time(last_chance)
                );
                return fate("left_state", Some(by), why);
            }
        }
        return fate("late", Some(by), format!("{head}, so it went to {}.late", at.name));
    }
    match at.spec {
        OperatorSpec::IntervalJoin(spec) => {
            let bound = interval_bound(spec.lower, spec.upper, l);
            let by = outside(r.ts, bound);
            if by > 0 {
                let why = format!(
                    "they did not join at {}: outside the bound by {by} ms: {} had to be in [{}, {}] for {} (lower {} ms, upper {} ms)",
                    at.name,
                    row(r),
                    bound.0,
                    bound.1,
                    row(l),
                    spec.lower,
                    spec.upper
                );
                return fate("outside_bound", Some(by), why);
            }
        }
        OperatorSpec::WindowJoin(spec) if !spec.window.is_session() => {
            if let Some(missed) = outside_windows(at, l, r, &spec.window) {
                return missed;
            }
        }
        OperatorSpec::CoGroup(spec) if !spec.window.is_session() => {
            if let Some(missed) = outside_windows(at, l, r, &spec.window) {
                return missed;
            }
            return fate(
                "joined",
                None,
                format!("they were grouped together at {} (same window, both on time)", at.name),
            );
        }
        OperatorSpec::TemporalJoin(_) if r.ts > l.ts => {
            let by = r.ts - l.ts;
            let why = format!(
                "they did not join at {}: {} is a version {by} ms later than {} (a temporal join takes the latest version at or before the row)",
                at.name,
                row(r),
                row(l)
            );
            return fate("outside_bound", Some(by), why);
        }
        _ => {}
    }
    let why = format!(
        "they did not join at {}: both arrived on time and within reach of each other, but {} did not pair them (its `where` condition, or another version taken)",
        at.name, at.name
    );
    fate("not_paired", None, why)
}

/// The `match` result of the pair (`l` on the left input), if the operator emitted one.
pub fn pair_result(at: &AtOperator<'_>, l: &Arrival, r: &Arrival) -> Option<u64> {
    let mut ids = IdHasher::default();
    let windows: Vec<Option<(i64, i64)>> = match at.spec {
        OperatorSpec::WindowJoin(spec) if !spec.window.is_session() => spec.window.assign(l.ts).map(Some).collect(),
        _ => vec![None],
    };
    windows.into_iter().find_map(|window| {
        let id = ids.pair(at.name, l.id, r.id);
        if let Some((start, end)) = window {
            id.u64(start as u64).u64(end as u64);
        }
        let id = id.finish();
        at.emitted.iter().any(|e| e.kind == "match" && e.id == id).then_some(id)
    })
}

/// `outside_window` when `r` shares no window with `l`.
fn outside_windows(at: &AtOperator<'_>, l: &Arrival, r: &Arrival, window: &WindowSpec) -> Option<PairFate> {
    let windows: Vec<(i64, i64)> = window.assign(l.ts).collect();
    if windows.iter().any(|&(s, e)| (s..e).contains(&r.ts)) {
        return None;
    }
    let span = (windows.iter().map(|w| w.0).min()?, windows.iter().map(|w| w.1 - 1).max()?);
    let by = outside(r.ts, span);
    let shown = windows.iter().map(|(s, e)| format!("[{s}, {e})")).collect::<Vec<_>>().join(", ");
    let why = format!(
        "they did not join at {}: outside the window by {by} ms: {} ts {} is not in {shown}, the window of {} ts {}",
        at.name, at.inputs[r.input], r.ts, at.inputs[l.input], l.ts
    );
    Some(PairFate { verdict: "outside_window", result_id: None, by_ms: Some(by), why })
}
