//! The embedded broker's ACL file (`[sources.X] acl_file`): mosquitto's format, checked by the
//! gate (`gate.rs`) on every PUBLISH and SUBSCRIBE a device sends.
//!
//! ```text
//! # rules before any `user` line are the anonymous clients'
//! topic read public/#
//! user braid-admin
//! topic readwrite config/#           # `topic [read|write|readwrite|deny] FILTER`; no access = readwrite
//! pattern write devices/%u/#         # every client; %u = its user name, %c = its client id
//! pattern read devices/%u/command
//! ```
//!
//! Rules of the check (mosquitto 2's, except where noted):
//! - A client's rules are its user's `topic` lines (the anonymous ones when it has no user name)
//!   and every `pattern` with `%u`/`%c` replaced. A pattern whose `%u` or `%c` would be replaced
//!   by a name holding `/`, `+` or `#`, or `%u` for an anonymous client, grants nothing (else a
//!   user named `a/#` would gain `devices/a/#/...`).
//! - Nothing is allowed that no rule grants; a `deny` rule wins over any grant, wherever it is.
//! - A topic starting with `$` is matched only by a rule starting with `$`.
//! - **Publish** to topic T: some `write`/`readwrite` rule matches T.
//! - **Subscribe** to filter F: some `read`/`readwrite` rule *covers* F (every topic F matches,
//!   the rule matches too) and no `deny` rule overlaps it. mosquitto 2's acl_file grants every
//!   subscription and filters each message at delivery instead; braid refuses the subscription
//!   (SUBACK failure, counted), because the gate forwards the broker's deliveries untouched. An
//!   allowed subscription receives the same messages either way; `#` gets a refusal here and
//!   nothing but what the ACL lets it read at mosquitto.
//! - Without an ACL file every client may publish and subscribe to everything (mosquitto without
//!   `acl_file`); `braid validate` warns about a users file without one.

use std::collections::HashMap;

use super::users::LineError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    ReadWrite,
    Deny,
}

impl Access {
    fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    access: Access,
    filter: String,
}

/// The rules of one ACL file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    anonymous: Vec<Rule>,
    users: HashMap<String, Vec<Rule>>,
    patterns: Vec<Rule>,
}

/// One client's rules, resolved once when it connects (and again after a reload), so that a
/// publish is checked without allocating.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grants {
    /// `None`: no ACL file, everything is allowed.
    rules: Option<Vec<(Access, String)>>,
}

impl Acl {
    /// Parses the text of an ACL file.
    pub fn parse(text: &str) -> Result<Acl, LineError> {
        let mut acl = Acl::default();
        let mut user: Option<String> = None;
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let error = |reason: String| LineError { line: index + 1, reason };
            let (keyword, rest) = line.split_once([' ', '\t']).map_or((line, ""), |(k, r)| (k, r.trim_start()));
            match keyword {
                "user" if rest.is_empty() => return Err(error("`user` needs a user name".into())),
                "user" => {
                    user = Some(rest.to_owned());
                }
                "topic" | "pattern" => {
                    let rule = rule(rest).map_err(error)?;
                    match (keyword, &user) {
                        ("pattern", _) => acl.patterns.push(rule),
                        (_, Some(user)) => acl.users.entry(user.clone()).or_default().push(rule),
                        (_, None) => acl.anonymous.push(rule),
                    }
                }
                other => {
                    return Err(error(format!("unknown keyword {other:?} (expected `user`, `topic` or `pattern`)")));
                }
            }
        }
        Ok(acl)
    }

    /// The rules of a client with user name `user` (`None`: anonymous) and client id `client_id`.
    pub fn grants(&self, user: Option<&str>, client_id: &str) -> Grants {
        let own = match user {
            Some(user) => self.users.get(user).map_or(&[][..], Vec::as_slice),
            None => &self.anonymous,
        };
        let mut rules: Vec<(Access, String)> = own.iter().map(|r| (r.access, r.filter.clone())).collect();
        let unsafe_name = |name: &str| name.contains(['/', '+', '#']);
        for pattern in &self.patterns {
            let wants_user = pattern.filter.contains("%u");
            let wants_id = pattern.filter.contains("%c");
            let user = match (wants_user, user) {
                (false, _) => "",
                (true, Some(user)) if !unsafe_name(user) => user,
                (true, _) => continue,
            };
            if wants_id && (client_id.is_empty() || unsafe_name(client_id)) {
                continue;
            }
            rules.push((pattern.access, pattern.filter.replace("%u", user).replace("%c", client_id)));
        }
        Grants { rules: Some(rules) }
    }
}

