//! The TOML configuration (CONTRACT.md "Configuration") and its validation.
//!
//! Two phases over toml's spanned document (STYLE.md 12): structure (unknown keys, types) and
//! meaning (references, key types, bounds, select fields), both collecting *every* error with the
//! line and column of the offending key or value and the component it belongs to. The result is
//! a [`Plan`] (`src/plan.rs`): streams with positional schemas and operators in topological
//! order, names resolved to positions, ready to run. This module only turns text into a plan; what
//! a plan is, what it derives (readers, chain depth) and the limits it is checked against
//! ([`crate::plan::MAX_SHARDS`] and the rest) live in [`crate::plan`]. Every command loads the whole
//! file the same way, so `validate` passes exactly what `run` and `replay` accept.
//!
//! An operator's `kind` is parsed once into an [`OperatorKind`](crate::operator::OperatorKind);
//! its allowed keys and its checks are chosen by an exhaustive `match` on it
//! (`operators.rs`), so a new kind does not compile until it has both.

mod io;
pub(crate) mod operators;
mod streams;
pub mod walk;

use std::fmt;
use std::path::{Path, PathBuf};

use toml::de::DeTable;

use crate::plan::{MAX_SHARDS, Plan};
use walk::{Errors, Table};

pub use io::{BrokerAccess, DEFAULT_EMBEDDED_LISTEN, MqttConn, Overflow, SinkDef, SinkKind, SourceDef, SourceKind};
pub use streams::StreamDef;

/// Names braid writes into results itself; no field, alias or aggregate may take them.
pub const RESERVED_FIELDS: [&str; 8] =
    ["_id", "_ts", "_kind", "_stream", "_version", "_window_start", "_window_end", "_supersedes"];

/// The output name of rows that could not be used.
pub const DEAD_LETTER: &str = "dead_letter";

/// One configuration error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Byte offset in the file of the key or value the error is about.
    pub offset: usize,
    /// Dotted path of that key, e.g. `operators.effect.lower` (empty for a syntax error).
    pub path: String,
    pub message: String,
}

/// Every error found in one configuration file; displays as `FILE:LINE:COL: PATH: message` lines.
#[derive(Debug)]
pub struct ConfigErrors {
    pub file: String,
    text: String,
    pub errors: Vec<ConfigError>,
}

impl ConfigErrors {
    /// Errors in `text` (the file named `file`).
    pub(crate) fn new(file: &str, text: &str, errors: Vec<ConfigError>) -> ConfigErrors {
        ConfigErrors { file: file.to_owned(), text: text.to_owned(), errors }
    }

    /// (line, column), both from 1; the column counts characters. A key in a `[table]` header
    /// is reported at the header's `[`.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let (line, column) = self.exact_line_col(offset);
        let line_start = self.text[..floor_char_boundary(&self.text, offset)].rfind('\n').map_or(0, |i| i + 1);
        let rest = &self.text[line_start..];
        let header = rest.trim_start_matches([' ', '\t', '\u{feff}']);
        match header.starts_with('[') {
            true => (line, columns(&rest[..rest.len() - header.len()]) + 1),
            false => (line, column),
        }
    }

    /// (line, column) of `offset` itself.
    fn exact_line_col(&self, offset: usize) -> (usize, usize) {
        let before = &self.text[..floor_char_boundary(&self.text, offset)];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        (before.matches('\n').count() + 1, columns(&before[line_start..]) + 1)
    }
}

