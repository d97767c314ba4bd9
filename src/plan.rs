//! The plan: what a checked configuration runs, and the limits every path runs under.
//!
//! [`config`](crate::config) turns TOML into a [`Plan`]; the shard runtime (which replay,
//! the service and the bench drive) reads it and nothing else. A plan is a graph whose nodes are input
//! streams and operators ([`NodeRef`]); edges go from a node to the operators reading it.
//!
//! # Invariants (checked by `config`, relied on everywhere)
//!
//! - Operators are in topological order, upstream first: an operator's inputs name streams and
//!   *earlier* operators only, so one pass in index order sees every input before its readers.
//!   There are no cycles.
//! - At most [`MAX_OPERATORS`] operators, each with at most [`MAX_INPUTS`] inputs, on chains of
//!   at most [`MAX_CHAIN_DEPTH`] operators; a runtime runs at most [`MAX_SHARDS`] shards.
//!
//! # What the plan derives once
//!
//! Every path needs the same facts about the graph, so they are computed here when the plan is
//! built, from `operators[..].inputs` and the specs' kinds, and never again:
//!
//! - [`Plan::readers`]: per stream and per operator, the `(operator, input)` pairs reading it,
//!   in operator order (then input order). Delivery follows this order, so it is part of the
//!   single-threaded order that `_id`s and the shard tags reproduce.
//! - [`Plan::depth`]: operators on the longest chain ending at an operator (1 when it reads
//!   streams only), and [`Plan::longest_chain`]. One rule, [`chain_depth`], which `config` also
//!   applies while it builds the graph to refuse a chain that is too long.
//! - [`Plan::chained`]: the operator reads another operator (its inputs are merged in tag order).
//! - [`Plan::clocked`]: the operator may hold processing-time timers
//!   ([`OperatorKind::is_clocked`](crate::operator::OperatorKind::is_clocked): connect) or has a
//!   `ttl` (its host needs every row's processing time).
//! - [`Plan::origin_key_positions`]: where its results carry the key of the row they came from.
//!
//! The derived facts describe the operators' inputs as they were checked: a caller may swap an
//! operator's spec for another of the same kind (tests install custom connect functions), never
//! its inputs.
//!
//! # Limits
//!
//! The limits exist because of one encoding: a row's place in the single-threaded order is a
//! [`Tag`](crate::shard::tag::Tag), whose words pack (operator, input) and (shard, emission
//! index) into fixed bit fields and whose path holds one word per hop. `shard/tag.rs` states the
//! layout and proves, with `const` assertions beside it, that these limits fit it; the config
//! checks, the runtime's refusals and the CLI's ranges read the constants below, never a literal.

use crate::config::{RuntimeSettings, SinkDef, SourceDef, StreamDef};
use crate::operator::{OperatorSpec, Side};
use crate::record::Schema;

/// The most shards a runtime runs: a tag's path step names the shard in 8 bits.
pub const MAX_SHARDS: usize = 256;

/// The most operators on a chain, counted from the operator reading an input stream: a tag's
/// path holds one word per hop after the root.
pub const MAX_CHAIN_DEPTH: usize = 8;

/// The most operators in a plan: a tag's path step names the reading operator in 16 bits.
pub const MAX_OPERATORS: usize = 1 << 16;

/// The most inputs of one operator (a union's list): a tag names the input in 8 bits.
pub const MAX_INPUTS: usize = 256;

/// A node of the graph: an input stream or an operator (whose results other operators read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeRef {
    Stream(usize),
    Operator(usize),
}

#[derive(Clone, Debug)]
pub struct OperatorDef {
    pub name: String,
    pub inputs: Vec<NodeRef>,
    /// The schema of its results (what a downstream operator reads).
    pub output: Schema,
    /// Its kind and checked settings ([`OperatorSpec::kind`]).
    pub spec: OperatorSpec,
    /// `ttl` in ms (processing time): state older than this leaves to `OPERATOR.expired`
    /// (operator/host.rs, state/ttl.rs). The host's, not the kind's: any kind may have one.
    pub ttl: Option<i64>,
}

/// A checked configuration.
#[derive(Clone, Debug)]
pub struct Plan {
    pub runtime: RuntimeSettings,
    /// `[ops] listen`; empty turns the endpoint off.
    pub ops_listen: String,
    /// `[ops] no_match_warning` and `state_stall_warning`.
    pub ops_thresholds: crate::ops::warnings::Thresholds,
    pub sources: Vec<SourceDef>,
    pub streams: Vec<StreamDef>,
    /// Upstream first.
    pub operators: Vec<OperatorDef>,
    pub sinks: Vec<SinkDef>,
    /// Valid settings that make matches unlikely, as `FILE:LINE:COL: warning: PATH: message`.
    pub warnings: Vec<String>,
    wiring: Wiring,
}

