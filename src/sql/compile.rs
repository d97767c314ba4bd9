//! Statements → the TOML of `[streams]` and `[operators]` (module doc of [`super`] for the
//! mapping). The compiler knows the names, keys and time attributes of what it has compiled so
//! far (the catalog), recognises each operator by the shape of its query, and refuses every
//! other shape with what braid supports instead. Types, durations and the rest of each table's
//! and operator's checks are the configuration's own (`crate::config`), run on the TOML written
//! here, so an SQL pipeline passes exactly the checks its TOML twin passes.

use std::collections::HashMap;

use super::SqlError;
use super::ast::*;
use super::toml_out::{TomlOut, key, quote};
use crate::config::walk::parse_duration;

/// The compiled pipeline.
#[derive(Debug)]
pub struct Compiled {
    pub toml: TomlOut,
    /// `INSERT INTO sink …`: (sink, the stream or operator it takes).
    pub inserts: Vec<(String, String)>,
}

/// What the compiler knows of a table or view.
#[derive(Clone, Debug)]
struct Relation {
    fields: Vec<String>,
    /// The key fields in the key's order (several for a composite key); empty for a broadcast
    /// table or one without a key.
    key: Vec<String>,
    /// The name SQL gives its event time: a table's time attribute (`rt`), a view's `_ts`.
    time: Option<String>,
}

const TABLE_OPTIONS: [&str; 7] = ["key", "source", "topic", "idle_timeout", "max_age", "max_skew", "max_payload"];
const LATENESS_OPTION: &str = "table.exec.emit.allow-lateness";
const WINDOW_META: [&str; 3] = ["_window_start", "_window_end", "_version"];

pub fn compile(statements: &[Statement]) -> Result<Compiled, Vec<SqlError>> {
    let mut c = Compiler { catalog: HashMap::new(), broken: Vec::new(), lateness: None, inserts: Vec::new() };
    let mut toml = TomlOut::default();
    let mut errors = Vec::new();
    for statement in statements {
        let mut out = TomlOut::default();
        match c.statement(statement, &mut out) {
            Ok(()) => toml.append(out),
            Err(e) => {
                if let Some(name) = defined_name(statement) {
                    c.broken.push(name.to_owned());
                }
                errors.push(e);
            }
        }
    }
    if errors.is_empty() { Ok(Compiled { toml, inserts: c.inserts }) } else { Err(errors) }
}

fn defined_name(statement: &Statement) -> Option<&str> {
    match statement {
        Statement::CreateTable(t) => Some(&t.name.name),
        Statement::CreateView { name, .. } | Statement::Insert { target: name, .. } => Some(&name.name),
        Statement::Set { .. } => None,
    }
}

struct Compiler {
    catalog: HashMap<String, Relation>,
    /// Names whose statement failed: reading them reports nothing more.
    broken: Vec<String>,
    /// `SET 'table.exec.emit.allow-lateness'`: the allowed lateness of the windows that follow.
    lateness: Option<i64>,
    inserts: Vec<(String, String)>,
}

/// Names the operators of one view: the view's own name, `VIEW_1`, `VIEW_2`, … for the operators
/// inside it, numbered upstream first.
struct Namer {
    view: String,
    inner: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Window {
    Tumble { size: i64, offset: i64 },
    Hop { slide: i64, size: i64, offset: i64 },
    Session { gap: i64 },
}

#[derive(Clone, Debug)]
struct Aggregate {
    function: &'static str,
    field: Option<String>,
    alias: String,
    at: usize,
}

#[derive(Clone, Debug)]
enum SideKind {
    Plain,
    Windowed(Window),
    Aggregated(Window, Vec<Aggregate>),
}

/// One input of a join as the query names it.
#[derive(Clone, Debug)]
struct Side {
    input: String,
    alias: String,
    rel: Relation,
    kind: SideKind,
    at: usize,
}

const SIDES: [&str; 2] = ["left", "right"];

fn err<T>(at: usize, message: impl Into<String>) -> Result<T, SqlError> {
    Err(SqlError::new(at, message))
}

impl Compiler {
    fn statement(&mut self, statement: &Statement, out: &mut TomlOut) -> Result<(), SqlError> {
        match statement {
            Statement::CreateTable(t) => self.table(t, out),
            Statement::CreateView { name, query } => {
                self.fresh_name(name)?;
                let mut namer = Namer { view: name.name.clone(), inner: 0 };
                self.operator(Some(name), query, &mut namer, out).map(|_| ())
            }
            Statement::Insert { target, query } => self.insert(target, query, out),
            Statement::Set { key, value, at } => {
                if key != LATENESS_OPTION {
                    return err(
                        *at,
                        format!(
                            "unknown option {key:?}: braid reads {LATENESS_OPTION:?} (the allowed lateness of the windows after it)"
                        ),
                    );
                }
                let text = value.replace("min", "m");
                match parse_duration(&text) {
                    Ok(ms) if ms >= 0 => self.lateness = Some(ms),
                    _ => {
                        return err(
                            *at,
                            format!("{LATENESS_OPTION}: expected a duration such as '30 s', got {value:?}"),
                        );
                    }
                }
                Ok(())
            }
        }
    }

    fn fresh_name(&self, name: &Ident) -> Result<(), SqlError> {
        if self.catalog.contains_key(&name.name) || self.broken.contains(&name.name) {
            return err(name.at, format!("{:?} is already defined", name.name));
        }
        Ok(())
    }

    fn relation(&self, name: &Ident) -> Result<Relation, SqlError> {
        match self.catalog.get(&name.name) {
            Some(rel) => Ok(rel.clone()),
            None if self.broken.contains(&name.name) => Err(SqlError::quiet(name.at)),
            None => err(
                name.at,
                format!("unknown table or view {:?} (define it above the statement that reads it)", name.name),
            ),
        }
    }

