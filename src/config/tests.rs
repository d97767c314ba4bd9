use super::*;
use crate::operator::OperatorSpec;
use crate::plan::NodeRef;

const VALID: &str = r#"
[streams.status]
key = "device"
time = { field = "ts", unit = "ms" }
fields = { device = "string", ts = "int", seq = "int" }

[streams.command]
key = "device"
time = { field = "ts" }
fields = { device = "string", ts = "int", cmd_id = "string" }

[operators.effect]
kind = "interval_join"
left = "command"
right = "status"
lower = "-3s"
upper = "5s"
lower_exclusive = true
join = "left"
select = ["left.cmd_id", "right.seq", "right.device", "right.ts AS status_ts"]
"#;

fn errors(text: &str) -> Vec<String> {
    match parse("t.toml", text) {
        Ok(_) => Vec::new(),
        Err(e) => e.to_string().lines().map(str::to_owned).collect(),
    }
}

#[test]
fn a_valid_config_becomes_a_plan() {
    let plan = parse("t.toml", VALID).unwrap();
    assert_eq!(plan.streams.len(), 2);
    assert_eq!(plan.runtime.shards, None);
    assert!(plan.runtime.idle_advance);
    assert_eq!(plan.streams[0].idle_timeout, 30_000, "default idle_timeout");
    assert_eq!(plan.streams[0].max_payload, 256 * 1024);
    assert_eq!(plan.streams[0].max_skew, 30_000, "default max_skew (CONTRACT.md)");
    let effect = &plan.operators[0];
    assert_eq!(effect.inputs, [NodeRef::Stream(1), NodeRef::Stream(0)]);
    let names: Vec<&str> = effect.output.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["device", "cmd_id", "seq", "status_ts", "_kind"], "key first, selected key not repeated");
    assert!(effect.output.fields[2].nullable, "a left join can miss the right side");
    let OperatorSpec::IntervalJoin(spec) = &effect.spec else { panic!("an interval join") };
    assert_eq!((spec.lower, spec.upper), (-2999, 5000), "lower_exclusive moves lower by 1 ms");
}

#[test]
fn errors_point_at_keys_and_headers() {
    let text = VALID.replace("upper = \"5s\"", "upper = \"-4s\"").replace("seq = \"int\" }", "seq = \"integer\" }");
    let got = errors(&text);
    assert_eq!(
        got,
        [
            "t.toml:5:43: streams.status.fields.seq: unknown type \"integer\" (string, int, float, bool, bytes)",
            "t.toml:16:1: operators.effect.lower: the bounds leave no room: lower' = -2999 ms > upper' = -4000 ms \
             (after the exclusive flags)",
        ]
    );
    let got =
        errors(&format!("{VALID}\n[operators.status]\nkind = \"absence\"\ninput = \"status\"\ntimeout = \"1s\"\n"));
    assert_eq!(got, ["t.toml:22:1: operators.status: name \"status\" is already used by a stream"]);
}

#[test]
fn every_error_is_reported_at_once() {
    let text = VALID
        .replace("kind = \"interval_join\"", "kind = \"interval_join\"\ncolour = 1")
        .replace("\"right.seq\"", "\"right.nope\"")
        .replace("[streams.command]\nkey = \"device\"", "[streams.command]\nkey = \"nokey\"");
    let got = errors(&text);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].contains("streams.command.key: key field \"nokey\" is not in `fields`"), "{got:?}");
    assert!(got[1].contains("operators.effect.colour: unknown key"), "{got:?}");
    // The broken stream hides the operator's select error, which would only repeat it.
}

#[test]
fn syntax_errors_carry_the_parser_position() {
    let got = errors("[streams.a]\nkey = \n");
    assert_eq!(got.len(), 1);
    assert!(got[0].starts_with("t.toml:2:"), "{got:?}");
}

#[test]
fn line_col_counts_characters() {
    let e = ConfigErrors { file: "f".into(), text: "ä = 1\n  [x]\n".into(), errors: Vec::new() };
    assert_eq!(e.line_col(0), (1, 1));
    assert_eq!(e.line_col(5), (1, 5));
    assert_eq!(e.line_col(10), (2, 3), "a key inside a header is reported at its [");
}

