use super::eval::{Val, int_true_div};
use super::{Expr, MAX_DEPTH};
use crate::record::schema::Field;
use crate::record::view::RowView;
use crate::record::{FieldType, Key, Row, Schema, TimeSpec, Value};
use proptest::prelude::*;

fn schema(fields: &[(&str, FieldType)]) -> Schema {
    let fields = fields.iter().map(|(n, ty)| Field { name: (*n).into(), ty: *ty, nullable: true }).collect();
    Schema::new(fields, None, TimeSpec::Ingest)
}

/// left: name string, n int, x float, flag bool, b bytes; right: amount float, qty int, tag string, ok bool.
fn schemas() -> (Schema, Schema) {
    use FieldType::*;
    (
        schema(&[("name", String), ("n", Int), ("x", Float), ("flag", Bool), ("b", Bytes)]),
        schema(&[("amount", Float), ("qty", Int), ("tag", String), ("ok", Bool)]),
    )
}

fn row(values: Vec<Value>) -> Row {
    Row { ts: 0, key: Key::Broadcast, key_hash: 0, id: 0, values: values.into() }
}

fn s(v: &str) -> Value {
    Value::Str(v.into())
}

/// A typical pair: name "ann", n 7, x 2.5, flag true, b "QQ=="; amount 150.0, qty -3, tag "a", ok false.
fn pair() -> (Row, Row) {
    (
        row(vec![s("ann"), Value::Int(7), Value::Float(2.5), Value::Bool(true), s("QQ==")]),
        row(vec![Value::Float(150.0), Value::Int(-3), s("a"), Value::Bool(false)]),
    )
}

fn parse(text: &str) -> Result<Expr, String> {
    let (l, r) = schemas();
    Expr::parse(text, &l, &r)
}

fn eval_on(text: &str, l: &Row, r: &Row) -> bool {
    match parse(text) {
        Ok(e) => e.eval(l, r),
        Err(e) => panic!("{text}: {e}"),
    }
}

fn eval(text: &str) -> bool {
    let (l, r) = pair();
    eval_on(text, &l, &r)
}

/// The value of a whole expression (not only its truthiness), on `pair()`.
fn value_of(text: &str) -> Value {
    let (l, r) = pair();
    let e = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    match e.value(e.root, Some(RowView::Heap(&l)), Some(RowView::Heap(&r))) {
        Val::Null => Value::Null,
        Val::Bool(b) => Value::Bool(b),
        Val::Int(i) => Value::Int(i),
        Val::Float(f) => Value::Float(f),
        Val::Str(s) => Value::Str(s.into()),
    }
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(e) => panic!("{text}: parsed as {e:?}"),
        Err(e) => e,
    }
}

#[test]
fn the_contract_example() {
    let (l, r) = schemas();
    let e = Expr::parse("right.amount > 100", &l, &r).unwrap();
    let (left, mut right) = pair();
    assert!(e.eval(&left, &right));
    right.values[0] = Value::Float(100.0);
    assert!(!e.eval(&left, &right));
    right.values[0] = Value::Null;
    assert!(!e.eval(&left, &right));
}

