//! Windows shared by window_join and cogroup: tumbling, sliding and session windows over event
//! time, `[start, end)`, epoch-aligned with an optional offset (DESIGN.md "Operators").

use crate::config::walk::{Errors, Table};

/// Checks a `window = { kind = ..., ... }` table.
pub fn check_spec(t: Table<'_, '_>, errors: &mut Errors) {
    let Some((span, table)) = t.table("window", errors) else {
        if t.get("window").is_none() {
            t.missing("window", errors, "e.g. { kind = \"tumbling\", size = \"5m\" }");
        }
        return;
    };
    let path = t.child_path("window");
    let w = Table { path: &path, span: &span, table };
    w.check_keys(&["kind", "size", "slide", "gap", "offset"], errors);
    let needs: &[&str] = match w.required_str("kind", errors, "tumbling, sliding or session") {
        Some(("tumbling", _)) => &["size"],
        Some(("sliding", _)) => &["size", "slide"],
        Some(("session", _)) => &["gap"],
        Some((_, span)) => {
            errors.at(&span, &w.child_path("kind"), "must be tumbling, sliding or session");
            return;
        }
        None => return,
    };
    for key in ["size", "slide", "gap", "offset"] {
        let wanted = needs.contains(&key) || (key == "offset" && !needs.contains(&"gap"));
        match (wanted, w.get(key).is_some()) {
            (true, false) if key != "offset" => w.missing(key, errors, "a positive duration"),
            (false, true) => w.error(key, errors, format!("this window kind takes {}", needs.join(", "))),
            (true, true) => match w.duration(key, errors) {
                Some(ms) if ms <= 0 && key != "offset" => w.error(key, errors, "must be positive"),
                _ => {}
            },
            _ => {}
        }
    }
}