/// The facts derived from the graph (module doc, "What the plan derives once").
#[derive(Clone, Debug)]
struct Wiring {
    /// Per stream: the (operator, input) pairs reading it.
    stream_readers: Vec<Vec<(usize, usize)>>,
    operators: Vec<OperatorWiring>,
    longest_chain: usize,
}

#[derive(Clone, Debug)]
struct OperatorWiring {
    readers: Vec<(usize, usize)>,
    depth: usize,
    chained: bool,
    clocked: bool,
    origin: Vec<usize>,
}

/// Operators on the longest chain ending at an operator reading `inputs`, given that number for
/// each upstream operator: 1 + the deepest operator input (streams count 0).
pub fn chain_depth(inputs: &[NodeRef], upstream: impl Fn(usize) -> usize) -> usize {
    let deepest = inputs.iter().filter_map(|n| match *n {
        NodeRef::Operator(u) => Some(upstream(u)),
        NodeRef::Stream(_) => None,
    });
    1 + deepest.max().unwrap_or(0)
}

impl Plan {
    /// A plan over checked parts (`operators` upstream first); derives the wiring.
    pub(crate) fn new(
        runtime: RuntimeSettings,
        ops_listen: String,
        sources: Vec<SourceDef>,
        streams: Vec<StreamDef>,
        operators: Vec<OperatorDef>,
        sinks: Vec<SinkDef>,
    ) -> Plan {
        let mut stream_readers = vec![Vec::new(); streams.len()];
        let mut wired: Vec<OperatorWiring> = Vec::with_capacity(operators.len());
        for (op, def) in operators.iter().enumerate() {
            for (input, node) in def.inputs.iter().enumerate() {
                match *node {
                    NodeRef::Stream(s) => stream_readers[s].push((op, input)),
                    NodeRef::Operator(u) => wired[u].readers.push((op, input)),
                }
            }
            wired.push(OperatorWiring {
                readers: Vec::new(),
                depth: chain_depth(&def.inputs, |u| wired[u].depth),
                chained: def.inputs.iter().any(|n| matches!(n, NodeRef::Operator(_))),
                clocked: def.spec.kind().is_clocked() || def.ttl.is_some(),
                origin: origin_key_positions(&streams, &operators, op),
            });
        }
        let longest_chain = wired.iter().map(|w| w.depth).max().unwrap_or(0);
        let wiring = Wiring { stream_readers, operators: wired, longest_chain };
        let ops_thresholds = crate::ops::warnings::Thresholds::default();
        Plan { runtime, ops_listen, ops_thresholds, sources, streams, operators, sinks, warnings: Vec::new(), wiring }
    }

    /// The (operator, input) pairs reading `node`, in operator order.
    pub fn readers(&self, node: NodeRef) -> &[(usize, usize)] {
        match node {
            NodeRef::Stream(s) => &self.wiring.stream_readers[s],
            NodeRef::Operator(op) => &self.wiring.operators[op].readers,
        }
    }

    /// Operators on the longest chain ending at operator `op` (1 when it reads streams only).
    pub fn depth(&self, op: usize) -> usize {
        self.wiring.operators[op].depth
    }

    /// Operators on the longest chain of the plan (0 without operators); at most
    /// [`MAX_CHAIN_DEPTH`].
    pub fn longest_chain(&self) -> usize {
        self.wiring.longest_chain
    }

    /// Operator `op` reads another operator.
    pub fn chained(&self, op: usize) -> bool {
        self.wiring.operators[op].chained
    }

    /// Operator `op` may hold processing-time timers.
    pub fn clocked(&self, op: usize) -> bool {
        self.wiring.operators[op].clocked
    }

    /// Where operator `op`'s results carry the key of the row they came from (rule 9: under the
    /// key field names of its left or only input, one position per key field), whatever `key =`
    /// re-keys them by; empty when they do not.
    pub fn origin_key_positions(&self, op: usize) -> &[usize] {
        &self.wiring.operators[op].origin
    }

    /// The streams source `source` feeds, with their indices.
    pub fn source_streams(&self, source: usize) -> impl Iterator<Item = (usize, &StreamDef)> {
        let name = self.sources.get(source).map(|s| s.name.as_str());
        self.streams.iter().enumerate().filter(move |(_, s)| s.source.is_some() && s.source.as_deref() == name)
    }

