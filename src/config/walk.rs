//! Walking toml's spanned tables (STYLE.md 12): every accessor records its error with the
//! position of the offending key or value and returns `None`, so one pass reports every error.
//!
//! Positions: an error points at the key it is about (for a bad value, the key that holds it;
//! for a list item, the list's key), and an error about a missing key at the table that lacks it
//! — at the `[` of its header when it has one (see `ConfigErrors::line_col`).

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::ConfigError;

/// Every error found so far, and the warnings: settings that are valid but make matches unlikely
/// (they do not change `validate`'s exit status).
#[derive(Default)]
pub struct Errors {
    pub list: Vec<ConfigError>,
    pub warnings: Vec<ConfigError>,
}

impl Errors {
    pub fn warn(&mut self, span: &Range<usize>, path: &str, message: impl Into<String>) {
        self.warnings.push(ConfigError { offset: span.start, path: path.to_owned(), message: message.into() });
    }

    pub fn at(&mut self, span: &Range<usize>, path: &str, message: impl Into<String>) {
        self.list.push(ConfigError { offset: span.start, path: path.to_owned(), message: message.into() });
    }

    pub fn count(&self) -> usize {
        self.list.len()
    }
}

pub type Value<'a, 'i> = &'a Spanned<DeValue<'i>>;

/// A TOML table with its dotted path (`operators.effect`) and position.
#[derive(Clone, Copy)]
pub struct Table<'a, 'i> {
    pub path: &'a str,
    pub span: &'a Range<usize>,
    pub table: &'a DeTable<'i>,
}

pub fn type_name(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a date-time",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

impl<'a, 'i> Table<'a, 'i> {
    pub fn child_path(&self, key: &str) -> String {
        if self.path.is_empty() { key.to_owned() } else { format!("{}.{key}", self.path) }
    }

    /// Records an error for every key not in `allowed`.
    pub fn check_keys(&self, allowed: &[&str], errors: &mut Errors) {
        for (key, _) in self.table.iter() {
            if !allowed.contains(&key.get_ref().as_ref()) {
                let mut known = allowed.to_vec();
                known.sort_unstable();
                errors.at(
                    &key.span(),
                    &self.child_path(key.get_ref()),
                    format!("unknown key (known here: {})", known.join(", ")),
                );
            }
        }
    }

    pub fn get(&self, key: &str) -> Option<Value<'a, 'i>> {
        self.table.get(key)
    }

    /// Where `key` is written (the table's own position when it is absent).
    pub fn key_span(&self, key: &str) -> Range<usize> {
        self.table.get_key_value(key).map_or_else(|| self.span.clone(), |(k, _)| k.span())
    }

    pub fn error(&self, key: &str, errors: &mut Errors, message: impl Into<String>) {
        errors.at(&self.key_span(key), &self.child_path(key), message);
    }

    pub fn missing(&self, key: &str, errors: &mut Errors, what: &str) {
        errors.at(self.span, &self.child_path(key), format!("required: {what}"));
    }

    fn wrong_type(&self, key: &str, v: Value<'a, 'i>, expected: &str, errors: &mut Errors) {
        self.error(key, errors, format!("expected {expected}, found {}", type_name(v.get_ref())));
    }

    /// A string value and the key's position; `None` (with an error) when present and not a
    /// string.
    pub fn str(&self, key: &str, errors: &mut Errors) -> Option<(&'a str, Range<usize>)> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::String(s) => Some((s.as_ref(), self.key_span(key))),
            _ => {
                self.wrong_type(key, v, "a string", errors);
                None
            }
        }
    }

    pub fn required_str(&self, key: &str, errors: &mut Errors, what: &str) -> Option<(&'a str, Range<usize>)> {
        if self.get(key).is_none() {
            self.missing(key, errors, what);
        }
        self.str(key, errors)
    }

    pub fn bool(&self, key: &str, default: bool, errors: &mut Errors) -> bool {
        match self.get(key) {
            None => default,
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => *b,
                _ => {
                    self.wrong_type(key, v, "true or false", errors);
                    default
                }
            },
        }
    }

    pub fn int(&self, key: &str, errors: &mut Errors) -> Option<(i64, Range<usize>)> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::Integer(i) => match i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()) {
                Ok(n) => Some((n, self.key_span(key))),
                Err(_) => {
                    self.error(key, errors, "integer out of range");
                    None
                }
            },
            _ => {
                self.wrong_type(key, v, "an integer", errors);
                None
            }
        }
    }

    /// A sub-table and the key's position.
    pub fn table(&self, key: &str, errors: &mut Errors) -> Option<(Range<usize>, &'a DeTable<'i>)> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::Table(t) => Some((self.key_span(key), t)),
            _ => {
                self.wrong_type(key, v, "a table", errors);
                None
            }
        }
    }

    /// The entries of a section such as `[streams]`: (name, span of the name, value).
    pub fn entries(&self) -> impl Iterator<Item = (&'a str, Range<usize>, Value<'a, 'i>)> {
        self.table.iter().map(|(k, v)| (k.get_ref().as_ref(), k.span(), v))
    }

    /// A list of strings: each with its span; `None` when absent or not a list of strings.
    pub fn str_list(&self, key: &str, errors: &mut Errors) -> Option<Vec<(&'a str, Range<usize>)>> {
        let v = self.get(key)?;
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong_type(key, v, "a list of strings", errors);
            return None;
        };
        let mut out = Vec::new();
        for item in items.iter() {
            match item.get_ref() {
                DeValue::String(s) => out.push((s.as_ref(), self.key_span(key))),
                other => self.error(key, errors, format!("expected a string, found {}", type_name(other))),
            }
        }
        (out.len() == items.len()).then_some(out)
    }

    /// `key`: one field name, or a list of them for a composite key (non-empty, no name twice);
    /// `None` when absent or in error (reported).
    pub fn key_names(&self, key: &str, errors: &mut Errors) -> Option<Vec<(&'a str, Range<usize>)>> {
        let v = self.get(key)?;
        if let DeValue::String(s) = v.get_ref() {
            return Some(vec![(s.as_ref(), self.key_span(key))]);
        }
        let DeValue::Array(_) = v.get_ref() else {
            self.wrong_type(key, v, "a field name or a list of field names", errors);
            return None;
        };
        let names = self.str_list(key, errors)?;
        if names.is_empty() {
            self.error(key, errors, "an empty list: name the key field, or several for a composite key");
            return None;
        }
        for (i, (name, span)) in names.iter().enumerate() {
            if names[..i].iter().any(|(n, _)| n == name) {
                errors.at(span, &self.child_path(key), format!("{name:?} is named twice in the key"));
                return None;
            }
        }
        Some(names)
    }

    /// A required non-empty list of strings; one error whatever is wrong with it.
    pub fn required_list(&self, key: &str, errors: &mut Errors, what: &str) -> Option<Vec<(&'a str, Range<usize>)>> {
        if self.get(key).is_none() {
            self.missing(key, errors, what);
            return None;
        }
        let list = self.str_list(key, errors)?;
        if list.is_empty() {
            self.error(key, errors, format!("must not be empty: {what}"));
            return None;
        }
        Some(list)
    }

    /// A duration (`"-3s"`, `"500ms"`), negative allowed.
    pub fn duration(&self, key: &str, errors: &mut Errors) -> Option<i64> {
        let (text, span) = self.str(key, errors)?;
        match parse_duration(text) {
            Ok(ms) => Some(ms),
            Err(e) => {
                errors.at(&span, &self.child_path(key), e);
                None
            }
        }
    }

    /// A non-negative duration with a default; errors leave the default in place.
    pub fn duration_or(&self, key: &str, default: i64, errors: &mut Errors) -> i64 {
        match self.duration(key, errors) {
            Some(ms) if ms < 0 => {
                self.error(key, errors, "must not be negative");
                default
            }
            Some(ms) => ms,
            None => default,
        }
    }

    /// A size (`"256KiB"`) with a default.
    pub fn size_or(&self, key: &str, default: u64, errors: &mut Errors) -> u64 {
        let Some((text, span)) = self.str(key, errors) else { return default };
        parse_size(text).unwrap_or_else(|| {
            errors.at(&span, &self.child_path(key), format!("expected a size such as \"256KiB\", got {text:?}"));
            default
        })
    }
}