    fn table(&mut self, t: &CreateTable, out: &mut TomlOut) -> Result<(), SqlError> {
        self.fresh_name(&t.name)?;
        if let Some(at) = t.primary_key {
            return err(
                at,
                "PRIMARY KEY is not supported: a table's key is its 'key' option (WITH ('key' = 'device'))",
            );
        }
        let mut fields = Vec::new();
        for column in &t.columns {
            fields.push((column, field_type(column)?));
        }
        let time = time_attribute(t)?;
        let ooo = watermark(t, time.as_ref())?;
        out.line(t.name.at, format!("[streams.{}]", key(&t.name.name)));
        let mut table_key = None;
        for (option, value, at) in &t.options {
            if !TABLE_OPTIONS.contains(&option.as_str()) {
                let why = match option.as_str() {
                    "max_out_of_orderness" => "write WATERMARK FOR rt AS rt - INTERVAL '…' SECOND".to_owned(),
                    _ => format!("braid's options are {}", TABLE_OPTIONS.join(", ")),
                };
                return err(*at, format!("unknown option {option:?}: {why}"));
            }
            if option == "key" {
                // 'site, device': a composite key, written as the list TOML takes.
                let names: Vec<String> = value.split(',').map(|n| n.trim().to_owned()).collect();
                let declared = |name: &String| name == "*" || t.columns.iter().any(|c| c.name.name == *name);
                if let Some(unknown) = names.iter().find(|n| !declared(n)) {
                    return err(*at, format!("key field {unknown:?} is not a column of {}", t.name.name));
                }
                if let [one] = names.as_slice() {
                    out.string(*at, option, one);
                } else {
                    let quoted: Vec<String> = names.iter().map(|n| quote(n)).collect();
                    out.line(*at, format!("key = [{}]", quoted.join(", ")));
                }
                table_key = Some(names);
                continue;
            }
            out.string(*at, option, value);
        }
        if let Some((_, field, unit, at)) = &time {
            out.line(*at, format!("time = {{ field = {}, unit = {} }}", quote(field), quote(unit)));
        }
        if let Some((ms, at)) = ooo {
            out.line(at, format!("max_out_of_orderness = \"{ms}ms\""));
        }
        out.line(t.name.at, format!("[streams.{}.fields]", key(&t.name.name)));
        for (column, ty) in &fields {
            out.line(column.name.at, format!("{} = {}", key(&column.name.name), quote(ty)));
        }
        let rel = Relation {
            fields: t.columns.iter().map(|c| c.name.name.clone()).collect(),
            key: table_key.filter(|k| k != &["*"]).unwrap_or_default(),
            time: time.map(|(name, ..)| name),
        };
        self.catalog.insert(t.name.name.clone(), rel);
        Ok(())
    }

    fn insert(&mut self, target: &Ident, query: &Query, out: &mut TomlOut) -> Result<(), SqlError> {
        if let Query::Select(select) = query
            && let Some(input) = pass_through(select)
        {
            self.relation(input)?;
            self.inserts.push((target.name.clone(), input.name.clone()));
            return Ok(());
        }
        self.fresh_name(target)?;
        let mut namer = Namer { view: target.name.clone(), inner: 0 };
        self.operator(Some(target), query, &mut namer, out)?;
        self.inserts.push((target.name.clone(), target.name.clone()));
        Ok(())
    }

    /// Compiles `query` into operators (the last one named `name`, or an inner name); returns
    /// the last one's name.
    fn operator(
        &mut self,
        name: Option<&Ident>,
        query: &Query,
        namer: &mut Namer,
        out: &mut TomlOut,
    ) -> Result<String, SqlError> {
        let (header_at, rel, body) = match query {
            Query::UnionAll { parts, at } => {
                let mut inputs = Vec::new();
                let mut first: Option<Relation> = None;
                for part in parts {
                    let Some(input) = pass_through(part) else {
                        return err(
                            part.at,
                            "each part of a UNION ALL is SELECT * FROM a table or view (braid's union keeps every field and adds _stream)",
                        );
                    };
                    let rel = self.relation(input)?;
                    first.get_or_insert(rel);
                    inputs.push((input.name.clone(), input.at));
                }
                let first = first.unwrap_or(Relation { fields: Vec::new(), key: Vec::new(), time: None });
                let mut fields = first.fields.clone();
                fields.push("_stream".into());
                let mut body = TomlOut::default();
                body.string(*at, "kind", "union");
                body.line(*at, "inputs = [");
                for (input, at) in inputs {
                    body.line(at, format!("  {},", quote(&input)));
                }
                body.line(*at, "]");
                (*at, Relation { fields, key: first.key, time: Some("_ts".into()) }, body)
            }
            Query::Select(select) => {
                let mut body = TomlOut::default();
                let rel = self.select(select, namer, &mut body, out)?;
                (select.at, rel, body)
            }
        };
        let named = name.map(|n| n.at);
        let name = match name {
            Some(name) => name.name.clone(),
            None => {
                namer.inner += 1;
                let inner = format!("{}_{}", namer.view, namer.inner);
                if self.catalog.contains_key(&inner) {
                    return err(
                        header_at,
                        format!("the operator inside view {} would be named {inner:?}, which is taken", namer.view),
                    );
                }
                inner
            }
        };
        let header_mark = named.unwrap_or(header_at);
        out.line(header_mark, format!("[operators.{}]", key(&name)));
        out.append(body);
        self.catalog.insert(name.clone(), rel);
        Ok(name)
    }

    /// A SELECT with one join: its operator's keys into `body`, inner operators into `out`.
    fn select(
        &mut self,
        s: &Select,
        namer: &mut Namer,
        body: &mut TomlOut,
        out: &mut TomlOut,
    ) -> Result<Relation, SqlError> {
        if s.distinct {
            return err(s.at, "SELECT DISTINCT is not supported: results carry _id, deduplicate by it");
        }
        let join = match s.joins.as_slice() {
            [join] => join,
            [] if !s.group_by.is_empty() => return self.window_aggregate(s, body),
            [] => {
                return err(
                    s.at,
                    "a SELECT over one table (a filter or projection) is not an operator braid has: join it, union it (UNION ALL), aggregate it by window (GROUP BY window_start, window_end, key), or read the table itself",
                );
            }
            [_, second, ..] => {
                return err(second.at, "one JOIN per SELECT: join the result of a view (or a subquery) for a chain");
            }
        };
        if join.kind == JoinKind::Cross {
            return err(
                join.at,
                "a cross join is not supported: join on the keys (JOIN … ON a.key = b.key AND a time bound)",
            );
        }
        if s.from.as_of.is_some() {
            return err(s.from.at, "FOR SYSTEM_TIME AS OF belongs to the right (versioned) table of the join");
        }
        let left = self.side(&s.from, namer, out)?;
        let right = self.side(&join.right, namer, out)?;
        if left.alias == right.alias {
            return err(join.right.at, format!("both sides are called {:?}: give one an alias", left.alias));
        }
        let Some(on) = &join.on else {
            return err(join.at, "a join needs ON a.key = b.key (and a time bound, a window or FOR SYSTEM_TIME AS OF)");
        };
        let sides = [left, right];
        let shapes = (&sides[0].kind, &sides[1].kind, &join.right.as_of);
        let rel = match shapes {
            (SideKind::Plain, SideKind::Plain, Some(as_of)) => self.temporal(s, join, &sides, on, as_of, body)?,
            (SideKind::Plain, SideKind::Plain, None) => self.interval(s, join, &sides, on, body)?,
            (SideKind::Windowed(a), SideKind::Windowed(b), None) => {
                self.window_join(s, join, &sides, [*a, *b], on, body)?
            }
            (SideKind::Aggregated(a, _), SideKind::Aggregated(b, _), None) => {
                self.cogroup(s, join, &sides, [*a, *b], on, body)?
            }
            _ => {
                return err(
                    join.at,
                    "both sides of a join are plain tables (interval join, FOR SYSTEM_TIME AS OF), both windowed by the same TVF (window join), or both window aggregates grouped by the same window (cogroup)",
                );
            }
        };
        Ok(rel)
    }