#[test]
fn disorder_far_above_the_join_span_is_a_warning_not_an_error() {
    let text = VALID.replace("lower = \"-3s\"\nupper = \"5s\"", "lower = \"0ms\"\nupper = \"10ms\"").replace(
        "time = { field = \"ts\", unit = \"ms\" }\nfields = { device = \"string\", ts = \"int\", seq",
        "time = { field = \"ts\", unit = \"ms\" }\nmax_out_of_orderness = \"5s\"\nfields = { device = \"string\", ts = \"int\", seq",
    );
    let plan = parse("t.toml", &text).unwrap();
    assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
    assert!(
        plan.warnings[0].starts_with("t.toml:13:1: warning: operators.effect: status may be out of order by 5000 ms")
    );
    assert!(parse("t.toml", VALID).unwrap().warnings.is_empty());
}

#[test]
fn an_mqtt_sink_takes_a_status_topic() {
    let sink = "[sinks.up]\nkind = \"mqtt\"\ninputs = [\"effect\"]\nurl = \"mqtt://h:1\"\ntopic = \"r/{device}\"\n";
    let plan = parse("t.toml", &format!("{VALID}\n{sink}status_topic = \"gw/1/status\"\n")).unwrap();
    assert_eq!(plan.sinks[0].status_topic.as_deref(), Some("gw/1/status"));
    assert_eq!(parse("t.toml", &format!("{VALID}\n{sink}")).unwrap().sinks[0].status_topic, None);
    let got = errors(&format!("{VALID}\n{sink}status_topic = \"gw/{{device}}\"\n"));
    assert_eq!(got.len(), 1);
    assert!(got[0].contains("sinks.up.status_topic: a publish topic"), "{got:?}");
}

#[test]
fn a_union_reads_at_most_max_inputs() {
    let union = |n: usize| {
        let inputs = vec!["\"status\""; n].join(", ");
        format!("{VALID}\n[operators.all]\nkind = \"union\"\ninputs = [{inputs}]\n")
    };
    assert!(parse("t.toml", &union(crate::plan::MAX_INPUTS)).is_ok());
    let got = errors(&union(crate::plan::MAX_INPUTS + 1));
    assert_eq!(got, ["t.toml:24:1: operators.all.inputs: 257 inputs: an operator reads at most 256"]);
}

#[test]
fn an_unknown_kind_lists_every_kind() {
    let got = errors(&VALID.replace("kind = \"interval_join\"", "kind = \"merge\""));
    assert_eq!(
        got,
        ["t.toml:13:1: operators.effect.kind: must be one of union, connect, window_join, cogroup, interval_join, \
             temporal_join, absence, window_aggregate"]
    );
}

#[test]
fn ttl_is_checked_and_warned_about_when_shorter_than_the_join_span() {
    // The join's span is upper' − lower' = 5000 − (−2999) = 7999 ms.
    let with = |ttl: &str| VALID.replace("join = \"left\"", &format!("join = \"left\"\nttl = \"{ttl}\""));
    let plan = parse("t.toml", &with("8s")).unwrap();
    assert_eq!(plan.operators[0].ttl, Some(8_000));
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    let plan = parse("t.toml", &with("7s")).unwrap();
    assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
    assert!(
        plan.warnings[0].starts_with(
            "t.toml:20:1: warning: operators.effect.ttl: ttl of 7000 ms is shorter than the join span (7999 ms)"
        ),
        "{:?}",
        plan.warnings
    );
    let got = errors(&with("0ms"));
    assert!(got.iter().any(|e| e.starts_with("t.toml:20:1: operators.effect.ttl: must be positive")), "{got:?}");
    let got = errors(&with("soon"));
    assert!(got.iter().any(|e| e.starts_with("t.toml:20:1: operators.effect.ttl:")), "{got:?}");
    let union = "[operators.u]\nkind = \"union\"\ninputs = [\"status\"]\nttl = \"1h\"\n";
    assert!(parse("t.toml", &format!("{VALID}{union}")).is_ok(), "a union keeps no state: any ttl will do");
    // An absence's floor is its timeout: a key expiring sooner is never reported absent.
    let absence = |ttl: &str| {
        format!("{VALID}[operators.quiet]\nkind = \"absence\"\ninput = \"status\"\ntimeout = \"1s\"\nttl = \"{ttl}\"\n")
    };
    assert!(parse("t.toml", &absence("1s")).unwrap().warnings.is_empty());
    let plan = parse("t.toml", &absence("999ms")).unwrap();
    assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
    assert!(
        plan.warnings[0].contains("operators.quiet.ttl: ttl of 999 ms is shorter than the absence timeout (1000 ms)")
    );
    let got = errors(&absence("-1s"));
    assert!(got.iter().any(|e| e.contains("operators.quiet.ttl: must be positive")), "{got:?}");
}

