//! Plain-text math expressions: a parser with sympy's conventions (implicit multiplication,
//! `^` or `**` for powers, `!` for factorials, `sqrt(...)`) and an equality test that decides by
//! exact rational arithmetic where it can and by evaluation at random points otherwise.
//!
//! Every operation is bounded: inputs are capped in length and nesting, exact powers and
//! factorials are capped in size (beyond that they are evaluated in floating point, where huge
//! towers such as `2^2^2^99` simply overflow to infinity).

use std::collections::BTreeSet;

const MAX_TOKENS: usize = 2000;
const MAX_DEPTH: usize = 100;
/// Points at which expressions with free symbols are compared.
const ROUNDS: u64 = 3;

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// An exact number (decimals are exact too: `0.75` is 3/4).
    Num(Rat),
    /// A floating-point literal that does not fit a rational (e.g. `1e40`).
    Float(f64),
    /// A free symbol.
    Sym(String),
    /// π.
    Pi,
    /// ∞.
    Inf,
    /// Negation.
    Neg(Box<Expr>),
    /// Sum.
    Add(Box<Expr>, Box<Expr>),
    /// Difference.
    Sub(Box<Expr>, Box<Expr>),
    /// Product.
    Mul(Box<Expr>, Box<Expr>),
    /// Quotient.
    Div(Box<Expr>, Box<Expr>),
    /// Power.
    Pow(Box<Expr>, Box<Expr>),
    /// Factorial.
    Fact(Box<Expr>),
    /// A known function applied to arguments.
    Call(String, Vec<Expr>),
}

/// An exact rational number `n/d` in lowest terms with `d > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rat {
    /// Numerator.
    pub n: i128,
    /// Denominator, positive.
    pub d: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    a = a.abs();
    b = b.abs();
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Rat {
    /// `n/d` reduced; `None` when `d == 0`, or when either is `i128::MIN` (whose negation
    /// does not fit: arithmetic would wrap).
    pub fn new(n: i128, d: i128) -> Option<Rat> {
        if d == 0 || n == i128::MIN || d == i128::MIN {
            return None;
        }
        let g = gcd(n, d).max(1);
        let s = if d < 0 { -1 } else { 1 };
        Some(Rat {
            n: s * n / g,
            d: s * d / g,
        })
    }
    fn int(n: i128) -> Rat {
        Rat { n, d: 1 }
    }
    fn to_f64(self) -> f64 {
        self.n as f64 / self.d as f64
    }
    fn is_int(self) -> bool {
        self.d == 1
    }
    fn add(self, o: Rat) -> Option<Rat> {
        let n = self.n.checked_mul(o.d)?.checked_add(o.n.checked_mul(self.d)?)?;
        Rat::new(n, self.d.checked_mul(o.d)?)
    }
    fn mul(self, o: Rat) -> Option<Rat> {
        let g1 = gcd(self.n, o.d).max(1);
        let g2 = gcd(o.n, self.d).max(1);
        Rat::new(
            (self.n / g1).checked_mul(o.n / g2)?,
            (self.d / g2).checked_mul(o.d / g1)?,
        )
    }
    fn recip(self) -> Option<Rat> {
        Rat::new(self.d, self.n)
    }
    fn pow(self, k: i64) -> Option<Rat> {
        if k.unsigned_abs() > 512 {
            return None;
        }
        let base = if k < 0 { self.recip()? } else { self };
        let mut acc = Rat::int(1);
        let mut b = base;
        let mut e = k.unsigned_abs();
        while e > 0 {
            if e & 1 == 1 {
                acc = acc.mul(b)?;
            }
            e >>= 1;
            if e > 0 {
                b = b.mul(b)?;
            }
        }
        Some(acc)
    }
    fn sqrt(self) -> Option<Rat> {
        if self.n < 0 {
            return None;
        }
        let r = |x: i128| {
            let s = (x as f64).sqrt().round() as i128;
            (s.checked_mul(s) == Some(x)).then_some(s)
        };
        Rat::new(r(self.n)?, r(self.d)?)
    }
}