#[test]
fn parse_errors_say_what_and_where() {
    let cases = [
        ("left.n > 1 ) ", "unexpected ')' at column 12"),
        ("(left.n > 1", "missing ) for the ( at column 1 (found the end)"),
        ("(left.n 1)", "missing ) for the ( at column 1 (found '1' at column 9)"),
        ("left.n > foo", "unknown word 'foo' (fields are left.x / right.x)"),
        ("left.nope > 1", "unknown field left.nope (left has: name, n, x, flag, b)"),
        ("right.name = 'x'", "unknown field right.name (right has: amount, qty, tag, ok)"),
        ("left.n # 2", "cannot parse '# 2' at column 8"),
        ("left.n & 2", "cannot parse '& 2' at column 8"),
        ("left.n > 'abc", "unterminated string \"'abc\" at column 10"),
        ("left.name = 'a\\qb'", "bad escape \\q in the string at column 13"),
        ("left.name = '\\ud800'", "lone surrogate \\uD800 in the string at column 13"),
        ("left.name = '\\u12'", "bad escape \\u12' in the string at column 13: want 4 hex digits"),
        ("", "empty condition"),
        ("   ", "empty condition"),
        ("left.n >", "unexpected end of condition at column 9"),
        ("left.n > 1 and", "unexpected end of condition at column 15"),
        ("1 < left.n < 3", "unexpected '<' at column 12: comparisons do not chain (use and)"),
        ("left.n 2", "unexpected '2' at column 8"),
        ("left.n > 1 left.x", "unexpected 'left.x' at column 12"),
        ("left.n && && 1", "unexpected '&&' at column 11"),
        ("1 + not true", "unexpected 'not' at column 5"),
        ("left.n > 99999999999999999999", "integer 99999999999999999999 at column 10 is out of range"),
        ("LEFT.n > 1", "unknown word 'LEFT'"),
        ("left. n > 1", "unknown word 'left'"),
        ("left.n.x > 1", "cannot parse '.x > 1' at column 7"),
        ("left.n <> 1", "unexpected '>' at column 9"),
        ("()", "unexpected ')' at column 2"),
    ];
    for (text, want) in cases {
        let got = err(text);
        assert!(got.starts_with(want), "{text:?}: got {got:?}, want {want:?}");
    }
    // Tokens are all read first (as the model does): an unknown word beats a missing ).
    assert!(err("(left.n > foo").starts_with("unknown word 'foo'"));
    // Quoting follows Python's repr.
    assert_eq!(err("don't"), "unknown word 'don' (fields are left.x / right.x)");
    assert_eq!(err("1 = \"it's"), "unterminated string '\"it\\'s' at column 5");
}

#[test]
fn type_errors_are_refused_at_parse_time() {
    let cases = [
        ("left.name * 2 > 1", "cannot apply * to string left.name at column 1"),
        ("left.name + right.tag == 'ab'", "cannot apply + to string left.name at column 1"),
        ("1 + 'a' == 2", "cannot apply + to string 'a' at column 5"),
        ("left.b % 2", "cannot apply % to string left.b"),
        ("-left.name < 1", "cannot apply unary - to string left.name at column 2"),
        ("left.name > 5", "cannot compare string left.name with int 5 at column 1"),
        ("(left.n + 1) = left.name", "cannot compare int (left.n + 1) with string left.name at column 1"),
        ("left.name == true", "cannot compare string left.name with bool true"),
        ("right.tag != right.amount", "cannot compare string right.tag with float right.amount"),
        ("'x' < (1 < 2)", "cannot compare string 'x' with bool (1 < 2)"),
    ];
    for (text, want) in cases {
        let got = err(text);
        assert!(got.starts_with(want), "{text:?}: got {got:?}, want {want:?}");
    }
    // A syntax error anywhere is reported before a type error (the model finds only those).
    assert_eq!(err("left.name * 2 )"), "unexpected ')' at column 15");
    assert_eq!(err("left.name * 2 > (1"), "missing ) for the ( at column 17 (found the end)");
    // The first type error is reported, and a bad operand does not cause more.
    assert!(err("-left.name + 1 < 'a'").starts_with("cannot apply unary - to string left.name at column 2"));
    // Still fine: strings with strings and with null, bools and numbers together.
    for ok in ["left.name < right.tag", "left.name = null", "left.flag + 1 == 2", "-left.flag = -1", "left.b"] {
        assert!(parse(ok).is_ok(), "{ok}");
    }
}

#[test]
fn id_lists_are_refused() {
    let (l, r) = schemas();
    let mut fields = r.fields.clone();
    fields.push(Field { name: "_supersedes".into(), ty: FieldType::IdList, nullable: false });
    let r = Schema::new(fields, None, TimeSpec::Ingest);
    assert_eq!(
        Expr::parse("right._supersedes", &l, &r),
        Err("right._supersedes at column 1 is an id list, which a condition cannot use".into())
    );
}