/// Characters an editor shows: a byte-order mark takes no column.
fn columns(s: &str) -> usize {
    s.chars().filter(|&c| c != '\u{feff}').count()
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.errors {
            let (line, col) = if e.path.is_empty() { self.exact_line_col(e.offset) } else { self.line_col(e.offset) };
            let path = if e.path.is_empty() { String::new() } else { format!("{}: ", e.path) };
            writeln!(f, "{}:{line}:{col}: {path}{}", self.file, e.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    Process,
    Power,
}

/// `[runtime]`: settings of the shard runtime and the service around it.
#[derive(Clone, Debug)]
pub struct RuntimeSettings {
    /// `None`: one shard per core.
    pub shards: Option<usize>,
    pub state_dir: Option<PathBuf>,
    /// `braid run`: where the rings and the shards' arenas go (scratch, rebuilt at every start),
    /// in a subdirectory of their own; `None`: `$RUNTIME_DIRECTORY`, else `/dev/shm`, else
    /// `STATE_DIR/run` (`service::scratch`).
    pub scratch_dir: Option<PathBuf>,
    pub durability: Durability,
    pub checkpoint_interval: i64,
    pub idle_advance: bool,
    /// `braid run`: processing time the ingest journal keeps (ms, default 10 min) — what a restart
    /// replays to rebuild operator state (`service::journal`).
    pub journal_retention: i64,
    /// `braid run`: bytes the ingest journal may hold (default 1 GiB); beyond, its oldest entries
    /// go early (counted).
    pub journal_bytes: u64,
    /// Bytes of operator state one shard may hold (`None`: no bound); `state/budget.rs`.
    pub state_budget: Option<u64>,
    /// What a shard does at its budget.
    pub on_state_full: OnStateFull,
}

/// `runtime.on_state_full`: what a shard does when its state reaches `state_budget`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnStateFull {
    /// The intake takes no input until state frees (the brokers keep the messages).
    #[default]
    Backpressure,
    /// The oldest rows by (ts, id) go to `OPERATOR.expired` with `_reason` `budget`.
    EvictOldest,
}

/// Reads and checks a configuration file.
pub fn load(path: &Path) -> Result<Plan, ConfigErrors> {
    let file = path.display().to_string();
    match std::fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) if path.extension().is_some_and(|e| e == "sql") => crate::sql::load(&file, &text),
            Ok(text) => parse(&file, &text),
            Err(e) => {
                let offset = e.utf8_error().valid_up_to();
                let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
                Err(ConfigErrors { file, text, errors: vec![syntax_error(offset, "invalid UTF-8".into())] })
            }
        },
        Err(e) => {
            Err(ConfigErrors { file, text: String::new(), errors: vec![syntax_error(0, format!("cannot read: {e}"))] })
        }
    }
}

/// An error about the file itself rather than a key: reported at its exact position.
fn syntax_error(offset: usize, message: String) -> ConfigError {
    ConfigError { offset, path: String::new(), message }
}

/// Checks configuration text; `file` names it in error messages. A `[pipeline] sql` string is
/// compiled ([`crate::sql`]) and its streams and operators checked with the rest of the file.
pub fn parse(file: &str, text: &str) -> Result<Plan, ConfigErrors> {
    let document = match DeTable::parse(text) {
        Ok(document) => document,
        Err(e) => {
            let offset = e.span().map_or(0, |s| s.start);
            return Err(ConfigErrors::new(file, text, vec![syntax_error(offset, e.message().trim().to_owned())]));
        }
    };
    let sql = document.get_ref().get("pipeline").and_then(|p| match p.get_ref() {
        toml::de::DeValue::Table(t) => t.get("sql"),
        _ => None,
    });
    if let Some(sql) = sql
        && let toml::de::DeValue::String(s) = sql.get_ref()
    {
        return crate::sql::expand_pipeline(file, text, sql.span(), s);
    }
    check_generated(file, text, text, usize::MAX, &|offset| offset, &[])
}

