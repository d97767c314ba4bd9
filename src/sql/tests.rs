use proptest::prelude::*;

use super::*;
use crate::operator::OperatorSpec;
use crate::record::FieldType;

const TABLES: &str = "
CREATE TABLE status (device STRING, ts BIGINT, state STRING, seq BIGINT,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device', 'idle_timeout' = '5s');
CREATE TABLE command (device STRING, ts BIGINT, cmd STRING, cmd_id STRING,
  rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND)
  WITH ('key' = 'device', 'idle_timeout' = '5s');
";

fn plan(sql: &str) -> Plan {
    match load("t.sql", sql) {
        Ok(plan) => plan,
        Err(e) => panic!("{e}"),
    }
}

/// The errors as `t.sql:LINE:COL: message` lines.
fn errors(sql: &str) -> Vec<String> {
    match load("t.sql", sql) {
        Ok(_) => Vec::new(),
        Err(e) => e.to_string().lines().map(str::to_owned).collect(),
    }
}

fn interval_bounds(plan: &Plan) -> (i64, i64) {
    match &plan.operators[0].spec {
        OperatorSpec::IntervalJoin(spec) => (spec.lower, spec.upper),
        other => panic!("an interval join, not {:?}", other.kind()),
    }
}

#[test]
fn the_contract_gateway_join_compiles() {
    let plan = plan(&format!(
        "{TABLES}
CREATE VIEW effect AS
  SELECT c.cmd_id, c.device, s.seq, s.ts AS status_ts
  FROM command c LEFT JOIN status s
    ON c.device = s.device
   AND s.rt BETWEEN c.rt - INTERVAL '3' SECOND AND c.rt + INTERVAL '5' SECOND;"
    ));
    // '0.5' SECOND: Flink's watermark max − 500 ms is braid's max − 499 ms − 1 ms.
    assert_eq!(plan.streams[0].max_out_of_orderness, 499);
    assert_eq!(plan.streams[0].idle_timeout, 5_000);
    assert_eq!(plan.operators[0].name, "effect");
    assert_eq!(interval_bounds(&plan), (-3000, 5000));
    let names: Vec<&str> = plan.operators[0].output.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["device", "cmd_id", "seq", "status_ts", "_kind"]);
    assert!(plan.operators[0].output.fields[2].nullable, "a left join can miss the right side");
}

#[test]
fn every_form_of_the_bounds_means_the_same() {
    let bounds = |on: &str| {
        let sql = format!(
            "{TABLES} CREATE VIEW j AS SELECT c.cmd FROM command c JOIN status s ON c.device = s.device AND {on};"
        );
        interval_bounds(&plan(&sql))
    };
    assert_eq!(bounds("s.rt BETWEEN c.rt - INTERVAL '3' SECOND AND c.rt + INTERVAL '5' SECOND"), (-3000, 5000));
    // The left time bounded by the right: the same span, seen from the other side.
    assert_eq!(bounds("c.rt BETWEEN s.rt - INTERVAL '5' SECOND AND s.rt + INTERVAL '3' SECOND"), (-3000, 5000));
    assert_eq!(bounds("s.rt >= c.rt - INTERVAL '3' SECOND AND s.rt <= c.rt + INTERVAL '5' SECOND"), (-3000, 5000));
    // Exclusive bounds move by 1 ms, as lower_exclusive / upper_exclusive do.
    assert_eq!(bounds("s.rt > c.rt - INTERVAL '3' SECOND AND s.rt < c.rt + INTERVAL '5' SECOND"), (-2999, 4999));
    assert_eq!(bounds("c.rt - INTERVAL '3' SECOND < s.rt AND c.rt + INTERVAL '5' SECOND > s.rt"), (-2999, 4999));
    assert_eq!(bounds("c.rt < s.rt + INTERVAL '3' SECOND AND c.rt >= s.rt - INTERVAL '5' SECOND"), (-2999, 5000));
    assert_eq!(bounds("s.rt = c.rt"), (0, 0));
    assert_eq!(bounds("s.rt BETWEEN c.rt AND c.rt + INTERVAL '250' MILLISECOND"), (0, 250));
    assert_eq!(bounds("s.rt BETWEEN c.rt - INTERVAL '1' MINUTE AND c.rt + INTERVAL '1' HOUR"), (-60_000, 3_600_000));
}

