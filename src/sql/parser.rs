//! Tokens → statements: a recursive-descent parser, one method per rule.
//!
//! ```text
//! script     = { statement ";" }                    (the last ";" may be left out)
//! statement  = CREATE TABLE name "(" element { "," element } ")" [ WITH "(" 'k' = 'v' { , } ")" ]
//!            | CREATE [TEMPORARY] VIEW name AS query
//!            | INSERT INTO name query
//!            | SET 'key' = 'value'
//! element    = name type [ "(" n { , n } ")" ] [ NOT NULL ] | name AS expr
//!            | WATERMARK FOR name AS expr | [CONSTRAINT n] PRIMARY KEY ( … ) NOT ENFORCED
//! query      = select { UNION ALL select }
//! select     = SELECT item { , item } FROM table_ref { join } [ WHERE expr ] [ GROUP BY expr { , expr } ]
//! table_ref  = ( name | TABLE "(" tvf ")" | "(" query ")" ) [ FOR SYSTEM_TIME AS OF expr ] [ [AS] alias ]
//! join       = [INNER | LEFT [OUTER] | RIGHT [OUTER] | FULL [OUTER] | CROSS] JOIN table_ref [ ON expr ]
//! expr       = or;  precedence loosest first: OR, AND, NOT, comparison / BETWEEN / IS / IN / LIKE,
//!              + - ||, * / %, unary -, primary
//! ```
//!
//! Nesting (parentheses, subqueries, NOT, unary minus) is limited to [`MAX_NESTING`] levels, so
//! no input can exhaust the stack; every failure is an error with a position, never a panic.

use super::SqlError;
use super::ast::*;
use super::lexer::{Tok, TokKind, tokenize};

/// The deepest nesting of parentheses, subqueries and unary operators.
pub const MAX_NESTING: usize = 64;

/// Words that end a table reference instead of naming its alias.
const NOT_AN_ALIAS: [&str; 20] = [
    "JOIN",
    "LEFT",
    "RIGHT",
    "FULL",
    "INNER",
    "CROSS",
    "ON",
    "WHERE",
    "GROUP",
    "UNION",
    "FOR",
    "ORDER",
    "HAVING",
    "LIMIT",
    "OUTER",
    "WINDOW",
    "EXCEPT",
    "INTERSECT",
    "MATCH_RECOGNIZE",
    "NATURAL",
];

pub fn parse(text: &str) -> Result<Vec<Statement>, SqlError> {
    let toks = tokenize(text)?;
    let mut p = Parser { toks, i: 0, end: text.len(), depth: 0 };
    let mut out = Vec::new();
    loop {
        while p.eat_punct(";") {}
        if p.i >= p.toks.len() {
            return Ok(out);
        }
        out.push(p.statement()?);
        if p.i < p.toks.len() && !p.eat_punct(";") {
            return Err(p.expected("';' (the end of the statement)"));
        }
    }
}

struct Parser {
    toks: Vec<Tok>,
    i: usize,
    /// The text's length: where "the end" is.
    end: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&TokKind> {
        self.toks.get(self.i).map(|t| &t.kind)
    }

    fn peek_at(&self, n: usize) -> Option<&TokKind> {
        self.toks.get(self.i + n).map(|t| &t.kind)
    }

