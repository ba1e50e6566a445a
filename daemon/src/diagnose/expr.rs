//! The small expression language of diagnosis rules: arithmetic and comparisons over named
//! signals, `&&`, `||`, `!`, parentheses. A missing signal makes every comparison that uses it
//! false (a GPU rule never fires on a process without GPU data) and every value None.
//!
//! ```text
//! gpu.device_idle_ratio > 0.3 && (cpu.main_thread_busy_ratio > 0.8 || io.wait_ratio > 0.3)
//! 1 / (1 - gpu.device_idle_ratio)
//! ```
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Num(f64),
    Signal(String),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    Bin(Box<Expr>, Op, Box<Expr>),
    /// `min(a, b, ...)`, `max(a, b, ...)`.
    Call(Func, Vec<Expr>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    Min,
    Max,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Or,
    And,
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("at character {pos}: {msg}")]
pub struct ParseError {
    pub pos: usize,
    pub msg: String,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Num(f64),
    Ident(String),
    Op(&'static str),
    LParen,
    RParen,
    Comma,
}

fn lex(s: &str) -> Result<Vec<(usize, Tok)>, ParseError> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i] as char;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        if c.is_ascii_digit() || (c == '.' && b.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            while i < b.len()
                && (b[i].is_ascii_digit()
                    || b[i] == b'.'
                    || b[i] == b'e'
                    || b[i] == b'E'
                    || ((b[i] == b'-' || b[i] == b'+') && matches!(b[i - 1], b'e' | b'E')))
            {
                i += 1;
            }
            let t = &s[start..i];
            let v = t.parse::<f64>().map_err(|_| ParseError {
                pos: start,
                msg: format!("bad number {t:?}"),
            })?;
            out.push((start, Tok::Num(v)));
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            out.push((start, Tok::Ident(s[start..i].to_string())));
            continue;
        }
        let two = s.get(i..i + 2).unwrap_or("");
        let op = match two {
            "&&" | "||" | ">=" | "<=" | "==" | "!=" => Some(two),
            _ => None,
        };
        if let Some(op) = op {
            let op: &'static str = match op {
                "&&" => "&&",
                "||" => "||",
                ">=" => ">=",
                "<=" => "<=",
                "==" => "==",
                _ => "!=",
            };
            out.push((start, Tok::Op(op)));
            i += 2;
            continue;
        }
        let tok = match c {
            '(' => Tok::LParen,
            ',' => Tok::Comma,
            ')' => Tok::RParen,
            '>' => Tok::Op(">"),
            '<' => Tok::Op("<"),
            '+' => Tok::Op("+"),
            '-' => Tok::Op("-"),
            '*' => Tok::Op("*"),
            '/' => Tok::Op("/"),
            '!' => Tok::Op("!"),
            _ => {
                return Err(ParseError {
                    pos: start,
                    msg: format!("unexpected {c:?}"),
                });
            }
        };
        out.push((start, tok));
        i += 1;
    }
    Ok(out)
}

/// Deepest nesting of parentheses, `!` and `-` accepted: the parser and `eval` recurse once per
/// level, and a rules file must not be able to overflow the daemon's stack.
const MAX_NESTING: usize = 64;
/// Most tokens in one expression: bounds the depth of left-leaning chains (`a + a + ...`) too.
const MAX_TOKENS: usize = 1024;