    fn side(&mut self, r: &TableRef, namer: &mut Namer, out: &mut TomlOut) -> Result<Side, SqlError> {
        let (input, kind) = match &r.source {
            Source::Named(name) => (name.name.clone(), SideKind::Plain),
            Source::Window(tvf) => (tvf.table.name.clone(), SideKind::Windowed(self.window(tvf)?)),
            Source::Subquery(query) => match windowed(query) {
                Some((tvf, None)) => (tvf.table.name.clone(), SideKind::Windowed(self.window(tvf)?)),
                Some((tvf, Some(select))) => {
                    let window = self.window(tvf)?;
                    let rel = self.relation(&tvf.table)?;
                    if let Some(w) = &select.where_ {
                        return err(
                            w.at(),
                            "WHERE inside a cogroup's window aggregate is not supported: a cogroup aggregates every row of its tables (a window aggregate over one table takes WHERE)",
                        );
                    }
                    (tvf.table.name.clone(), SideKind::Aggregated(window, aggregates(select, &rel)?))
                }
                None => (self.operator(None, query, namer, out)?, SideKind::Plain),
            },
        };
        let rel = self.relation(&Ident { name: input.clone(), at: r.at })?;
        let alias = r.alias.as_ref().map_or_else(|| input.clone(), |a| a.name.clone());
        Ok(Side { input, alias, rel, kind, at: r.at })
    }

    fn window(&self, tvf: &Tvf) -> Result<Window, SqlError> {
        let rel = self.relation(&tvf.table)?;
        match &rel.time {
            Some(time) if *time == tvf.descriptor.name => {}
            Some(time) => return err(tvf.descriptor.at, format!("the time attribute of {} is {time}", tvf.table.name)),
            None => {
                return err(
                    tvf.descriptor.at,
                    format!(
                        "{} has no event-time attribute (rt AS TO_TIMESTAMP_LTZ(ts, 3) and a WATERMARK)",
                        tvf.table.name
                    ),
                );
            }
        }
        let durations: Vec<i64> = tvf.args.iter().map(duration).collect::<Result<_, _>>()?;
        let wrong = |want: &str| err(tvf.at, want);
        match tvf.kind {
            TvfKind::Session => {
                // The key's fields, in any order (a session is per key).
                let keyed = !rel.key.is_empty()
                    && tvf.partition_by.len() == rel.key.len()
                    && rel.key.iter().all(|k| tvf.partition_by.iter().any(|p| p.name == *k));
                if !keyed {
                    let at = tvf.partition_by.first().map_or(tvf.at, |k| k.at);
                    return err(
                        at,
                        format!(
                            "braid's sessions are per key: SESSION(TABLE {} PARTITION BY {}, DESCRIPTOR(…), gap)",
                            tvf.table.name,
                            key_text(&rel.key, ", ")
                        ),
                    );
                }
                match durations.as_slice() {
                    [gap] => Ok(Window::Session { gap: *gap }),
                    _ => wrong("SESSION(TABLE t PARTITION BY key, DESCRIPTOR(rt), gap) takes one interval"),
                }
            }
            _ if !tvf.partition_by.is_empty() => err(tvf.partition_by[0].at, "PARTITION BY belongs to SESSION windows"),
            TvfKind::Tumble => match durations.as_slice() {
                [size] => Ok(Window::Tumble { size: *size, offset: 0 }),
                [size, offset] => Ok(Window::Tumble { size: *size, offset: *offset }),
                _ => wrong("TUMBLE(TABLE t, DESCRIPTOR(rt), size [, offset]) takes one or two intervals"),
            },
            TvfKind::Hop => match durations.as_slice() {
                [slide, size] => Ok(Window::Hop { slide: *slide, size: *size, offset: 0 }),
                [slide, size, offset] => Ok(Window::Hop { slide: *slide, size: *size, offset: *offset }),
                _ => wrong("HOP(TABLE t, DESCRIPTOR(rt), slide, size [, offset]) takes two or three intervals"),
            },
            TvfKind::Cumulate => err(tvf.at, "CUMULATE is not supported: braid's windows are TUMBLE, HOP and SESSION"),
        }
    }

    fn header(&self, body: &mut TomlOut, kind: &str, s: &Select, sides: &[Side; 2]) {
        body.string(s.at, "kind", kind);
        body.string(sides[0].at, "left", &sides[0].input);
        body.string(sides[1].at, "right", &sides[1].input);
    }

    fn join_type(join: &Join, body: &mut TomlOut) {
        let kind = match join.kind {
            JoinKind::Inner | JoinKind::Cross => "inner",
            JoinKind::Left => "left",
            JoinKind::Right => "right",
            JoinKind::Full => "full",
        };
        body.string(join.at, "join", kind);
    }

    fn window_keys(&self, body: &mut TomlOut, window: Window, at: usize) {
        let line = match window {
            Window::Tumble { size, offset } => {
                format!("window = {{ kind = \"tumbling\", size = \"{size}ms\"{} }}", offset_key(offset))
            }
            Window::Hop { slide, size, offset } => {
                format!(
                    "window = {{ kind = \"sliding\", size = \"{size}ms\", slide = \"{slide}ms\"{} }}",
                    offset_key(offset)
                )
            }
            Window::Session { gap } => format!("window = {{ kind = \"session\", gap = \"{gap}ms\" }}"),
        };
        body.line(at, line);
        if let Some(ms) = self.lateness {
            body.line(at, format!("allowed_lateness = \"{ms}ms\""));
        }
    }