    /// Where the next token starts (the end of the text after the last).
    fn at(&self) -> usize {
        self.toks.get(self.i).map_or(self.end, |t| t.at)
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(TokKind::Word(w)) if w.eq_ignore_ascii_case(word))
    }

    fn is_word_at(&self, n: usize, word: &str) -> bool {
        matches!(self.peek_at(n), Some(TokKind::Word(w)) if w.eq_ignore_ascii_case(word))
    }

    fn is_punct(&self, p: &str) -> bool {
        matches!(self.peek(), Some(TokKind::Punct(q)) if *q == p)
    }

    fn eat_word(&mut self, word: &str) -> bool {
        let yes = self.is_word(word);
        self.i += usize::from(yes);
        yes
    }

    fn eat_punct(&mut self, p: &str) -> bool {
        let yes = self.is_punct(p);
        self.i += usize::from(yes);
        yes
    }

    fn expect_word(&mut self, word: &str) -> Result<(), SqlError> {
        if self.eat_word(word) { Ok(()) } else { Err(self.expected(word)) }
    }

    fn expect_punct(&mut self, p: &str) -> Result<(), SqlError> {
        if self.eat_punct(p) { Ok(()) } else { Err(self.expected(&format!("'{p}'"))) }
    }

    fn found(&self) -> String {
        match self.peek() {
            None => "the end".into(),
            Some(TokKind::Word(w)) => format!("{w:?}"),
            Some(TokKind::Quoted(w)) => format!("`{w}`"),
            Some(TokKind::Str(s)) => format!("'{s}'"),
            Some(TokKind::Number(n)) => n.clone(),
            Some(TokKind::Punct(p)) => format!("'{p}'"),
        }
    }

    fn expected(&self, what: &str) -> SqlError {
        SqlError::new(self.at(), format!("expected {what}, found {}", self.found()))
    }

    fn nest(&mut self) -> Result<(), SqlError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(SqlError::new(self.at(), format!("nested more than {MAX_NESTING} levels deep")));
        }
        Ok(())
    }

    fn ident(&mut self, what: &str) -> Result<Ident, SqlError> {
        let at = self.at();
        let name = match self.peek() {
            Some(TokKind::Word(w)) => w.clone(),
            Some(TokKind::Quoted(w)) => w.clone(),
            _ => return Err(self.expected(what)),
        };
        self.i += 1;
        Ok(Ident { name, at })
    }

    fn string(&mut self, what: &str) -> Result<(String, usize), SqlError> {
        let at = self.at();
        match self.peek() {
            Some(TokKind::Str(s)) => {
                let s = s.clone();
                self.i += 1;
                Ok((s, at))
            }
            _ => Err(self.expected(what)),
        }
    }

    fn statement(&mut self) -> Result<Statement, SqlError> {
        let at = self.at();
        if self.eat_word("CREATE") {
            self.eat_word("TEMPORARY");
            if self.eat_word("TABLE") {
                return self.create_table().map(Statement::CreateTable);
            }
            if self.eat_word("VIEW") {
                self.if_not_exists()?;
                let name = self.ident("the view's name")?;
                self.expect_word("AS")?;
                return Ok(Statement::CreateView { name, query: self.query()? });
            }
            return Err(self.expected("TABLE or VIEW after CREATE (braid's SQL has tables and views)"));
        }
        if self.eat_word("INSERT") {
            self.expect_word("INTO")?;
            let target = self.ident("the name of what the query feeds")?;
            if self.is_punct("(") {
                return Err(SqlError::new(
                    self.at(),
                    "INSERT INTO with a column list is not supported: name the columns in the SELECT (AS)",
                ));
            }
            return Ok(Statement::Insert { target, query: self.query()? });
        }
        if self.eat_word("SET") {
            let (key, _) = self.string("a quoted option name, as in SET 'table.exec.emit.allow-lateness' = '30s'")?;
            self.expect_punct("=")?;
            let (value, _) = self.string("a quoted value")?;
            return Ok(Statement::Set { key, value, at });
        }
        if self.is_word("SELECT") {
            return Err(SqlError::new(
                at,
                "a bare SELECT has no name: write CREATE VIEW name AS SELECT … or INSERT INTO name SELECT …",
            ));
        }
        Err(self.expected("CREATE TABLE, CREATE VIEW, INSERT INTO or SET"))
    }

    fn if_not_exists(&mut self) -> Result<(), SqlError> {
        if self.eat_word("IF") {
            self.expect_word("NOT")?;
            self.expect_word("EXISTS")?;
        }
        Ok(())
    }

    fn create_table(&mut self) -> Result<CreateTable, SqlError> {
        self.if_not_exists()?;
        let name = self.ident("the table's name")?;
        let mut table = CreateTable {
            name,
            columns: Vec::new(),
            computed: Vec::new(),
            watermark: None,
            primary_key: None,
            options: Vec::new(),
        };
        self.expect_punct("(")?;
        loop {
            self.table_element(&mut table)?;
            if !self.eat_punct(",") {
                break;
            }
        }
        self.expect_punct(")")?;
        if self.eat_word("WITH") {
            self.expect_punct("(")?;
            if !self.is_punct(")") {
                loop {
                    let (key, at) = self.string("a quoted option name such as 'key'")?;
                    self.expect_punct("=")?;
                    let (value, _) = self.string("a quoted value")?;
                    table.options.push((key, value, at));
                    if !self.eat_punct(",") {
                        break;
                    }
                }
            }
            self.expect_punct(")")?;
        }
        Ok(table)
    }

    fn table_element(&mut self, table: &mut CreateTable) -> Result<(), SqlError> {
        let at = self.at();
        if self.eat_word("WATERMARK") {
            self.expect_word("FOR")?;
            let column = self.ident("the time attribute")?;
            self.expect_word("AS")?;
            let expr = self.expr()?;
            if table.watermark.is_some() {
                return Err(SqlError::new(at, "a table has one WATERMARK"));
            }
            table.watermark = Some((column, expr));
            return Ok(());
        }
        if self.is_word("CONSTRAINT") || self.is_word("PRIMARY") {
            table.primary_key.get_or_insert(at);
            // Skipped to the element's end; the compiler refuses it.
            let mut parens = 0usize;
            while let Some(kind) = self.peek() {
                match kind {
                    TokKind::Punct("(") => parens += 1,
                    TokKind::Punct(")") if parens == 0 => break,
                    TokKind::Punct(")") => parens -= 1,
                    TokKind::Punct(",") if parens == 0 => break,
                    _ => {}
                }
                self.i += 1;
            }
            return Ok(());
        }
        let name = self.ident("a column name, WATERMARK FOR or PRIMARY KEY")?;
        if self.eat_word("AS") {
            let expr = self.expr()?;
            table.computed.push((name, expr));
            return Ok(());
        }
        let ty_at = self.at();
        let ty = match self.peek() {
            Some(TokKind::Word(w)) => w.to_ascii_uppercase(),
            _ => return Err(self.expected("a column type such as STRING, BIGINT or DOUBLE")),
        };
        self.i += 1;
        let mut decorated = false;
        // A type may have more words (DOUBLE PRECISION, TIMESTAMP WITH LOCAL TIME ZONE) and a
        // precision: kept as written for the message, refused by the compiler.
        while let Some(TokKind::Word(w)) = self.peek() {
            if w.eq_ignore_ascii_case("NOT") || w.eq_ignore_ascii_case("NULL") || w.eq_ignore_ascii_case("COMMENT") {
                break;
            }
            decorated = true;
            self.i += 1;
        }
        if self.eat_punct("(") {
            decorated = true;
            while !self.eat_punct(")") {
                if self.peek().is_none() {
                    return Err(self.expected("')'"));
                }
                self.i += 1;
            }
            while let Some(TokKind::Word(w)) = self.peek() {
                if w.eq_ignore_ascii_case("NOT") || w.eq_ignore_ascii_case("NULL") {
                    break;
                }
                self.i += 1;
            }
        }
        if self.eat_word("NOT") {
            self.expect_word("NULL")?;
        } else {
            self.eat_word("NULL");
        }
        if self.is_word("COMMENT") {
            return Err(SqlError::new(self.at(), "COMMENT on a column is not supported; use -- comments"));
        }
        table.columns.push(ColumnDef { name, ty: Ident { name: ty, at: ty_at }, decorated });
        Ok(())
    }

    fn query(&mut self) -> Result<Query, SqlError> {
        self.nest()?;
        let first = self.select()?;
        let mut parts = vec![first];
        let mut union_at = None;
        while self.is_word("UNION") || self.is_word("EXCEPT") || self.is_word("INTERSECT") || self.is_word("MINUS") {
            let at = self.at();
            if !self.eat_word("UNION") {
                return Err(SqlError::new(
                    at,
                    format!("{} is not supported: braid combines streams with UNION ALL", self.found()),
                ));
            }
            if !self.eat_word("ALL") {
                return Err(SqlError::new(
                    at,
                    "UNION without ALL removes duplicates, which needs unbounded state: braid supports UNION ALL",
                ));
            }
            union_at.get_or_insert(at);
            parts.push(self.select()?);
        }
        self.depth -= 1;
        Ok(match union_at {
            None => Query::Select(Box::new(parts.remove(0))),
            Some(at) => Query::UnionAll { parts, at },
        })
    }

    fn select(&mut self) -> Result<Select, SqlError> {
        let at = self.at();
        if self.is_punct("(") {
            return Err(SqlError::new(
                at,
                "a parenthesized query here is not supported: write SELECT … UNION ALL SELECT …",
            ));
        }
        self.expect_word("SELECT")?;
        if self.is_punct("/") {
            return Err(SqlError::new(self.at(), "unexpected '/' (hints /*+ … */ are not supported)"));
        }
        let distinct = self.eat_word("DISTINCT");
        self.eat_word("ALL");
        let mut items = vec![self.select_item()?];
        while self.eat_punct(",") {
            items.push(self.select_item()?);
        }
        self.expect_word("FROM")?;
        let from = self.table_ref()?;
        let mut joins = Vec::new();
        while let Some(join) = self.join()? {
            joins.push(join);
        }
        let where_ = if self.eat_word("WHERE") { Some(self.expr()?) } else { None };
        let mut group_by = Vec::new();
        if self.eat_word("GROUP") {
            self.expect_word("BY")?;
            group_by.push(self.expr()?);
            while self.eat_punct(",") {
                group_by.push(self.expr()?);
            }
        }
        for clause in ["HAVING", "ORDER", "LIMIT", "WINDOW", "QUALIFY", "OFFSET", "FETCH"] {
            if self.is_word(clause) {
                let why = match clause {
                    "HAVING" => {
                        "filter the aggregates in a view that reads this one (not yet: braid has no filter operator)"
                    }
                    "ORDER" | "LIMIT" | "OFFSET" | "FETCH" => {
                        "a stream has no end to sort or count to; a consumer orders by _ts"
                    }
                    _ => "braid supports the TUMBLE, HOP and SESSION table-valued functions",
                };
                return Err(SqlError::new(self.at(), format!("{clause} is not supported: {why}")));
            }
        }
        Ok(Select { at, distinct, items, from, joins, where_, group_by })
    }

    fn select_item(&mut self) -> Result<SelectItem, SqlError> {
        let at = self.at();
        if self.eat_punct("*") {
            return Ok(SelectItem::Star { qualifier: None, at });
        }
        if matches!(self.peek(), Some(TokKind::Word(_) | TokKind::Quoted(_)))
            && matches!(self.peek_at(1), Some(TokKind::Punct(".")))
            && matches!(self.peek_at(2), Some(TokKind::Punct("*")))
        {
            let qualifier = self.ident("a table alias")?;
            self.i += 2;
            return Ok(SelectItem::Star { qualifier: Some(qualifier), at });
        }
        let expr = self.expr()?;
        let alias = if self.eat_word("AS") {
            Some(self.ident("a column name after AS")?)
        } else if matches!(self.peek(), Some(TokKind::Word(w)) if !w.eq_ignore_ascii_case("FROM"))
            || matches!(self.peek(), Some(TokKind::Quoted(_)))
        {
            Some(self.ident("a column name")?)
        } else {
            None
        };
        Ok(SelectItem::Expr { expr, alias })
    }

    fn table_ref(&mut self) -> Result<TableRef, SqlError> {
        let at = self.at();
        let source = if self.is_word("TABLE") && matches!(self.peek_at(1), Some(TokKind::Punct("("))) {
            self.i += 2;
            let tvf = self.tvf()?;
            self.expect_punct(")")?;
            Source::Window(tvf)
        } else if self.is_word("LATERAL") || self.is_word("UNNEST") {
            return Err(SqlError::new(
                at,
                format!("{} is not supported: braid reads tables, views and window TVFs", self.found()),
            ));
        } else if self.eat_punct("(") {
            let query = self.query()?;
            self.expect_punct(")")?;
            Source::Subquery(Box::new(query))
        } else {
            Source::Named(self.ident("a table or view name")?)
        };
        let as_of = if self.is_word("FOR") {
            self.i += 1;
            self.expect_word("SYSTEM_TIME")?;
            self.expect_word("AS")?;
            self.expect_word("OF")?;
            Some(self.additive()?)
        } else {
            None
        };
        let alias = if self.eat_word("AS") {
            Some(self.ident("an alias after AS")?)
        } else {
            match self.peek() {
                Some(TokKind::Word(w)) if !NOT_AN_ALIAS.iter().any(|k| w.eq_ignore_ascii_case(k)) => {
                    Some(self.ident("an alias")?)
                }
                Some(TokKind::Quoted(_)) => Some(self.ident("an alias")?),
                _ => None,
            }
        };
        Ok(TableRef { source, alias, as_of, at })
    }

    fn tvf(&mut self) -> Result<Tvf, SqlError> {
        let at = self.at();
        let kind = match self.peek() {
            Some(TokKind::Word(w)) => match w.to_ascii_uppercase().as_str() {
                "TUMBLE" => TvfKind::Tumble,
                "HOP" => TvfKind::Hop,
                "SESSION" => TvfKind::Session,
                "CUMULATE" => TvfKind::Cumulate,
                _ => return Err(self.expected("TUMBLE, HOP or SESSION")),
            },
            _ => return Err(self.expected("TUMBLE, HOP or SESSION")),
        };
        self.i += 1;
        self.expect_punct("(")?;
        if matches!(self.peek_at(1), Some(TokKind::Punct("=>"))) {
            return Err(SqlError::new(self.at(), "named arguments (DATA => …) are not supported: pass them in order"));
        }
        self.expect_word("TABLE")?;
        let table = self.ident("the table to window")?;
        let mut partition_by = Vec::new();
        if self.eat_word("PARTITION") {
            self.expect_word("BY")?;
            partition_by.push(self.ident("a column")?);
            while self.is_punct(",") && !self.is_word_at(1, "DESCRIPTOR") {
                self.i += 1;
                partition_by.push(self.ident("a column")?);
            }
        }
        self.expect_punct(",")?;
        self.expect_word("DESCRIPTOR")?;
        self.expect_punct("(")?;
        let descriptor = self.ident("the time attribute")?;
        self.expect_punct(")")?;
        let mut args = Vec::new();
        while self.eat_punct(",") {
            args.push(self.expr()?);
        }
        self.expect_punct(")")?;
        Ok(Tvf { kind, table, partition_by, descriptor, args, at })
    }

    fn join(&mut self) -> Result<Option<Join>, SqlError> {
        let at = self.at();
        let kind = if self.eat_punct(",") {
            JoinKind::Cross
        } else if self.eat_word("JOIN") {
            JoinKind::Inner
        } else if self.eat_word("INNER") {
            self.expect_word("JOIN")?;
            JoinKind::Inner
        } else if self.eat_word("CROSS") {
            self.expect_word("JOIN")?;
            JoinKind::Cross
        } else if self.is_word("LEFT") || self.is_word("RIGHT") || self.is_word("FULL") {
            let kind = if self.eat_word("LEFT") {
                JoinKind::Left
            } else if self.eat_word("RIGHT") {
                JoinKind::Right
            } else {
                self.i += 1;
                JoinKind::Full
            };
            self.eat_word("OUTER");
            self.expect_word("JOIN")?;
            kind
        } else if self.is_word("NATURAL") {
            return Err(SqlError::new(at, "NATURAL JOIN is not supported: write JOIN … ON a.key = b.key"));
        } else {
            return Ok(None);
        };
        let right = self.table_ref()?;
        let on = if self.eat_word("ON") {
            Some(self.expr()?)
        } else if self.is_word("USING") {
            return Err(SqlError::new(self.at(), "JOIN … USING is not supported: write ON a.key = b.key"));
        } else {
            None
        };
        Ok(Some(Join { kind, right, on, at }))
    }

    pub fn expr(&mut self) -> Result<Expr, SqlError> {
        self.nest()?;
        let e = self.or();
        self.depth -= 1;
        e
    }

    fn binary(&mut self, op: BinOp, left: Expr, right: Expr) -> Expr {
        let at = left.at();
        Expr::Binary { op, left: Box::new(left), right: Box::new(right), at }
    }

    fn or(&mut self) -> Result<Expr, SqlError> {
        let mut left = self.and()?;
        while self.eat_word("OR") {
            let right = self.and()?;
            left = self.binary(BinOp::Or, left, right);
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, SqlError> {
        let mut left = self.not()?;
        while self.eat_word("AND") {
            let right = self.not()?;
            left = self.binary(BinOp::And, left, right);
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Expr, SqlError> {
        let at = self.at();
        if self.eat_word("NOT") {
            self.nest()?;
            let operand = self.not();
            self.depth -= 1;
            return Ok(Expr::Not { operand: Box::new(operand?), at });
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Result<Expr, SqlError> {
        let left = self.additive()?;
        let at = left.at();
        let op = match self.peek() {
            Some(TokKind::Punct("=")) => Some(BinOp::Eq),
            Some(TokKind::Punct("<>" | "!=")) => Some(BinOp::Ne),
            Some(TokKind::Punct("<")) => Some(BinOp::Lt),
            Some(TokKind::Punct("<=")) => Some(BinOp::Le),
            Some(TokKind::Punct(">")) => Some(BinOp::Gt),
            Some(TokKind::Punct(">=")) => Some(BinOp::Ge),
            _ => None,
        };
        if let Some(op) = op {
            self.i += 1;
            let right = self.additive()?;
            return Ok(self.binary(op, left, right));
        }
        let negated = self.is_word("NOT")
            && (self.is_word_at(1, "BETWEEN") || self.is_word_at(1, "IN") || self.is_word_at(1, "LIKE"));
        self.i += usize::from(negated);
        if self.eat_word("BETWEEN") {
            self.eat_word("SYMMETRIC");
            let low = self.additive()?;
            self.expect_word("AND")?;
            let high = self.additive()?;
            return Ok(Expr::Between {
                operand: Box::new(left),
                low: Box::new(low),
                high: Box::new(high),
                negated,
                at,
            });
        }
        for (word, what) in [("IN", "IN (…)"), ("LIKE", "LIKE"), ("IS", "IS [NOT] NULL")] {
            if self.is_word(word) {
                let at_word = self.at();
                self.skip_operand_of(word)?;
                return Ok(Expr::Other { what: what.into(), at: at_word });
            }
        }
        Ok(left)
    }

    /// Skips the rest of `IN (…)`, `LIKE x` or `IS [NOT] NULL|TRUE|…` after its word.
    fn skip_operand_of(&mut self, word: &str) -> Result<(), SqlError> {
        self.i += 1;
        match word {
            "IN" => {
                self.expect_punct("(")?;
                self.skip_to_close()
            }
            "IS" => {
                self.eat_word("NOT");
                self.eat_word("DISTINCT");
                self.eat_word("FROM");
                self.additive().map(|_| ())
            }
            _ => self.additive().map(|_| ()),
        }
    }

    /// After a `(`: skips to its matching `)`.
    fn skip_to_close(&mut self) -> Result<(), SqlError> {
        let mut depth = 1usize;
        while depth > 0 {
            match self.peek() {
                None => return Err(self.expected("')'")),
                Some(TokKind::Punct("(")) => depth += 1,
                Some(TokKind::Punct(")")) => depth -= 1,
                _ => {}
            }
            self.i += 1;
        }
        Ok(())
    }

    fn additive(&mut self) -> Result<Expr, SqlError> {
        let mut left = self.multiplicative()?;
        loop {
            let op = match self.peek() {
                Some(TokKind::Punct("+")) => BinOp::Add,
                Some(TokKind::Punct("-")) => BinOp::Sub,
                Some(TokKind::Punct("||")) => BinOp::Concat,
                _ => return Ok(left),
            };
            self.i += 1;
            let right = self.multiplicative()?;
            left = self.binary(op, left, right);
        }
    }

    fn multiplicative(&mut self) -> Result<Expr, SqlError> {
        let mut left = self.unary()?;
        loop {
            let op = match self.peek() {
                Some(TokKind::Punct("*")) => BinOp::Mul,
                Some(TokKind::Punct("/")) => BinOp::Div,
                Some(TokKind::Punct("%")) => BinOp::Rem,
                _ => return Ok(left),
            };
            self.i += 1;
            let right = self.unary()?;
            left = self.binary(op, left, right);
        }
    }

    fn unary(&mut self) -> Result<Expr, SqlError> {
        let at = self.at();
        if self.eat_punct("-") {
            self.nest()?;
            let operand = self.unary();
            self.depth -= 1;
            return Ok(Expr::Neg { operand: Box::new(operand?), at });
        }
        if self.eat_punct("+") {
            return self.unary();
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, SqlError> {
        let at = self.at();
        let Some(tok) = self.peek().cloned() else { return Err(self.expected("an expression")) };
        match tok {
            TokKind::Number(text) => {
                self.i += 1;
                Ok(Expr::Number { text, at })
            }
            TokKind::Str(value) => {
                self.i += 1;
                Ok(Expr::Str { value, at })
            }
            TokKind::Punct("(") => {
                self.i += 1;
                if self.is_word("SELECT") {
                    self.skip_to_close()?;
                    return Ok(Expr::Other { what: "a subquery in an expression".into(), at });
                }
                let e = self.expr()?;
                self.expect_punct(")")?;
                Ok(e)
            }
            TokKind::Word(w) => self.word(w, at),
            TokKind::Quoted(_) => self.column_or_call(),
            TokKind::Punct(_) => Err(self.expected("an expression")),
        }
    }

    fn word(&mut self, w: String, at: usize) -> Result<Expr, SqlError> {
        let upper = w.to_ascii_uppercase();
        match upper.as_str() {
            "TRUE" | "FALSE" | "NULL" => {
                self.i += 1;
                Ok(Expr::Keyword { word: upper, at })
            }
            "INTERVAL" => {
                self.i += 1;
                let (value, _) = self.string("a quoted amount, as in INTERVAL '3' SECOND")?;
                let unit = match self.peek() {
                    Some(TokKind::Word(u)) => u.to_ascii_uppercase(),
                    _ => return Err(self.expected("a unit such as SECOND or MINUTE")),
                };
                self.i += 1;
                if self.is_word("TO") {
                    return Err(SqlError::new(
                        self.at(),
                        "INTERVAL … TO … is not supported: write one unit, as in INTERVAL '90' SECOND",
                    ));
                }
                Ok(Expr::Interval { value, unit, at })
            }
            "CASE" if matches!(self.peek_at(1), Some(TokKind::Word(x)) if x.eq_ignore_ascii_case("WHEN")) => {
                self.i += 1;
                self.nest()?;
                let case = self.case(at);
                self.depth -= 1;
                case
            }
            "CASE" => {
                self.i += 1;
                let mut depth = 1usize;
                while depth > 0 {
                    match self.peek() {
                        None => return Err(self.expected("END")),
                        Some(TokKind::Word(x)) if x.eq_ignore_ascii_case("CASE") => depth += 1,
                        Some(TokKind::Word(x)) if x.eq_ignore_ascii_case("END") => depth -= 1,
                        _ => {}
                    }
                    self.i += 1;
                }
                Ok(Expr::Other { what: "the simple CASE x WHEN … form".into(), at })
            }
            "CAST" | "TRY_CAST" | "EXISTS" => {
                self.i += 1;
                self.expect_punct("(")?;
                self.skip_to_close()?;
                Ok(Expr::Other { what: upper, at })
            }
            _ => self.column_or_call(),
        }
    }

    /// `WHEN c THEN v … [ELSE v] END` after `CASE` (at `at`).
    fn case(&mut self, at: usize) -> Result<Expr, SqlError> {
        let mut arms = Vec::new();
        while self.eat_word("WHEN") {
            let when = self.expr()?;
            if !self.eat_word("THEN") {
                return Err(self.expected("THEN"));
            }
            arms.push((when, self.expr()?));
        }
        let otherwise = if self.eat_word("ELSE") { Some(Box::new(self.expr()?)) } else { None };
        if !self.eat_word("END") {
            return Err(self.expected("WHEN, ELSE or END"));
        }
        Ok(Expr::Case { arms, otherwise, at })
    }

    fn column_or_call(&mut self) -> Result<Expr, SqlError> {
        let first = self.ident("a column")?;
        if self.eat_punct("(") {
            let mut args = Vec::new();
            let star = self.eat_punct("*");
            let distinct = !star && self.eat_word("DISTINCT");
            if !star && !self.is_punct(")") {
                args.push(self.expr()?);
                while self.eat_punct(",") {
                    args.push(self.expr()?);
                }
            }
            self.expect_punct(")")?;
            if self.is_word("OVER") {
                return Err(SqlError::new(
                    self.at(),
                    "OVER windows are not supported: braid aggregates with GROUP BY window_start, window_end over a TUMBLE, HOP or SESSION TVF",
                ));
            }
            return Ok(Expr::Call { name: first, args, star, distinct });
        }
        if self.eat_punct(".") {
            let name = self.ident("a column name after '.'")?;
            return Ok(Expr::Column { qualifier: Some(first), name });
        }
        Ok(Expr::Column { qualifier: None, name: first })
    }
}