#[test]
fn a_subquery_join_is_an_inner_operator_named_after_the_view() {
    let plan = plan(&format!(
        "{TABLES}
CREATE VIEW outer_join AS
  SELECT x.cmd, y.state FROM
    (SELECT c.cmd, s.seq FROM command c JOIN status s ON c.device = s.device AND s.rt BETWEEN c.rt AND c.rt + INTERVAL '1' SECOND) x
    JOIN status y ON x.device = y.device AND y.rt BETWEEN x._ts AND x._ts + INTERVAL '2' SECOND;"
    ));
    let names: Vec<&str> = plan.operators.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["outer_join_1", "outer_join"]);
}

#[test]
fn precision_zero_is_seconds_and_proctime_is_ingest_time() {
    let plan = plan(
        "CREATE TABLE a (k STRING, t BIGINT, rt AS TO_TIMESTAMP_LTZ(t, 0), WATERMARK FOR rt AS rt - INTERVAL '1' MILLISECOND) WITH ('key' = 'k');
         CREATE TABLE b (k STRING, pt AS PROCTIME()) WITH ('key' = 'k', 'max_payload' = '1KiB')",
    );
    assert_eq!(
        plan.streams[0].schema.time,
        crate::record::TimeSpec::Field { pos: 1, unit: crate::record::TimeUnit::S }
    );
    assert_eq!(plan.streams[0].max_out_of_orderness, 0);
    assert_eq!(plan.streams[1].schema.time, crate::record::TimeSpec::Ingest);
    assert_eq!(plan.streams[1].max_payload, 1024);
}

#[test]
fn insert_into_feeds_a_sink_of_the_toml() {
    let toml = format!(
        "[sinks.out]\nkind = \"stdout\"\n\n[pipeline]\nsql = \"\"\"\n{TABLES}\nINSERT INTO out SELECT c.cmd FROM command c JOIN status s ON c.device = s.device AND s.rt = c.rt;\nINSERT INTO out SELECT * FROM status;\n\"\"\"\n"
    );
    let plan = match crate::config::parse("t.toml", &toml) {
        Ok(plan) => plan,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(plan.operators[0].name, "out");
    assert_eq!(plan.sinks[0].inputs, ["out", "status"]);
}

#[test]
fn errors_in_pipeline_sql_carry_the_toml_files_lines() {
    let toml = format!(
        "[runtime]\nshards = 1\n\n[pipeline]\nsql = \"\"\"\n{TABLES}\nCREATE VIEW v AS SELECT * FROM status s, command c;\n\"\"\"\n"
    );
    let got = match crate::config::parse("t.toml", &toml) {
        Ok(_) => Vec::new(),
        Err(e) => e.to_string().lines().map(str::to_owned).collect(),
    };
    assert_eq!(
        got,
        ["t.toml:14:40: a cross join is not supported: join on the keys (JOIN … ON a.key = b.key AND a time bound)"]
    );
    // A configuration error in a generated table: at the WITH option it came from.
    let toml = toml
        .replace("'idle_timeout' = '5s');\nCREATE TABLE command", "'idle_timeout' = 'soon');\nCREATE TABLE command")
        .replace("CREATE VIEW v AS SELECT * FROM status s, command c", "INSERT INTO nowhere SELECT * FROM status");
    let got = match crate::config::parse("t.toml", &toml) {
        Ok(_) => Vec::new(),
        Err(e) => e.to_string().lines().map(str::to_owned).collect(),
    };
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with("t.toml:9:27: table status: bad duration \"soon\""), "{got:?}");
}