#[test]
fn precedence() {
    assert_eq!(value_of("1 + 2 * 3"), Value::Int(7));
    assert_eq!(value_of("(1 + 2) * 3"), Value::Int(9));
    assert_eq!(value_of("10 - 4 - 3"), Value::Int(3)); // left-associative
    assert_eq!(value_of("2 * 7 % 4"), Value::Int(2)); // (2*7)%4
    assert_eq!(value_of("2 * (7 % 4)"), Value::Int(6));
    assert_eq!(value_of("-2 * 3"), Value::Int(-6));
    assert_eq!(value_of("- -2"), Value::Int(2));
    assert_eq!(value_of("-(2 - 5)"), Value::Int(3));
    assert_eq!(value_of("100 / 10 / 5"), Value::Float(2.0));
    // or < and < not < comparison
    assert!(eval("true or true and false")); // true or (true and false)
    assert!(!eval("(true or true) and false"));
    assert!(eval("not false and true")); // (not false) and true
    assert!(!eval("not (false or true)"));
    assert!(eval("not 1 == 2")); // not (1 == 2)
    assert!(eval("! left.n == 8"));
    assert!(eval("left.n + 1 > 7 and right.amount / 2 >= 75"));
    assert!(eval("left.n > 100 or right.qty < 0"));
    assert!(eval("left.n > 100 || right.qty < 0 && !right.ok"));
    assert!(eval("not not true"));
    assert!(eval("1 + 2 == 3"));
    assert!(eval("3 == 1 + 2"));
    assert!(eval("left.n = 7 AND right.qty = -3"));
    assert!(eval("NOT left.n = 8 Or FALSE"));
}

#[test]
fn literals() {
    assert_eq!(value_of("42"), Value::Int(42));
    assert_eq!(value_of("007"), Value::Int(7));
    assert_eq!(value_of("9223372036854775807"), Value::Int(i64::MAX));
    assert_eq!(value_of("2.5"), Value::Float(2.5));
    assert_eq!(value_of("2."), Value::Float(2.0));
    assert_eq!(value_of(".25"), Value::Float(0.25));
    assert_eq!(value_of("0.1"), Value::Float(0.1));
    assert_eq!(value_of("true"), Value::Bool(true));
    assert_eq!(value_of("FALSE"), Value::Bool(false));
    assert_eq!(value_of("Null"), Value::Null);
    assert_eq!(value_of("'it\\'s'"), s("it's"));
    assert_eq!(value_of("\"say \\\"hi\\\"\""), s("say \"hi\""));
    assert_eq!(value_of("'a\"b'"), s("a\"b"));
    assert_eq!(value_of("\"a'b\""), s("a'b"));
    assert_eq!(value_of(r"'\\ \/ \b \f \n \r \t'"), s("\\ / \u{8} \u{c} \n \r \t"));
    assert_eq!(value_of(r"'\u00e9\u00C9'"), s("éÉ"));
    assert_eq!(value_of(r"'\ud83d\ude00'"), s("😀"));
    assert_eq!(value_of("'héllo wörld'"), s("héllo wörld"));
    assert_eq!(value_of("''"), s(""));
    assert_eq!(value_of("  left.n  "), Value::Int(7));
    assert_eq!(value_of("left.name"), s("ann"));
    assert_eq!(value_of("left.flag"), Value::Bool(true));
    assert_eq!(value_of("right.amount"), Value::Float(150.0));
    assert!(eval("left.name == 'ann' and left.name == \"ann\""));
    assert!(eval("left.b = 'QQ=='"));
}