const DURATION_UNITS: [(&str, i128); 5] = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)];

/// `"-3s"`, `"500ms"`, `"1.5s"` → ms. Units: ms, s, m, h, d; a whole number of ms.
pub fn parse_duration(text: &str) -> Result<i64, String> {
    let bad = || format!("bad duration {text:?} (want e.g. \"500ms\", \"-3s\", \"10m\", \"7d\")");
    let t = text.trim();
    let (negative, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let number_end = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (&t[..number_end], t[number_end..].trim_start());
    let &(_, scale) = DURATION_UNITS.iter().find(|(u, _)| *u == unit).ok_or_else(bad)?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let all_digits = |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(whole) || (number.contains('.') && !all_digits(fraction)) {
        return Err(bad());
    }
    let denominator = 10i128.pow(fraction.len() as u32);
    let numerator =
        (whole.parse::<i128>().map_err(|_| bad())? * denominator + fraction.parse::<i128>().unwrap_or(0)) * scale;
    if numerator % denominator != 0 {
        return Err(format!("{text:?} is not a whole number of milliseconds"));
    }
    let ms = numerator / denominator;
    let ms = if negative { -ms } else { ms };
    i64::try_from(ms).map_err(|_| format!("{text:?} is too long"))
}

/// `"256KiB"`, `"64MiB"`, `"1GiB"`, `"512B"`, `"100"` → bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let number: u64 = t[..digits_end].parse().ok()?;
    let scale = match t[digits_end..].trim_start() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    number.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("-3s"), Ok(-3000));
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration(" 1.5 s "), Ok(1500));
        assert_eq!(parse_duration("+10m"), Ok(600_000));
        assert_eq!(parse_duration("7d"), Ok(604_800_000));
        assert!(parse_duration("1.0005s").is_err());
        assert!(parse_duration("3").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1.s").is_err());
        assert!(parse_duration("--1s").is_err());
        assert!(parse_duration("99999999999999999d").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256KiB"), Some(262_144));
        assert_eq!(parse_size("64B"), Some(64));
        assert_eq!(parse_size("10"), Some(10));
        assert_eq!(parse_size("1 MiB"), Some(1 << 20));
        assert_eq!(parse_size("1MB"), None);
        assert_eq!(parse_size("-1B"), None);
    }
}