#[test]
fn refusals_say_where_and_what_instead() {
    let view = |body: &str| errors(&format!("{TABLES}CREATE VIEW v AS {body}"));
    assert_eq!(
        view("SELECT c.cmd FROM command c JOIN status s ON c.device = s.device"),
        [
            "t.sql:8:63: a join without a time bound would keep every row forever: bound it (s.rt BETWEEN c.rt - INTERVAL … AND c.rt + INTERVAL …, or >, >=, <, <=), window both sides, or join FOR SYSTEM_TIME AS OF"
        ]
    );
    assert_eq!(
        view("SELECT c.cmd, c.ts * 2 FROM command c JOIN status s ON c.device = s.device AND s.rt = c.rt"),
        ["t.sql:8:32: a computed select expression needs a name: … AS name"]
    );
    assert_eq!(
        view("SELECT cmd FROM command WHERE cmd = 'x'"),
        [
            "t.sql:8:18: a SELECT over one table (a filter or projection) is not an operator braid has: join it, union it (UNION ALL), aggregate it by window (GROUP BY window_start, window_end, key), or read the table itself"
        ]
    );
    assert_eq!(
        view("SELECT c.cmd FROM command c JOIN status s ON c.cmd = s.state AND s.rt = c.rt"),
        [
            "t.sql:8:63: braid joins on the tables' keys: c.device = s.device ('key' options); other equalities are not supported yet"
        ]
    );
    assert_eq!(
        view("SELECT DISTINCT cmd FROM command"),
        ["t.sql:8:18: SELECT DISTINCT is not supported: results carry _id, deduplicate by it"]
    );
    assert_eq!(
        view("SELECT * FROM command UNION SELECT * FROM command"),
        ["t.sql:8:40: UNION without ALL removes duplicates, which needs unbounded state: braid supports UNION ALL"]
    );
}

#[test]
fn every_failing_statement_is_reported_and_readers_of_it_stay_quiet() {
    let got = errors(
        "CREATE TABLE a (k INT) WITH ('key' = 'k');\nCREATE TABLE b (k STRING, x FLOAT) WITH ('key' = 'k');\nCREATE VIEW u AS SELECT * FROM a UNION ALL SELECT * FROM b;",
    );
    assert_eq!(
        got,
        [
            "t.sql:1:19: INT: braid's integers are 64-bit, declare BIGINT",
            "t.sql:2:29: FLOAT: braid's floats are doubles, declare DOUBLE",
        ]
    );
}

#[test]
fn watermarks_map_and_are_checked() {
    let table = |wm: &str| {
        errors(&format!("CREATE TABLE a (k STRING, ts BIGINT, rt AS TO_TIMESTAMP_LTZ(ts, 3){wm}) WITH ('key' = 'k')"))
    };
    assert_eq!(table(", WATERMARK FOR rt AS rt - INTERVAL '2' SECOND"), Vec::<String>::new());
    assert_eq!(
        table(", WATERMARK FOR rt AS rt"),
        [
            "t.sql:1:89: braid's watermark trails the largest time by at least 1 ms: the delay must be at least INTERVAL '0.001' SECOND"
        ]
    );
    assert_eq!(
        table(""),
        ["t.sql:1:38: an event-time attribute needs a watermark: WATERMARK FOR rt AS rt - INTERVAL '0.5' SECOND"]
    );
    assert_eq!(
        table(", WATERMARK FOR rt AS rt - INTERVAL '0.0005' SECOND"),
        ["t.sql:1:94: \"0.0005s\" is not a whole number of milliseconds"]
    );
}