struct Parser {
    toks: Vec<(usize, Tok)>,
    i: usize,
    len: usize,
    nesting: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i).map(|(_, t)| t)
    }
    fn pos(&self) -> usize {
        self.toks.get(self.i).map_or(self.len, |(p, _)| *p)
    }
    fn err<T>(&self, msg: impl Into<String>) -> Result<T, ParseError> {
        Err(ParseError {
            pos: self.pos(),
            msg: msg.into(),
        })
    }
    fn eat_op(&mut self, ops: &[&'static str]) -> Option<&'static str> {
        if let Some(Tok::Op(o)) = self.peek() {
            if let Some(found) = ops.iter().find(|x| *x == o) {
                self.i += 1;
                return Some(found);
            }
        }
        None
    }
    fn binary(
        &mut self,
        ops: &[&'static str],
        next: fn(&mut Self) -> Result<Expr, ParseError>,
    ) -> Result<Expr, ParseError> {
        let mut l = next(self)?;
        while let Some(o) = self.eat_op(ops) {
            let r = next(self)?;
            l = Expr::Bin(Box::new(l), op_of(o), Box::new(r));
        }
        Ok(l)
    }
    fn or(&mut self) -> Result<Expr, ParseError> {
        self.binary(&["||"], Self::and)
    }
    fn and(&mut self) -> Result<Expr, ParseError> {
        self.binary(&["&&"], Self::cmp)
    }
    fn cmp(&mut self) -> Result<Expr, ParseError> {
        let l = self.sum()?;
        if let Some(o) = self.eat_op(&[">=", "<=", "==", "!=", ">", "<"]) {
            let r = self.sum()?;
            return Ok(Expr::Bin(Box::new(l), op_of(o), Box::new(r)));
        }
        Ok(l)
    }
    fn sum(&mut self) -> Result<Expr, ParseError> {
        self.binary(&["+", "-"], Self::product)
    }
    fn product(&mut self) -> Result<Expr, ParseError> {
        self.binary(&["*", "/"], Self::unary)
    }
    fn unary(&mut self) -> Result<Expr, ParseError> {
        // Every nested level (parenthesis, function call, `!`, `-`) passes through here.
        if self.nesting >= MAX_NESTING {
            return self.err(format!("nested more than {MAX_NESTING} levels deep"));
        }
        self.nesting += 1;
        let e = if self.eat_op(&["!"]).is_some() {
            Expr::Not(Box::new(self.unary()?))
        } else if self.eat_op(&["-"]).is_some() {
            Expr::Neg(Box::new(self.unary()?))
        } else {
            self.atom()?
        };
        self.nesting -= 1;
        Ok(e)
    }
    fn atom(&mut self) -> Result<Expr, ParseError> {
        match self.peek().cloned() {
            Some(Tok::Num(v)) => {
                self.i += 1;
                Ok(Expr::Num(v))
            }
            Some(Tok::Ident(n)) if matches!(self.toks.get(self.i + 1), Some((_, Tok::LParen))) => {
                let f = match n.as_str() {
                    "min" => Func::Min,
                    "max" => Func::Max,
                    _ => return self.err(format!("unknown function {n:?} (known: min, max)")),
                };
                self.i += 2;
                let mut args = vec![self.or()?];
                while self.peek() == Some(&Tok::Comma) {
                    self.i += 1;
                    args.push(self.or()?);
                }
                if self.peek() != Some(&Tok::RParen) {
                    return self.err("expected ')' after the arguments");
                }
                self.i += 1;
                Ok(Expr::Call(f, args))
            }
            Some(Tok::Ident(n)) => {
                self.i += 1;
                Ok(match n.as_str() {
                    "true" => Expr::Num(1.0),
                    "false" => Expr::Num(0.0),
                    _ => Expr::Signal(n),
                })
            }
            Some(Tok::LParen) => {
                self.i += 1;
                let e = self.or()?;
                if self.peek() != Some(&Tok::RParen) {
                    return self.err("expected ')'");
                }
                self.i += 1;
                Ok(e)
            }
            Some(t) => self.err(format!("unexpected {t:?}")),
            None => self.err("unexpected end of expression"),
        }
    }
}

fn op_of(o: &str) -> Op {
    match o {
        "||" => Op::Or,
        "&&" => Op::And,
        ">" => Op::Gt,
        ">=" => Op::Ge,
        "<" => Op::Lt,
        "<=" => Op::Le,
        "==" => Op::Eq,
        "!=" => Op::Ne,
        "+" => Op::Add,
        "-" => Op::Sub,
        "*" => Op::Mul,
        _ => Op::Div,
    }
}

pub fn parse(s: &str) -> Result<Expr, ParseError> {
    let toks = lex(s)?;
    if let Some((pos, _)) = toks.get(MAX_TOKENS) {
        return Err(ParseError {
            pos: *pos,
            msg: format!("longer than {MAX_TOKENS} tokens"),
        });
    }
    let mut p = Parser {
        toks,
        i: 0,
        len: s.len(),
        nesting: 0,
    };
    let e = p.or()?;
    if p.i != p.toks.len() {
        return p.err("unexpected text after the expression");
    }
    Ok(e)
}

impl Expr {
    /// The value; None when a signal it needs is missing or a division by zero happens.
    pub fn eval(&self, s: &BTreeMap<String, f64>) -> Option<f64> {
        let b = |x: bool| if x { 1.0 } else { 0.0 };
        Some(match self {
            Expr::Num(v) => *v,
            Expr::Signal(n) => *s.get(n)?,
            Expr::Not(e) => b(!e.truth(s)),
            Expr::Neg(e) => -e.eval(s)?,
            // Over the arguments that have a value: max(a, missing) is a.
            Expr::Call(f, args) => {
                let mut v: Option<f64> = None;
                for x in args.iter().filter_map(|a| a.eval(s)) {
                    v = Some(match (v, f) {
                        (None, _) => x,
                        (Some(v), Func::Min) => v.min(x),
                        (Some(v), Func::Max) => v.max(x),
                    });
                }
                v?
            }
            Expr::Bin(l, op, r) => match op {
                Op::Or => b(l.truth(s) || r.truth(s)),
                Op::And => b(l.truth(s) && r.truth(s)),
                _ => {
                    let (x, y) = (l.eval(s)?, r.eval(s)?);
                    match op {
                        Op::Gt => b(x > y),
                        Op::Ge => b(x >= y),
                        Op::Lt => b(x < y),
                        Op::Le => b(x <= y),
                        Op::Eq => b(x == y),
                        Op::Ne => b(x != y),
                        Op::Add => x + y,
                        Op::Sub => x - y,
                        Op::Mul => x * y,
                        Op::Div => {
                            if y == 0.0 {
                                return None;
                            }
                            x / y
                        }
                        Op::Or | Op::And => unreachable!(),
                    }
                }
            },
        })
    }

    /// The signal names it reads, in order (with repeats).
    pub fn signals(&self) -> impl Iterator<Item = &str> {
        let mut out = Vec::new();
        let mut stack = vec![self];
        while let Some(e) = stack.pop() {
            match e {
                Expr::Num(_) => {}
                Expr::Signal(n) => out.push(n.as_str()),
                Expr::Not(x) | Expr::Neg(x) => stack.push(x),
                Expr::Bin(l, _, r) => {
                    stack.push(r);
                    stack.push(l);
                }
                Expr::Call(_, args) => stack.extend(args.iter().rev()),
            }
        }
        out.into_iter()
    }

    /// As a condition: a missing signal is false.
    pub fn truth(&self, s: &BTreeMap<String, f64>) -> bool {
        self.eval(s).is_some_and(|v| v != 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(v: &[(&str, f64)]) -> BTreeMap<String, f64> {
        v.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn precedence_and_logic() {
        let s = sig(&[("a.x", 0.5), ("b", 2.0)]);
        assert_eq!(parse("1 + 2 * 3").unwrap().eval(&s), Some(7.0));
        assert_eq!(parse("(1 + 2) * 3").unwrap().eval(&s), Some(9.0));
        assert!(parse("a.x > 0.3 && b >= 2").unwrap().truth(&s));
        assert!(!parse("a.x > 0.6 || b < 1").unwrap().truth(&s));
        assert!(parse("!(a.x > 0.6)").unwrap().truth(&s));
        assert_eq!(parse("1 / (1 - a.x)").unwrap().eval(&s), Some(2.0));
        assert_eq!(parse("-b + 1e1").unwrap().eval(&s), Some(8.0));
        assert_eq!(
            parse("min(b, 1) + max(a.x, 0.1, 3)").unwrap().eval(&s),
            Some(4.0)
        );
        assert!(parse("foo(1)").is_err());
        // A missing argument is skipped; all missing is missing.
        assert_eq!(parse("max(nope, 2)").unwrap().eval(&s), Some(2.0));
        assert_eq!(parse("min(nope, nada)").unwrap().eval(&s), None);
    }

    #[test]
    fn missing_signals_never_fire() {
        let s = sig(&[("b", 2.0)]);
        assert!(!parse("gpu.idle > 0.3").unwrap().truth(&s));
        assert!(!parse("gpu.idle > 0.3 && b > 1").unwrap().truth(&s));
        assert!(parse("gpu.idle > 0.3 || b > 1").unwrap().truth(&s));
        assert_eq!(parse("b / 0").unwrap().eval(&s), None);
    }

    #[test]
    fn errors_point_at_the_problem() {
        assert_eq!(parse("a > ").unwrap_err().pos, 4);
        assert!(parse("a >> b").is_err());
        assert!(parse("(a > 1").unwrap_err().msg.contains(')'));
        assert!(parse("a $ b").unwrap_err().msg.contains('$'));
    }

    /// Deep nesting (in a rules file) used to overflow the stack and kill the daemon.
    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        // Under the token limit, over the nesting limit.
        let deep = format!("{}1{}", "(".repeat(500), ")".repeat(500));
        assert!(parse(&deep).unwrap_err().msg.contains("nested"));
        assert!(parse(&"!".repeat(1000)).unwrap_err().msg.contains("nested"));
        assert!(parse(&"-".repeat(100_000)).is_err());
        let ok = format!(
            "{}1{}",
            "(".repeat(MAX_NESTING - 1),
            ")".repeat(MAX_NESTING - 1)
        );
        assert_eq!(parse(&ok).unwrap().eval(&BTreeMap::new()), Some(1.0));
        let chain = vec!["a"; 100_000].join(" + ");
        assert!(parse(&chain).unwrap_err().msg.contains("tokens"));
    }
}