#[test]
fn nulls() {
    let (l, _) = pair();
    let r = row(vec![Value::Null, Value::Null, Value::Null, Value::Null]);
    for cmp in ["==", "!=", "<", "<=", ">", ">="] {
        assert!(!eval_on(&format!("right.qty {cmp} 1"), &l, &r), "{cmp}");
        assert!(!eval_on(&format!("1 {cmp} right.qty"), &l, &r), "{cmp}");
        assert!(!eval_on(&format!("right.tag {cmp} 'a'"), &l, &r), "{cmp}");
        assert!(!eval_on(&format!("null {cmp} null"), &l, &r), "{cmp}");
        // and `not` of a null comparison is true
        assert!(eval_on(&format!("not right.qty {cmp} 1"), &l, &r), "{cmp}");
    }
    assert_eq!(value_of("null + 1"), Value::Null);
    assert_eq!(value_of("-null"), Value::Null);
    assert_eq!(value_of("left.n * null"), Value::Null);
    assert!(!eval_on("right.qty + 1 > 0 or right.qty + 1 <= 0", &l, &r));
    assert!(!eval_on("right.ok", &l, &r));
    assert!(eval_on("not right.ok", &l, &r));
    assert!(eval_on("right.ok or true", &l, &r));
    assert!(!eval("null"));
    // A comparison with the null literal is always false: `!= null` is no null test.
    assert!(!eval("left.n != null"));
}

#[test]
fn truthiness() {
    assert!(!eval("0") && eval("1") && eval("-1"));
    assert!(!eval("0.0") && eval("0.5"));
    assert!(!eval("''") && eval("'x'"));
    assert!(!eval("false") && eval("true"));
    assert!(eval("left.n") && !eval("left.n - 7"));
    assert!(eval("left.n and right.amount and left.name"));
    assert!(!eval("left.n and right.ok"));
}

#[test]
fn int_and_float_mix() {
    assert_eq!(value_of("left.n + 1"), Value::Int(8));
    assert_eq!(value_of("left.n + 0.5"), Value::Float(7.5));
    assert_eq!(value_of("left.n * left.x"), Value::Float(17.5));
    assert_eq!(value_of("right.amount - left.n"), Value::Float(143.0));
    assert!(eval("left.n == 7.0"));
    assert!(eval("7.0 == left.n"));
    assert!(eval("left.n < 7.5 and left.n > 6.9999"));
    assert!(eval("right.amount == 150"));
    // Bools are 0 and 1 (Python's bool is an int).
    assert_eq!(value_of("left.flag + left.flag"), Value::Int(2));
    assert_eq!(value_of("true * 2.5"), Value::Float(2.5));
    assert_eq!(value_of("-true"), Value::Int(-1));
    assert!(eval("left.flag == 1 and right.ok == 0 and true > false"));
    // Exact comparison of int and float, as Python: 2^53 + 1 is not 2^53 as a double.
    assert!(eval("9007199254740993 > 9007199254740992.0"));
    assert!(eval("9007199254740993 != 9007199254740992.0"));
    assert!(eval("9007199254740992 == 9007199254740992.0"));
    assert!(eval("9223372036854775807 < 9223372036854775808.0"));
    assert!(eval("-9223372036854775807 - 1 == -9223372036854775808.0"));
    assert!(eval("-3 < -2.5 and -2 > -2.5 and 2 > 1.5 and 1 < 1.5"));
    // Overflow of int arithmetic: null.
    assert_eq!(value_of("9223372036854775807 + 1"), Value::Null);
    assert_eq!(value_of("-9223372036854775807 - 2"), Value::Null);
    assert_eq!(value_of("4611686018427387904 * 2"), Value::Null);
    assert_eq!(value_of("-(-9223372036854775807 - 1)"), Value::Null);
    assert_eq!(value_of("9223372036854775807 + 1.0"), Value::Float(9223372036854775808.0));
    // Float overflow is inf, like Python.
    let big = format!("{}.0", "9".repeat(300));
    assert_eq!(value_of(&format!("{big} * {big}")), Value::Float(f64::INFINITY));
    assert!(eval(&format!("{big} * {big} > 9223372036854775807")));
    // NaN (inf - inf): every comparison false but !=; truthy.
    let nan = format!("({big} * {big} - {big} * {big})");
    assert!(!eval(&format!("{nan} == {nan}")) && eval(&format!("{nan} != {nan}")));
    assert!(!eval(&format!("{nan} < 1")) && !eval(&format!("1 >= {nan}")) && eval(&format!("1 != {nan}")));
    assert!(eval(&nan));
}