/// A value during evaluation.
#[derive(Debug, Clone, Copy)]
enum Val {
    /// Exact.
    Q(Rat),
    /// A real number, to double precision (π, roots, logarithms).
    F(f64),
    /// A number whose exact value was lost: exact arithmetic overflowed (or it is not finite),
    /// and the float kept is only its magnitude. Two such values are never called equal:
    /// `171!` and `172!`, or `2^200` and `2^200 + 1`, would agree as floats.
    Lost(f64),
}

impl Val {
    fn f(self) -> f64 {
        match self {
            Val::Q(r) => r.to_f64(),
            Val::F(x) | Val::Lost(x) => x,
        }
    }

    /// The float result `x` of an operation on `inputs`: lost when an input was, or when `x`
    /// is not finite.
    fn float(x: f64, inputs: &[Val]) -> Val {
        if !x.is_finite() || inputs.iter().any(|v| matches!(v, Val::Lost(_))) {
            Val::Lost(x)
        } else {
            Val::F(x)
        }
    }
}

/// Why a string is not an expression.
#[derive(Debug, Clone, PartialEq)]
pub struct ParseError(pub String);

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(String),
    Ident(String),
    Op(char),
}

/// Names kept whole instead of being split into one-letter symbols.
const FUNCTIONS: &[&str] = &["sqrt", "cbrt", "sin", "cos", "tan", "ln", "log", "exp", "abs", "binom"];
const CONSTANTS: &[&str] = &["pi", "inf", "oo", "infinity"];

fn tokenize(s: &str) -> Result<Vec<Tok>, ParseError> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if out.len() > MAX_TOKENS {
            return Err(ParseError("expression too long".into()));
        }
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            let st = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            // Scientific notation: `1e3`, `2.5e-4` (but `2e` alone is 2·e).
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '-' || chars[j] == '+') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            out.push(Tok::Num(chars[st..i].iter().collect()));
        } else if c.is_alphabetic() {
            let st = i;
            while i < chars.len() && chars[i].is_alphabetic() {
                i += 1;
            }
            let word: String = chars[st..i].iter().collect();
            split_word(&word, &mut out);
        } else if c == '*' && chars.get(i + 1) == Some(&'*') {
            out.push(Tok::Op('^'));
            i += 2;
        } else if "+-*/^()[]!,".contains(c) {
            out.push(Tok::Op(c));
            i += 1;
        } else if c == 'π' {
            out.push(Tok::Ident("pi".into()));
            i += 1;
        } else if c == '∞' {
            out.push(Tok::Ident("inf".into()));
            i += 1;
        } else if c == '√' {
            out.push(Tok::Ident("sqrt".into()));
            i += 1;
        } else if c == '·' || c == '×' {
            out.push(Tok::Op('*'));
            i += 1;
        } else {
            return Err(ParseError(format!("unexpected character {c:?}")));
        }
    }
    Ok(out)
}

/// Split a run of letters like sympy's `split_symbols`: known names stay whole, the rest
/// become one-letter symbols (`xy` is `x*y`), longest known name first.
fn split_word(word: &str, out: &mut Vec<Tok>) {
    let mut rest = word;
    'outer: while !rest.is_empty() {
        for name in FUNCTIONS.iter().chain(CONSTANTS) {
            if rest.starts_with(name) {
                out.push(Tok::Ident(name.to_string()));
                rest = &rest[name.len()..];
                continue 'outer;
            }
        }
        let c = rest.chars().next().unwrap();
        out.push(Tok::Ident(c.to_string()));
        rest = &rest[c.len_utf8()..];
    }
}

struct Parser {
    toks: Vec<Tok>,
    i: usize,
    depth: usize,
}