#[test]
fn ttl_on_a_window_kind_is_warned_about_when_shorter_than_the_window_and_its_lateness() {
    // A window_aggregate's floor is size + allowed_lateness (a session's: gap + allowed_lateness).
    let aggregate = |window: &str, ttl: &str| {
        format!(
            "{VALID}[operators.agg]\nkind = \"window_aggregate\"\ninput = \"status\"\nwindow = {window}\n\
             allowed_lateness = \"1s\"\naggregate = [\"count(*) AS n\"]\nttl = \"{ttl}\"\n"
        )
    };
    let tumbling = "{ kind = \"tumbling\", size = \"5s\" }";
    let plan = parse("t.toml", &aggregate(tumbling, "6s")).unwrap();
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    assert_eq!(plan.operators[1].ttl, Some(6_000));
    let plan = parse("t.toml", &aggregate(tumbling, "5999ms")).unwrap();
    assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
    assert!(plan.warnings[0].contains("operators.agg.ttl: ttl of 5999 ms is shorter than the window's span"));
    assert!(plan.warnings[0].contains("(6000 ms)"), "{:?}", plan.warnings);
    let session = "{ kind = \"session\", gap = \"2s\" }";
    assert!(parse("t.toml", &aggregate(session, "3s")).unwrap().warnings.is_empty());
    assert_eq!(parse("t.toml", &aggregate(session, "2999ms")).unwrap().warnings.len(), 1);
    // A window_join's floor is the same: its windows are per-key state too.
    let join = |ttl: &str| {
        format!(
            "{VALID}[operators.wj]\nkind = \"window_join\"\nleft = \"status\"\nright = \"status\"\n\
             select = [\"left.seq\"]\nwindow = {tumbling}\nallowed_lateness = \"1s\"\nttl = \"{ttl}\"\n"
        )
    };
    assert!(parse("t.toml", &join("6s")).unwrap().warnings.is_empty());
    let plan = parse("t.toml", &join("5s")).unwrap();
    assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
    assert!(plan.warnings[0].contains("operators.wj.ttl: ttl of 5000 ms is shorter than the window's span"));
}

#[test]
fn state_budget_and_on_state_full() {
    let plan =
        parse("t.toml", &format!("[runtime]\nstate_budget = \"64MiB\"\non_state_full = \"evict_oldest\"\n{VALID}"))
            .unwrap();
    assert_eq!(plan.runtime.state_budget, Some(64 << 20));
    assert_eq!(plan.runtime.on_state_full, OnStateFull::EvictOldest);
    let plan = parse("t.toml", &format!("[runtime]\nstate_budget = \"64MiB\"\n{VALID}")).unwrap();
    assert_eq!(plan.runtime.on_state_full, OnStateFull::Backpressure, "the default");
    assert_eq!(parse("t.toml", VALID).unwrap().runtime.state_budget, None);

    let bad = format!("[runtime]\nstate_budget = \"lots\"\non_state_full = \"drop\"\n{VALID}");
    assert_eq!(
        errors(&bad),
        [
            "t.toml:2:1: runtime.state_budget: expected a size such as \"256MiB\" (bytes of state per shard), got \"lots\"",
            "t.toml:3:1: runtime.on_state_full: expected \"backpressure\" or \"evict_oldest\"",
        ]
    );
    assert_eq!(
        errors(&format!("[runtime]\non_state_full = \"evict_oldest\"\n{VALID}")),
        ["t.toml:2:1: runtime.on_state_full: needs runtime.state_budget (the bound it acts at)"]
    );
    // The interval join's two arenas map an active and a spare 256 KiB segment each: 1 MiB.
    assert_eq!(
        errors(&format!("[runtime]\nstate_budget = \"768KiB\"\n{VALID}")),
        ["t.toml:2:1: runtime.state_budget: 768KiB is less than the 1MiB a shard's arenas map holding nothing \
          (an active and a spare 256KiB segment per store; stores: effect (2)); give at least that, better a few times more"]
    );
    assert!(parse("t.toml", &format!("[runtime]\nstate_budget = \"1MiB\"\n{VALID}")).is_ok());
}