    /// The largest `max_payload` of the streams source `source` feeds (256 KiB, the default,
    /// when it feeds none).
    pub fn source_max_payload(&self, source: usize) -> u64 {
        self.source_streams(source).map(|(_, s)| s.max_payload).max().unwrap_or(256 * 1024)
    }

    pub fn stream(&self, name: &str) -> Option<usize> {
        self.streams.iter().position(|s| s.name == name)
    }

    pub fn operator(&self, name: &str) -> Option<usize> {
        self.operators.iter().position(|o| o.name == name)
    }

    pub fn node_name(&self, node: NodeRef) -> &str {
        match node {
            NodeRef::Stream(i) => &self.streams[i].name,
            NodeRef::Operator(i) => &self.operators[i].name,
        }
    }

    pub fn node_schema(&self, node: NodeRef) -> &Schema {
        node_schema(&self.streams, &self.operators, node)
    }
}

fn node_schema<'p>(streams: &'p [StreamDef], operators: &'p [OperatorDef], node: NodeRef) -> &'p Schema {
    match node {
        NodeRef::Stream(i) => &streams[i].schema,
        NodeRef::Operator(i) => &operators[i].output,
    }
}

/// [`Plan::origin_key_positions`] of operator `op`.
fn origin_key_positions(streams: &[StreamDef], operators: &[OperatorDef], op: usize) -> Vec<usize> {
    let def = &operators[op];
    let Some(&first) = def.inputs.first() else { return Vec::new() };
    let input = node_schema(streams, operators, first);
    let positions: Option<Vec<usize>> =
        input.key_fields().map(|k| def.output.fields.iter().position(|f| f.name == k.name)).collect();
    positions.unwrap_or_default()
}

/// What an output name refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Stream(usize),
    Operator(usize),
    Late(usize),
    Expired(usize),
    DeadLetter,
}

/// The suffix of an operator's late side output.
pub const LATE_SUFFIX: &str = ".late";
/// The suffix of an operator's expired side output (`ttl`, byte budget).
pub const EXPIRED_SUFFIX: &str = ".expired";

/// An operator's side output named by `name` (`OPERATOR.late` or `OPERATOR.expired`): the
/// operator's name and whether it is the expired one.
pub fn side_output(name: &str) -> Option<(&str, bool)> {
    name.strip_suffix(LATE_SUFFIX)
        .map(|op| (op, false))
        .or_else(|| name.strip_suffix(EXPIRED_SUFFIX).map(|op| (op, true)))
}

impl Plan {
    /// Resolves an output name (replay's `--output`, a sink's `input`): a stream, an operator,
    /// `OPERATOR.late`, `OPERATOR.expired` or `dead_letter`.
    pub fn target(&self, name: &str) -> Option<Target> {
        if name == crate::config::DEAD_LETTER {
            return Some(Target::DeadLetter);
        }
        if let Some((operator, expired)) = side_output(name)
            && let Some(op) = self.operator(operator)
        {
            return Some(if expired { Target::Expired(op) } else { Target::Late(op) });
        }
        self.stream(name).map(Target::Stream).or_else(|| self.operator(name).map(Target::Operator))
    }

    /// The schema rows of operator `op`'s `side` are laid out by.
    pub fn side_schema(&self, op: usize, side: Side) -> &Schema {
        let def = &self.operators[op];
        match side {
            Side::Late(input) | Side::Expired { input: Some(input), .. } => self.node_schema(def.inputs[input]),
            Side::Result | Side::TooLarge | Side::Expired { input: None, .. } => &def.output,
        }
    }