/// SQL-ish words and symbols, so random token sequences reach deep into the parser.
const VOCABULARY: [&str; 48] = [
    "CREATE",
    "TABLE",
    "VIEW",
    "AS",
    "SELECT",
    "FROM",
    "JOIN",
    "LEFT",
    "ON",
    "AND",
    "OR",
    "NOT",
    "WHERE",
    "GROUP",
    "BY",
    "UNION",
    "ALL",
    "INSERT",
    "INTO",
    "WITH",
    "WATERMARK",
    "FOR",
    "SYSTEM_TIME",
    "OF",
    "BETWEEN",
    "INTERVAL",
    "'3'",
    "SECOND",
    "TUMBLE",
    "SESSION",
    "DESCRIPTOR",
    "PARTITION",
    "(",
    ")",
    ",",
    ";",
    ".",
    "*",
    "=",
    "<",
    "-",
    "+",
    "a",
    "b",
    "rt",
    "ts",
    "CASE",
    "END",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = load("t.sql", &text);
    }

    #[test]
    fn token_soup_never_panics(words in proptest::collection::vec(proptest::sample::select(&VOCABULARY[..]), 0..60)) {
        let text = words.join(" ");
        let _ = load("t.sql", &text);
        let _ = load("t.sql", &format!("{TABLES}{text}"));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash(depth in 0usize..400) {
        let text = format!("{TABLES} CREATE VIEW v AS SELECT c.cmd FROM command c JOIN status s ON {}c.device = s.device{}",
            "(".repeat(depth), ")".repeat(depth));
        let _ = load("t.sql", &text);
        let nots = format!("{TABLES} CREATE VIEW v AS SELECT c.cmd FROM command c JOIN status s ON {} c.device = s.device", "NOT ".repeat(depth));
        let _ = load("t.sql", &nots);
    }
}

#[test]
fn two_window_aggregates_joined_are_a_cogroup() {
    let plan = plan(&format!(
        "{TABLES}
SET 'table.exec.emit.allow-lateness' = '2 s';
CREATE VIEW per_minute AS
  SELECT c.device, c.n, s.mean_seq, c.window_start FROM
    (SELECT device, window_start, window_end, COUNT(*) AS n
       FROM TABLE(HOP(TABLE command, DESCRIPTOR(rt), INTERVAL '30' SECOND, INTERVAL '1' MINUTE))
       GROUP BY device, window_start, window_end) c
  FULL JOIN
    (SELECT device, window_start, window_end, AVG(seq) AS mean_seq
       FROM TABLE(HOP(TABLE status, DESCRIPTOR(rt), INTERVAL '30' SECOND, INTERVAL '1' MINUTE))
       GROUP BY window_start, window_end, device) s
  ON c.device = s.device AND c.window_start = s.window_start AND c.window_end = s.window_end;"
    ));
    let OperatorSpec::CoGroup(spec) = &plan.operators[0].spec else { panic!("a cogroup") };
    assert_eq!(spec.join, crate::operator::interval_join::JoinType::Full);
    assert_eq!(spec.window.allowed_lateness, 2_000);
    assert_eq!(spec.window.kind, crate::operator::window::WindowKind::Fixed { size: 60_000, slide: 30_000, offset: 0 });
    let functions: Vec<_> = spec.aggregates.iter().map(|a| (a.function, a.input)).collect();
    use crate::operator::cogroup::Function;
    assert_eq!(functions, [(Function::Count, 0), (Function::Avg, 1)]);
    let names: Vec<&str> = plan.operators[0].output.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["device", "n", "mean_seq", "_kind", "_window_start", "_window_end", "_version"]);
}

