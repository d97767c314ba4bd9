//! Reading Prometheus text (exposition format 0.0.4), the little that `braid status` needs.
//!
//! Design: a scrape is a flat list of samples — name, labels in the order written, value. `#`
//! lines (HELP, TYPE and plain comments) and blank lines are skipped; a label value may hold the
//! escapes `\\`, `\"` and `\n`; a value is a float (`NaN`, `+Inf` and `-Inf` included) and may be
//! followed by a timestamp, which is ignored. A malformed line is an error naming its line number:
//! braid's own endpoint never writes one, so it means the address is something else.

/// One sample: `name{label="value",...} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Labels,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// Every sample of one answer of `/metrics`, in the order written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scrape {
    pub samples: Vec<Sample>,
}

/// A line that is not Prometheus text.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line}: {what}: {text:?}")]
pub struct ParseError {
    pub line: usize,
    pub what: &'static str,
    pub text: String,
}

impl Scrape {
    pub fn parse(text: &str) -> Result<Scrape, ParseError> {
        let mut samples = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fail = |what| ParseError { line: i + 1, what, text: line.to_owned() };
            samples.push(sample(line).map_err(fail)?);
        }
        Ok(Scrape { samples })
    }

    /// The samples of metric `name`.
    pub fn family<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// The value of `name` whose labels include every `(key, value)` of `labels`; the first such.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.family(name).find(|s| labels.iter().all(|(k, v)| s.label(k) == Some(*v))).map(|s| s.value)
    }

    /// The sum of every sample of `name` whose labels include `labels`; None when there is none.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.family(name)
            .filter(|s| labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
            .map(|s| s.value)
            .fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
    }

    /// The distinct values of label `key` over the samples of `name`, in first-seen order.
    pub fn label_values(&self, name: &str, key: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for v in self.family(name).filter_map(|s| s.label(key)) {
            if !out.iter().any(|o| o == v) {
                out.push(v.to_owned());
            }
        }
        out
    }
}

fn is_name_char(c: char, first: bool) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':' || (!first && c.is_ascii_digit())
}

fn name(s: &str) -> Option<(&str, &str)> {
    let end = s.char_indices().find(|&(i, c)| !is_name_char(c, i == 0)).map_or(s.len(), |(i, _)| i);
    (end > 0).then(|| s.split_at(end))
}

fn sample(line: &str) -> Result<Sample, &'static str> {
    let (metric, rest) = name(line).ok_or("no metric name")?;
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => labels(inner)?,
        None => (Vec::new(), rest),
    };
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let value = number(value).ok_or("value is not a number")?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().map_err(|_| "timestamp is not an integer")?;
    }
    if fields.next().is_some() {
        return Err("text after the timestamp");
    }
    Ok(Sample { name: metric.to_owned(), labels, value })
}

/// A sample's labels, (name, value) in the order written.
type Labels = Vec<(String, String)>;

/// `key="value",...}` → the labels and what follows the `}`.
fn labels(mut s: &str) -> Result<(Labels, &str), &'static str> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((out, rest));
        }
        let (key, rest) = name(s).ok_or("bad label name")?;
        let rest = rest.trim_start().strip_prefix('=').ok_or("no `=` after a label name")?;
        let rest = rest.trim_start().strip_prefix('"').ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated label value"),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => return Err("bad escape in a label value"),
                },
                Some((_, c)) => value.push(c),
            }
        };
        out.push((key.to_owned(), value));
        s = rest[end + 1..].trim_start();
        if let Some(rest) = s.strip_prefix(',') {
            s = rest;
        } else if !s.starts_with('}') {
            return Err("expected `,` or `}` after a label");
        }
    }
}

fn number(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok().filter(|v: &f64| v.is_finite()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_and_without_labels_skipping_comments() {
        let text = "# HELP braid_x Rows.\n# TYPE braid_x counter\nbraid_x{stream=\"status\"} 12\n\n\
                    # a comment\nbraid_y 3.5\nbraid_z{a=\"1\",b=\"two\",} -4e3 1700000000000\n";
        let scrape = Scrape::parse(text).unwrap();
        assert_eq!(
            scrape.samples,
            vec![
                Sample { name: "braid_x".into(), labels: vec![("stream".into(), "status".into())], value: 12.0 },
                Sample { name: "braid_y".into(), labels: vec![], value: 3.5 },
                Sample {
                    name: "braid_z".into(),
                    labels: vec![("a".into(), "1".into()), ("b".into(), "two".into())],
                    value: -4000.0
                },
            ]
        );
    }

    #[test]
    fn label_values_unescape_and_may_hold_separators() {
        let scrape = Scrape::parse(r#"m{k="a \"q\" , } \\ x\ny", j = "2"} 1"#).unwrap();
        assert_eq!(scrape.samples[0].label("k"), Some("a \"q\" , } \\ x\ny"));
        assert_eq!(scrape.samples[0].label("j"), Some("2"));
    }

    #[test]
    fn special_values() {
        let scrape = Scrape::parse("a +Inf\nb -Inf\nc NaN\n").unwrap();
        assert_eq!(scrape.value("a", &[]), Some(f64::INFINITY));
        assert_eq!(scrape.value("b", &[]), Some(f64::NEG_INFINITY));
        assert!(scrape.value("c", &[]).unwrap().is_nan());
    }

    #[test]
    fn lookups_by_labels_sums_and_label_values() {
        let text =
            "r{operator=\"j\",input=\"l\"} 3\nr{operator=\"j\",input=\"r\"} 4\nr{operator=\"k\",input=\"l\"} 1\n";
        let scrape = Scrape::parse(text).unwrap();
        assert_eq!(scrape.value("r", &[("operator", "j"), ("input", "r")]), Some(4.0));
        assert_eq!(scrape.sum("r", &[("operator", "j")]), Some(7.0));
        assert_eq!(scrape.sum("r", &[("operator", "none")]), None);
        assert_eq!(scrape.label_values("r", "operator"), vec!["j", "k"]);
        assert_eq!(scrape.value("missing", &[]), None);
    }

    #[test]
    fn malformed_lines_name_their_line() {
        for (text, what) in [
            ("ok 1\n{x=\"1\"} 2", "no metric name"),
            ("ok 1\nm{x=1} 2", "label value not quoted"),
            ("ok 1\nm{x=\"1} 2", "unterminated label value"),
            ("ok 1\nm{x=\"1\" y=\"2\"} 2", "expected `,` or `}` after a label"),
            ("ok 1\nm", "no value"),
            ("ok 1\nm one", "value is not a number"),
            ("ok 1\nm 1 2 3", "text after the timestamp"),
            ("ok 1\n<html> 1", "no metric name"),
        ] {
            let e = Scrape::parse(text).unwrap_err();
            assert_eq!((e.line, e.what), (2, what), "{text:?}");
        }
    }
}
