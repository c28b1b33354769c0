//! The lenient grader: mathematically right where PRM800K's grader is deliberately strict.
//! `2^{10}` = 1024, `\sqrt[3]{8}` = 2, `\frac{2}{4}` = 1/2, `\binom{5}{2}` = 10, `5!` = 120,
//! `\pm 2` = `2, -2`, unordered answer lists compare as multisets, a percentage equals its
//! number with or without the `%`, trailing units and `x =` prefixes are ignored.

use super::expr;
use super::latex::{convert, Style};
use super::mathd::strip_text_wrapper;
use super::prm800k::{self, strip_commas};
use crate::answer::last_boxed;

const UNIT_WORDS: &[&str] = &[
    "degrees",
    "degree",
    "dollars",
    "dollar",
    "cents",
    "cent",
    "units",
    "unit",
    "cm",
    "centimeters",
    "meters",
    "meter",
    "m",
    "km",
    "miles",
    "mile",
    "seconds",
    "second",
    "minutes",
    "minute",
    "hours",
    "hour",
    "days",
    "day",
    "weeks",
    "week",
    "months",
    "month",
    "years",
    "year",
    "feet",
    "foot",
    "inches",
    "inch",
    "yards",
    "yard",
    "square",
    "sq",
    "percent",
    "mph",
];

/// Lenient equality of a given answer and the ground truth.
///
/// Two numbers (or lists of numbers) are equal exactly when their values are (to 12 significant
/// digits when a value is irrational), whatever their notation: `3e-10` = `3\times10^{-10}` ≠
/// `5e-10`. PRM800K's grader, which the rest defers to, rounds any number within 1e-7 of an
/// integer to it, so it calls `3e-10` and `5e-10` both 0.
pub fn grade(given: &str, ground_truth: &str) -> bool {
    // No answer is never right, not even against no gold answer.
    if given.trim().is_empty() || ground_truth.trim().is_empty() {
        return false;
    }
    let (a, b) = (answer_set(given), answer_set(ground_truth));
    if let (Some(a), Some(b)) = (&a, &b) {
        if numeric(a) && numeric(b) {
            return same_answers(a, b);
        }
    }
    if prm800k::grade(given, ground_truth) {
        return true;
    }
    match (a, b) {
        (Some(a), Some(b)) => same_answers(&a, &b),
        _ => false,
    }
}

/// Whether every element of an answer is a number (no symbols; a percentage counts).
fn numeric(a: &Answer) -> bool {
    !a.elems.is_empty()
        && a.elems.iter().all(|e| {
            let e = e.replace(' ', "");
            let e = e.strip_suffix('%').unwrap_or(&e);
            expr::parse(e).is_ok_and(|x| x.symbols().is_empty())
        })
}

/// An answer as a list of alternatives to compare: (bracket kind, elements).
#[derive(Debug)]
struct Answer {
    brackets: Option<(char, char)>,
    elems: Vec<String>,
}

fn clean(s: &str) -> String {
    // A sentence's full stop after the answer (`\frac{14}{3}.`) is not part of it.
    let mut s = s.trim().trim_end_matches('.').trim_end().to_string();
    if let Some(b) = last_boxed(&s) {
        s = b;
    }
    if let Some(inner) = strip_text_wrapper(&s) {
        s = inner.to_string();
    }
    s = s
        .replace("\\$", "")
        .replace('$', "")
        .replace("\\!", "")
        .replace("\\left", "")
        .replace("\\right", "");
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\%", "%");
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac");
    // Mixed numbers: `3\frac12` is 3 + 1/2.
    let b = s.as_bytes();
    if let Some(i) = s.find("\\frac") {
        if i > 0 && b[i - 1].is_ascii_digit() && s[..i].bytes().all(|c| c.is_ascii_digit() || c == b'-') {
            s = format!("{}+{}", &s[..i], &s[i..]);
        }
    }
    s
}

