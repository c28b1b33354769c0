//! A faithful port of OpenAI's PRM800K grader (`grade_answer` in `prm800k/grading/grader.py`):
//! MATH normalisation first, then its own normalisation, tuple splitting with matching brackets,
//! the rules that unreduced fractions and integer-vs-non-integer never match, and symbolic
//! equality where sympy would be asked (here: [`super::expr`]).

use super::expr;
use super::latex::latex_to_text;
use super::mathd::{normalize_answer, strip_text_wrapper};
use regex::Regex;
use std::sync::LazyLock;

const UNITS: &[&str] = &[
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
];

static UNIT_RES: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    UNITS
        .iter()
        .map(|u| Regex::new(&format!(r"{u}(es)?(s)? *(\^[0-9]+)?")).unwrap())
        .collect()
});
static CIRC: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\^ *\\circ").unwrap());
static THIN_COMMA: LazyLock<Regex> = LazyLock::new(|| Regex::new(r",\\! *").unwrap());
static MINUS_SPACE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"- *").unwrap());
static MIXED: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"([0-9]) +([0-9])").unwrap());
static COMMA_GROUP: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(\d)(,)(\d\d\d)($|\D)").unwrap());
static FRAC: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$").unwrap());
static BAD_RES: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    vec![
        Regex::new(r"\^[0-9]+\^").unwrap(),
        Regex::new(r"\^[0-9][0-9]+").unwrap(),
    ]
});

/// Python's `float(s)` acceptance: decimal literals, exponents, inf/nan, `_` separators aside.
pub(crate) fn py_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    if matches!(body, "inf" | "infinity" | "nan") {
        return t.parse::<f64>().ok().or(Some(if lower.starts_with('-') {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        }));
    }
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) {
        return None;
    }
    t.parse::<f64>().ok()
}

fn is_int(x: f64) -> bool {
    x.is_finite() && (x - x.round()).abs() <= 1e-7
}

/// Past 2^53 a float no longer holds every integer: two different numbers read as floats can
/// become one (`100000000000000000001` and `100000000000000000000`). Python's grader rounds
/// them through a float anyway; here they keep their digits.
const EXACT_FLOAT_INTS: f64 = 9_007_199_254_740_992.0;

/// An integer written with digits only (a sign and commas aside), as its digits without
/// leading zeros: the exact form of an integer too large for a float.
fn integer_digits(x: &str) -> Option<String> {
    let t = x.trim().replace(',', "");
    let (sign, digits) = match t.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", t.strip_prefix('+').unwrap_or(&t)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = digits.trim_start_matches('0');
    Some(if digits.is_empty() {
        "0".into()
    } else {
        format!("{sign}{digits}")
    })
}

/// `_strip_properly_formatted_commas`: `1,000,000` → `1000000`, tuples left alone.
pub(crate) fn strip_commas(expr: &str) -> String {
    let mut e = expr.to_string();
    loop {
        let next = COMMA_GROUP.replace_all(&e, "$1$3$4").into_owned();
        if next == e {
            return next;
        }
        e = next;
    }
}

fn str_is_int(x: &str) -> bool {
    py_float(&strip_commas(x)).is_some_and(is_int)
}

/// `int(float(x.replace(",", "")))` rendered back to a string.
fn str_to_int(x: &str) -> Option<String> {
    let f = py_float(&x.replace(',', ""))?;
    if !f.is_finite() {
        return None;
    }
    if f.abs() >= EXACT_FLOAT_INTS {
        // Too large for the float to be exact: digits stay digits, anything else cannot be
        // decided.
        return integer_digits(x);
    }
    Some(format!("{}", f.trunc() as i128))
}

fn parse_latex(expr: &str) -> Option<String> {
    let e = expr
        .replace("\\tfrac", "\\frac")
        .replace("\\dfrac", "\\frac")
        .replace("\\frac", " \\frac");
    let t = latex_to_text(&e)?;
    Some(
        t.replace('√', "sqrt")
            .replace('π', "pi")
            .replace('∞', "inf")
            .replace('∪', "U")
            .replace(['·', '×'], "*")
            .trim()
            .to_string(),
    )
}