/// Parse a plain-text expression.
pub fn parse(s: &str) -> Result<Expr, ParseError> {
    let toks = tokenize(s)?;
    if toks.is_empty() {
        return Err(ParseError("empty expression".into()));
    }
    let mut p = Parser { toks, i: 0, depth: 0 };
    let e = p.sum()?;
    if p.i != p.toks.len() {
        return Err(ParseError(format!("unexpected {:?}", p.toks[p.i])));
    }
    Ok(e)
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i)
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Op(c)) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ParseError("expression nested too deeply".into()));
        }
        Ok(())
    }

    fn sum(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let mut e = self.product()?;
        loop {
            if self.eat('+') {
                e = Expr::Add(Box::new(e), Box::new(self.product()?));
            } else if self.eat('-') {
                e = Expr::Sub(Box::new(e), Box::new(self.product()?));
            } else {
                break;
            }
        }
        self.depth -= 1;
        Ok(e)
    }

    fn starts_atom(&self) -> bool {
        matches!(
            self.peek(),
            Some(Tok::Num(_)) | Some(Tok::Ident(_)) | Some(Tok::Op('('))
        )
    }

    fn product(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.unary()?;
        loop {
            if self.eat('*') {
                e = Expr::Mul(Box::new(e), Box::new(self.unary()?));
            } else if self.eat('/') {
                e = Expr::Div(Box::new(e), Box::new(self.unary()?));
            } else if self.starts_atom() {
                e = Expr::Mul(Box::new(e), Box::new(self.power()?));
            } else {
                break;
            }
        }
        Ok(e)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let e = if self.eat('-') {
            Expr::Neg(Box::new(self.unary()?))
        } else if self.eat('+') {
            self.unary()?
        } else {
            self.power()?
        };
        self.depth -= 1;
        Ok(e)
    }

    fn power(&mut self) -> Result<Expr, ParseError> {
        let base = self.postfix()?;
        if self.eat('^') {
            let exp = self.unary()?;
            return Ok(Expr::Pow(Box::new(base), Box::new(exp)));
        }
        Ok(base)
    }

    fn postfix(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.atom()?;
        while self.eat('!') {
            e = Expr::Fact(Box::new(e));
        }
        Ok(e)
    }

    fn atom(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let tok = self
            .peek()
            .cloned()
            .ok_or_else(|| ParseError("unexpected end".into()))?;
        self.i += 1;
        let e = match tok {
            Tok::Num(s) => number(&s)?,
            Tok::Op('(') => {
                let e = self.sum()?;
                if !self.eat(')') {
                    return Err(ParseError("missing `)`".into()));
                }
                e
            }
            Tok::Ident(name) if FUNCTIONS.contains(&name.as_str()) => {
                let args = if self.eat('(') {
                    let mut args = vec![self.sum()?];
                    while self.eat(',') {
                        args.push(self.sum()?);
                    }
                    if !self.eat(')') {
                        return Err(ParseError("missing `)`".into()));
                    }
                    args
                } else {
                    vec![self.power()?]
                };
                Expr::Call(name, args)
            }
            Tok::Ident(name) => match name.as_str() {
                "pi" => Expr::Pi,
                "inf" | "oo" | "infinity" => Expr::Inf,
                _ => Expr::Sym(name),
            },
            Tok::Op(c) => return Err(ParseError(format!("unexpected `{c}`"))),
        };
        self.depth -= 1;
        Ok(e)
    }
}

/// A number literal, exact where it fits a rational (`1.5e3` is 1500, `0.75` is 3/4); one too
/// long for that is kept as a float ([`Expr::Float`]).
fn number(s: &str) -> Result<Expr, ParseError> {
    let bad = || ParseError(format!("bad number {s:?}"));
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i64>().map_err(|_| bad())?),
        None => (s, 0),
    };
    if mantissa.matches('.').count() > 1 || mantissa.is_empty() || mantissa == "." {
        return Err(bad());
    }
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    // value = digits · 10^scale
    let scale = exp.saturating_sub(frac.len() as i64);
    let float = || -> Result<Expr, ParseError> {
        let x: f64 = s.parse().map_err(|_| bad())?;
        // A nonzero literal past f64's range (`1e-400`, `1e400`) has no value to compare: NaN
        // is never equal to anything (identical texts are still equal as texts).
        Ok(Expr::Float(if x == 0.0 || x.is_infinite() { f64::NAN } else { x }))
    };
    if digits.is_empty() {
        return Ok(Expr::Num(Rat::int(0)));
    }
    if digits.len() > 36 || !(-36..=36).contains(&scale) || digits.len() as i64 + scale.max(0) > 36 {
        return float();
    }
    let n: i128 = digits.parse().map_err(|_| bad())?;
    let ten = 10i128.pow(scale.unsigned_abs() as u32);
    Ok(Expr::Num(if scale >= 0 {
        Rat::int(n * ten)
    } else {
        Rat::new(n, ten).ok_or_else(bad)?
    }))
}

