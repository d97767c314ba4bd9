//! `[sources.NAME]` and `[sinks.NAME]`: parsed and checked by every command (replay ignores
//! them, `run` uses them), so `validate` passes exactly what `run` accepts.

use toml::de::DeValue;

use super::DEAD_LETTER;
use super::operators::Graph;
use super::streams::Streams;
use super::walk::{Errors, Table, type_name};
use crate::plan::NodeRef;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceKind {
    Mqtt,
    /// braid's own MQTT broker.
    Embedded,
}

#[derive(Clone, Debug)]
pub struct SourceDef {
    pub name: String,
    pub kind: SourceKind,
    pub url: Option<String>,
    pub listen: Option<String>,
    pub conn: MqttConn,
    /// `kind = "embedded"`: who may connect and publish what (README "Security").
    pub access: BrokerAccess,
}

/// `users_file`, `acl_file` and `anonymous` of an embedded source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrokerAccess {
    /// mosquitto_passwd's format: every client authenticates.
    pub users_file: Option<String>,
    /// mosquitto's ACL format.
    pub acl_file: Option<String>,
    /// Anonymous clients are let in (on any address, with a warning).
    pub anonymous: bool,
}

/// How braid connects to a broker: identity, credentials, TLS files and limits (sources and MQTT
/// sinks alike; CONTRACT.md "Configuration").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MqttConn {
    /// MQTT client id; `None`: braid derives a stable one from the host name and section name.
    pub client_id: Option<String>,
    pub username: Option<String>,
    /// A file holding the password (systemd `LoadCredential=`); a trailing newline is ignored.
    pub password_file: Option<String>,
    /// CA certificates (PEM) to verify the broker with; an `mqtts://` URL without one uses none
    /// and is refused at start.
    pub ca_file: Option<String>,
    /// Client certificate chain and key (PEM) for mutual TLS; both or neither.
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    /// Keep-alive interval in ms (default 30 s).
    pub keep_alive_ms: Option<i64>,
    /// Un-acked QoS 1 messages in flight (default: 100 for sinks; sources: the broker decides).
    pub max_inflight: Option<u16>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkKind {
    Mqtt,
    File,
    Stdout,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    Block,
    DropOldest,
}

#[derive(Clone, Debug)]
pub struct SinkDef {
    pub name: String,
    pub kind: SinkKind,
    /// Streams, operators, `OPERATOR.late` or `dead_letter`.
    pub inputs: Vec<String>,
    pub url: Option<String>,
    pub topic: Option<String>,
    pub qos: u8,
    pub buffer: u64,
    pub overflow: Overflow,
    pub path: Option<String>,
    pub conn: MqttConn,
    /// MQTT sinks: the topic of the sink's retained `online`/`offline` status (the last will says
    /// `offline`). `None`: `braid/<client id>/status`. A plain publish topic, no placeholders.
    pub status_topic: Option<String>,
}

const TLS_AND_AUTH: [&str; 6] = ["client_id", "username", "password_file", "ca_file", "cert_file", "key_file"];

fn tables<'a, 'i>(
    section: Table<'a, 'i>,
    errors: &mut Errors,
) -> Vec<(&'a str, String, std::ops::Range<usize>, &'a toml::de::DeTable<'i>)> {
    let mut out = Vec::new();
    for (name, span, value) in section.entries() {
        let path = section.child_path(name);
        match value.get_ref() {
            DeValue::Table(table) => out.push((name, path, span, table)),
            other => errors.at(&span, &path, format!("expected a table, found {}", type_name(other))),
        }
    }
    out
}

pub fn sources(section: Table<'_, '_>, errors: &mut Errors) -> Vec<SourceDef> {
    let mut out = Vec::new();
    for (name, path, span, table) in tables(section, errors) {
        let t = Table { path: &path, span: &span, table };
        let mut keys = vec!["kind", "url", "listen", "keep_alive", "max_inflight"];
        keys.extend(TLS_AND_AUTH);
        keys.extend(BROKER_ACCESS);
        t.check_keys(&keys, errors);
        let kind = match t.required_str("kind", errors, "\"mqtt\" or \"embedded\"") {
            Some(("mqtt", _)) => SourceKind::Mqtt,
            Some(("embedded", _)) => SourceKind::Embedded,
            Some((_, span)) => {
                errors.at(&span, &t.child_path("kind"), "must be \"mqtt\" or \"embedded\"");
                continue;
            }
            None => continue,
        };
        let url = t.str("url", errors).map(|(url, span)| {
            if let Err(e) = check_mqtt_url(url) {
                errors.at(&span, &t.child_path("url"), e);
            }
            url.to_owned()
        });
        if kind == SourceKind::Mqtt && url.is_none() && t.get("url").is_none() {
            t.missing("url", errors, "the broker, e.g. \"mqtt://127.0.0.1:1883\"");
        }
        let listen = t.str("listen", errors).map(|(listen, span)| {
            if listen.parse::<std::net::SocketAddr>().is_err() {
                errors.at(&span, &t.child_path("listen"), format!("expected \"host:port\", got {listen:?}"));
            }
            listen.to_owned()
        });
        let conn = common_mqtt_keys(t, errors);
        let access = broker_access(t, &kind, errors);
        match kind {
            SourceKind::Embedded => check_embedded_exposure(t, listen.as_deref(), &conn, &access, errors),
            SourceKind::Mqtt => warn_clear_text(t, url.as_deref(), errors),
        }
        out.push(SourceDef { name: name.to_owned(), kind, url, listen, conn, access });
    }
    out
}

