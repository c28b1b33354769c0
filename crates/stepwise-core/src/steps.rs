//! Splitting a solution text into steps.

use std::str::FromStr;

/// How to cut a solution text into steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitStrategy {
    /// Paragraphs separated by one or more blank lines.
    BlankLine,
    /// Every non-empty line.
    Newline,
    /// At `Step k:` markers (the marker stays in the step).
    StepMarker,
    /// At an explicit tag (e.g. `ки` or `<extra_0>`), which is removed.
    Tag(String),
}

impl FromStr for SplitStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "blank-line" | "paragraph" => SplitStrategy::BlankLine,
            "newline" | "line" => SplitStrategy::Newline,
            "step-marker" | "step" => SplitStrategy::StepMarker,
            _ => match s.strip_prefix("tag:") {
                Some(t) if !t.is_empty() => SplitStrategy::Tag(t.to_string()),
                _ => {
                    return Err(format!(
                        "unknown split strategy `{s}`: use blank-line, newline, step-marker or tag:TAG"
                    ))
                }
            },
        })
    }
}

/// Split `text` into trimmed, non-empty steps.
pub fn split_steps(text: &str, strategy: &SplitStrategy) -> Vec<String> {
    let parts: Vec<String> = match strategy {
        SplitStrategy::BlankLine => {
            let mut out = Vec::new();
            let mut cur = String::new();
            for line in text.lines() {
                if line.trim().is_empty() {
                    if !cur.trim().is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                    cur.clear();
                } else {
                    if !cur.is_empty() {
                        cur.push('\n');
                    }
                    cur.push_str(line);
                }
            }
            out.push(cur);
            out
        }
        SplitStrategy::Newline => text.lines().map(str::to_string).collect(),
        SplitStrategy::StepMarker => {
            let starts = step_marker_starts(text);
            if starts.is_empty() {
                vec![text.to_string()]
            } else {
                let mut bounds = starts.clone();
                bounds.push(text.len());
                let mut out = vec![text[..starts[0]].to_string()];
                out.extend(bounds.windows(2).map(|w| text[w[0]..w[1]].to_string()));
                out
            }
        }
        SplitStrategy::Tag(tag) => text.split(tag.as_str()).map(str::to_string).collect(),
    };
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Byte offsets where `Step k:` (or `Step k.`) markers begin.
fn step_marker_starts(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("Step ") {
        let at = from + i;
        let rest = &text[at + 5..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && matches!(rest.as_bytes().get(digits), Some(b':') | Some(b'.')) {
            out.push(at);
        }
        from = at + 5;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategies() {
        let t = "Step 1: a\nb\n\nStep 2: c\n\n\nStep 3: d";
        assert_eq!(
            split_steps(t, &SplitStrategy::BlankLine),
            vec!["Step 1: a\nb", "Step 2: c", "Step 3: d"]
        );
        assert_eq!(split_steps(t, &SplitStrategy::Newline).len(), 4);
        assert_eq!(
            split_steps(t, &SplitStrategy::StepMarker),
            vec!["Step 1: a\nb", "Step 2: c", "Step 3: d"]
        );
        assert_eq!(
            split_steps("a ки\nb ки", &SplitStrategy::Tag("ки".into())),
            vec!["a", "b"]
        );
        assert_eq!(
            "tag:<extra_0>".parse::<SplitStrategy>().unwrap(),
            SplitStrategy::Tag("<extra_0>".into())
        );
        assert!("bogus".parse::<SplitStrategy>().is_err());
    }
}