/// `[ACCESS] FILTER` of a `topic` or `pattern` line.
fn rule(rest: &str) -> Result<Rule, String> {
    let (first, after) = rest.split_once([' ', '\t']).map_or((rest, ""), |(a, b)| (a, b.trim_start()));
    let access = match first {
        "read" => Some(Access::Read),
        "write" => Some(Access::Write),
        "readwrite" => Some(Access::ReadWrite),
        "deny" => Some(Access::Deny),
        _ => None,
    };
    let (access, filter) = match access {
        Some(access) => (access, after),
        None => (Access::ReadWrite, rest),
    };
    if filter.is_empty() {
        return Err("a rule needs a topic filter".into());
    }
    if !valid_filter(filter) {
        return Err(format!("{filter:?} is not a valid MQTT topic filter"));
    }
    Ok(Rule { access, filter: filter.to_owned() })
}

/// `#` only as the last level, `+` and `#` only as whole levels.
fn valid_filter(filter: &str) -> bool {
    let levels: Vec<&str> = filter.split('/').collect();
    levels.iter().enumerate().all(|(i, level)| match *level {
        "#" => i == levels.len() - 1,
        "+" => true,
        other => !other.contains(['+', '#']),
    })
}

impl Grants {
    /// Everything (no ACL file).
    pub fn all() -> Grants {
        Grants { rules: None }
    }

    pub fn may_publish(&self, topic: &str) -> bool {
        let Some(rules) = &self.rules else { return true };
        let matching = || rules.iter().filter(|(_, filter)| matches(filter, topic));
        !matching().any(|(access, _)| *access == Access::Deny) && matching().any(|(access, _)| access.writes())
    }

    pub fn may_subscribe(&self, filter: &str) -> bool {
        let Some(rules) = &self.rules else { return true };
        let denied = rules.iter().any(|(access, rule)| *access == Access::Deny && overlaps(rule, filter));
        !denied && rules.iter().any(|(access, rule)| access.reads() && covers(rule, filter))
    }
}

/// Whether filter `rule` matches topic name `topic` (MQTT 3.1.1 §4.7).
fn matches(rule: &str, topic: &str) -> bool {
    if topic.starts_with('$') != rule.starts_with('$') {
        return false;
    }
    let mut topic_levels = topic.split('/');
    for level in rule.split('/') {
        match (level, topic_levels.next()) {
            ("#", _) => return true,
            ("+", Some(_)) => {}
            (literal, Some(t)) if literal == t => {}
            _ => return false,
        }
    }
    topic_levels.next().is_none()
}

/// Whether every topic that filter `filter` matches is matched by filter `rule`.
fn covers(rule: &str, filter: &str) -> bool {
    if filter.starts_with('$') && !rule.starts_with('$') {
        return false;
    }
    let mut filter_levels = filter.split('/');
    for level in rule.split('/') {
        match (level, filter_levels.next()) {
            ("#", _) => return true,
            (_, None) | (_, Some("#")) => return false,
            ("+", Some(_)) => {}
            (literal, Some(f)) if literal == f && f != "+" => {}
            _ => return false,
        }
    }
    filter_levels.next().is_none()
}