/// Checks `toml`, whose text from `generated_from` on was compiled from SQL: an error there is
/// moved to `relocate(offset − generated_from)` of `shown` (the text of `file`, which positions
/// refer to) and named in SQL's words. `inserts`: `INSERT INTO sink` feeds (sink, input).
pub(crate) fn check_generated(
    file: &str,
    shown: &str,
    toml: &str,
    generated_from: usize,
    relocate: &dyn Fn(usize) -> usize,
    inserts: &[(String, String)],
) -> Result<Plan, ConfigErrors> {
    let place = |mut e: ConfigError| {
        if e.offset >= generated_from {
            e.offset = relocate(e.offset - generated_from);
            e.path = crate::sql::component(&e.path);
        }
        e
    };
    let document = match DeTable::parse(toml) {
        Ok(document) => document,
        Err(e) => {
            let offset = e.span().map_or(0, |s| s.start);
            let error = place(syntax_error(offset, e.message().trim().to_owned()));
            return Err(ConfigErrors::new(file, shown, vec![error]));
        }
    };
    let mut errors = Errors::default();
    let root = Table { path: "", span: &(0..0), table: document.get_ref() };
    let plan = check(root, inserts, &mut errors);
    match plan {
        Some(mut plan) if errors.list.is_empty() => {
            let warnings = errors.warnings.into_iter().map(place).collect();
            let located = ConfigErrors::new(file, shown, warnings);
            plan.warnings = located
                .errors
                .iter()
                .map(|w| {
                    let (line, col) = located.line_col(w.offset);
                    format!("{file}:{line}:{col}: warning: {}: {}", w.path, w.message)
                })
                .collect();
            Ok(plan)
        }
        _ => {
            let mut list: Vec<ConfigError> = errors.list.into_iter().map(place).collect();
            list.sort_by_key(|e| e.offset);
            Err(ConfigErrors::new(file, shown, list))
        }
    }
}

const SECTIONS: [&str; 7] = ["runtime", "ops", "sources", "streams", "operators", "sinks", "pipeline"];

fn check(root: Table<'_, '_>, inserts: &[(String, String)], errors: &mut Errors) -> Option<Plan> {
    root.check_keys(&SECTIONS, errors);
    let empty = DeTable::default();
    let spans: Vec<_> = SECTIONS.iter().map(|name| root.table(name, errors).unwrap_or((0..0, &empty))).collect();
    let [runtime_t, ops_t, sources_t, streams_t, operators_t, sinks_t, pipeline_t] =
        [0, 1, 2, 3, 4, 5, 6].map(|i| Table { path: SECTIONS[i], span: &spans[i].0, table: spans[i].1 });
    pipeline_t.check_keys(&["sql"], errors);
    if pipeline_t.get("sql").is_some_and(|v| v.get_ref().as_str().is_none()) {
        pipeline_t.error("sql", errors, "expected a string of SQL (sql = \"\"\" … \"\"\")");
    }
    let runtime = runtime(runtime_t, errors);
    let (ops_listen, ops_thresholds) = ops(ops_t, errors);
    let sources = io::sources(sources_t, errors);
    let streams = streams::streams(streams_t, &sources, errors);
    let graph = operators::operators(operators_t, &streams, errors);
    let sinks = io::sinks(sinks_t, &streams, &graph, inserts, errors);
    let mut plan = Plan::new(runtime, ops_listen, sources, streams.defs, graph.operators, sinks);
    plan.ops_thresholds = ops_thresholds;
    crate::state::budget::check_budget(&plan, runtime_t, errors);
    Some(plan)
}