const BROKER_ACCESS: [&str; 3] = ["users_file", "acl_file", "anonymous"];

fn broker_access(t: Table<'_, '_>, kind: &SourceKind, errors: &mut Errors) -> BrokerAccess {
    if *kind != SourceKind::Embedded {
        for key in BROKER_ACCESS.iter().filter(|key| t.get(key).is_some()) {
            t.error(key, errors, "only for kind = \"embedded\" (an external broker has its own, e.g. mosquitto's password_file and acl_file)");
        }
        return BrokerAccess::default();
    }
    let [users_file, acl_file] = ["users_file", "acl_file"].map(|key| {
        t.str(key, errors).map(|(path, span)| {
            if path.is_empty() {
                errors.at(&span, &t.child_path(key), "may not be empty");
            }
            path.to_owned()
        })
    });
    BrokerAccess { users_file, acl_file, anonymous: t.bool("anonymous", false, errors) }
}

/// The embedded broker's address is loopback unless every client authenticates (a users file, or
/// client certificates) or `anonymous = true` says that anybody who can reach it may use it.
fn check_embedded_exposure(
    t: Table<'_, '_>,
    listen: Option<&str>,
    conn: &MqttConn,
    access: &BrokerAccess,
    errors: &mut Errors,
) {
    let Some(addr) = listen.map_or(Some(DEFAULT_EMBEDDED_LISTEN), |l| l.parse::<std::net::SocketAddr>().ok()) else {
        return; // reported already
    };
    let at = if listen.is_some() { "listen" } else { "kind" };
    let client_certificates = conn.ca_file.is_some() && conn.cert_file.is_some();
    let authenticated = access.users_file.is_some() || client_certificates;
    let exposed = !addr.ip().is_loopback();
    if exposed && access.anonymous {
        errors.warn(
            &t.key_span(at),
            &t.child_path(at),
            format!(
                "anonymous = true on {addr}: any client that reaches it may publish and subscribe without credentials"
            ),
        );
    } else if exposed && !authenticated {
        t.error(
            at,
            errors,
            format!(
                "{addr} is not a loopback address: set users_file (every client authenticates), or \
                 anonymous = true to let anybody who reaches it in"
            ),
        );
    }
    if exposed && access.users_file.is_some() && access.acl_file.is_none() {
        errors.warn(
            &t.key_span("users_file"),
            &t.child_path("users_file"),
            "no acl_file: every authenticated client may publish and subscribe to every topic, other devices' included",
        );
    }
}

/// `listen` of an embedded source without one.
pub const DEFAULT_EMBEDDED_LISTEN: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 1883);

/// `mqtt://` to another host sends credentials and data in clear text.
fn warn_clear_text(t: Table<'_, '_>, url: Option<&str>, errors: &mut Errors) {
    let Some(host) = url.and_then(|url| url.strip_prefix("mqtt://")).map(|rest| {
        let host_port = rest.trim_end_matches('/');
        host_port.rsplit_once(':').map_or(host_port, |(host, _)| host)
    }) else {
        return;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        errors.warn(
            &t.key_span("url"),
            &t.child_path("url"),
            format!("mqtt:// to {host} sends credentials and data in clear text; use mqtts:// (with ca_file)"),
        );
    }
}

fn common_mqtt_keys(t: Table<'_, '_>, errors: &mut Errors) -> MqttConn {
    let [client_id, username, password_file, ca_file, cert_file, key_file] =
        TLS_AND_AUTH.map(|key| t.str(key, errors).map(|(v, _)| v.to_owned()));
    if cert_file.is_some() != key_file.is_some() {
        let missing = if cert_file.is_some() { "key_file" } else { "cert_file" };
        t.missing(missing, errors, "cert_file and key_file go together (mutual TLS)");
    }
    if client_id.as_deref() == Some("") {
        t.error("client_id", errors, "may not be empty");
    }
    let keep_alive_ms = t.duration("keep_alive", errors);
    if keep_alive_ms.is_some_and(|ms| ms < 1000) {
        t.error("keep_alive", errors, "must be at least 1s");
    }
    let mut max_inflight = None;
    if let Some((n, span)) = t.int("max_inflight", errors) {
        match u16::try_from(n) {
            Ok(n) if n >= 1 => max_inflight = Some(n),
            _ => errors.at(&span, &t.child_path("max_inflight"), "must be between 1 and 65535"),
        }
    }
    MqttConn { client_id, username, password_file, ca_file, cert_file, key_file, keep_alive_ms, max_inflight }
}