#[test]
fn python_division_and_remainder() {
    // True division gives a float, correctly rounded.
    assert_eq!(value_of("7 / 2"), Value::Float(3.5));
    assert_eq!(value_of("-7 / 2"), Value::Float(-3.5));
    assert_eq!(value_of("6 / 3"), Value::Float(2.0));
    assert_eq!(value_of("1 / 3"), Value::Float(1.0 / 3.0));
    assert_eq!(value_of("7.0 / 2"), Value::Float(3.5));
    // Python: 9007199254740993 / 1 == 9007199254740992.0 (ties to even);
    // (2**63 - 1) / 3 == 3074457345618258602.3333… → 3.0744573456182584e18.
    assert_eq!(value_of("9007199254740993 / 1"), Value::Float(9007199254740992.0));
    assert_eq!(value_of("9007199254740995 / 1"), Value::Float(9007199254740996.0));
    assert_eq!(value_of("9223372036854775807 / 3"), Value::Float(3.0744573456182584e18));
    assert_eq!(value_of("9223372036854775807 / 9223372036854775806"), Value::Float(1.0));
    assert_eq!(value_of("1 / 9223372036854775807"), Value::Float(1.0842021724855044e-19));
    assert_eq!(value_of("-9007199254740997 / 2"), Value::Float(-4503599627370498.0));
    // Python: 18014398509481985 / 2 == 9007199254740992.0 (…992.5: the doubles there are 2 apart)
    assert_eq!(value_of("18014398509481985 / 2"), Value::Float(9007199254740992.0));
    // Python: 18014398509481987 / 2 == 9007199254740994.0 (…993.5 is nearer …994)
    assert_eq!(value_of("18014398509481987 / 2"), Value::Float(9007199254740994.0));
    // Remainder: the sign of the divisor.
    assert_eq!(value_of("7 % 3"), Value::Int(1));
    assert_eq!(value_of("-7 % 3"), Value::Int(2));
    assert_eq!(value_of("7 % -3"), Value::Int(-2));
    assert_eq!(value_of("-7 % -3"), Value::Int(-1));
    assert_eq!(value_of("6 % -3"), Value::Int(0));
    assert_eq!(value_of("(-9223372036854775807 - 1) % -1"), Value::Int(0));
    assert_eq!(value_of("7.5 % 2"), Value::Float(1.5));
    assert_eq!(value_of("7.5 % -2"), Value::Float(-0.5));
    assert_eq!(value_of("-7.5 % 2"), Value::Float(0.5));
}

#[test]
fn division_by_zero_is_null() {
    for text in ["1 / 0", "1 % 0", "1.0 / 0", "1 / 0.0", "1.5 % 0.0", "0 / 0", "left.n / (left.n - 7)"] {
        assert_eq!(value_of(text), Value::Null, "{text}");
        assert!(!eval(&format!("{text} == {text}")), "{text}");
    }
}

#[test]
fn strings_compare_by_code_point() {
    assert!(eval("left.name == 'ann'"));
    assert!(eval("left.name != 'Ann'"));
    assert!(eval("left.name > 'Ann'")); // 'a' > 'A'
    assert!(eval("left.name < 'anna' and left.name > 'an' and left.name >= 'ann' and left.name <= 'ann'"));
    assert!(eval("'' < left.name"));
    assert!(eval("'z' < 'é' and 'é' < '😀'"));
    assert!(eval("right.tag < left.name"));
    assert!(!eval("left.name = right.tag"));
}

#[test]
fn runtime_type_mismatches_follow_python() {
    // Rows whose values disagree with the schema (the decoder never makes them): no panic,
    // Python's answers (the model's None for a TypeError).
    let l = row(vec![Value::Int(3), s("x"), s("y"), s("z"), Value::Float(1.0)]);
    let r = row(vec![]);
    assert!(!eval_on("left.name == 'x'", &l, &r));
    assert!(eval_on("left.name != 'x'", &l, &r));
    assert!(!eval_on("left.name < 'x'", &l, &r));
    assert!(eval_on("not left.name < 'x'", &l, &r));
    assert!(!eval_on("left.n + 1 == 2", &l, &r));
    assert!(!eval_on("-left.n", &l, &r));
    // A row shorter than its schema reads null.
    assert!(!eval_on("right.qty == 1 or right.qty != 1", &l, &r));
    assert!(eval_on("not right.ok", &l, &r));
}