impl Expr {
    /// The free symbols.
    pub fn symbols(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        self.collect(&mut out);
        out
    }
    fn collect(&self, out: &mut BTreeSet<String>) {
        match self {
            Expr::Sym(s) => {
                out.insert(s.clone());
            }
            Expr::Neg(a) | Expr::Fact(a) => a.collect(out),
            Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Div(a, b) | Expr::Pow(a, b) => {
                a.collect(out);
                b.collect(out);
            }
            Expr::Call(_, args) => args.iter().for_each(|a| a.collect(out)),
            Expr::Num(_) | Expr::Float(_) | Expr::Pi | Expr::Inf => {}
        }
    }

    /// The exact value when the expression is a plain rational number (no symbols, no roots
    /// of non-squares).
    pub fn rational(&self) -> Option<Rat> {
        match eval(self, &|_| None) {
            Some(Val::Q(r)) => Some(r),
            _ => None,
        }
    }

    /// The numeric value with no symbols, in floating point.
    pub fn value(&self) -> Option<f64> {
        eval(self, &|_| None).map(Val::f)
    }
}

/// A deterministic pseudo-random rational for symbol `name` in round `r` (in (0, 4), not an
/// integer, different per symbol), so that polynomial identities are checked exactly.
fn point(name: &str, r: u64) -> Rat {
    let mut h: u64 = 0x9e3779b97f4a7c15 ^ r.wrapping_mul(0xbf58476d1ce4e5b9);
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    let d = 7 + (h % 11) as i128;
    let n = 1 + ((h >> 16) % (4 * d as u64 - 1)) as i128;
    Rat::new(n, d).unwrap()
}