    fn interval(
        &self,
        s: &Select,
        join: &Join,
        sides: &[Side; 2],
        on: &Expr,
        body: &mut TomlOut,
    ) -> Result<Relation, SqlError> {
        let parts = on_parts(on, sides, true)?;
        let [(lower, lower_ex, lower_at), (upper, upper_ex, upper_at)] = match (parts.lower, parts.upper) {
            (Some(l), Some(u)) => [l, u],
            _ => {
                return err(
                    on.at(),
                    format!(
                        "a join without a time bound would keep every row forever: bound it ({r}.rt BETWEEN {l}.rt - INTERVAL … AND {l}.rt + INTERVAL …, or >, >=, <, <=), window both sides, or join FOR SYSTEM_TIME AS OF",
                        l = sides[0].alias,
                        r = sides[1].alias
                    ),
                );
            }
        };
        self.header(body, "interval_join", s, sides);
        body.line(lower_at, format!("lower = \"{lower}ms\""));
        body.line(upper_at, format!("upper = \"{upper}ms\""));
        if lower_ex {
            body.line(lower_at, "lower_exclusive = true");
        }
        if upper_ex {
            body.line(upper_at, "upper_exclusive = true");
        }
        Self::join_type(join, body);
        pair_where(s, join, &parts.filters, sides, body)?;
        let names = select_list(s, sides, false, body)?;
        Ok(join_output(&sides[0], names, false))
    }

    fn temporal(
        &self,
        s: &Select,
        join: &Join,
        sides: &[Side; 2],
        on: &Expr,
        as_of: &Expr,
        body: &mut TomlOut,
    ) -> Result<Relation, SqlError> {
        if !matches!(join.kind, JoinKind::Inner | JoinKind::Left) {
            return err(join.at, "a temporal join (FOR SYSTEM_TIME AS OF) is INNER or LEFT");
        }
        match time_term(as_of, sides) {
            Ok(Some((0, 0))) => {}
            _ => {
                return err(
                    as_of.at(),
                    format!(
                        "FOR SYSTEM_TIME AS OF takes the left table's time attribute ({}.{})",
                        sides[0].alias,
                        sides[0].rel.time.as_deref().unwrap_or("rt")
                    ),
                );
            }
        }
        let parts = on_parts(on, sides, false)?;
        self.header(body, "temporal_join", s, sides);
        Self::join_type(join, body);
        pair_where(s, join, &parts.filters, sides, body)?;
        let names = select_list(s, sides, false, body)?;
        Ok(join_output(&sides[0], names, false))
    }

    /// Both sides windowed alike and matched on key and window: the operator's kind, inputs and
    /// window.
    fn windowed_header<'e>(
        &self,
        kind: &str,
        s: &Select,
        sides: &[Side; 2],
        windows: [Window; 2],
        on: &'e Expr,
        body: &mut TomlOut,
    ) -> Result<Vec<&'e Expr>, SqlError> {
        same_window(windows, sides)?;
        let parts = on_parts(on, sides, false)?;
        parts.window_bounds(on, sides)?;
        self.header(body, kind, s, sides);
        self.window_keys(body, windows[0], sides[0].at);
        Ok(parts.filters)
    }

    fn window_join(
        &self,
        s: &Select,
        join: &Join,
        sides: &[Side; 2],
        windows: [Window; 2],
        on: &Expr,
        body: &mut TomlOut,
    ) -> Result<Relation, SqlError> {
        let filters = self.windowed_header("window_join", s, sides, windows, on, body)?;
        if join.kind != JoinKind::Inner {
            Self::join_type(join, body);
        }
        pair_where(s, join, &filters, sides, body)?;
        let names = select_list(s, sides, true, body)?;
        Ok(join_output(&sides[0], names, true))
    }

    /// `SELECT key, window_start, window_end, aggregates FROM TABLE(TVF(TABLE t, …)) [WHERE …]
    /// GROUP BY window_start, window_end, key` → window_aggregate.
    fn window_aggregate(&self, s: &Select, body: &mut TomlOut) -> Result<Relation, SqlError> {
        let Source::Window(tvf) = &s.from.source else {
            return err(
                s.from.at,
                "GROUP BY over one table is a window aggregate: FROM TABLE(TUMBLE|HOP|SESSION(TABLE t, DESCRIPTOR(rt), …)) GROUP BY window_start, window_end, key",
            );
        };
        let window = self.window(tvf)?;
        let rel = self.relation(&tvf.table)?;
        let aggregates = aggregates(s, &rel)?;
        body.string(s.at, "kind", "window_aggregate");
        body.string(tvf.table.at, "input", &tvf.table.name);
        self.window_keys(body, window, tvf.at);
        if let Some(w) = &s.where_ {
            let names = [Some(tvf.table.name.as_str()), s.from.alias.as_ref().map(|a| a.name.as_str())];
            let column = |qualifier: Option<&Ident>, name: &Ident| {
                if let Some(q) = qualifier.filter(|q| !names.contains(&Some(q.name.as_str()))) {
                    return err(q.at, format!("unknown alias {:?} (here: {})", q.name, tvf.table.name));
                }
                if !rel.fields.contains(&name.name) {
                    return err(name.at, format!("unknown column {:?}", name.name));
                }
                Ok(name.name.clone())
            };
            body.string(w.at(), "where", &expression(w, &column)?);
        }
        body.line(s.at, "aggregate = [");
        for agg in &aggregates {
            let argument = agg.field.as_deref().unwrap_or("*");
            body.line(agg.at, format!("  {},", quote(&format!("{}({argument}) AS {}", agg.function, agg.alias))));
        }
        body.line(s.at, "]");
        let mut fields: Vec<String> = rel.key.to_vec();
        fields.extend(aggregates.into_iter().map(|a| a.alias));
        fields.extend(WINDOW_META.map(String::from));
        Ok(Relation { fields, key: rel.key.clone(), time: Some("_ts".into()) })
    }

    fn cogroup(
        &self,
        s: &Select,
        join: &Join,
        sides: &[Side; 2],
        windows: [Window; 2],
        on: &Expr,
        body: &mut TomlOut,
    ) -> Result<Relation, SqlError> {
        no_where(s, "cogroups")?;
        if let [first, ..] = self.windowed_header("cogroup", s, sides, windows, on, body)?[..] {
            return err(
                first.at(),
                "a cogroup's ON holds the key equality and the window bounds only: filters are not supported here (a cogroup aggregates groups, not pairs)",
            );
        }
        Self::join_type(join, body);
        let mut names = Vec::new();
        body.line(s.at, "aggregate = [");
        for item in &s.items {
            let SelectItem::Expr { expr: Expr::Column { qualifier, name }, alias } = item else {
                return err(
                    item_at(item),
                    "the SELECT over two window aggregates names their columns (b.views, p.total AS spent)",
                );
            };
            let side = resolve(qualifier.as_ref(), name, sides)?;
            if is_group_column(&name.name, &sides[side].rel) {
                continue;
            }
            let SideKind::Aggregated(_, aggregates) = &sides[side].kind else { continue };
            let Some(agg) = aggregates.iter().find(|a| a.alias == name.name) else {
                return err(name.at, format!("{} has no aggregate named {:?}", sides[side].alias, name.name));
            };
            let out_name = alias.as_ref().map_or(&agg.alias, |a| &a.name);
            let argument = match &agg.field {
                Some(field) => format!("{}.{field}", SIDES[side]),
                None => SIDES[side].to_owned(),
            };
            body.line(name.at, format!("  {},", quote(&format!("{}({argument}) AS {out_name}", agg.function))));
            names.push(out_name.clone());
        }
        body.line(s.at, "]");
        Ok(join_output(&sides[0], names, true))
    }
}