/// Whether some topic is matched by both filters (a `deny` rule and a subscription).
fn overlaps(a: &str, b: &str) -> bool {
    let (mut a_levels, mut b_levels) = (a.split('/'), b.split('/'));
    loop {
        match (a_levels.next(), b_levels.next()) {
            (Some("#"), _) | (_, Some("#")) | (None, None) => return true,
            (Some(_), None) | (None, Some(_)) => return false,
            (Some(x), Some(y)) if x == "+" || y == "+" || x == y => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACL: &str = "\
# anonymous clients
topic read public/#

user braid-admin
topic config/#
topic deny config/secret

pattern write devices/%u/#
pattern read devices/%u/command
pattern readwrite clients/%c/#
";

    #[test]
    fn a_device_publishes_under_its_own_topics_only() {
        let acl = Acl::parse(ACL).unwrap();
        let d1 = acl.grants(Some("d1"), "d1-board");
        assert!(d1.may_publish("devices/d1/status"));
        assert!(d1.may_publish("devices/d1/command"));
        assert!(d1.may_publish("clients/d1-board/x"));
        assert!(!d1.may_publish("devices/d2/status"));
        assert!(d1.may_publish("devices/d1"), "`#` matches its parent level too (MQTT 3.1.1 §4.7.1.2)");
        assert!(!d1.may_publish("public/news"));
        assert!(!d1.may_publish("config/x"));
    }

    #[test]
    fn subscriptions_must_be_covered_by_a_read_rule() {
        let acl = Acl::parse(ACL).unwrap();
        let d1 = acl.grants(Some("d1"), "d1-board");
        assert!(d1.may_subscribe("devices/d1/command"));
        assert!(d1.may_subscribe("clients/d1-board/+"));
        assert!(d1.may_subscribe("clients/d1-board/#"));
        for refused in
            ["#", "devices/#", "devices/+/command", "devices/d2/command", "devices/d1/status", "+/d1/command"]
        {
            assert!(!d1.may_subscribe(refused), "{refused}");
        }
        let admin = acl.grants(Some("braid-admin"), "admin");
        assert!(admin.may_subscribe("config/a"));
        assert!(!admin.may_subscribe("config/#"), "overlaps the denied config/secret");
        assert!(!admin.may_subscribe("config/secret"));
        assert!(admin.may_publish("config/a"));
        assert!(!admin.may_publish("config/secret"));
    }

    #[test]
    fn anonymous_clients_get_the_rules_before_any_user_and_no_percent_u_patterns() {
        let acl = Acl::parse(ACL).unwrap();
        let anonymous = acl.grants(None, "x");
        assert!(anonymous.may_subscribe("public/#"));
        assert!(!anonymous.may_publish("public/a"));
        assert!(!anonymous.may_publish("devices/x/status"));
        assert!(anonymous.may_publish("clients/x/a"), "%c patterns apply to anonymous clients");
    }

    #[test]
    fn names_with_wildcards_or_slashes_get_nothing_from_patterns() {
        let acl = Acl::parse(ACL).unwrap();
        for user in ["a/b", "+", "#"] {
            let grants = acl.grants(Some(user), "ok");
            assert!(!grants.may_publish(&format!("devices/{user}/status")), "{user}");
            assert!(!grants.may_publish("devices/a/b/status"), "{user}");
        }
        let grants = acl.grants(Some("d1"), "a/#");
        assert!(!grants.may_publish("clients/a/x"));
        let grants = acl.grants(Some("d1"), "");
        assert!(!grants.may_publish("clients//x"));
    }

    #[test]
    fn dollar_topics_need_dollar_rules() {
        let acl = Acl::parse("topic #\ntopic read $SYS/#\n").unwrap();
        let grants = acl.grants(None, "c");
        assert!(grants.may_publish("a/b"));
        assert!(!grants.may_publish("$SYS/x"));
        assert!(grants.may_subscribe("#"));
        assert!(grants.may_subscribe("$SYS/broker/#"));
        assert!(!Acl::parse("topic #\n").unwrap().grants(None, "c").may_subscribe("$SYS/#"));
    }

    #[test]
    fn without_a_file_everything_is_allowed() {
        assert!(Grants::all().may_publish("any/thing"));
        assert!(Grants::all().may_subscribe("#"));
        let empty = Acl::parse("").unwrap().grants(Some("u"), "c");
        assert!(!empty.may_publish("a") && !empty.may_subscribe("a"));
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, line, reason) in [
            ("user", 1, "needs a user name"),
            ("\ntopic read", 2, "needs a topic filter"),
            ("topic write a/#/b", 1, "not a valid MQTT topic filter"),
            ("pattern read a+", 1, "not a valid"),
            ("\n\nallow all", 3, "unknown keyword"),
        ] {
            let error = Acl::parse(text).unwrap_err();
            assert_eq!(error.line, line, "{text}: {error:?}");
            assert!(error.reason.contains(reason), "{text}: {error:?}");
        }
    }

    #[test]
    fn filter_relations() {
        assert!(matches("a/+/c", "a/b/c") && matches("a/#", "a") && matches("#", "a/b"));
        assert!(!matches("a/+", "a/b/c") && !matches("a/b", "a") && !matches("+", "$SYS"));
        assert!(covers("a/#", "a/+/c") && covers("a/+", "a/+") && covers("#", "#"));
        assert!(!covers("a/+", "a/#") && !covers("a/b", "a/+") && !covers("a/+/c", "a/+/+"));
        assert!(overlaps("a/+", "+/b") && overlaps("a/#", "a") && overlaps("#", "x"));
        assert!(!overlaps("a/b", "a/c") && !overlaps("a/+", "a/b/c"));
    }
}