fn check_mqtt_url(url: &str) -> Result<(), String> {
    let rest = url.strip_prefix("mqtt://").or_else(|| url.strip_prefix("mqtts://"));
    let Some(rest) = rest else {
        return Err(format!("expected mqtt://HOST:PORT or mqtts://HOST:PORT, got {url:?}"));
    };
    let host_port = rest.trim_end_matches('/');
    match host_port.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        None if !host_port.is_empty() && !host_port.contains('/') => Ok(()),
        _ => Err(format!("expected mqtt://HOST:PORT or mqtts://HOST:PORT, got {url:?}")),
    }
}

/// `inserts`: what SQL's `INSERT INTO sink` statements feed (sink, input), added to `inputs`.
pub fn sinks(
    section: Table<'_, '_>,
    streams: &Streams,
    graph: &Graph,
    inserts: &[(String, String)],
    errors: &mut Errors,
) -> Vec<SinkDef> {
    let mut out = Vec::new();
    for (name, path, span, table) in tables(section, errors) {
        let t = Table { path: &path, span: &span, table };
        let kind = match t.required_str("kind", errors, "\"mqtt\", \"file\" or \"stdout\"") {
            Some(("mqtt", _)) => SinkKind::Mqtt,
            Some(("file", _)) => SinkKind::File,
            Some(("stdout", _)) => SinkKind::Stdout,
            Some((_, span)) => {
                errors.at(&span, &t.child_path("kind"), "must be \"mqtt\", \"file\" or \"stdout\"");
                continue;
            }
            None => continue,
        };
        let mut keys = vec!["kind", "inputs"];
        match kind {
            SinkKind::Mqtt => keys.extend(
                ["url", "topic", "qos", "buffer", "overflow", "keep_alive", "max_inflight", "status_topic"]
                    .iter()
                    .chain(&TLS_AND_AUTH),
            ),
            SinkKind::File => keys.push("path"),
            SinkKind::Stdout => {}
        }
        t.check_keys(&keys, errors);
        let inserted: Vec<String> = inserts.iter().filter(|(s, _)| s == name).map(|(_, i)| i.clone()).collect();
        let mut inputs = match (t.get("inputs"), inserted.is_empty()) {
            (None, false) => Vec::new(),
            _ => sink_inputs(t, streams, graph, errors),
        };
        inputs.extend(inserted);
        let mut sink = SinkDef {
            name: name.to_owned(),
            kind: kind.clone(),
            inputs,
            url: None,
            topic: None,
            qos: 1,
            buffer: 256 << 20,
            overflow: Overflow::Block,
            path: None,
            conn: MqttConn::default(),
            status_topic: None,
        };
        match kind {
            SinkKind::Mqtt => {
                mqtt_sink(t, &mut sink, errors);
                check_topic_fields(t, &sink, streams, graph, errors);
            }
            SinkKind::File => {
                sink.path =
                    t.required_str("path", errors, "the file to append JSON lines to").map(|(p, _)| p.to_owned())
            }
            SinkKind::Stdout => {}
        }
        out.push(sink);
    }
    out
}

fn sink_inputs(t: Table<'_, '_>, streams: &Streams, graph: &Graph, errors: &mut Errors) -> Vec<String> {
    let what = "a list of streams, operators, OPERATOR.late, OPERATOR.expired or dead_letter";
    let Some(items) = t.required_list("inputs", errors, what) else { return Vec::new() };
    let known = |name: &str| {
        let operator = crate::plan::side_output(name).map_or(name, |(op, _)| op);
        name == DEAD_LETTER
            || graph.outputs.contains_key(operator)
            || (operator == name
                && (streams.defs.iter().any(|s| s.name == name) || streams.broken.iter().any(|s| s == name)))
    };
    for (name, span) in &items {
        if !known(name) {
            errors.at(
                span,
                &t.child_path("inputs"),
                format!("{name:?} is no stream, operator, OPERATOR.late, OPERATOR.expired or dead_letter"),
            );
        }
    }
    items.into_iter().map(|(n, _)| n.to_owned()).collect()
}