#[test]
fn depth_is_bounded() {
    let fine = format!("{}1{}", "(".repeat(100), ")".repeat(100));
    assert_eq!(value_of(&fine), Value::Int(1));
    let chain = vec!["left.n > 0"; 100].join(" or ");
    assert!(eval(&chain));
    for deep in [
        format!("{}1{}", "(".repeat(10_000), ")".repeat(10_000)),
        format!("{}1", "(".repeat(10_000)),
        format!("{}true", "not ".repeat(10_000)),
        format!("{}1", "-".repeat(10_000)),
        format!("1{}", " + 1".repeat(10_000)),
        vec!["true"; 10_000].join(" and "),
    ] {
        let e = err(&deep);
        assert!(e.contains("too deep"), "{e}");
    }
}

#[test]
fn the_deepest_condition_evaluates_on_a_small_stack() {
    // MAX_DEPTH levels of recursion must fit easily in a shard thread's stack (debug build).
    let text = vec!["left.n > 0"; MAX_DEPTH - 1].join(" and ");
    let e = parse(&text).unwrap();
    let handle = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            let (l, r) = pair();
            e.eval(&l, &r)
        })
        .unwrap();
    assert!(handle.join().unwrap());
}

const EXPRESSIONS: &[&str] = &[
    "right.amount > 100",
    "left.n + right.qty * 2 - 1 >= left.x / 3",
    "left.n % right.qty == 0 or right.qty % 0 = 1",
    "left.x % right.amount < 0.5 and -left.x != right.amount",
    "left.n / right.qty < left.x",
    "left.name < right.tag or left.b = 'QQ=='",
    "not left.flag and right.ok or left.flag != right.ok",
    "left.flag + right.ok * left.n > right.qty",
    "left.n * right.qty * left.n * right.qty > 1000000000000",
    "-left.n - -right.qty",
    "left.name",
    "left.x",
    "(left.n - 9223372036854775807) * 2 < 0",
    "left.name = null or right.tag != null",
    "right.qty / 0 > 1 or 1.5 % right.amount < 1",
];

fn arb_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        prop_oneof![-3i64..=3, Just(i64::MIN), Just(i64::MAX)].prop_map(Value::Int),
        any::<f64>().prop_map(Value::Float),
        prop_oneof![Just(0.0), Just(-0.0), Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY)]
            .prop_map(Value::Float),
        ".{0,6}".prop_map(|s| Value::Str(s.into())),
        prop::collection::vec(any::<u64>(), 0..3).prop_map(|ids| Value::IdList(ids.into())),
    ]
}

fn arb_row() -> impl Strategy<Value = Row> {
    prop::collection::vec(arb_value(), 0..7).prop_map(row)
}

/// Condition-like text: mostly valid tokens, glued at random.
fn arb_text() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("left.n"),
        Just("left.x"),
        Just("left.name"),
        Just("left.flag"),
        Just("left.b"),
        Just("right.amount"),
        Just("right.qty"),
        Just("right.tag"),
        Just("right.ok"),
        Just("left.zz"),
        Just("1"),
        Just("0"),
        Just("2.5"),
        Just(".5"),
        Just("9223372036854775807"),
        Just("'s'"),
        Just("\"t\\u00e9\""),
        Just("'\\ud83d"),
        Just("'"),
        Just("\\"),
        Just("true"),
        Just("null"),
        Just("and"),
        Just("or"),
        Just("not"),
        Just("&&"),
        Just("||"),
        Just("!"),
        Just("=="),
        Just("="),
        Just("!="),
        Just("<"),
        Just("<="),
        Just(">"),
        Just(">="),
        Just("+"),
        Just("-"),
        Just("*"),
        Just("/"),
        Just("%"),
        Just("("),
        Just(")"),
        Just("foo"),
        Just("é"),
        Just("."),
    ];
    prop::collection::vec((token, prop_oneof![Just(""), Just(" ")]), 0..24)
        .prop_map(|ts| ts.into_iter().map(|(t, sp)| format!("{t}{sp}")).collect())
}