/// Drop a leading `x =` and trailing unit words.
fn strip_decorations(mut e: String) -> String {
    if let Some((lhs, rhs)) = e.split_once('=') {
        if lhs.trim().chars().all(|c| c.is_alphabetic() || c == '_' || c == ' ') && lhs.trim().len() <= 3 {
            e = rhs.trim().to_string();
        }
    }
    loop {
        let t = e.trim_end();
        let word_start = t
            .char_indices()
            .rev()
            .find(|(_, c)| !c.is_ascii_alphabetic())
            .map_or(0, |(i, c)| i + c.len_utf8());
        let word = &t[word_start..];
        if word_start > 0 && !word.is_empty() && UNIT_WORDS.contains(&word.to_ascii_lowercase().as_str()) {
            e = t[..word_start].trim_end().to_string();
        } else {
            return t.to_string();
        }
    }
}

fn answer_set(s: &str) -> Option<Answer> {
    let s = clean(s);
    let text = if s.contains(['\\', '{']) {
        convert(&s, Style::Math)?
    } else {
        s
    };
    let text = strip_commas(&strip_decorations(text.replace(" or ", ",").replace(" and ", ",")));
    let text = text.trim();
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len();
    let (brackets, inner) =
        if n >= 2 && "([".contains(chars[0]) && ")]".contains(chars[n - 1]) && top_level_commas(&chars[1..n - 1]) {
            (
                Some((chars[0], chars[n - 1])),
                chars[1..n - 1].iter().collect::<String>(),
            )
        } else {
            (None, text.to_string())
        };
    let mut elems = Vec::new();
    for part in split_top(&inner) {
        // `±a` stands for both signs.
        match part.split_once('±') {
            Some((pre, post)) if brackets.is_none() => {
                elems.push(format!("{pre}+({post})"));
                elems.push(format!("{pre}-({post})"));
            }
            _ => elems.push(part),
        }
    }
    Some(Answer { brackets, elems })
}

fn top_level_commas(chars: &[char]) -> bool {
    let mut depth = 0i32;
    for &c in chars {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            ',' if depth == 0 => return true,
            _ => {}
        }
    }
    false
}

fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur).trim().to_string());
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur.trim().to_string());
    out.into_iter().filter(|e| !e.is_empty()).collect()
}

fn same_answers(a: &Answer, b: &Answer) -> bool {
    if a.elems.len() != b.elems.len() || a.elems.is_empty() {
        return false;
    }
    if a.brackets.is_some() || b.brackets.is_some() {
        return a.brackets == b.brackets && a.elems.iter().zip(&b.elems).all(|(x, y)| same_value(x, y));
    }
    // Unordered: a greedy matching is exact here because equality is transitive.
    let mut used = vec![false; b.elems.len()];
    a.elems.iter().all(|x| {
        let hit = b
            .elems
            .iter()
            .enumerate()
            .position(|(j, y)| !used[j] && same_value(x, y));
        hit.map(|j| used[j] = true).is_some()
    })
}

/// The sign of an infinity however it is written (`inf`, `-\\infty`, `+∞`, `oo`), or None for
/// anything else: infinities are equal by sign, not by a value that cannot be held.
fn infinity(s: &str) -> Option<bool> {
    let s = s.replace(' ', "").to_lowercase();
    let (negative, rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(&s)),
    };
    matches!(rest, "inf" | "infinity" | "∞" | "oo" | "\\infty" | "\\inf").then_some(negative)
}

fn same_value(a: &str, b: &str) -> bool {
    let norm = |s: &str| s.replace(' ', "").to_lowercase();
    if norm(a) == norm(b) {
        return true;
    }
    if let (Some(x), Some(y)) = (infinity(a), infinity(b)) {
        return x == y;
    }
    let variants = |s: &str| -> Vec<expr::Expr> {
        let s = s.replace(' ', "");
        let mut v = Vec::new();
        if let Some(p) = s.strip_suffix('%') {
            v.extend(expr::parse(p).ok());
            v.extend(expr::parse(&format!("({p})/100")).ok());
        } else {
            v.extend(expr::parse(&s).ok());
        }
        v
    };
    let (va, vb) = (variants(a), variants(b));
    va.iter().any(|x| vb.iter().any(|y| expr::equivalent(x, y)))
}