fn mqtt_sink(t: Table<'_, '_>, sink: &mut SinkDef, errors: &mut Errors) {
    sink.url = t.required_str("url", errors, "the upstream broker, e.g. \"mqtts://cloud.example.com:8883\"").map(
        |(url, span)| {
            if let Err(e) = check_mqtt_url(url) {
                errors.at(&span, &t.child_path("url"), e);
            }
            url.to_owned()
        },
    );
    warn_clear_text(t, sink.url.as_deref(), errors);
    sink.topic =
        t.required_str("topic", errors, "a topic template such as \"gateways/gw1/{device}\"").map(|(topic, span)| {
            if let Err(e) = check_topic_template(topic) {
                errors.at(&span, &t.child_path("topic"), e);
            }
            topic.to_owned()
        });
    if let Some((qos, span)) = t.int("qos", errors) {
        if qos == 0 || qos == 1 {
            sink.qos = qos as u8;
        } else {
            errors.at(&span, &t.child_path("qos"), "must be 0 or 1");
        }
    }
    sink.buffer = t.size_or("buffer", sink.buffer, errors);
    sink.overflow = match t.str("overflow", errors) {
        None | Some(("block", _)) => Overflow::Block,
        Some(("drop_oldest", _)) => Overflow::DropOldest,
        Some((_, span)) => {
            errors.at(&span, &t.child_path("overflow"), "must be \"block\" or \"drop_oldest\"");
            Overflow::Block
        }
    };
    sink.conn = common_mqtt_keys(t, errors);
    sink.status_topic = t.str("status_topic", errors).map(|(topic, span)| {
        if topic.is_empty() || topic.contains(['+', '#', '\0', '{', '}']) {
            errors.at(&span, &t.child_path("status_topic"), "a publish topic: not empty, no '+', '#', NUL or '{…}'");
        }
        topic.to_owned()
    });
}

/// Every `{field}` of an MQTT sink's topic must be a field of every input's rows (a late side
/// output: of each of the operator's inputs; an expired one: those and the operator's output, for
/// the results an open window would have emitted; `dead_letter` rows have none), so that `run` can
/// render the topic of every row it sends.
fn check_topic_fields(t: Table<'_, '_>, sink: &SinkDef, streams: &Streams, graph: &Graph, errors: &mut Errors) {
    let (Some(topic), Some((_, span))) = (&sink.topic, t.str("topic", errors)) else { return };
    if check_topic_template(topic).is_err() {
        return; // reported already
    }
    let empty = crate::record::Schema::new(Vec::new(), None, crate::record::TimeSpec::Ingest);
    let node_schema = |node: NodeRef| match node {
        NodeRef::Stream(i) => streams.defs.get(i).map(|d| &d.schema),
        NodeRef::Operator(i) => graph.operators.get(i).map(|o| &o.output),
    };
    for input in &sink.inputs {
        let schemas: Vec<&crate::record::Schema> = if input == DEAD_LETTER {
            vec![&empty]
        } else if let Some((op, expired)) = crate::plan::side_output(input)
            .and_then(|(n, expired)| graph.operators.iter().find(|o| o.name == n).map(|o| (o, expired)))
        {
            let mut schemas: Vec<_> = op.inputs.iter().filter_map(|&n| node_schema(n)).collect();
            if expired {
                schemas.push(&op.output);
            }
            schemas
        } else if let Some(op) = graph.operators.iter().find(|o| &o.name == input) {
            vec![&op.output]
        } else if let Some(def) = streams.defs.iter().find(|d| &d.name == input) {
            vec![&def.schema]
        } else {
            continue; // unknown or broken: reported already
        };
        for schema in schemas {
            if let Err(message) = crate::sink::topic::TopicTemplate::compile(topic, schema) {
                errors.at(&span, &t.child_path("topic"), format!("for input {input:?}: {message}"));
                break;
            }
        }
    }
}

/// A topic with `{field}` placeholders: no wildcards, balanced braces, identifiers inside.
fn check_topic_template(topic: &str) -> Result<(), String> {
    if topic.is_empty() || topic.contains(['+', '#', '\0']) {
        return Err("a publish topic may not be empty or contain '+', '#' or NUL".into());
    }
    let mut rest = topic;
    while let Some(open) = rest.find(['{', '}']) {
        if rest.as_bytes()[open] == b'}' {
            return Err(format!("unbalanced '}}' in {topic:?}"));
        }
        let Some(close) = rest[open..].find('}') else {
            return Err(format!("unclosed '{{' in {topic:?}"));
        };
        let field = &rest[open + 1..open + close];
        if field.is_empty() || !field.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return Err(format!("bad placeholder {{{field}}} in {topic:?}"));
        }
        rest = &rest[open + close + 1..];
    }
    Ok(())
}
