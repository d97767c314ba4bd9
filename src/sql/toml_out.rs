//! The TOML the compiler writes, with a map from every line back to the SQL it came from, so a
//! configuration error found in the generated text is reported at the SQL's line and column.

/// Generated TOML text and, per line written, (offset of the line in the TOML, offset in the SQL).
#[derive(Default, Debug)]
pub struct TomlOut {
    pub text: String,
    marks: Vec<(usize, usize)>,
}

impl TomlOut {
    /// Appends one line that came from the SQL at `sql_at`.
    pub fn line(&mut self, sql_at: usize, line: impl AsRef<str>) {
        self.marks.push((self.text.len(), sql_at));
        self.text.push_str(line.as_ref());
        self.text.push('\n');
    }

    /// `key = "value"`.
    pub fn string(&mut self, sql_at: usize, key: &str, value: &str) {
        self.line(sql_at, format!("{key} = {}", quote(value)));
    }

    /// Appends everything `other` holds.
    pub fn append(&mut self, other: TomlOut) {
        let base = self.text.len();
        self.marks.extend(other.marks.into_iter().map(|(line, sql)| (base + line, sql)));
        self.text.push_str(&other.text);
    }

    /// The SQL offset of the line holding `toml_offset`.
    pub fn sql_offset(&self, toml_offset: usize) -> usize {
        let i = self.marks.partition_point(|&(line, _)| line <= toml_offset);
        self.marks.get(i.saturating_sub(1)).map_or(0, |&(_, sql)| sql)
    }
}

/// A TOML basic string.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A TOML key: bare when it can be, else quoted.
pub fn key(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        s.to_owned()
    } else {
        quote(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_map_back() {
        let mut out = TomlOut::default();
        out.line(10, "[streams.a]");
        out.string(20, "key", "k\"\\\n");
        assert_eq!(out.text, "[streams.a]\nkey = \"k\\\"\\\\\\u000A\"\n");
        assert_eq!(out.sql_offset(0), 10);
        assert_eq!(out.sql_offset(11), 10);
        assert_eq!(out.sql_offset(12), 20);
        assert_eq!(out.sql_offset(999), 20);
        assert_eq!(key("a b"), "\"a b\"");
        assert_eq!(key("ok_1"), "ok_1");
    }
}
