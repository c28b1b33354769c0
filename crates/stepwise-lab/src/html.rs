//! The report's HTML: enough Markdown for it (headings, bullet lists, tables with a header row,
//! images, bold, emphasis, code, paragraphs), so `report.html` opens in any browser with no
//! converter installed.

use std::fmt::Write as _;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Replace each pair of `marker` in `s` by `open`…`close` (an unpaired marker stays as it is).
fn pairs(s: &str, marker: &str, open: &str, close: &str) -> String {
    let parts: Vec<&str> = s.split(marker).collect();
    let paired = if parts.len() % 2 == 1 {
        parts.len()
    } else {
        parts.len() - 1
    };
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push_str(match (i < paired, i % 2 == 1) {
                (true, true) => open,
                (true, false) => close,
                (false, _) => marker,
            });
        }
        out.push_str(part);
    }
    out
}

/// Inline Markdown: `code`, **bold**, *emphasis* (a `*` between spaces or digits is a times
/// sign and stays).
fn inline(s: &str) -> String {
    let s = pairs(&escape(s), "`", "<code>", "</code>");
    let s = pairs(&s, "**", "<b>", "</b>");
    // Emphasis needs a star against a word: `*lucky*`, not `2 * 3`.
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::new();
    let mut open = false;
    for (i, &c) in chars.iter().enumerate() {
        let before = i.checked_sub(1).map(|j| chars[j]);
        let after = chars.get(i + 1).copied();
        let word = |x: Option<char>| x.is_some_and(|x| x.is_alphanumeric() || "(%_".contains(x));
        if c == '*' && !open && word(after) && !word(before) {
            let closes = chars[i + 1..].iter().position(|&x| x == '*').is_some();
            if closes {
                out.push_str("<em>");
                open = true;
                continue;
            }
        } else if c == '*' && open && word(before) {
            out.push_str("</em>");
            open = false;
            continue;
        }
        out.push(c);
    }
    if open {
        out.push_str("</em>");
    }
    out
}

/// Enough Markdown for the report: headings, bullet lists, tables, images, bold, emphasis,
/// code, paragraphs.
pub fn markdown_to_html(md: &str) -> String {
    let mut h = String::from("<!doctype html><html><head><meta charset=\"utf-8\"><title>stepwise lab report</title><style>body{font-family:sans-serif;max-width:960px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}th{background:#f4f4f4}img{max-width:100%}code{background:#f4f4f4;padding:0 2px}</style></head><body>\n");
    let lines: Vec<&str> = md.lines().collect();
    let (mut in_table, mut in_list) = (false, false);
    for (k, line) in lines.iter().enumerate() {
        let is_row = line.starts_with('|');
        let is_item = line.starts_with("- ");
        if in_table && !is_row {
            h.push_str("</table>\n");
            in_table = false;
        }
        if in_list && !is_item {
            h.push_str("</ul>\n");
            in_list = false;
        }
        if is_row {
            let separator = line.trim_matches('|').split('|').all(|c| {
                let c = c.trim();
                !c.is_empty() && c.chars().all(|x| "-:".contains(x))
            });
            if separator {
                continue;
            }
            if !in_table {
                h.push_str("<table>\n");
                in_table = true;
            }
            // The row above a `|---|` line is the header.
            let header = lines
                .get(k + 1)
                .is_some_and(|next| next.starts_with("|") && next.contains("---"));
            let cell = if header { "th" } else { "td" };
            h.push_str("<tr>");
            for c in line.trim_matches('|').split('|') {
                let _ = write!(h, "<{cell}>{}</{cell}>", inline(c.trim()));
            }
            h.push_str("</tr>\n");
        } else if is_item {
            if !in_list {
                h.push_str("<ul>\n");
                in_list = true;
            }
            let _ = writeln!(h, "<li>{}</li>", inline(&line[2..]));
        } else if let Some(t) = line.strip_prefix("### ") {
            let _ = writeln!(h, "<h3>{}</h3>", inline(t));
        } else if let Some(t) = line.strip_prefix("## ") {
            let _ = writeln!(h, "<h2>{}</h2>", inline(t));
        } else if let Some(t) = line.strip_prefix("# ") {
            let _ = writeln!(h, "<h1>{}</h1>", inline(t));
        } else if let Some(t) = line.strip_prefix("![") {
            let (alt, rest) = t.split_once("](").unwrap_or((t, ""));
            let _ = writeln!(
                h,
                "<p><img alt=\"{}\" src=\"{}\"></p>",
                escape(alt),
                escape(rest.trim_end_matches(')'))
            );
        } else if !line.trim().is_empty() {
            let _ = writeln!(h, "<p>{}</p>", inline(line));
        }
    }
    if in_table {
        h.push_str("</table>\n");
    }
    if in_list {
        h.push_str("</ul>\n");
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_headers_emphasis_and_code_become_html() {
        let md = "## Results\n\n*lucky* is **rare**; `metrics.json` has 2 * 3 cells.\n\n- one\n- two\n\n| method | N |\n|---|---|\n| bon | 4 |\n";
        let h = markdown_to_html(md);
        assert!(h.contains("<h2>Results</h2>"));
        assert!(
            h.contains("<em>lucky</em> is <b>rare</b>; <code>metrics.json</code> has 2 * 3 cells."),
            "{h}"
        );
        assert!(h.contains("<ul>\n<li>one</li>\n<li>two</li>\n</ul>"), "{h}");
        assert!(
            h.contains("<tr><th>method</th><th>N</th></tr>\n<tr><td>bon</td><td>4</td></tr>"),
            "{h}"
        );
        assert!(!h.contains("---"));
    }
}