proptest! {
    #[test]
    fn eval_never_panics(l in arb_row(), r in arb_row()) {
        for text in EXPRESSIONS {
            let e = parse(text).unwrap();
            let _ = e.eval(&l, &r);
        }
    }

    #[test]
    fn parse_never_panics_on_any_string(text in any::<String>()) {
        let _ = parse(&text);
    }

    #[test]
    fn random_conditions_parse_or_fail_cleanly_and_evaluate(text in arb_text(), l in arb_row(), r in arb_row()) {
        if let Ok(e) = parse(&text) {
            let _ = e.eval(&l, &r);
            // Parsing is deterministic.
            prop_assert_eq!(parse(&text), Ok(e));
        }
    }

    #[test]
    fn int_true_division_is_correctly_rounded(x in any::<i64>(), y in any::<i64>()) {
        // |y| <= |x|, so |x / y| >= 1 and the exact check below fits an i128.
        let (x, y) = if y.unsigned_abs() <= x.unsigned_abs() { (x, y) } else { (y, x) };
        prop_assume!(y != 0);
        let q = int_true_div(x, y);
        let (below, above) = (q.next_down(), q.next_up());
        // |x - c*y| * 2^k for c = m * 2^e, with one k that makes every c * 2^k an integer.
        let k = [q, below, above].iter().map(|c| -decompose(*c).1).max().unwrap_or(0).max(0);
        let distance = |c: f64| {
            let (m, e) = decompose(c);
            (i128::from(x) * (1i128 << k) - m * i128::from(y) * (1i128 << (e + k))).abs()
        };
        let (d, d_below, d_above) = (distance(q), distance(below), distance(above));
        prop_assert!(d <= d_below && d <= d_above, "{x} / {y} = {q}");
        if d == d_below || d == d_above {
            prop_assert_eq!(decompose(q).0 % 2, 0, "{} / {} = {}: a tie goes to the even double", x, y, q);
        }
    }
}

/// `f` (finite, normal) = m * 2^e with m an integer of 53 bits.
fn decompose(f: f64) -> (i128, i32) {
    let bits = f.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let m = i128::from((bits & ((1 << 52) - 1)) | 1 << 52);
    (if f < 0.0 { -m } else { m }, exp - 1075)
}

/// A computed select item's value and type on `pair()`, the right side missing when `outer`.
fn computed(text: &str, outer: bool) -> (Value, FieldType) {
    let (ls, rs) = schemas();
    let (l, r) = pair();
    let (e, ty) = Expr::parse_value(text, &ls, &rs).unwrap_or_else(|e| panic!("{text}: {e}"));
    let right = if outer { None } else { Some(RowView::Heap(&r)) };
    (e.compute(ty, Some(RowView::Heap(&l)), right), ty)
}

#[test]
fn computed_values_have_a_type() {
    use FieldType::*;
    assert_eq!(computed("left.n * right.qty", false), (Value::Int(-21), Int));
    assert_eq!(computed("right.amount * left.n", false), (Value::Float(1050.0), Float));
    assert_eq!(computed("left.n / 2", false), (Value::Float(3.5), Float));
    assert_eq!(computed("right.amount > 100", false), (Value::Bool(true), Bool));
    assert_eq!(computed("left.b", false), (s("QQ=="), String), "bytes read as their text");
    // CASE: the first arm that holds, else ELSE, else null; an int branch in a float CASE is a float.
    let case = "case when right.amount > 200 then 'big' when right.amount > 100 then 'mid' else 'small' end";
    assert_eq!(computed(case, false), (s("mid"), String));
    assert_eq!(computed("CASE WHEN left.n > 100 THEN 'x' END", false), (Value::Null, String));
    assert_eq!(computed("case when left.flag then 1 else right.amount end", false), (Value::Float(1.0), Float));
    assert_eq!(
        computed("case when left.n = 7 then case when right.ok then 1 else 2 end end", false),
        (Value::Int(2), Int)
    );
    // COALESCE: the first operand not null; a missing side reads null.
    assert_eq!(computed("coalesce(right.qty, 0)", false), (Value::Int(-3), Int));
    assert_eq!(computed("coalesce(right.qty, 0)", true), (Value::Int(0), Int));
    assert_eq!(computed("coalesce(right.amount * 2, left.n, 0)", true), (Value::Float(7.0), Float));
    assert_eq!(computed("right.tag", true), (Value::Null, String));
    // The same language in `where`.
    assert!(eval("coalesce(right.tag, 'z') == 'a' and case when left.flag then true else false end"));
}