/// The grader's own `_normalize`.
pub fn normalize(expr: &str) -> String {
    let mut e = strip_text_wrapper(expr).unwrap_or(expr).to_string();
    e = e.replace("\\%", "%").replace("\\$", "$").replace(['$', '%'], "");
    e = e.replace(" or ", " , ").replace(" and ", " , ");
    e = e
        .replace("million", "*10^6")
        .replace("billion", "*10^9")
        .replace("trillion", "*10^12");
    for re in UNIT_RES.iter() {
        e = re.replace_all(&e, "").into_owned();
    }
    e = CIRC.replace_all(&e, "").into_owned();
    if e.len() > 1 && e.starts_with('{') && e.ends_with('}') {
        e = e[1..e.len() - 1].to_string();
    } else if e == "{" || e == "}" {
        // A one-character string both starts and ends with the brace: Python slices it away.
        e.clear();
    }
    e = THIN_COMMA.replace_all(&e, "").into_owned();
    if let Some(f) = py_float(&e) {
        if is_int(f) && f.abs() < EXACT_FLOAT_INTS {
            e = format!("{}", f.round() as i128);
        } else if let Some(digits) = integer_digits(&e).filter(|_| is_int(f)) {
            e = digits;
        }
    }
    if e.contains('\\') {
        if let Some(t) = parse_latex(&e) {
            e = t;
        }
    }
    e = MINUS_SPACE.replace_all(&e, "-").into_owned();
    e = MIXED.replace_all(&e, "$1+$2").into_owned();
    e = e.replace(' ', "").replace(['{', '}'], "").to_lowercase();
    if str_is_int(&e) {
        if let Some(i) = str_to_int(&e) {
            e = i;
        }
    }
    e
}

fn count_unknown_letters(expr: &str) -> usize {
    let e = expr.replace("sqrt", "").replace("frac", "");
    e.chars()
        .filter(|c| c.is_alphabetic())
        .collect::<std::collections::HashSet<_>>()
        .len()
}

fn should_allow_eval(expr: &str) -> bool {
    count_unknown_letters(expr) <= 2
        && !expr.contains("^{")
        && !expr.contains("^(")
        && !BAD_RES.iter().any(|re| re.is_match(expr))
}

/// `are_equal_under_sympy`: `simplify(gt - given) == 0`, decided by [`expr::equivalent`].
fn equal_symbolically(gt: &str, given: &str) -> bool {
    let combined = format!("({gt})-({given})");
    if !should_allow_eval(&combined) {
        return false;
    }
    match (expr::parse(gt), expr::parse(given)) {
        (Ok(a), Ok(b)) => expr::equivalent(&a, &b),
        _ => false,
    }
}

const TUPLE_CHARS: &[char] = &['(', ')', '[', ']'];

/// `split_tuple`: the elements of a bracketed tuple/interval, or the whole expression.
pub(crate) fn split_tuple(expr: &str) -> Vec<String> {
    let e = strip_commas(expr);
    if e.is_empty() {
        return Vec::new();
    }
    let chars: Vec<char> = e.chars().collect();
    let n = chars.len();
    if n > 2
        && TUPLE_CHARS.contains(&chars[0])
        && TUPLE_CHARS.contains(&chars[n - 1])
        && !chars[1..n - 1].iter().any(|c| TUPLE_CHARS.contains(c))
    {
        let inner: String = chars[1..n - 1].iter().collect();
        inner.split(',').map(|s| s.trim().to_string()).collect()
    } else {
        vec![e]
    }
}

/// `grade_answer(given_answer, ground_truth)`.
pub fn grade(given: &str, ground_truth: &str) -> bool {
    if normalize_answer(ground_truth) == normalize_answer(given) {
        return true;
    }
    let gt = normalize(ground_truth);
    let gv = normalize(given);
    if gt == gv {
        return true;
    }
    if gv.is_empty() {
        return false;
    }
    let gt_elems = split_tuple(&gt);
    let gv_elems = split_tuple(&gv);
    if gt_elems.len() > 1 && (gt.chars().next() != gv.chars().next() || gt.chars().last() != gv.chars().last()) {
        return false;
    }
    if gt_elems.len() != gv_elems.len() {
        return false;
    }
    gt_elems.iter().zip(&gv_elems).all(|(a, b)| {
        if FRAC.is_match(a) && FRAC.is_match(b) {
            a == b
        } else if str_is_int(a) != str_is_int(b) {
            false
        } else {
            equal_symbolically(a, b)
        }
    })
}