/// `SELECT * FROM name` with nothing else: the input it names.
fn pass_through(s: &Select) -> Option<&Ident> {
    let plain = s.joins.is_empty() && s.where_.is_none() && s.group_by.is_empty() && !s.distinct;
    match (&s.items[..], &s.from.source) {
        ([SelectItem::Star { qualifier: None, .. }], Source::Named(name)) if plain && s.from.as_of.is_none() => {
            Some(name)
        }
        _ => None,
    }
}

/// `SELECT * FROM TABLE(tvf)` → (tvf, None); `SELECT … FROM TABLE(tvf) GROUP BY …` → (tvf, the
/// select); anything else → `None`.
fn windowed(query: &Query) -> Option<(&Tvf, Option<&Select>)> {
    let Query::Select(s) = query else { return None };
    let Source::Window(tvf) = &s.from.source else { return None };
    if !s.joins.is_empty() {
        return None;
    }
    if s.group_by.is_empty() && s.where_.is_none() && matches!(s.items[..], [SelectItem::Star { qualifier: None, .. }])
    {
        return Some((tvf, None));
    }
    if !s.group_by.is_empty() {
        return Some((tvf, Some(s)));
    }
    None
}

fn no_where(s: &Select, what: &str) -> Result<(), SqlError> {
    match &s.where_ {
        Some(w) => err(w.at(), format!("WHERE on {what} is not supported: braid filters pairs of joins")),
        None => Ok(()),
    }
}

/// The filters of ON and, on an inner join, WHERE → `where`, a condition on the pair. An outer
/// join's WHERE is refused: it would filter the outer rows too, where braid's `where` (as ON)
/// decides which pairs join and emits the rest alone.
fn pair_where(
    s: &Select,
    join: &Join,
    filters: &[&Expr],
    sides: &[Side; 2],
    body: &mut TomlOut,
) -> Result<(), SqlError> {
    let mut all: Vec<&Expr> = filters.to_vec();
    if let Some(w) = &s.where_ {
        if !matches!(join.kind, JoinKind::Inner | JoinKind::Cross) {
            return err(
                w.at(),
                "WHERE after an outer join would drop its outer rows too: write the condition in ON (braid's where decides which pairs join, as ON does)",
            );
        }
        all.push(w);
    }
    let Some(first) = all.first() else { return Ok(()) };
    let parts: Vec<String> = all.iter().map(|c| condition(c, sides)).collect::<Result<_, _>>()?;
    let text = if parts.len() == 1 { parts[0].clone() } else { format!("({})", parts.join(" and ")) };
    body.string(first.at(), "where", &text);
    Ok(())
}

fn same_window(windows: [Window; 2], sides: &[Side; 2]) -> Result<(), SqlError> {
    if windows[0] != windows[1] {
        return err(sides[1].at, "both sides must be windowed alike (the same TVF, sizes and offset)");
    }
    Ok(())
}

fn offset_key(offset: i64) -> String {
    if offset == 0 { String::new() } else { format!(", offset = \"{offset}ms\"") }
}

fn item_at(item: &SelectItem) -> usize {
    match item {
        SelectItem::Star { at, .. } => *at,
        SelectItem::Expr { expr, .. } => expr.at(),
    }
}

fn field_type(column: &ColumnDef) -> Result<&'static str, SqlError> {
    let ty = column.ty.name.as_str();
    let braid = match ty {
        "STRING" | "VARCHAR" => "string",
        "BIGINT" => "int",
        "DOUBLE" => "float",
        "BOOLEAN" => "bool",
        "BYTES" | "VARBINARY" => "bytes",
        "INT" | "INTEGER" | "SMALLINT" | "TINYINT" => {
            return err(column.ty.at, format!("{ty}: braid's integers are 64-bit, declare BIGINT"));
        }
        "FLOAT" | "DECIMAL" | "NUMERIC" | "REAL" => {
            return err(column.ty.at, format!("{ty}: braid's floats are doubles, declare DOUBLE"));
        }
        _ => {
            return err(
                column.ty.at,
                format!(
                    "type {ty} is not supported: STRING, BIGINT, DOUBLE, BOOLEAN or BYTES (times are BIGINT with a TO_TIMESTAMP_LTZ time attribute)"
                ),
            );
        }
    };
    if column.decorated {
        return err(
            column.ty.at,
            format!("{ty} with a length, precision or more words is not supported: write {ty} alone"),
        );
    }
    Ok(braid)
}

/// `rt AS TO_TIMESTAMP_LTZ(ts, 3)` → (rt, ts, unit, where); `pt AS PROCTIME()` → none (ingest time).
fn time_attribute(t: &CreateTable) -> Result<Option<(String, String, &'static str, usize)>, SqlError> {
    let mut found = None;
    for (name, expr) in &t.computed {
        let refuse = || {
            err(
                expr.at(),
                "a computed column is the time attribute only: rt AS TO_TIMESTAMP_LTZ(ts, 3) (ms) or (ts, 0) (s)",
            )
        };
        let Expr::Call { name: function, args, star: false, distinct: false } = expr else { return refuse() };
        let function = function.name.to_ascii_uppercase();
        if function == "PROCTIME" && args.is_empty() {
            continue;
        }
        if function != "TO_TIMESTAMP_LTZ" {
            return refuse();
        }
        let unit = match args.as_slice() {
            [Expr::Column { qualifier: None, name: field }, Expr::Number { text, .. }] => match text.as_str() {
                "3" => (field, "ms"),
                "0" => (field, "s"),
                _ => return err(args[1].at(), "the precision is 3 (a BIGINT of ms) or 0 (seconds)"),
            },
            _ => return refuse(),
        };
        if found.is_some() {
            return err(name.at, "a table has one time attribute");
        }
        found = Some((name.name.clone(), unit.0.name.clone(), unit.1, name.at));
    }
    Ok(found)
}