#[test]
fn a_window_aggregate_over_one_table_is_a_window_aggregate() {
    let view = |tvf: &str, rest: &str| {
        plan(&format!(
            "{TABLES}
CREATE VIEW per_device AS
  SELECT device, window_start, window_end, COUNT(*) AS n, AVG(seq) AS mean, LAST_VALUE(state) AS last_state
  FROM TABLE({tvf}) s{rest}
  GROUP BY window_start, window_end, device;"
        ))
    };
    use crate::operator::window::WindowKind;
    for (tvf, kind) in [
        (
            "TUMBLE(TABLE status, DESCRIPTOR(rt), INTERVAL '10' SECOND)",
            WindowKind::Fixed { size: 10_000, slide: 10_000, offset: 0 },
        ),
        (
            "HOP(TABLE status, DESCRIPTOR(rt), INTERVAL '5' SECOND, INTERVAL '10' SECOND, INTERVAL '1' SECOND)",
            WindowKind::Fixed { size: 10_000, slide: 5_000, offset: 1_000 },
        ),
        (
            "SESSION(TABLE status PARTITION BY device, DESCRIPTOR(rt), INTERVAL '3' SECOND)",
            WindowKind::Session { gap: 3_000 },
        ),
    ] {
        let plan = view(tvf, " WHERE s.seq > 3 AND state <> 'off'");
        let OperatorSpec::WindowAggregate(spec) = &plan.operators[0].spec else { panic!("a window aggregate") };
        assert_eq!(spec.window.kind, kind);
        assert!(spec.one.as_ref().is_some_and(|one| one.filter.is_some()), "WHERE is the where");
        use crate::operator::cogroup::Function;
        let functions: Vec<_> = spec.aggregates.iter().map(|a| (a.function, a.pos)).collect();
        assert_eq!(functions, [(Function::Count, None), (Function::Avg, Some(3)), (Function::Last, Some(2))]);
        let mut names: Vec<&str> = plan.operators[0].output.fields.iter().map(|f| f.name.as_str()).collect();
        if matches!(kind, WindowKind::Session { .. }) {
            assert_eq!(names.pop(), Some("_supersedes"));
        }
        assert_eq!(names, ["device", "n", "mean", "last_state", "_window_start", "_window_end", "_version"]);
    }
    let text = |sql: &str| compile(sql).unwrap_or_else(|e| panic!("{}", e[0].message)).toml.text;
    let toml = text(&format!(
        "{TABLES}CREATE VIEW v AS SELECT device, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE status, DESCRIPTOR(rt), \
         INTERVAL '1' MINUTE)) WHERE seq BETWEEN 1 AND 9 GROUP BY device, window_start, window_end;"
    ));
    assert!(toml.contains("where = \"(seq >= 1 and seq <= 9)\""), "{toml}");
    assert!(toml.contains("\"count(*) AS n\""), "{toml}");
    assert_eq!(
        errors(&format!(
            "{TABLES}CREATE VIEW v AS SELECT device, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE status, DESCRIPTOR(rt), \
             INTERVAL '1' MINUTE)) WHERE x.seq > 1 GROUP BY device, window_start, window_end;"
        )),
        ["t.sql:8:123: unknown alias \"x\" (here: status)"]
    );
    assert_eq!(
        errors(&format!(
            "{TABLES}CREATE VIEW v AS SELECT device, COUNT(*) AS n FROM status GROUP BY device, window_start, window_end;"
        )),
        [
            "t.sql:8:52: GROUP BY over one table is a window aggregate: FROM TABLE(TUMBLE|HOP|SESSION(TABLE t, DESCRIPTOR(rt), …)) GROUP BY window_start, window_end, key"
        ]
    );
}

/// The `where` a compiled view's operator got (the generated TOML line).
fn where_line(sql: &str) -> Option<String> {
    let compiled = compile(sql).unwrap_or_else(|e| panic!("{}", e[0].message));
    compiled.toml.text.lines().find(|l| l.starts_with("where = ")).map(str::to_owned)
}

