//! The plan as the shards use it: per operator its spec, inputs and readers, and whether it is
//! chained (its inputs merge in tag order) or clocked (processing-time timers).

use crate::config::{NodeRef, Plan};
use crate::operator::OperatorSpec;

/// The plan as the shards use it.
pub struct Topology {
    pub shards: usize,
    pub ops: Vec<OpNode>,
    /// Per stream: the (operator, input) pairs reading it, in operator order.
    pub stream_readers: Vec<Vec<(usize, usize)>>,
    pub idle_advance: bool,
}

pub struct OpNode {
    pub spec: OperatorSpec,
    pub inputs: Vec<NodeRef>,
    /// The (operator, input) pairs reading this operator's results.
    pub readers: Vec<(usize, usize)>,
    /// Reads another operator: its inputs are merged in tag order.
    pub chained: bool,
    /// May hold processing-time timers (connect).
    pub clocked: bool,
    /// Where its results carry the key they came from ([`origin_rank`](crate::operator::host::origin_rank)).
    pub origin: Option<usize>,
}

impl Topology {
    pub fn new(plan: &Plan, shards: usize) -> Topology {
        let mut stream_readers = vec![Vec::new(); plan.streams.len()];
        let mut ops: Vec<OpNode> = plan
            .operators
            .iter()
            .enumerate()
            .map(|(op, o)| OpNode {
                origin: plan.origin_key_position(op),
                spec: o.spec.clone(),
                inputs: o.inputs.clone(),
                readers: Vec::new(),
                chained: o.inputs.iter().any(|n| matches!(n, NodeRef::Operator(_))),
                clocked: matches!(o.spec, OperatorSpec::Connect(_)),
            })
            .collect();
        for (op, def) in plan.operators.iter().enumerate() {
            for (input, node) in def.inputs.iter().enumerate() {
                match *node {
                    NodeRef::Stream(s) => stream_readers[s].push((op, input)),
                    NodeRef::Operator(u) => ops[u].readers.push((op, input)),
                }
            }
        }
        Topology { shards, ops, stream_readers, idle_advance: plan.runtime.idle_advance }
    }

    /// Operators on the longest chain (a tag's path holds at most [`MAX_DEPTH`]).
    pub(super) fn depth(&self) -> usize {
        let mut depth = vec![0usize; self.ops.len()];
        for (op, node) in self.ops.iter().enumerate() {
            let upstream = node.inputs.iter().filter_map(|n| match *n {
                NodeRef::Operator(u) => Some(depth[u]),
                NodeRef::Stream(_) => None,
            });
            depth[op] = 1 + upstream.max().unwrap_or(0);
        }
        depth.into_iter().max().unwrap_or(0)
    }
}
