//! The MATH dataset's answer normalisation (`normalize_answer` of Hendrycks et al.), which the
//! PRM800K grader applies first ("be at least as lenient as mathd").

/// Normalise an answer string the way the MATH dataset's `normalize_answer` does.
pub fn normalize_answer(answer: &str) -> String {
    let mut a = answer.trim().to_string();
    if let Some(inner) = strip_text_wrapper(&a) {
        a = inner.trim().to_string();
    }
    strip_string(&a).unwrap_or(a)
}

/// `^\\text\{(.+?)\}$` — the lazy group is forced to the end by `$`, so this is "the whole
/// string is `\text{...}`" with at least one character inside.
pub(crate) fn strip_text_wrapper(s: &str) -> Option<&str> {
    let inner = s.strip_prefix("\\text{")?.strip_suffix('}')?;
    (!inner.is_empty() && !inner.contains('\n')).then_some(inner)
}

fn fix_fracs(s: &str) -> Option<String> {
    let mut parts = s.split("\\frac");
    let mut out = parts.next().unwrap_or("").to_string();
    for sub in parts {
        out.push_str("\\frac");
        let chars: Vec<char> = sub.chars().collect();
        if chars.first() == Some(&'{') {
            out.push_str(sub);
            continue;
        }
        if chars.len() < 2 {
            return None; // the original returns the input unchanged
        }
        let (a, b) = (chars[0], chars[1]);
        let tail: String = chars[2..].iter().collect();
        if b != '{' {
            out.push_str(&format!("{{{a}}}{{{b}}}{tail}"));
        } else {
            out.push_str(&format!("{{{a}}}{b}{tail}"));
        }
    }
    Some(out)
}

fn fix_a_slash_b(s: &str) -> String {
    let parts: Vec<&str> = s.split('/').collect();
    if parts.len() != 2 {
        return s.to_string();
    }
    match (py_int(parts[0]), py_int(parts[1])) {
        (Some(a), Some(b)) if s == format!("{a}/{b}") => format!("\\frac{{{a}}}{{{b}}}"),
        _ => s.to_string(),
    }
}

/// Python's `int(str)` for plain decimal integers (surrounding whitespace and `_` aside).
fn py_int(s: &str) -> Option<i128> {
    let t = s.trim();
    let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

fn remove_right_units(s: &str) -> Option<String> {
    if s.contains("\\text{ ") {
        let splits: Vec<&str> = s.split("\\text{ ").collect();
        if splits.len() != 2 {
            return None; // assertion failure in the original
        }
        Some(splits[0].to_string())
    } else {
        Some(s.to_string())
    }
}

fn fix_sqrt(s: &str) -> Option<String> {
    if !s.contains("\\sqrt") {
        return Some(s.to_string());
    }
    let mut parts = s.split("\\sqrt");
    let mut out = parts.next().unwrap_or("").to_string();
    for split in parts {
        let mut chars = split.chars();
        match chars.next() {
            None => return None, // IndexError in the original
            Some('{') => {
                out.push_str("\\sqrt");
                out.push_str(split);
            }
            Some(a) => out.push_str(&format!("\\sqrt{{{a}}}{}", chars.as_str())),
        }
    }
    Some(out)
}

/// `_strip_string`; `None` where the original raises (the caller then keeps the input).
fn strip_string(s: &str) -> Option<String> {
    let mut s = s.replace('\n', "").replace("\\!", "").replace("\\\\", "\\");
    s = s
        .replace("tfrac", "frac")
        .replace("dfrac", "frac")
        .replace("\\left", "")
        .replace("\\right", "");
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "");
    s = remove_right_units(&s)?;
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.");
    if s.is_empty() {
        return Some(s);
    }
    if s.starts_with('.') {
        s = format!("0{s}");
    }
    let eq: Vec<&str> = s.split('=').collect();
    if eq.len() == 2 && eq[0].chars().count() <= 2 {
        s = eq[1].to_string();
    }
    s = fix_sqrt(&s)?;
    s = s.replace(' ', "");
    s = fix_fracs(&s).unwrap_or(s);
    if s == "0.5" {
        s = "\\frac{1}{2}".into();
    }
    Some(fix_a_slash_b(&s))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn examples() {
        assert_eq!(normalize_answer("\\frac12"), "\\frac{1}{2}");
        assert_eq!(normalize_answer("1/2"), "\\frac{1}{2}");
        assert_eq!(normalize_answer(".5"), "\\frac{1}{2}");
        assert_eq!(normalize_answer("x = 5"), "5");
        assert_eq!(normalize_answer("\\text{no}"), "no");
        assert_eq!(normalize_answer("\\sqrt2"), "\\sqrt{2}");
        assert_eq!(normalize_answer("90^\\circ"), "90");
    }
}