#[test]
fn filters_in_on_and_an_inner_where_become_the_pairs_where() {
    let interval = format!(
        "{TABLES}CREATE VIEW v AS SELECT c.cmd FROM command c JOIN status s \
         ON c.device = s.device AND s.rt = c.rt AND s.seq > 3 WHERE c.cmd <> 'noop';"
    );
    assert_eq!(where_line(&interval).as_deref(), Some(r#"where = "((right.seq > 3) and (left.cmd != \"noop\"))""#));
    let compiled = plan(&interval);
    let OperatorSpec::IntervalJoin(spec) = &compiled.operators[0].spec else { panic!("an interval join") };
    assert!(spec.condition.is_some());

    let outer_on = format!(
        "{TABLES}CREATE VIEW v AS SELECT c.cmd FROM command c LEFT JOIN status s \
         ON c.device = s.device AND s.rt = c.rt AND s.seq > 3;"
    );
    assert_eq!(where_line(&outer_on).as_deref(), Some(r#"where = "(right.seq > 3)""#));

    let temporal = format!(
        "{TABLES}CREATE VIEW v AS SELECT c.cmd FROM command c LEFT JOIN status FOR SYSTEM_TIME AS OF c.rt AS s \
         ON c.device = s.device AND s.state = 'on';"
    );
    assert_eq!(where_line(&temporal).as_deref(), Some(r#"where = "(right.state == \"on\")""#));
    let OperatorSpec::TemporalJoin(spec) = &plan(&temporal).operators[0].spec else { panic!("a temporal join") };
    assert!(spec.condition.is_some());
}

#[test]
fn computed_select_expressions_become_computed_items() {
    let sql = format!(
        "{TABLES}CREATE VIEW v AS SELECT c.cmd, s.seq * 2 + 1 AS odd, \
         CASE WHEN s.state = 'on' THEN 1.5 WHEN s.seq > 3 THEN 2 END AS weight, \
         COALESCE(s.state, c.cmd) AS what \
         FROM command c LEFT JOIN status s ON c.device = s.device AND s.rt = c.rt;"
    );
    let compiled = compile(&sql).unwrap_or_else(|e| panic!("{}", e[0].message));
    let items: Vec<&str> = compiled.toml.text.lines().filter(|l| l.starts_with("  \"")).collect();
    assert_eq!(
        items,
        [
            r#"  "left.cmd","#,
            r#"  "((right.seq * 2) + 1) AS odd","#,
            r#"  "(case when (right.state == \"on\") then 1.5 when (right.seq > 3) then 2 end) AS weight","#,
            r#"  "coalesce(right.state, left.cmd) AS what","#,
        ]
    );
    let plan = plan(&sql);
    let fields: Vec<(&str, FieldType)> =
        plan.operators[0].output.fields.iter().map(|f| (f.name.as_str(), f.ty)).collect();
    assert_eq!(
        fields,
        [
            ("device", FieldType::String),
            ("cmd", FieldType::String),
            ("odd", FieldType::Int),
            ("weight", FieldType::Float),
            ("what", FieldType::String),
            ("_kind", FieldType::String)
        ]
    );
    assert_eq!(
        errors(&format!(
            "{TABLES}CREATE VIEW v AS SELECT CASE s.seq WHEN 1 THEN 2 END AS x \
             FROM command c JOIN status s ON c.device = s.device AND s.rt = c.rt;"
        )),
        [
            "t.sql:8:25: the simple CASE x WHEN … form is not supported in expressions: fields, literals, arithmetic, comparisons, AND, OR, NOT, BETWEEN, CASE WHEN, COALESCE"
        ]
    );
}

#[test]
fn outer_window_joins_compile_with_their_join_type() {
    for (words, join) in [("LEFT", "left"), ("RIGHT", "right"), ("FULL", "full")] {
        let sql = format!(
            "{TABLES}CREATE VIEW v AS SELECT c.cmd, s.state \
             FROM TABLE(TUMBLE(TABLE command, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) c \
             {words} JOIN TABLE(TUMBLE(TABLE status, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) s \
             ON c.device = s.device AND c.window_start = s.window_start AND c.window_end = s.window_end AND s.seq > 1;"
        );
        let compiled = compile(&sql).unwrap_or_else(|e| panic!("{}", e[0].message));
        assert!(compiled.toml.text.contains(&format!("join = \"{join}\"\n")), "{}", compiled.toml.text);
        assert!(compiled.toml.text.contains("where = \"(right.seq > 1)\"\n"), "{}", compiled.toml.text);
        let plan = plan(&sql);
        let OperatorSpec::WindowJoin(spec) = &plan.operators[0].spec else { panic!("a window join") };
        assert_eq!(spec.join.keeps_unmatched(1), join != "left");
        let state = plan.operators[0].output.fields.iter().find(|f| f.name == "state").map(|f| f.nullable);
        assert_eq!(state, Some(join != "right"), "a right field may be missing from left_only rows");
    }
}