/// `WATERMARK FOR rt AS rt - INTERVAL 'd' UNIT` → (max_out_of_orderness = d − 1 ms, where).
fn watermark(
    t: &CreateTable,
    time: Option<&(String, String, &'static str, usize)>,
) -> Result<Option<(i64, usize)>, SqlError> {
    let Some((column, expr)) = &t.watermark else {
        if let Some((name, .., at)) = time {
            return err(
                *at,
                format!(
                    "an event-time attribute needs a watermark: WATERMARK FOR {name} AS {name} - INTERVAL '0.5' SECOND"
                ),
            );
        }
        return Ok(None);
    };
    let Some((name, ..)) = time else {
        return err(column.at, "WATERMARK FOR needs the time attribute: rt AS TO_TIMESTAMP_LTZ(ts, 3)");
    };
    if column.name != *name {
        return err(column.at, format!("the time attribute is {name}"));
    }
    let is_time = |e: &Expr| matches!(e, Expr::Column { qualifier: None, name: n } if n.name == *name);
    let delay = match expr {
        e if is_time(e) => 0,
        Expr::Binary { op: BinOp::Sub, left, right, .. } if is_time(left) => duration(right)?,
        _ => return err(expr.at(), format!("the watermark is {name} - INTERVAL '…' UNIT (a bounded delay)")),
    };
    if delay < 1 {
        return err(
            expr.at(),
            "braid's watermark trails the largest time by at least 1 ms: the delay must be at least INTERVAL '0.001' SECOND",
        );
    }
    Ok(Some((delay - 1, expr.at())))
}

/// An `INTERVAL '…' UNIT` → ms.
fn duration(e: &Expr) -> Result<i64, SqlError> {
    let Expr::Interval { value, unit, at } = e else {
        return err(e.at(), "expected an interval, as in INTERVAL '5' SECOND");
    };
    let suffix = match unit.trim_end_matches('S') {
        "MILLISECOND" => "ms",
        "SECOND" => "s",
        "MINUTE" => "m",
        "HOUR" => "h",
        "DAY" => "d",
        _ => return err(*at, format!("unit {unit}: MILLISECOND, SECOND, MINUTE, HOUR or DAY")),
    };
    parse_duration(&format!("{}{suffix}", value.trim())).or_else(|e| err(*at, e))
}

fn aggregates(s: &Select, rel: &Relation) -> Result<Vec<Aggregate>, SqlError> {
    let key = key_text(&rel.key, ", ");
    let want = || format!("GROUP BY window_start, window_end, {key} (the table's key)");
    let mut grouped: Vec<&str> = Vec::new();
    for g in &s.group_by {
        match g {
            Expr::Column { name, .. } if is_group_column(&name.name, rel) => grouped.push(&name.name),
            _ => return err(g.at(), want()),
        }
    }
    let needed = ["window_start", "window_end"].into_iter().chain(rel.key.iter().map(String::as_str));
    if rel.key.is_empty() || !needed.into_iter().all(|g| grouped.contains(&g)) {
        return err(s.group_by.first().map_or(s.at, Expr::at), want());
    }
    let mut out = Vec::new();
    for item in &s.items {
        let SelectItem::Expr { expr, alias } = item else {
            return err(item_at(item), "a window aggregate selects the key, window_start, window_end and aggregates");
        };
        match expr {
            Expr::Column { name, .. } if grouped.contains(&name.name.as_str()) => {
                if let Some(alias) = alias.as_ref().filter(|a| a.name != name.name) {
                    return err(
                        alias.at,
                        "braid writes the key under its own name and the window bounds as _window_start and _window_end: select them without AS",
                    );
                }
                continue;
            }
            Expr::Call { name, args, star, distinct } => {
                if *distinct {
                    return err(name.at, "DISTINCT aggregates are not supported");
                }
                let function = match name.name.to_ascii_uppercase().as_str() {
                    "COUNT" => "count",
                    "SUM" => "sum",
                    "MIN" => "min",
                    "MAX" => "max",
                    "FIRST_VALUE" => "first",
                    "LAST_VALUE" => "last",
                    "AVG" => "avg",
                    other => {
                        return err(
                            name.at,
                            format!(
                                "{other} is not an aggregate braid has: COUNT, SUM, MIN, MAX, FIRST_VALUE, LAST_VALUE"
                            ),
                        );
                    }
                };
                let field = match (args.as_slice(), *star) {
                    ([], true) if function == "count" => None,
                    ([Expr::Column { name: field, .. }], false) => {
                        if !rel.fields.contains(&field.name) {
                            return err(field.at, format!("no field {:?} here", field.name));
                        }
                        Some(field.name.clone())
                    }
                    _ => return err(name.at, "an aggregate takes one field (COUNT also *)"),
                };
                let Some(alias) = alias else {
                    return err(name.at, "name the aggregate: COUNT(*) AS views");
                };
                out.push(Aggregate { function, field, alias: alias.name.clone(), at: name.at });
            }
            other => {
                return err(other.at(), "a window aggregate selects the key, window_start, window_end and aggregates");
            }
        }
    }
    Ok(out)
}

fn is_group_column(name: &str, rel: &Relation) -> bool {
    name == "window_start" || name == "window_end" || rel.key.iter().any(|k| k == name)
}

/// A key's field names joined by `separator` (`key` when there are none).
fn key_text(key: &[String], separator: &str) -> String {
    if key.is_empty() { "key".into() } else { key.join(separator) }
}

/// The relation a join's results form: the left key, the selected names, `_kind` (and the
/// window's fields).
fn join_output(left: &Side, names: Vec<String>, window: bool) -> Relation {
    let mut fields: Vec<String> = left.rel.key.clone();
    fields.extend(names.into_iter().filter(|n| !left.rel.key.contains(n)));
    fields.push("_kind".into());
    if window {
        fields.extend(WINDOW_META.map(String::from));
    }
    Relation { fields, key: left.rel.key.clone(), time: Some("_ts".into()) }
}

/// Which side a column belongs to.
fn resolve(qualifier: Option<&Ident>, name: &Ident, sides: &[Side; 2]) -> Result<usize, SqlError> {
    let has = |side: &Side| {
        side.rel.fields.contains(&name.name)
            || side.rel.time.as_deref() == Some(name.name.as_str())
            || match &side.kind {
                SideKind::Plain => false,
                SideKind::Windowed(_) => name.name == "window_start" || name.name == "window_end",
                SideKind::Aggregated(_, aggs) => {
                    is_group_column(&name.name, &side.rel) || aggs.iter().any(|a| a.alias == name.name)
                }
            }
    };
    match qualifier {
        Some(q) => match sides.iter().position(|s| s.alias == q.name) {
            Some(i) if has(&sides[i]) => Ok(i),
            Some(_) => err(name.at, format!("{} has no column {:?}", q.name, name.name)),
            None => err(q.at, format!("unknown alias {:?} (here: {}, {})", q.name, sides[0].alias, sides[1].alias)),
        },
        None => match (has(&sides[0]), has(&sides[1])) {
            (true, false) => Ok(0),
            (false, true) => Ok(1),
            (true, true) => err(
                name.at,
                format!(
                    "{:?} is ambiguous: write {}.{n} or {}.{n}",
                    name.name,
                    sides[0].alias,
                    sides[1].alias,
                    n = name.name
                ),
            ),
            (false, false) => err(name.at, format!("unknown column {:?}", name.name)),
        },
    }
}

/// The select list of a join → `select = [...]` in `body`; returns the output names.
fn select_list(s: &Select, sides: &[Side; 2], windowed: bool, body: &mut TomlOut) -> Result<Vec<String>, SqlError> {
    let mut names = Vec::new();
    body.line(s.at, "select = [");
    for item in &s.items {
        let (qualifier, name, alias) = match item {
            SelectItem::Star { at, .. } => {
                return err(
                    *at,
                    "SELECT * over a join is not supported: name the fields (c.cmd_id, s.seq AS status_seq)",
                );
            }
            SelectItem::Expr { expr: Expr::Column { qualifier, name }, alias } => (qualifier, name, alias),
            SelectItem::Expr { expr, alias } => {
                let Some(alias) = alias else {
                    return err(expr.at(), "a computed select expression needs a name: … AS name");
                };
                let text = format!("{} AS {}", condition(expr, sides)?, alias.name);
                body.line(expr.at(), format!("  {},", quote(&text)));
                names.push(alias.name.clone());
                continue;
            }
        };
        let side = resolve(qualifier.as_ref(), name, sides)?;
        if windowed && (name.name == "window_start" || name.name == "window_end") {
            if let Some(alias) = alias {
                return err(
                    alias.at,
                    format!("braid writes the window bounds as _{} itself: select {} without AS", name.name, name.name),
                );
            }
            continue;
        }
        if sides[side].rel.time.as_deref() == Some(name.name.as_str()) {
            return err(
                name.at,
                "select the time field the attribute is made of (s.ts), not the attribute: braid's results carry _ts",
            );
        }
        let out_name = alias.as_ref().map_or(&name.name, |a| &a.name);
        let text = match alias {
            Some(alias) => format!("{}.{} AS {}", SIDES[side], name.name, alias.name),
            None => format!("{}.{}", SIDES[side], name.name),
        };
        body.line(name.at, format!("  {},", quote(&text)));
        names.push(out_name.clone());
    }
    body.line(s.at, "]");
    Ok(names)
}

/// What the ON condition of a join says.
#[derive(Default)]
struct OnParts<'e> {
    /// The right time minus the left: (bound in ms, exclusive, where).
    lower: Option<(i64, bool, usize)>,
    upper: Option<(i64, bool, usize)>,
    window_start: bool,
    window_end: bool,
    /// The other conjuncts: conditions on the pair (braid's `where`).
    filters: Vec<&'e Expr>,
}