    /// Writes a row of operator `op`'s output `side` as the JSON line replay and the sinks write
    /// (CONTRACT.md "Replay"). A too-large stand-in has no line of its own: nothing is written.
    pub fn write_side_row(&self, out: &mut Vec<u8>, op: usize, side: Side, row: &crate::record::Row) {
        use crate::record::json;
        let def = &self.operators[op];
        let schema = self.side_schema(op, side);
        match side {
            Side::Result => json::write_result(out, schema, crate::record::view::RowView::Heap(row)),
            Side::Late(input) => {
                let node = def.inputs[input];
                json::write_late(out, schema, matches!(node, NodeRef::Operator(_)), self.node_name(node), row);
            }
            Side::Expired { reason, input: Some(input) } => {
                let node = def.inputs[input];
                let from_operator = matches!(node, NodeRef::Operator(_));
                json::write_expired(out, schema, from_operator, self.node_name(node), row, reason.as_str());
            }
            Side::Expired { reason, input: None } => {
                json::write_expired(out, schema, true, &def.name, row, reason.as_str());
            }
            Side::TooLarge => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAMS: &str = r#"
[streams.a]
key = "k"
time = { field = "ts" }
fields = { k = "string", ts = "int" }
[streams.b]
key = "k"
time = { field = "ts" }
fields = { k = "string", ts = "int" }
"#;

    fn plan(operators: &str) -> Plan {
        let text = format!("{STREAMS}{operators}");
        match crate::config::parse("plan.toml", &text) {
            Ok(plan) => plan,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn readers_depth_and_kinds_are_derived_once() {
        let p = plan(
            r#"
[operators.u]
kind = "union"
inputs = ["a", "b"]
[operators.j]
kind = "interval_join"
left = "u"
right = "b"
lower = "0ms"
upper = "1s"
select = ["left.ts"]
[operators.quiet]
kind = "absence"
input = "j"
timeout = "1s"
"#,
        );
        let [u, j, quiet] = ["u", "j", "quiet"].map(|n| p.operator(n).expect("declared"));
        let (a, b) = (p.stream("a").expect("declared"), p.stream("b").expect("declared"));
        assert_eq!(p.readers(NodeRef::Stream(a)), &[(u, 0)]);
        assert_eq!(p.readers(NodeRef::Stream(b)), &[(u, 1), (j, 1)]);
        assert_eq!(p.readers(NodeRef::Operator(u)), &[(j, 0)]);
        assert_eq!(p.readers(NodeRef::Operator(j)), &[(quiet, 0)]);
        assert!(p.readers(NodeRef::Operator(quiet)).is_empty());
        assert_eq!([p.depth(u), p.depth(j), p.depth(quiet)], [1, 2, 3]);
        assert_eq!(p.longest_chain(), 3);
        assert_eq!([p.chained(u), p.chained(j), p.chained(quiet)], [false, true, true]);
        assert!(!p.clocked(u) && !p.clocked(j) && !p.clocked(quiet));
        // The join's results carry the union's key `k` first (rule 9).
        assert_eq!(p.origin_key_positions(j), [0]);
    }

    #[test]
    fn side_outputs_are_named_after_their_operator() {
        let p = plan("[operators.u]\nkind = \"union\"\ninputs = [\"a\", \"b\"]\n");
        let u = p.operator("u").expect("declared");
        assert_eq!(p.target("u.late"), Some(Target::Late(u)));
        assert_eq!(p.target("u.expired"), Some(Target::Expired(u)));
        assert_eq!(p.target("a.expired"), None, "a stream has no side outputs");
        assert_eq!(p.target("u"), Some(Target::Operator(u)));
    }

    #[test]
    fn an_expired_row_is_written_with_its_input_and_reason() {
        let p = plan("[operators.u]\nkind = \"union\"\ninputs = [\"a\", \"b\"]\n");
        let row = crate::record::Row {
            ts: 5,
            key: crate::record::Key::Str("x".into()),
            key_hash: 1,
            id: 2,
            values: vec![crate::record::Value::Str("x".into()), crate::record::Value::Int(5)].into(),
        };
        let mut out = Vec::new();
        let side = Side::Expired { reason: crate::operator::ExpiryReason::Ttl, input: Some(1) };
        p.write_side_row(&mut out, 0, side, &row);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\"k\":\"x\",\"ts\":5,\"_stream\":\"b\",\"_ts\":5,\"_reason\":\"ttl\"}\n"
        );
    }

    #[test]
    fn connect_is_clocked() {
        let p = plan(
            r#"
[operators.c]
kind = "connect"
function = "reconcile"
timeout = "1s"
left = "a"
right = "b"
select = ["left.ts"]
"#,
        );
        assert!(p.clocked(0) && !p.chained(0));
        assert_eq!(p.longest_chain(), 1);
    }

    #[test]
    fn chain_depth_counts_operators_not_streams() {
        let depths = [1, 3];
        let depth = |inputs: &[NodeRef]| chain_depth(inputs, |u| depths[u]);
        assert_eq!(depth(&[NodeRef::Stream(0), NodeRef::Stream(1)]), 1);
        assert_eq!(depth(&[NodeRef::Operator(0), NodeRef::Stream(1)]), 2);
        assert_eq!(depth(&[NodeRef::Operator(0), NodeRef::Operator(1)]), 4);
    }
}