fn eval(e: &Expr, sym: &dyn Fn(&str) -> Option<Rat>) -> Option<Val> {
    use Val::*;
    let bin = |a: &Expr, b: &Expr| Some((eval(a, sym)?, eval(b, sym)?));
    // Exact where both are exact and the result fits; when exact arithmetic overflows, the
    // float result has lost the exact value.
    let exact_or_lost = |r: Option<Rat>, x: f64| r.map(Q).unwrap_or(Lost(x));
    Some(match e {
        Expr::Num(r) => Q(*r),
        // A literal too long for a rational: past 2^53 its float is not even an integer's.
        Expr::Float(x) if x.abs() >= 9_007_199_254_740_992.0 => Lost(*x),
        Expr::Float(x) => Val::float(*x, &[]),
        Expr::Sym(s) => Q(sym(s)?),
        Expr::Pi => F(std::f64::consts::PI),
        Expr::Inf => Lost(f64::INFINITY),
        Expr::Neg(a) => match eval(a, sym)? {
            Q(r) => Q(Rat { n: -r.n, d: r.d }),
            F(x) => F(-x),
            Lost(x) => Lost(-x),
        },
        Expr::Add(a, b) => match bin(a, b)? {
            (Q(x), Q(y)) => exact_or_lost(x.add(y), x.to_f64() + y.to_f64()),
            (x, y) => Val::float(x.f() + y.f(), &[x, y]),
        },
        Expr::Sub(a, b) => match bin(a, b)? {
            (Q(x), Q(y)) => exact_or_lost(x.add(Rat { n: -y.n, d: y.d }), x.to_f64() - y.to_f64()),
            (x, y) => Val::float(x.f() - y.f(), &[x, y]),
        },
        Expr::Mul(a, b) => match bin(a, b)? {
            (Q(x), Q(y)) => exact_or_lost(x.mul(y), x.to_f64() * y.to_f64()),
            (x, y) => Val::float(x.f() * y.f(), &[x, y]),
        },
        Expr::Div(a, b) => match bin(a, b)? {
            (_, Q(y)) if y.n == 0 => return None,
            (Q(x), Q(y)) => exact_or_lost(x.mul(y.recip()?), x.to_f64() / y.to_f64()),
            (x, y) => Val::float(x.f() / y.f(), &[x, y]),
        },
        Expr::Pow(a, b) => match bin(a, b)? {
            (Q(x), Q(y)) if y.is_int() && !(x.n == 0 && y.n < 0) => {
                let k = i64::try_from(y.n).ok();
                exact_or_lost(k.and_then(|k| x.pow(k)), x.to_f64().powf(y.to_f64()))
            }
            (Q(x), Q(y)) if y == Rat::new(1, 2).unwrap() && x.sqrt().is_some() => Q(x.sqrt()?),
            (x, y) => Val::float(x.f().powf(y.f()), &[x, y]),
        },
        Expr::Fact(a) => match eval(a, sym)? {
            Q(r) if r.is_int() && r.n >= 0 => {
                if r.n <= 33 {
                    Q(Rat::int((1..=r.n).product::<i128>().max(1)))
                } else if r.n <= 170 {
                    Lost((1..=r.n).map(|k| k as f64).product())
                } else {
                    Lost(f64::INFINITY)
                }
            }
            _ => return None,
        },
        Expr::Call(f, args) => {
            let x = eval(args.first()?, sym)?;
            if f == "binom" {
                return binom(x, eval(args.get(1)?, sym)?);
            }
            let real = |y: f64| Val::float(y, &[x]);
            match (f.as_str(), x) {
                ("sqrt", Q(r)) if r.sqrt().is_some() => Q(r.sqrt()?),
                ("abs", Q(r)) => Q(Rat { n: r.n.abs(), d: r.d }),
                ("sqrt", x) => real(x.f().sqrt()),
                ("cbrt", x) => real(x.f().cbrt()),
                ("sin", x) => real(x.f().sin()),
                ("cos", x) => real(x.f().cos()),
                ("tan", x) => real(x.f().tan()),
                ("ln" | "log", x) => real(x.f().ln()),
                ("exp", x) => real(x.f().exp()),
                ("abs", x) => real(x.f().abs()),
                _ => return None,
            }
        }
    })
}

fn binom(n: Val, k: Val) -> Option<Val> {
    match (n, k) {
        (Val::Q(n), Val::Q(k)) if n.is_int() && k.is_int() && k.n >= 0 && k.n <= n.n && n.n <= 10_000 => {
            let k = k.n.min(n.n - k.n);
            let mut acc = Rat::int(1);
            for i in 0..k {
                match acc.mul(Rat::new(n.n - i, i + 1)?) {
                    Some(r) => acc = r,
                    None => return Some(Val::Lost(f64::INFINITY)),
                }
            }
            Some(Val::Q(acc))
        }
        _ => None,
    }
}

/// Whether two values are equal: exactly for rationals, to 12 significant digits (relative, at
/// any magnitude: `6.626e-34` ≠ `1.38e-23`) for reals; never when either lost its exact value
/// (cannot decide: not equal).
fn close(a: Val, b: Val) -> bool {
    match (a, b) {
        (Val::Q(x), Val::Q(y)) => x == y,
        (Val::Lost(_), _) | (_, Val::Lost(_)) => false,
        (x, y) => {
            let (x, y) = (x.f(), y.f());
            x.is_finite() && y.is_finite() && (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
    }
}

/// Whether two expressions are equal: exactly when both evaluate to rationals, otherwise at
/// `ROUNDS` random points for their symbols, to 12 significant digits.
pub fn equivalent(a: &Expr, b: &Expr) -> bool {
    let syms: BTreeSet<String> = a.symbols().union(&b.symbols()).cloned().collect();
    let rounds = if syms.is_empty() { 1 } else { ROUNDS };
    (0..rounds).all(|r| {
        let sym = |s: &str| syms.contains(s).then(|| point(s, r));
        match (eval(a, &sym), eval(b, &sym)) {
            (Some(x), Some(y)) => close(x, y),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests;