impl OnParts<'_> {
    fn window_bounds(&self, on: &Expr, sides: &[Side; 2]) -> Result<(), SqlError> {
        if !(self.window_start && self.window_end) {
            let (l, r) = (&sides[0].alias, &sides[1].alias);
            return err(
                on.at(),
                format!(
                    "a window join matches the windows: {l}.window_start = {r}.window_start AND {l}.window_end = {r}.window_end"
                ),
            );
        }
        Ok(())
    }
}

fn conjuncts<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::Binary { op: BinOp::And, left, right, .. } => {
            conjuncts(left, out);
            conjuncts(right, out);
        }
        _ => out.push(e),
    }
}

/// Splits ON into the key equality (required), the window bounds, with `bounds` the time bounds
/// of an interval join, and the filters.
fn on_parts<'e>(on: &'e Expr, sides: &[Side; 2], bounds: bool) -> Result<OnParts<'e>, SqlError> {
    let mut list = Vec::new();
    conjuncts(on, &mut list);
    let mut parts = OnParts::default();
    // Per key field (position by position): its equality was written.
    let (lk, rk) = (&sides[0].rel.key, &sides[1].rel.key);
    let mut key_eq = vec![false; lk.len()];
    for c in list {
        if let Expr::Binary { op: BinOp::Eq, left, right, .. } = c
            && let (Expr::Column { qualifier: lq, name: ln }, Expr::Column { qualifier: rq, name: rn }) =
                (&**left, &**right)
        {
            let (a, b) = (resolve(lq.as_ref(), ln, sides)?, resolve(rq.as_ref(), rn, sides)?);
            if a != b {
                let (l, r) = if a == 0 { (ln, rn) } else { (rn, ln) };
                let is_time =
                    sides[0].rel.time.as_deref() == Some(&l.name) && sides[1].rel.time.as_deref() == Some(&r.name);
                if !is_time {
                    if l.name == r.name
                        && (l.name == "window_start" || l.name == "window_end")
                        && !matches!(sides[0].kind, SideKind::Plain)
                    {
                        if l.name == "window_start" {
                            parts.window_start = true
                        } else {
                            parts.window_end = true
                        }
                        continue;
                    }
                    let position = (lk.iter().position(|k| *k == l.name), rk.iter().position(|k| *k == r.name));
                    if let (Some(i), Some(j)) = position
                        && i == j
                    {
                        if key_eq[i] {
                            return err(c.at(), format!("the key equality on {} is written twice", l.name));
                        }
                        key_eq[i] = true;
                        continue;
                    }
                    return err(
                        c.at(),
                        format!(
                            "braid joins on the tables' keys{}: {} ('key' options); other equalities are not supported yet",
                            if lk.len() > 1 { ", field by field in the keys' order" } else { "" },
                            key_equalities(sides)
                        ),
                    );
                }
            }
        }
        if bounds && time_bound(c, sides, &mut parts)? {
            continue;
        }
        parts.filters.push(c);
    }
    if lk.len() != rk.len() && !lk.is_empty() && !rk.is_empty() {
        return err(
            on.at(),
            format!(
                "{} is keyed by ({}), {} by ({}): a join matches keys of as many fields, string or int alike position by position",
                sides[0].alias,
                lk.join(", "),
                sides[1].alias,
                rk.join(", ")
            ),
        );
    }
    if key_eq.is_empty() || key_eq.contains(&false) {
        return err(on.at(), format!("a join needs its keys equal: {}", key_equalities(sides)));
    }
    Ok(parts)
}

/// `a.site = b.site AND a.device = b.device`: the key equalities a join of `sides` needs.
fn key_equalities(sides: &[Side; 2]) -> String {
    let (l, r) = (&sides[0], &sides[1]);
    let name = |key: &[String], i: usize| key.get(i).map_or("key", String::as_str).to_owned();
    let fields = l.rel.key.len().max(r.rel.key.len()).max(1);
    let pairs: Vec<String> = (0..fields)
        .map(|i| format!("{}.{} = {}.{}", l.alias, name(&l.rel.key, i), r.alias, name(&r.rel.key, i)))
        .collect();
    pairs.join(" AND ")
}

