//! Final-answer extraction from solution text: `\boxed{...}` (nested braces), "The answer is",
//! GSM8K's `#### N` and `A: N`, PRM800K's `# Answer`.

/// The content of the last `\boxed{...}` (or `\fbox{...}`) in `text`, braces balanced.
pub fn last_boxed(text: &str) -> Option<String> {
    let (start, skip) = ["\\boxed", "\\fbox"]
        .iter()
        .filter_map(|m| text.rfind(m).map(|i| (i, m.len())))
        .max_by_key(|(i, _)| *i)?;
    let rest = &text[start + skip..];
    let rest_trim = rest.trim_start();
    if let Some(inner) = rest_trim.strip_prefix('{') {
        let mut depth = 1usize;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(inner[..i].trim().to_string());
                    }
                }
                _ => {}
            }
        }
        None
    } else {
        // `\boxed 5` form: up to the next `$` or whitespace.
        let tok: String = rest_trim
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '$')
            .collect();
        (!tok.is_empty()).then_some(tok)
    }
}

/// PRM800K's `# Answer\n\nX` convention.
pub fn extract_prm800k_answer(text: &str) -> Option<String> {
    let i = text.rfind("# Answer")?;
    let a = text[i + "# Answer".len()..].trim();
    (!a.is_empty()).then(|| a.to_string())
}

/// The number after GSM8K's `#### ` marker.
pub fn extract_gsm8k_gold(text: &str) -> Option<String> {
    let i = text.rfind("####")?;
    let a = text[i + 4..].trim();
    (!a.is_empty()).then(|| a.replace(',', ""))
}

fn after_marker(text: &str, marker: &str) -> Option<String> {
    let lower = text.to_lowercase();
    // Lowercasing can change byte offsets for non-ASCII text; only trust ASCII-safe positions.
    let i = lower.rfind(marker)?;
    if lower.len() != text.len() {
        return None;
    }
    let mut a = text[i + marker.len()..].trim_start_matches([':', ' ', '\t']).trim();
    if let Some(b) = last_boxed(a) {
        return Some(b);
    }
    // Up to the end of the line; drop a trailing full stop and surrounding `$`.
    a = a.lines().next().unwrap_or("").trim();
    let a = a.strip_suffix('.').unwrap_or(a).trim();
    let a = a.trim_matches('$').trim();
    (!a.is_empty()).then(|| a.to_string())
}

/// Extract the final answer from a solution text, trying in order: `\boxed{}`, `# Answer`,
/// `####`, "The answer is", "A:" at the start of the last line, and finally the last number.
pub fn extract_answer(text: &str) -> Option<String> {
    extract_raw(text).map(|a| tidy(&a)).filter(|a| !a.is_empty())
}

/// Clean an extracted answer: surrounding `**`/`$`, a trailing full stop, a stray backslash
/// before digits (`\15` for `\$15`); a sentence with a number is reduced to its last number.
pub fn tidy(answer: &str) -> String {
    let mut a = answer
        .trim()
        .trim_matches('*')
        .trim()
        .trim_matches('$')
        .trim()
        .to_string();
    if a.ends_with('.') && !a.ends_with("..") {
        a.pop();
    }
    if a.starts_with('\\') && a[1..].starts_with(|c: char| c.is_ascii_digit()) {
        a.remove(0);
    }
    let words = a
        .split_whitespace()
        .filter(|w| w.len() > 1 && w.chars().all(char::is_alphabetic))
        .count();
    if words >= 2 && !a.contains('\\') {
        if let Some(n) = last_number(&a) {
            return n;
        }
    }
    a
}

fn extract_raw(text: &str) -> Option<String> {
    if let Some(b) = last_boxed(text) {
        return Some(b);
    }
    if let Some(a) = extract_prm800k_answer(text) {
        return Some(a);
    }
    if text.contains("####") {
        return extract_gsm8k_gold(text);
    }
    for marker in ["the answer is", "final answer is", "final answer:", "answer:"] {
        if let Some(a) = after_marker(text, marker) {
            return Some(a);
        }
    }
    if let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) {
        if let Some(a) = last.trim().strip_prefix("A:") {
            return Some(a.trim().to_string());
        }
    }
    // The number right after the last `=`, else the last number.
    if let Some(i) = text.rfind('=') {
        let after = &text[i + 1..];
        let lead = after.trim_start().trim_start_matches(['$', '\\']);
        if lead.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
            if let Some(n) = first_number(lead) {
                return Some(n);
            }
        }
    }
    last_number(text)
}

fn first_number(text: &str) -> Option<String> {
    let end = text
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || c == ',' || (i == 0 && c == '-')))
        .map_or(text.len(), |(i, _)| i);
    let n = text[..end].trim_end_matches(['.', ',']).replace(',', "");
    (!n.is_empty() && n != "-").then_some(n)
}

/// The last number in `text` (integers, decimals, thousands commas, a leading minus).
pub fn last_number(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut end = b.len();
    while end > 0 {
        if b[end - 1].is_ascii_digit() {
            let mut start = end;
            while start > 0 && (b[start - 1].is_ascii_digit() || b[start - 1] == b',' || b[start - 1] == b'.') {
                start -= 1;
            }
            while start < end && !b[start].is_ascii_digit() {
                start += 1;
            }
            let neg = start > 0 && b[start - 1] == b'-';
            let num = text[start..end].replace(',', "");
            let num = num.trim_end_matches('.').to_string();
            return Some(if neg { format!("-{num}") } else { num });
        }
        end -= 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_with_nested_braces() {
        assert_eq!(
            last_boxed(r"so \boxed{\frac{1}{2}} and \boxed{x^{2}}").as_deref(),
            Some("x^{2}")
        );
        assert_eq!(last_boxed(r"\boxed{\frac{a}{b}}").as_deref(), Some(r"\frac{a}{b}"));
        assert_eq!(last_boxed(r"\boxed 5$").as_deref(), Some("5"));
        assert_eq!(last_boxed(r"\boxed{unclosed"), None);
    }

    #[test]
    fn markers() {
        assert_eq!(extract_answer("x\n#### 1,234").as_deref(), Some("1234"));
        assert_eq!(extract_answer("so\nA: 18").as_deref(), Some("18"));
        assert_eq!(extract_answer("The answer is: 17").as_deref(), Some("17"));
        assert_eq!(extract_answer("Therefore, the answer is $42$.").as_deref(), Some("42"));
        assert_eq!(extract_answer("We get 3 then 4.5 apples.").as_deref(), Some("4.5"));
        assert_eq!(extract_answer("So 29 cents.\n\n# Answer\n\n29").as_deref(), Some("29"));
        assert_eq!(extract_answer("a loss of -12 dollars").as_deref(), Some("-12"));
    }
}
