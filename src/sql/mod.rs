//! The SQL front end: a pipeline's streams and operators written in a Flink-SQL subset
//! (CONTRACT.md "Extensions under way", README.md "SQL"), in a `.sql` file given to `--config`
//! or in `[pipeline] sql = """…"""` of a TOML configuration.
//!
//! # Design: SQL compiles to the TOML it stands for
//!
//! The compiler writes the `[streams.NAME]` and `[operators.NAME]` tables the SQL means, and the
//! configuration checks them exactly as if they had been written by hand ([`crate::config`]).
//! So an SQL pipeline and its TOML twin are one plan by construction — the same operator kinds,
//! names, settings and therefore the same `_id`s — and every check (types, keys, bounds, select
//! fields, sinks) has one home. What the compiler adds is the mapping and the refusals: it
//! recognises each operator by the shape of its query and refuses every other shape, at its
//! line and column, with what braid supports instead (never a silent reinterpretation).
//!
//! Positions: every line of the generated TOML remembers the SQL offset it came from
//! ([`toml_out::TomlOut`]); an error the configuration finds there is reported at that offset
//! of the file holding the SQL — the `.sql` file, or for `[pipeline] sql` the TOML file (the
//! string's offset plus the offset within it, exact when the string has no escapes, else the
//! string's start). Error paths name tables and views (`view effect`) instead of TOML keys.
//!
//! # The mapping
//!
//! - `CREATE TABLE t (cols, rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL 'd'
//!   UNIT) WITH ('key' = …)` → `[streams.t]`: `time = { field = "ts", unit = "ms" }` (precision 0:
//!   `"s"`), `max_out_of_orderness` = d − 1 ms (Flink's watermark is max − d, braid's max −
//!   out_of_orderness − 1 ms), the WITH options as stream keys. Types: STRING/VARCHAR, BIGINT,
//!   DOUBLE, BOOLEAN, BYTES/VARBINARY. `PROCTIME()` (or no time attribute) is ingest time.
//! - `CREATE VIEW v AS q` → operator(s), the last named `v`; an operator inside `q` (a join in a
//!   subquery) is `v_1`, `v_2`, … numbered upstream first. `INSERT INTO s q` is the same with
//!   the name `s`, and a `[sinks.s]` takes its result (`INSERT INTO s SELECT * FROM x`: takes x).
//! - The query shapes: `a [LEFT|RIGHT|FULL] JOIN b ON key = key AND <time bounds>` → interval
//!   join; `… JOIN b FOR SYSTEM_TIME AS OF a.rt ON …` → temporal join; two `TABLE(TUMBLE|HOP|
//!   SESSION(…))` sides joined on key, window_start, window_end → window join (WHERE → `where`);
//!   two `GROUP BY window_start, window_end, key` subqueries over the same window joined alike →
//!   cogroup; `SELECT * FROM a UNION ALL SELECT * FROM b` → union. `SET
//!   'table.exec.emit.allow-lateness' = '30 s'` sets the windows' `allowed_lateness` from there on.
//!
//! # Robustness
//!
//! The lexer and the recursive-descent parser return an error with a position for any input;
//! nesting is capped ([`parser::MAX_NESTING`]) so no input exhausts the stack (property-tested in
//! `tests.rs`: arbitrary text and token soup never panic).

mod ast;
mod compile;
pub mod export;
mod lexer;
mod parser;
#[cfg(test)]
mod tests;
mod toml_out;

use crate::config::{self, ConfigError, ConfigErrors};
use crate::plan::Plan;

pub use compile::Compiled;

/// An error in SQL text: where (a byte offset) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlError {
    pub offset: usize,
    pub message: String,
}

impl SqlError {
    pub fn new(offset: usize, message: impl Into<String>) -> SqlError {
        SqlError { offset, message: message.into() }
    }

    /// An error already reported elsewhere (a statement reads a table whose own statement
    /// failed): dropped before errors are shown.
    fn quiet(offset: usize) -> SqlError {
        SqlError { offset, message: String::new() }
    }
}

/// Parses and compiles SQL text into the TOML of its streams and operators.
pub fn compile(sql: &str) -> Result<Compiled, Vec<SqlError>> {
    let statements = parser::parse(sql).map_err(|e| vec![e])?;
    compile::compile(&statements).map_err(|errors| {
        let shown: Vec<SqlError> = errors.into_iter().filter(|e| !e.message.is_empty()).collect();
        if shown.is_empty() { vec![SqlError::new(0, "the pipeline has errors")] } else { shown }
    })
}

/// A `.sql` configuration file: streams and operators only, runtime defaults.
pub fn load(file: &str, sql: &str) -> Result<Plan, ConfigErrors> {
    match compile(sql) {
        Ok(compiled) => {
            let relocate = |offset: usize| compiled.toml.sql_offset(offset);
            config::check_generated(file, sql, &compiled.toml.text, 0, &relocate, &compiled.inserts)
        }
        Err(errors) => Err(ConfigErrors::new(file, sql, errors.into_iter().map(located).collect())),
    }
}

fn located(e: SqlError) -> ConfigError {
    ConfigError { offset: e.offset, path: String::new(), message: e.message }
}

/// `[pipeline] sql` of a TOML file: the file's text with the SQL's streams and operators
/// appended, checked as one configuration; positions in the SQL are the TOML file's.
/// `value_span` is where the string value is written in `text`, `sql` its contents.
pub(crate) fn expand_pipeline(
    file: &str,
    text: &str,
    value_span: std::ops::Range<usize>,
    sql: &str,
) -> Result<Plan, ConfigErrors> {
    let start = content_start(text, value_span, sql);
    let in_file = |offset: usize| match start {
        Ok(s) => s + offset,
        Err(s) => s,
    };
    match compile(sql) {
        Ok(compiled) => {
            let combined = format!("{text}\n{}", compiled.toml.text);
            let base = text.len() + 1;
            let relocate = |offset: usize| in_file(compiled.toml.sql_offset(offset));
            config::check_generated(file, text, &combined, base, &relocate, &compiled.inserts)
        }
        Err(errors) => {
            let errors = errors.into_iter().map(|e| SqlError { offset: in_file(e.offset), ..e }).map(located).collect();
            Err(ConfigErrors::new(file, text, errors))
        }
    }
}

/// Where the contents of the string at `span` start in `text`, when the file holds them as they
/// are (no escapes); else where the string starts (`Err`), so positions stay inside the string.
fn content_start(text: &str, span: std::ops::Range<usize>, sql: &str) -> Result<usize, usize> {
    let raw = text.get(span.clone()).unwrap_or("");
    let delimiter = ["\"\"\"", "'''", "\"", "'"].into_iter().find(|d| raw.starts_with(d)).unwrap_or("");
    let mut body_start = span.start + delimiter.len();
    if delimiter.len() == 3 {
        let rest = text.get(body_start..).unwrap_or("");
        body_start += if rest.starts_with("\r\n") { 2 } else { usize::from(rest.starts_with('\n')) };
    }
    match text.get(body_start..body_start + sql.len()) {
        Some(body) if body == sql => Ok(body_start),
        _ => Err(span.start),
    }
}

/// A configuration path of generated TOML in SQL's words: `streams.t.key` → `table t`,
/// `operators.v.select` → `view v`.
pub(crate) fn component(path: &str) -> String {
    let mut parts = path.splitn(3, '.');
    match (parts.next(), parts.next()) {
        (Some("streams"), Some(name)) => format!("table {name}"),
        (Some("operators"), Some(name)) => format!("view {name}"),
        _ => path.to_owned(),
    }
}