/// `x.rt` → (side, 0), `x.rt ± INTERVAL …` → (side, ±ms); `None` when `e` is no time term.
fn time_term(e: &Expr, sides: &[Side; 2]) -> Result<Option<(usize, i64)>, SqlError> {
    match e {
        Expr::Column { qualifier, name } => {
            let side = resolve(qualifier.as_ref(), name, sides)?;
            Ok((sides[side].rel.time.as_deref() == Some(&name.name)).then_some((side, 0)))
        }
        Expr::Binary { op: op @ (BinOp::Add | BinOp::Sub), left, right, .. } => {
            let Some((side, base)) = time_term(left, sides)? else { return Ok(None) };
            let ms = duration(right)?;
            let ms = if *op == BinOp::Add { ms } else { -ms };
            Ok(base.checked_add(ms).map(|total| (side, total)))
        }
        _ => Ok(None),
    }
}

/// A comparison of the two sides' times → a bound on r − l; false when `c` is none.
fn time_bound(c: &Expr, sides: &[Side; 2], parts: &mut OnParts) -> Result<bool, SqlError> {
    let mut set = |op: BinOp, a: &Expr, b: &Expr| -> Result<bool, SqlError> {
        let (Some((sa, da)), Some((sb, db))) = (time_term(a, sides)?, time_term(b, sides)?) else { return Ok(false) };
        if sa == sb {
            return err(c.at(), "a time bound compares the two sides' times");
        }
        // ta + da OP tb + db  ⇔  ta − tb OP db − da; with a = left, flip to r − l.
        let (op, bound) = if sa == 1 { (op, db - da) } else { (flip(op), da - db) };
        let at = c.at();
        let slot = |slot: &mut Option<(i64, bool, usize)>, value| match slot {
            Some(_) => err(at, "the join has two bounds on the same side: one lower and one upper"),
            None => {
                *slot = Some(value);
                Ok(true)
            }
        };
        match op {
            BinOp::Ge => slot(&mut parts.lower, (bound, false, at)),
            BinOp::Gt => slot(&mut parts.lower, (bound, true, at)),
            BinOp::Le => slot(&mut parts.upper, (bound, false, at)),
            BinOp::Lt => slot(&mut parts.upper, (bound, true, at)),
            BinOp::Eq => {
                slot(&mut parts.lower, (bound, false, at)).and_then(|_| slot(&mut parts.upper, (bound, false, at)))
            }
            _ => Ok(false),
        }
    };
    match c {
        Expr::Between { operand, low, high, negated: false, .. } => {
            Ok(set(BinOp::Ge, operand, low)? && set(BinOp::Le, operand, high)?)
        }
        Expr::Binary { op, left, right, .. } => set(*op, left, right),
        _ => Ok(false),
    }
}

fn flip(op: BinOp) -> BinOp {
    match op {
        BinOp::Lt => BinOp::Gt,
        BinOp::Le => BinOp::Ge,
        BinOp::Gt => BinOp::Lt,
        BinOp::Ge => BinOp::Le,
        other => other,
    }
}

/// A WHERE of a join → braid's condition language (`crate::operator::expr`), `left.x`/`right.x`.
fn condition(e: &Expr, sides: &[Side; 2]) -> Result<String, SqlError> {
    expression(e, &|qualifier, name| {
        let side = resolve(qualifier, name, sides)?;
        Ok(format!("{}.{}", SIDES[side], name.name))
    })
}

/// What a column becomes in braid's condition language.
type ColumnName<'c> = dyn Fn(Option<&Ident>, &Ident) -> Result<String, SqlError> + 'c;

/// An SQL expression → braid's condition language, each column written by `column`.
fn expression(e: &Expr, column: &ColumnName<'_>) -> Result<String, SqlError> {
    Ok(match e {
        Expr::Column { qualifier, name } => column(qualifier.as_ref(), name)?,
        Expr::Number { text, .. } => text.clone(),
        Expr::Str { value, .. } => quote(value),
        Expr::Keyword { word, .. } => word.to_ascii_lowercase(),
        Expr::Binary { op, left, right, at } => {
            let op = match op {
                BinOp::And => "and",
                BinOp::Or => "or",
                BinOp::Eq => "==",
                BinOp::Ne => "!=",
                BinOp::Lt => "<",
                BinOp::Le => "<=",
                BinOp::Gt => ">",
                BinOp::Ge => ">=",
                BinOp::Add => "+",
                BinOp::Sub => "-",
                BinOp::Mul => "*",
                BinOp::Div => "/",
                BinOp::Rem => "%",
                BinOp::Concat => return err(*at, "|| is not supported in WHERE"),
            };
            format!("({} {op} {})", expression(left, column)?, expression(right, column)?)
        }
        Expr::Not { operand, .. } => format!("(not {})", expression(operand, column)?),
        Expr::Neg { operand, .. } => format!("(-{})", expression(operand, column)?),
        Expr::Between { operand, low, high, negated, .. } => {
            let x = expression(operand, column)?;
            let inside = format!("({x} >= {} and {x} <= {})", expression(low, column)?, expression(high, column)?);
            if *negated { format!("(not {inside})") } else { inside }
        }
        Expr::Interval { at, .. } => return err(*at, "intervals are not supported in WHERE"),
        Expr::Call { name, args, star: false, distinct: false } if name.name.eq_ignore_ascii_case("COALESCE") => {
            let args: Vec<String> = args.iter().map(|a| expression(a, column)).collect::<Result<_, _>>()?;
            format!("coalesce({})", args.join(", "))
        }
        Expr::Case { arms, otherwise, .. } => {
            let mut text = String::from("(case");
            for (when, then) in arms {
                text += &format!(" when {} then {}", expression(when, column)?, expression(then, column)?);
            }
            if let Some(e) = otherwise {
                text += &format!(" else {}", expression(e, column)?);
            }
            text + " end)"
        }
        Expr::Call { name, .. } => {
            return err(
                name.at,
                format!(
                    "{} is not supported in expressions: fields, literals, arithmetic, comparisons, AND, OR, NOT, BETWEEN, CASE WHEN, COALESCE",
                    name.name
                ),
            );
        }
        Expr::Other { what, at } => {
            return err(
                *at,
                format!(
                    "{what} is not supported in expressions: fields, literals, arithmetic, comparisons, AND, OR, NOT, BETWEEN, CASE WHEN, COALESCE"
                ),
            );
        }
    })
}