fn runtime(t: Table<'_, '_>, errors: &mut Errors) -> RuntimeSettings {
    t.check_keys(
        &[
            "shards",
            "state_dir",
            "scratch_dir",
            "durability",
            "checkpoint_interval",
            "idle_advance",
            "journal_retention",
            "journal_bytes",
            "state_budget",
            "on_state_full",
        ],
        errors,
    );
    let shards = match t.get("shards").map(|v| v.get_ref()) {
        None => None,
        Some(toml::de::DeValue::String(s)) if s == "auto" => None,
        Some(toml::de::DeValue::Integer(_)) => {
            match t.int("shards", errors).and_then(|(n, _)| usize::try_from(n).ok()) {
                Some(n) if (1..=MAX_SHARDS).contains(&n) => Some(n),
                _ => {
                    t.error("shards", errors, format!("expected \"auto\" or a number from 1 to {MAX_SHARDS}"));
                    None
                }
            }
        }
        Some(_) => {
            t.error("shards", errors, format!("expected \"auto\" or a number from 1 to {MAX_SHARDS}"));
            None
        }
    };
    let state_dir = t.str("state_dir", errors).map(|(s, _)| PathBuf::from(s));
    let scratch_dir = t.str("scratch_dir", errors).map(|(s, _)| PathBuf::from(s));
    let durability = match t.str("durability", errors) {
        None | Some(("process", _)) => Durability::Process,
        Some(("power", _)) => Durability::Power,
        Some((_, span)) => {
            errors.at(&span, "runtime.durability", "expected \"process\" or \"power\"");
            Durability::Process
        }
    };
    let checkpoint_interval = match t.duration("checkpoint_interval", errors) {
        Some(ms) if ms <= 0 => {
            t.error("checkpoint_interval", errors, "must be positive");
            1000
        }
        Some(ms) => ms,
        None => 1000,
    };
    let idle_advance = t.bool("idle_advance", true, errors);
    let journal_retention = t.duration_or("journal_retention", 10 * 60_000, errors);
    if journal_retention <= 0 {
        t.error("journal_retention", errors, "must be positive");
    }
    let journal_bytes = t.size_or("journal_bytes", 1 << 30, errors);
    if journal_bytes < 1 << 20 {
        t.error("journal_bytes", errors, "must be at least 1MiB");
    }
    let state_budget = t.str("state_budget", errors).and_then(|(text, span)| match walk::parse_size(text) {
        Some(0) | None => {
            let message = format!("expected a size such as \"256MiB\" (bytes of state per shard), got {text:?}");
            errors.at(&span, "runtime.state_budget", message);
            None
        }
        Some(bytes) => Some(bytes),
    });
    let on_state_full = match t.str("on_state_full", errors) {
        None | Some(("backpressure", _)) => OnStateFull::Backpressure,
        Some(("evict_oldest", _)) => OnStateFull::EvictOldest,
        Some((_, span)) => {
            errors.at(&span, "runtime.on_state_full", "expected \"backpressure\" or \"evict_oldest\"");
            OnStateFull::Backpressure
        }
    };
    if state_budget.is_none() && t.get("on_state_full").is_some() && t.get("state_budget").is_none() {
        t.error("on_state_full", errors, "needs runtime.state_budget (the bound it acts at)");
    }
    RuntimeSettings {
        shards,
        state_dir,
        scratch_dir,
        durability,
        checkpoint_interval,
        idle_advance,
        journal_retention,
        journal_bytes,
        state_budget,
        on_state_full,
    }
}

fn ops(t: Table<'_, '_>, errors: &mut Errors) -> (String, crate::ops::warnings::Thresholds) {
    t.check_keys(&["listen", "no_match_warning", "state_stall_warning"], errors);
    let defaults = crate::ops::warnings::Thresholds::default();
    let thresholds = crate::ops::warnings::Thresholds {
        no_match_ms: t.duration_or("no_match_warning", defaults.no_match_ms, errors),
        state_stall_ms: t.duration_or("state_stall_warning", defaults.state_stall_ms, errors),
    };
    let listen = match t.str("listen", errors) {
        Some(("", _)) => String::new(),
        Some((listen, span)) => {
            if listen.parse::<std::net::SocketAddr>().is_err() {
                errors.at(
                    &span,
                    "ops.listen",
                    format!("expected \"host:port\" (e.g. \"127.0.0.1:9464\") or \"\", got {listen:?}"),
                );
            }
            listen.to_owned()
        }
        None => "127.0.0.1:9464".to_owned(),
    };
    (listen, thresholds)
}

#[cfg(test)]
mod tests;