#[test]
fn computed_values_refuse_mixed_and_null_types() {
    let (ls, rs) = schemas();
    let refused = |text: &str| Expr::parse_value(text, &ls, &rs).err().unwrap_or_default();
    assert_eq!(
        refused("case when left.flag then 1 else 'one' end"),
        "case mixes int and string 'one' at column 33 (one type, or int and float)"
    );
    assert_eq!(
        refused("coalesce(left.name, 0)"),
        "coalesce mixes string and int 0 at column 21 (one type, or int and float)"
    );
    assert_eq!(refused("null"), "the expression is always null: it has no type a field could have");
    assert_eq!(refused("case left.n when 1 then 2 end"), "expected when after case at column 6 (found 'left.n')");
    assert_eq!(refused("case when left.flag then 1"), "expected when, else or end at column 27 (found the end)");
    assert_eq!(refused("coalesce(left.n 1)"), "expected , or ) at column 17 (found '1')");
    assert_eq!(refused("coalesce left.n"), "expected ( after coalesce at column 10 (found 'left.n')");
}

proptest! {
    /// Arbitrary CASE / COALESCE soup never panics, in parsing or on any pair.
    #[test]
    fn case_and_coalesce_soup_never_panics(words in proptest::collection::vec(
        prop::sample::select(vec!["case", "when", "then", "else", "end", "coalesce", "(", ")", ",", "left.n",
            "right.qty", "left.name", "1", "2.5", "'s'", "null", "+", "/", ">", "and", "not"]), 0..24)) {
        let (ls, rs) = schemas();
        let (l, r) = pair();
        if let Ok((e, ty)) = Expr::parse_value(&words.join(" "), &ls, &rs) {
            let _ = e.compute(ty, Some(RowView::Heap(&l)), None);
            let _ = e.compute(ty, Some(RowView::Heap(&l)), Some(RowView::Heap(&r)));
        }
    }
}

#[test]
fn a_condition_on_one_row_names_fields_plainly() {
    let schema = Schema::new(
        vec![
            Field { name: "device".into(), ty: FieldType::String, nullable: false },
            Field { name: "temp".into(), ty: FieldType::Float, nullable: false },
        ],
        Some(0),
        TimeSpec::Ingest,
    );
    let expr = Expr::parse_row("temp >= -40 and device != 'x'", &schema).unwrap();
    let row = |device: &str, temp: f64| Row {
        ts: 0,
        key: Key::Str(device.into()),
        key_hash: 0,
        id: 0,
        values: Box::new([Value::Str(device.into()), Value::Float(temp)]),
    };
    assert!(expr.eval_row(RowView::Heap(&row("a", 20.0))));
    assert!(!expr.eval_row(RowView::Heap(&row("a", -273.0))));
    assert!(!expr.eval_row(RowView::Heap(&row("x", 20.0))));
    assert_eq!(
        Expr::parse_row("left.temp > 1", &schema).unwrap_err(),
        "unknown field 'left' (fields: device, temp)",
        "over one row there are no sides"
    );
    assert_eq!(Expr::parse_row("tmp > 1", &schema).unwrap_err(), "unknown field 'tmp' (fields: device, temp)");
    assert!(Expr::parse_row("device > 1", &schema).unwrap_err().contains("cannot compare string device with int 1"));
}
