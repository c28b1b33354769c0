//! Checking GSM8K calculator annotations `<<a op b=c>>`: is `c` what `a op b` evaluates to?

use crate::grader::expr;

/// One calculator annotation found in a text.
#[derive(Debug, Clone, PartialEq)]
pub struct Annotation {
    /// The expression left of `=`.
    pub expression: String,
    /// The stated result right of `=`.
    pub stated: String,
    /// The value of the expression, when it could be evaluated.
    pub value: Option<f64>,
    /// Whether the stated result matches the value (exactly, or rounded to the stated
    /// number of decimals).
    pub correct: bool,
}

/// Every `<<expr=result>>` annotation in `text`, checked.
pub fn check_annotations(text: &str) -> Vec<Annotation> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("<<") {
        let after = &rest[i + 2..];
        let Some(j) = after.find(">>") else { break };
        let inner = &after[..j];
        rest = &after[j + 2..];
        let Some((lhs, rhs)) = inner.rsplit_once('=') else {
            continue;
        };
        out.push(check(lhs.trim(), rhs.trim()));
    }
    out
}

fn check(lhs: &str, rhs: &str) -> Annotation {
    let clean = |s: &str| s.replace([',', '$'], "").replace('x', "*");
    let value = expr::parse(&clean(lhs)).ok().and_then(|e| e.value());
    let stated_val = expr::parse(&clean(rhs)).ok().and_then(|e| e.value());
    let correct = match (
        expr::parse(&clean(lhs)).ok().and_then(|e| e.rational()),
        expr::parse(&clean(rhs)).ok().and_then(|e| e.rational()),
        value,
        stated_val,
    ) {
        (Some(a), Some(b), _, _) if a == b => true,
        (_, _, Some(v), Some(s)) => {
            let decimals = rhs.split_once('.').map_or(0, |(_, d)| d.trim().len()) as i32;
            let scale = 10f64.powi(decimals);
            (v * scale).round() / scale == s || ((v * scale).trunc() / scale - s).abs() < 1e-9
        }
        _ => false,
    };
    Annotation {
        expression: lhs.to_string(),
        stated: rhs.to_string(),
        value,
        correct,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn right_and_wrong() {
        let a = check_annotations("16 - 3 - 4 = <<16-3-4=9>>9 and 13 * 2 = <<13*2=25>>25 and <<10/3=3.33>>");
        assert_eq!(a.iter().map(|x| x.correct).collect::<Vec<_>>(), vec![true, false, true]);
    }
}
